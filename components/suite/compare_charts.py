"""The comparison report's pictures over training: the learning curves of the tracked groups against samples seen, and
the logit scale and bias by step (components/suite/compare_report.py writes them beside compare.md)."""

from __future__ import annotations

from components.shared.reports import figure_png, pyplot
from components.suite.report import TRACKED

SWAP_ATT_TARGET = 0.6  # "samples to reach swap_att 0.6": where binding has clearly left chance (0.5) on the tracking suite


def logit_chart(curves: dict[str, tuple[str, list[dict]]]) -> bytes:
    """The logit scale s and bias b by step, one line per run (colour: arm)."""
    plt = pyplot()
    arms = list(dict.fromkeys(arm for arm, _ in curves.values()))
    colors = plt.get_cmap("tab10")
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), dpi=100)
    for ax, key, title in zip(axes, ("logit_scale", "logit_bias"), ("logit scale s", "logit bias b"), strict=False):
        for arm, points in curves.values():
            have = [p for p in points if key in p]
            ax.plot([p["step"] for p in have], [p[key] for p in have], color=colors(arms.index(arm) % 10), lw=1, alpha=0.8)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], color=colors(i % 10), label=arm) for i, arm in enumerate(arms)]
    fig.legend(handles=handles, loc="center right", fontsize=8)
    fig.tight_layout(rect=(0, 0, 0.84, 1))
    return figure_png(fig)


def curves_chart(curves: dict[str, tuple[str, list[dict]]], global_batch: int) -> bytes:
    """Learning curves: each tracked group against samples seen, one line per arm (the mean over its seeds) with a band
    from the lowest to the highest seed."""
    plt = pyplot()
    import numpy as np

    arms = list(dict.fromkeys(arm for arm, _ in curves.values()))
    colors = plt.get_cmap("tab10")
    # three panels a row, each about a third of a page wide at full size: readable where the docs show the picture
    ncols = 3
    nrows = -(-len(TRACKED) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(12, 3.9 * nrows + 0.6), dpi=100, squeeze=False)
    for ax, group in zip(axes.flat, TRACKED, strict=False):
        key = f"track/{group}"
        for k, arm in enumerate(arms):
            runs = [{p["step"]: p[key] for p in points if key in p} for a, points in curves.values() if a == arm]
            steps = sorted(set.intersection(*(set(r) for r in runs))) if runs else []
            if not steps:
                continue
            values = np.array([[r[s] for s in steps] for r in runs])  # [seeds, points]
            x = np.array(steps) * global_batch
            ax.plot(x, values.mean(axis=0), color=colors(k % 10), lw=2, label=f"{arm} ({len(runs)} seed{'s' if len(runs) > 1 else ''})")
            if len(runs) > 1:
                ax.fill_between(x, values.min(axis=0), values.max(axis=0), color=colors(k % 10), alpha=0.18)
        ax.set_title(group.replace("_", " "), fontsize=13)
        if group == "swap_att":  # the threshold "samples to reach swap_att 0.6" reads off
            ax.axhline(SWAP_ATT_TARGET, color="grey", lw=1, ls="--")
        ax.set_xlabel("samples seen", fontsize=11)
        ax.tick_params(labelsize=10)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(TRACKED):]:
        ax.set_visible(False)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncols=min(len(labels), 4) or 1, fontsize=11, frameon=False, bbox_to_anchor=(0.5, 1.0))
    fig.suptitle("line: mean over seeds; band: lowest to highest seed", fontsize=10, y=0.005, va="bottom", color="0.3")
    fig.tight_layout(rect=(0, 0.03, 1, 0.955))
    return figure_png(fig)
