"""The reports over http on 127.0.0.1 for `make serve` (infra/serve.sh): what the flow's link artifacts open.

    python -m flows.reports_server --port 4201 [--directory reports]

Python's ``http.server`` with three refusals a plain one lacks: no directory listings (a folder without index.html is a
404), no symbolic links (a link inside reports/ to a file elsewhere is never served), and only requests addressed to
this machine's loopback names (``Host: 127.0.0.1:<port>`` or ``localhost:<port>``): a page on another site that
rebinds its DNS name to 127.0.0.1 reaches the server with its own name in ``Host`` and gets a 403.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import sys
from pathlib import Path

LOOPBACK_NAMES = ("127.0.0.1", "localhost")


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
        return super().send_head()

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
