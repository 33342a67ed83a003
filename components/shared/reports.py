"""Pictures the stages write: a matplotlib figure as PNG bytes, and the training loss curve."""

from __future__ import annotations

import io
from pathlib import Path

from components.shared.atomic import atomic_write_bytes


def pyplot():
    """matplotlib's pyplot on the Agg backend (no display on servers and CI)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure_png(fig, dpi: int | None = None) -> bytes:
    """The figure as PNG bytes; the figure is closed."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", **({"dpi": dpi} if dpi else {}))
    pyplot().close(fig)
    return buf.getvalue()


def plot_losses(points: list[dict], path: Path) -> None:
    """The loss terms by step (log scale) and, where the run checked it, zero-shot top-1, as a PNG."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    terms = sorted({k for p in points for k in p if k.endswith("_loss")})  # CLIC's terms alternate by step
    for term in ["loss", *terms]:
        have = [p for p in points if term in p]
        ax.plot([p["step"] for p in have], [p[term] for p in have], label=term, lw=2 if term == "loss" else 1)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left")
    checks = [p for p in points if "zero_shot_top1" in p]
    if checks:
        right = ax.twinx()
        right.plot([p["step"] for p in checks], [p["zero_shot_top1"] for p in checks], "o-", color="black", label="zero-shot top-1")
        right.set_ylim(0, 1)
        right.set_ylabel("zero-shot top-1 (single objects)")
        right.legend(loc="center right")
    fig.tight_layout()
    atomic_write_bytes(path, figure_png(fig))
