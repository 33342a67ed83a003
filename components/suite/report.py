"""The evaluate stage's report: group summaries (the promotion gates read them), flat metric keys, the
markdown table and the bar chart."""

from __future__ import annotations

from typing import Any

from components.shared.markdown_text import md_literal
from components.shared.reports import figure_png, pyplot
from components.suite import formats, items

# The tests whose negatives differ from the caption only in which attribute goes with which object: what a bag of
# words cannot pass (C2LIP's target). Their mean is the ``binding`` group, beside the benchmark groups.
BINDING_TASKS = ("sugarcrepe/swap_att", "sugarcrepe_pp/swap_att", "winoground")
# the summary groups a learning curve follows (components.study.tracking), in the order charts show them
TRACKED_GROUPS = ("binding", "compositional", "zero_shot", "zero_shot_held_out", "retrieval")
# and one test on its own: SugarCrepe's swap_att, the headline of "samples to reach swap_att 0.6"
TRACKED_TASK = "sugarcrepe/swap_att"
TRACKED = ("swap_att", *TRACKED_GROUPS)


def tracked_figures(tasks: list[formats.Task], results: dict[str, dict[str, float]]) -> dict[str, float]:
    """What a learning curve records at one point: :data:`TRACKED_GROUPS` and :data:`TRACKED_TASK`'s headline."""
    groups = summarize(tasks, results)
    figures = {g: groups[g] for g in TRACKED_GROUPS if g in groups}
    task = next((t for t in tasks if t.name == TRACKED_TASK), None)
    if task is not None:
        figures["swap_att"] = results[task.name][task.headline]
    return figures


def summarize(tasks: list[formats.Task], results: dict[str, dict[str, float]]) -> dict[str, float]:
    """Per group, the mean of each task's headline metric (promotion gates compare these); ``binding`` is
    the mean over :data:`BINDING_TASKS` present."""
    groups: dict[str, list[float]] = {}
    for task in tasks:
        for group in [task.group, *(["binding"] if task.name in BINDING_TASKS else [])]:
            groups.setdefault(group, []).append(results[task.name][task.headline])
            held = results[task.name].get(f"held_out/{task.headline}")
            if held is not None:
                groups.setdefault(f"{group}_held_out", []).append(held)
    return {g: sum(v) / len(v) for g, v in groups.items()}


def paired_intervals(tasks: list[formats.Task], tables: dict[str, dict[str, Any]], names: list[str], resamples: int,
                     seed: int) -> dict[str, dict[str, Any]]:
    """For every model after the first: its difference from the first with a paired bootstrap interval over items, for
    every figure of every task (``tasks``: task -> key -> Interval) and for the summary groups (``groups``: the mean
    of the tasks' headline differences, the draws averaged alike)."""
    out = {}
    ref = names[0]
    for name in names[1:]:
        per_task = {t.name: items.paired_differences(tables[ref][t.name], tables[name][t.name], resamples, seed) for t in tasks}
        groups: dict[str, list[items.Interval]] = {}
        for task in tasks:
            for group in [task.group, *(["binding"] if task.name in BINDING_TASKS else [])]:
                groups.setdefault(group, []).append(per_task[task.name][task.headline])
                if (held := per_task[task.name].get(f"held_out/{task.headline}")) is not None:
                    groups.setdefault(f"{group}_held_out", []).append(held)
        out[name] = {"tasks": per_task, "groups": {g: items.mean_interval(v) for g, v in groups.items()}}
    return out


