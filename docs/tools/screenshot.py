"""A page as the docs show it: headless Chromium (Debian's `chromium`) opens an HTML file, optionally picks filter and
sort values and clicks, and saves a PNG of the window.

    .venv/bin/python docs/tools/screenshot.py reports/gallery/index.html docs/failure_gallery.png \
        --select outcome=fixed --select sort=gain --width 1280 --height 900

Used for the gallery pictures of docs/stages/evaluate.md; the gallery's own behaviour is tested in
tests/test_items_gallery.py."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("page", type=Path, help="the HTML file")
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--select", action="append", default=[], metavar="ID=VALUE", help="set a <select id=ID> to VALUE")
    parser.add_argument("--click", action="append", default=[], metavar="CSS", help="click the first element matching CSS")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=900)
    parser.add_argument("--full-page", action="store_true", help="the whole page, not only the window")
    args = parser.parse_args(argv)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("screenshot: no chromium on this machine (Debian: apt-get install chromium)", file=sys.stderr)
        return 2
    if not args.page.is_file():
        print(f"screenshot: {args.page}: no such file", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": args.width, "height": args.height})
        page.goto(args.page.resolve().as_uri())
        page.wait_for_load_state("load")
        for pair in args.select:
            key, _, value = pair.partition("=")
            page.select_option(f"#{key}", value)
        for selector in args.click:
            page.locator(selector).first.click()
        page.wait_for_timeout(300)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(args.out), full_page=args.full_page)
        browser.close()
    print(f"screenshot: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
