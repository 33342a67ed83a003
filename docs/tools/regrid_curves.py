"""A kept learning-curves picture drawn as one strip of six panels (the layout before the current one), laid out again
two panels a row so that it reads at page width without clicking. The pixels are the picture's own: the panels are cut
at the blank columns between them and placed on a grid, the strip's title line above them; nothing is redrawn.

    PYTHONPATH=. .venv/bin/python docs/tools/regrid_curves.py reports/compare-binding/curves.png [...]

A picture that is not such a strip (already a grid, or another size) is left as it is and named."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from PIL import Image

PANELS = 6
COLUMNS = 2


def _runs(blank: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of each run of True in ``blank``."""
    runs, start = [], None
    for i, value in enumerate([*blank, False]):
        if value and start is None:
            start = i
        elif not value and start is not None:
            runs.append((start, i))
            start = None
    return runs


def regrid(image: Image.Image) -> Image.Image | None:
    """The strip on a grid of :data:`COLUMNS` panels a row, or None when ``image`` is not a strip of six panels."""
    rgb = np.asarray(image.convert("RGB")).astype(int)
    height, width = rgb.shape[:2]
    if width < 4 * height:
        return None
    ink = (rgb < 235).any(axis=2)
    rows = ink.any(axis=1)
    # the title line: the first inked rows, then a blank gap, then the panels
    first = int(np.argmax(rows))
    gap = first + int(np.argmax(~rows[first:]))
    title, body = image.crop((0, 0, width, gap + 2)), image.crop((0, gap, width, height))
    # each panel by its axes: the spines are the columns inked over most of the body's height (two per panel)
    body_ink = ink[gap:]
    dark = (rgb[gap:] < 80).all(axis=2)  # the spines are black; curves, bands and grid lines are coloured or light
    spine_columns = np.flatnonzero(dark.mean(axis=0) > 0.5)
    spines = [int(group.mean()) for group in np.split(spine_columns, np.flatnonzero(np.diff(spine_columns) > 2) + 1) if len(group)]
    if len(spines) != 2 * PANELS:
        return None
    rows_inked = np.flatnonzero(dark[:, spines[0]])
    top, bottom = int(rows_inked.min()), int(rows_inked.max())
    panels = []
    for k in range(PANELS):
        left, right = spines[2 * k], spines[2 * k + 1]
        before = spines[2 * k - 1] + 2 if k else 0
        after = spines[2 * k + 2] - 8 if k < PANELS - 1 else width
        # its y tick labels, left of its left spine on the axes' rows; its x tick labels, which may reach past its
        # right spine, below the axes
        y_labels = np.flatnonzero(body_ink[top:bottom, before:left - 1].any(axis=0))
        start = before + int(y_labels.min()) if len(y_labels) else left - 40
        x_labels = np.flatnonzero(body_ink[bottom + 8:, right + 1:after].any(axis=0))  # below the lowest y tick label
        end = right + 2 + (int(x_labels.max()) if len(x_labels) else 0)
        panel = np.asarray(body.convert("RGB")).copy()[:, max(0, start - 4):min(width, end + 4)]
        offset = max(0, start - 4)
        # what belongs to a neighbour inside the window: its y tick labels right of this spine on the axes' rows, its x
        # tick labels left of this panel's own (below the axes, well left of the left spine)
        panel[max(0, top - 8):bottom + 5, right + 2 - offset:] = 255
        panel[bottom + 8:, :max(0, left - 12 - offset)] = 255
        panels.append(Image.fromarray(panel))
    cell_w, cell_h = max(p.width for p in panels) + 12, body.height
    rows_n = -(-PANELS // COLUMNS)
    # the title line, cut to its inked columns, centred above the grid
    title_ink = (np.asarray(title.convert("RGB")).astype(int) < 235).any(axis=2).any(axis=0)
    left, right = int(np.argmax(title_ink)), len(title_ink) - int(np.argmax(title_ink[::-1]))
    title = title.crop((max(0, left - 4), 0, min(width, right + 4), title.height))
    out = Image.new("RGB", (cell_w * COLUMNS, title.height + cell_h * rows_n), "white")
    out.paste(title, ((out.width - title.width) // 2, 0))
    for k, panel in enumerate(panels):
        out.paste(panel, ((k % COLUMNS) * cell_w + (cell_w - panel.width) // 2, title.height + (k // COLUMNS) * cell_h))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pictures", nargs="+", type=Path)
    args = parser.parse_args(argv)
    for path in args.pictures:
        grid = regrid(Image.open(path))
        if grid is None:
            print(f"regrid_curves: {path}: not a strip of {PANELS} panels, left as it is")
            continue
        grid.save(path)
        print(f"regrid_curves: {path}: {grid.width}×{grid.height}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