def interval_json(intervals: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The intervals without their draws (reports/intervals.json)."""
    return {name: {"groups": {g: i.as_dict() for g, i in v["groups"].items()},
                   "tasks": {t: {k: i.as_dict() for k, i in keys.items()} for t, keys in v["tasks"].items()}}
            for name, v in intervals.items()}


def _delta(d: float | None, interval: items.Interval | None) -> str:
    if d is None:
        return "—"
    if interval is None:
        return f"{d:+.3f}"
    return f"{d:+.3f} [{interval.low:+.3f}, {interval.high:+.3f}]{'†' if interval.excludes_zero else ''}"


def flat_metrics(tasks: list[formats.Task], per_model: dict[str, dict[str, dict[str, float]]]) -> dict[str, float]:
    """Every metric at full precision: the card, MLflow and the registry read these and print them as the report
    does, so a figure never shows two values (rounding 0.1205004 to 0.1205 first would print 0.120 beside 0.121)."""
    flat = {}
    for model, results in per_model.items():
        for name, metrics in results.items():
            for k, v in metrics.items():
                flat[f"{model}/{name}/{k}"] = float(v)
        for g, v in summarize(tasks, results).items():
            flat[f"{model}/summary/{g}"] = float(v)
    return flat


def _fmt(v: float | None) -> str:
    return "—" if v is None else f"{v:.3f}"


# the chart beside the report (the reports server and MLflow show the Markdown with it)
CHART_LINE = "![each benchmark: the models' scores beside chance, and the difference with its 95% interval](benchmarks.png)"


def markdown_report(tasks: list[formats.Task], per_model: dict[str, dict[str, dict[str, float]]], names: list[str], meta: dict[str, Any],
                    intervals: dict[str, dict[str, Any]] | None = None, resamples: int = 0, gallery: str | None = None,
                    precision: str = "fp32") -> str:
    ref = names[0]
    intervals = intervals or {}
    head = "| benchmark | metric | items | " + " | ".join(names) + "".join(f" | Δ {n} − {ref}" for n in names[1:]) + " |"
    sep = "|" + "---|" * (3 + len(names) + len(names) - 1)
    lines = [
        "# Benchmark report",
        "",
        f"Models: {', '.join(f'`{n}` ({md_literal(meta[n])})' for n in names)}. Differences are against `{ref}`. Ties follow each",
        "benchmark's official script: wrong everywhere except ARO's order benchmarks (p_at_1: the true caption wins a",
        "tie, as ARO's argmax; p_at_1_ties_wrong counts it wrong). ARO VG macro_acc is the official figure (symmetric",
        "relations and attribute pairs under 25 items left out; macro_acc_all_groups keeps them). Rows marked *held-out* are the "
        "items that show or name a (color, shape) pair never",
        "drawn in training (ShapesWorld); *seen* are the others (retrieval: those images and their captions as",
        "queries, ranked against every candidate).",
        "",
        *([f"**Scored with the weights in {precision}**, not fp32: the figures differ from the official scripts' in their last "
           "digits (the evaluate stage's `precision`).", ""] if precision != "fp32" else []),
        *([f"Δ cells: the difference, then its 95% paired bootstrap interval over the benchmark's items ({resamples:,} resamples of the "
           "items, the same draws for both models; retrieval resamples images with their captions); † marks an interval that excludes 0. "
           "A group's interval averages its benchmarks' draws. Method: docs/stages/evaluate.md.", ""] if intervals else []),
        *([f"Per-item results: `items/<model>/<benchmark>.parquet`. What changed, item by item: [the failure gallery]({gallery}).", ""]
          if gallery else []),
        CHART_LINE,
        "",
        "## Summary (mean of each benchmark's headline metric)",
        "",
        "| group | " + " | ".join(names) + "".join(f" | Δ {n} − {ref}" for n in names[1:]) + " |",
        "|---|" + "---|" * (2 * len(names) - 1),
    ]
    summaries = {n: summarize(tasks, per_model[n]) for n in names}
    for g in summaries[ref]:
        vals = [summaries[n].get(g) for n in names]
        deltas = [None if v is None or vals[0] is None else v - vals[0] for v in vals[1:]]
        cells = [_delta(d, intervals.get(n, {}).get("groups", {}).get(g)) for n, d in zip(names[1:], deltas, strict=True)]
        lines.append(f"| {g} | " + " | ".join(_fmt(v) for v in vals) + "".join(f" | {c}" for c in cells) + " |")
    lines += ["", "## Every metric", "", head, sep]
    for task in tasks:
        keys = list(per_model[ref][task.name])
        for key in keys:
            if key.split("/")[-1] in ("items", "groups"):  # counts, not scores (they stay in metrics.json)
                continue
            part, metric = (key.split("/", 1) if "/" in key else ("", key))
            bench = task.name + (f" *{part.replace('_', '-')}*" if part else "")
            count = per_model[ref][task.name].get(f"{part}/items" if part else "items")
            vals = [per_model[n][task.name].get(key) for n in names]
            deltas = [None if v is None or vals[0] is None else v - vals[0] for v in vals[1:]]
            cells = [_delta(d, intervals.get(n, {}).get("tasks", {}).get(task.name, {}).get(key)) for n, d in zip(names[1:], deltas, strict=True)]
            strong = "**" if metric == task.headline and not part else ""
            lines.append(f"| {bench} | {strong}{metric}{strong} | {int(count) if count else ''} | " + " | ".join(_fmt(v) for v in vals)
                         + "".join(f" | {c}" for c in cells) + " |")
    return "\n".join(lines) + "\n"


GROUP_ORDER = ("binding", "compositional", "zero_shot", "retrieval")


def chart_group(task: formats.Task) -> str:
    return "binding" if task.name in BINDING_TASKS else task.group


def chance_level(task: formats.Task, draws: int = 8, dim: int = 32, seed: int = 0) -> float:
    """The task's headline when every embedding is random: what guessing scores under the benchmark's own rule (0.5 for
    a caption against one negative, about one in the number of classes for zero-shot, ...), the mean of a few draws."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    texts = len(task.needs_classifier["classnames"]) if task.needs_classifier else len(task.texts)
    values = []
    for _ in range(draws):
        images = torch.nn.functional.normalize(torch.randn(len(task.images), dim, generator=generator), dim=-1)
        words = torch.nn.functional.normalize(torch.randn(texts, dim, generator=generator), dim=-1)
        table = items.item_table(task.name, task.headline, task.layout, task.score_items(images, words))
        values.append(items.results_of(table)[task.headline])
    return float(sum(values) / len(values))


def bar_chart(tasks: list[formats.Task], per_model: dict[str, dict[str, dict[str, float]]], names: list[str],
              intervals: dict[str, dict[str, Any]] | None = None) -> bytes:
    """One row per benchmark, grouped (binding, compositional, zero-shot, retrieval): each model's headline beside the
    chance level (left) and, with two or more models, the last one's difference from the first with its 95% paired
    interval over items (right: green when the interval lies above 0, red below, grey across it)."""
    plt = pyplot()

    order = {g: k for k, g in enumerate(GROUP_ORDER)}
    shown = sorted(tasks, key=lambda t: (order.get(chart_group(t), len(order)), t.name))
    rows = list(range(len(shown)))[::-1]  # the first task on top
    delta = intervals.get(names[-1]) if intervals and len(names) > 1 else None
    # sized for a page: about 1,000 px wide, 11 pt labels, a row every 0.42 in (the docs and the reports page show it
    # at 70-100 %; the earlier 22 rotated labels under bars could not be read there)
    fig, axes = plt.subplots(1, 2 if delta else 1, figsize=(10.5 if delta else 7.5, 0.42 * len(shown) + 1.9), squeeze=False,
                             dpi=100, gridspec_kw={"width_ratios": [3, 2] if delta else [1]}, sharey=True)
    ax = axes[0, 0]
    markers = "os^Dv<>"
    for k, name in enumerate(names):
        ax.scatter([per_model[name][t.name][t.headline] for t in shown], rows, marker=markers[k % len(markers)], s=55, zorder=3,
                   label=name)
    ax.scatter([chance_level(t) for t in shown], rows, marker="|", s=260, color="0.35", lw=2, zorder=2, label="chance")
    ax.set_yticks(rows, [f"{t.name} ({t.headline})" for t in shown], fontsize=11)
    ax.set_xlim(0, 1)
    ax.set_xlabel("score (headline metric)", fontsize=11)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=11, loc="lower left", bbox_to_anchor=(0, 1.0), ncols=len(names) + 1, frameon=False)
    # group bands: a line between groups and the group's name at the right edge of the last panel (on the scores
    # panel a name sat on the points of scores near 1)
    labelled = axes[0, -1]
    for axis in axes[0]:
        previous = None
        for row, task in zip(rows, shown, strict=True):
            if chart_group(task) != previous:
                if previous is not None:
                    axis.axhline(row + 0.5, color="0.7", lw=0.8)
                previous = chart_group(task)
                if axis is labelled:
                    axis.annotate(previous.replace("_", "-"), (0.99, row + 0.47), xycoords=("axes fraction", "data"), fontsize=9,
                                  color="0.25", va="top", ha="right", annotation_clip=False, fontweight="bold")
    if delta:
        right = axes[0, 1]
        for row, task in zip(rows, shown, strict=True):
            interval = delta["tasks"][task.name].get(task.headline)
            if interval is None:
                continue
            color = "tab:green" if interval.low > 0 else "tab:red" if interval.high < 0 else "0.5"
            right.errorbar(interval.delta, row, xerr=[[interval.delta - interval.low], [interval.high - interval.delta]], fmt="o",
                           color=color, ms=7, capsize=3, lw=2)
        right.axvline(0, color="0.3", lw=1)
        right.tick_params(labelsize=10)
        right.set_xlabel(f"Δ {names[-1]} − {names[0]}\n(95% paired interval over items)", fontsize=11)
        right.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return figure_png(fig)
