"""The reports over http on 127.0.0.1 for `make serve` (infra/serve.sh): what the flow's link artifacts open.

    python -m flows.reports_server --port 4201 [--directory reports]

Python's ``http.server`` with three refusals a plain one lacks: no directory listings (a folder without index.html is a
404), no symbolic links (a link inside reports/ to a file elsewhere is never served), and only requests addressed to
this machine's loopback names (``Host: 127.0.0.1:<port>`` or ``localhost:<port>``): a page on another site that
rebinds its DNS name to 127.0.0.1 reaches the server with its own name in ``Host`` and gets a 403.

A Markdown report (``benchmarks.md``, ``compare.md``) is sent as an HTML page rendered from it (UTF-8, its tables as
tables, its pictures shown beside it), since a browser shows ``text/markdown`` as raw text in a guessed encoding (Δ came
out as "Î”"); ``?raw`` sends the file itself. Every text type says its charset.
"""

from __future__ import annotations

import argparse
import functools
import html
import http.server
import io
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

LOOPBACK_NAMES = ("127.0.0.1", "localhost")
# a report's page: readable width, tables with lines, pictures no wider than the page
PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 72rem; margin: 1.5rem auto; padding: 0 1rem; line-height: 1.45; color: #222; }}
table {{ border-collapse: collapse; margin: 1rem 0; font-size: 0.9rem; }}
th, td {{ border: 1px solid #ccc; padding: 0.25rem 0.5rem; text-align: left; }}
th {{ background: #f3f3f3; }} tr:nth-child(even) td {{ background: #fafafa; }}
img {{ max-width: 100%; height: auto; }} code {{ background: #f3f3f3; padding: 0 0.2rem; }}
</style></head>
<body>
<p><a href="{raw}">the Markdown file</a></p>
{body}
</body></html>
"""


def markdown_page(text: str, name: str) -> bytes:
    """The report ``text`` (Markdown) as a UTF-8 HTML page. Raw HTML in it is shown as text, not run: a model name or a
    description with ``<script>`` stays inert, and ``items/<model>/`` in a code span reads as written."""
    import markdown

    converter = markdown.Markdown(extensions=["tables", "fenced_code", "sane_lists"], output_format="html")
    converter.preprocessors.deregister("html_block")  # python-markdown's way to treat raw HTML as text
    converter.inlinePatterns.deregister("html")
    body = converter.convert(text)
    return PAGE.format(title=html.escape(name), raw=html.escape(f"{name}?raw"), body=body).encode("utf-8")


class ReportsHandler(http.server.SimpleHTTPRequestHandler):
    def _allowed_host(self) -> bool:
        host = (self.headers.get("Host") or "").strip().lower()
        port = self.server.server_address[1]
        return host in {f"{name}:{port}" for name in LOOPBACK_NAMES}

    def send_head(self):  # every GET and HEAD passes here
        if not self._allowed_host():
            self.send_error(403, "requests must be addressed to 127.0.0.1 or localhost")
            return None
        try:
            return self._checked_head()
        except (OSError, ValueError):  # a NUL byte (%00) or a name the file system refuses: not found, not a traceback
            self.send_error(404, "not found")
            return None

    def _checked_head(self):
        # both absolute, unresolved: the link check below compares the path as asked with the root (a relative
        # --directory made it compare nothing)
        root = Path(os.path.abspath(self.directory))
        path = Path(os.path.abspath(self.translate_path(self.path)))
        if path.is_dir():
            path = path / "index.html"
        # a link anywhere on the way (the file, a folder above it) is refused, as is anything outside the root
        parts = [path, *path.parents]
        if any(p.is_symlink() for p in parts if p != root and root in p.parents) or not path.resolve().is_relative_to(root.resolve()):
            self.send_error(404, "not found")
            return None
        if not path.is_file():
            self.send_error(404, "not found")  # never a listing of a folder
            return None
        if path.suffix == ".md" and urlsplit(self.path).query != "raw":
            return self._markdown_head(path)
        return super().send_head()

    def _markdown_head(self, path: Path):
        page = markdown_page(path.read_text(encoding="utf-8", errors="replace"), path.name)
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        return io.BytesIO(page)

    def guess_type(self, path):
        kind = super().guess_type(path)
        # a text file says its encoding (the reports are UTF-8), so a browser never guesses Latin-1
        return f"{kind}; charset=utf-8" if kind.startswith("text/") and "charset" not in kind else kind

    def list_directory(self, path):  # reached only if send_head changes: still no listings
        self.send_error(404, "not found")
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=4201)
    parser.add_argument("--directory", type=Path, default=Path("reports"))
    args = parser.parse_args(argv)
    handler = functools.partial(ReportsHandler, directory=os.fspath(args.directory))
    with http.server.ThreadingHTTPServer(("127.0.0.1", args.port), handler) as server:
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
