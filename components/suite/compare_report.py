"""The comparison's report: each arm's mean ± sd per benchmark group over seeds, paired differences
against the reference arm seed by seed, the markdown table and the chart."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from components.shared.atomic import atomic_write_bytes, atomic_write_json
from components.shared.markdown_text import md_text
from components.shared.owned_outputs import OwnedOutputs
from components.shared.params import CompareParams
from components.shared.reports import figure_png, pyplot
from components.suite import gallery, items
from components.suite.compare_charts import SWAP_ATT_TARGET, curves_chart, logit_chart
from components.suite.report import paired_intervals

GROUPS = ("binding", "compositional", "zero_shot", "retrieval")  # binding: components.suite.report.BINDING_TASKS


# train-metric columns of the report: (key of the train stage's final metrics, column title); components.compare keeps these
TRAIN_COLUMNS = (("logit_scale", "s"), ("logit_bias", "b"), ("zero_shot_top1_held_out_pairs", "zero-shot held-out"),
                 ("zero_shot_held_out_predicted_as_seen", "as seen"), ("held_out_prompt_nearest_seen_cos", "held→seen cos"),
                 ("seen_prompt_nearest_seen_cos", "seen→seen cos"))


def _mean_sd(values: list[float]) -> tuple[float, float]:
    return round(statistics.fmean(values), 6), round(statistics.stdev(values) if len(values) > 1 else 0.0, 6)


def aggregate(params: CompareParams, runs: list, results: dict[str, dict[str, float]], headlines: dict[str, str] | None = None) -> dict[str, Any]:
    """Per arm and metric: every seed's value, mean, standard deviation; paired differences (arm − reference,
    same seed) of the summary groups."""
    arms = [a.name for a in params.arms]
    keys = sorted({k for r in results.values() for k in r})
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for arm in arms:
        table[arm] = {}
        for key in keys:
            values = [results[r.label][key] for r in runs if r.arm == arm and key in results[r.label]]
            if values:
                mean, sd = _mean_sd(values)
                table[arm][key] = {"values": [round(v, 6) for v in values], "mean": mean, "sd": sd}
    paired: dict[str, dict[str, Any]] = {}
    reference = {r.seed: results[r.label] for r in runs if r.arm == params.reference}
    for arm in arms:
        if arm == params.reference:
            continue
        paired[arm] = {}
        for group in [*GROUPS, *(f"{g}_held_out" for g in GROUPS)]:
            key = f"summary/{group}"
            diffs = [results[r.label][key] - reference[r.seed][key] for r in runs
                     if r.arm == arm and key in results[r.label] and key in reference.get(r.seed, {})]
            if diffs:
                mean, sd = _mean_sd(diffs)
                paired[arm][group] = {"values": [round(d, 6) for d in diffs], "mean": mean, "sd": sd, "positive": sum(d > 0 for d in diffs)}
    return {"arms": arms, "reference": params.reference, "seeds": list(params.seeds), "metrics": table, "paired": paired,
            "headlines": headlines or {}}


def item_level(params: CompareParams, runs: list, tasks: list, evaluate: Any, gallery_dir: Path) -> tuple[dict[str, Any], list[str]]:
    """Every arm against the reference item by item: the summary groups' paired bootstrap intervals per seed and pooled
    over seeds (the mean of the seeds' differences, the same item draws in every seed), and one failure-gallery page
    per arm (its first seed against the reference's same seed) into the new folder ``gallery_dir`` (swapped in as
    report_dir/compare-gallery/; report_dir/gallery/ is the evaluate stage's when the two share a folder)."""
    names = [t.name for t in tasks]
    tables = {r.label: items.read_tables(r.dir / "items", names) for r in runs if (r.dir / "items").is_dir()}
    boot = evaluate.bootstrap
    reference = {r.seed: r for r in runs if r.arm == params.reference}
    out: dict[str, Any] = {}
    pages = []
    for arm in [a.name for a in params.arms if a.name != params.reference]:
        per_seed: dict[int, dict[str, items.Interval]] = {}
        for r in runs:
            ref = reference.get(r.seed)
            if r.arm != arm or ref is None or r.label not in tables or ref.label not in tables:
                continue
            pair = {"reference": tables[ref.label], "arm": tables[r.label]}
            per_seed[r.seed] = paired_intervals(tasks, pair, ["reference", "arm"], boot.resamples, boot.seed)["arm"]["groups"]
            if not any(p.file == f"{arm}.html" for p in pages):  # the arm's first seed
                pages.append(gallery.Page(f"{arm}.html", f"{params.reference} (seed {r.seed})", f"{arm} (seed {r.seed})",
                                          tables[ref.label], tables[r.label]))
        if per_seed:
            groups = set.intersection(*(set(v) for v in per_seed.values()))
            pooled = {g: items.mean_interval([v[g] for v in per_seed.values()]) for g in sorted(groups)}
            out[arm] = {"pooled": {g: i.as_dict() for g, i in pooled.items()},
                        "per_seed": {str(seed): {g: i.as_dict() for g, i in v.items()} for seed, v in per_seed.items()}}
    written = []
    g = evaluate.gallery
    if pages and g.enabled:
        written = [p.name for p in gallery.write_gallery(gallery_dir, pages, tasks, g.per_outcome, g.seed, g.thumbnail_px, g.more, g.enlarge_px)]
    return out, written


def _cell(stats: dict[str, Any] | None, signed: bool = False) -> str:
    if not stats:
        return "–"
    fmt = "{:+.3f}" if signed else "{:.3f}"
    return f"{fmt.format(stats['mean'])} ± {stats['sd']:.3f}"


def markdown(params: CompareParams, summary: dict[str, Any], world: dict[str, float], budget: dict[str, Any]) -> str:
    arms, ref, n = summary["arms"], summary["reference"], len(summary["seeds"])
    m, paired = summary["metrics"], summary["paired"]
    descriptions = {a.name: a.description for a in params.arms}
    lines = ["# Comparison of methods", "",
             f"{len(arms)} arm{'s' if len(arms) > 1 else ''} × {n} seeds ({', '.join(map(str, summary['seeds']))}), each "
             f"{'fine-tuned from the same base' if len(arms) > 1 else 'trained by the same recipe'} for "
             f"{budget['steps']} steps of {budget['global_batch']} samples ({budget['samples']:,} samples), judged by the same suite. "
             + ("Cells: each seed's figure, then the mean ± standard deviation over seeds (one arm: nothing is paired)." if len(arms) == 1 else
                f"Cells: mean ± standard deviation over seeds. Paired differences: arm − `{ref}` with the same seed "
                "(the count says in how many seeds it was positive)."), ""]
    if world:
        lines += [f"World: {world['objects_per_image']:.2f} objects per image, {world['colors']} colors × {world['shapes']} shapes, "
                  f"{world['bag_of_words_ambiguous']:.0%} of training captions describe two objects that differ in color and shape "
                  f"(a bag of words cannot bind them: C2LIP's premise).", ""]
    if summary.get("not_applicable"):
        lines += [f"Not applicable in this world (no items): {', '.join(summary['not_applicable'])}.", ""]
    for title, suffix in (("All items", ""), ("Held-out (color, shape) combinations only", "_held_out")):
        if len(arms) == 1:  # a recipe's spread over seeds: nothing to pair, one row per seed
            lines += [f"## {title}", "", "| seed | " + " | ".join(GROUPS) + " |", "|---|" + "---:|" * len(GROUPS)]
            stats = [m[ref].get(f"summary/{g}{suffix}") for g in GROUPS]
            for k, seed in enumerate(summary["seeds"]):
                lines.append(f"| {seed} | " + " | ".join(f"{st['values'][k]:.3f}" if st and k < len(st["values"]) else "–" for st in stats) + " |")
            lines += ["| mean ± sd | " + " | ".join(_cell(st) for st in stats) + " |", ""]
            continue
        lines += [f"## {title}", "", "| arm | " + " | ".join(f"{g}" for g in GROUPS) + " | " + " | ".join(f"Δ {g}" for g in GROUPS) + " |",
                  "|---|" + "---:|" * (2 * len(GROUPS))]
        for arm in arms:
            cells = [_cell(m[arm].get(f"summary/{g}{suffix}")) for g in GROUPS]
            deltas = []
            for g in GROUPS:
                d = paired.get(arm, {}).get(f"{g}{suffix}")
                deltas.append("(reference)" if arm == ref else (f"{_cell(d, True)} ({d['positive']}/{len(d['values'])})" if d else "–"))
            lines.append(f"| {arm} | " + " | ".join(cells) + " | " + " | ".join(deltas) + " |")
        lines.append("")
    if summary.get("reach"):
        reach = {a: summary["reach"][a] for a in arms if a in summary["reach"]}  # the arms' order, also from a reread compare.json
        lines += reach_section(reach, reference=ref)
    if summary.get("intervals"):
        lines += intervals_section(summary, ref)
    if any(descriptions.values()):
        lines += ["## Arms", ""] + [f"- `{a}`: {md_text(descriptions[a])}" for a in arms if descriptions[a]] + [""]
    lines += ["## Every benchmark (headline metric, mean ± sd over seeds)", "", "| benchmark | " + " | ".join(arms) + " |", "|---|" + "---:|" * len(arms)]
    for task, metric in summary["headlines"].items():
        lines.append(f"| {task} ({metric}) | " + " | ".join(_cell(m[a].get(f"{task}/{metric}")) for a in arms) + " |")
    geometry = [(key, label) for key, label in TRAIN_COLUMNS if any(f"train/{key}" in m[a] for a in arms)]
    if geometry:
        lines += ["", "## End of training: logit scale and bias, and where held-out pairs go (mean ± sd over seeds)", "",
                  "Zero-shot on the single-object test images (16 classes). *as seen*: share of held-out images classified as a "
                  "pair seen in training; *held→seen cos*: cosine of each held-out class's prompt embedding to the nearest "
                  "seen class's; *seen→seen cos*: the same among seen classes. The curves of s and b by step: "
                  "compare-logits.png.", "",
                  "| arm | " + " | ".join(label for _, label in geometry) + " |", "|---|" + "---:|" * len(geometry)]
        for arm in arms:
            lines.append(f"| {arm} | " + " | ".join(_cell(m[arm].get(f"train/{key}")) for key, _ in geometry) + " |")
    shares = [m[a]["train/curves_share"]["mean"] for a in arms if "train/curves_share" in m[a]]
    if shares:
        lines += ["", f"Learning curves on the tracking suite (step 0 and every checkpoint): curves.png; scoring them took "
                  f"{min(shares):.0%}–{max(shares):.0%} of each run's time (mean over seeds, per arm)."]
    lines += ["", "Training throughput (samples/s, one torch thread, two runs at a time): " +
              ", ".join(f"{a} {m[a]['train/samples_per_s']['mean']:.0f}" for a in arms if 'train/samples_per_s' in m[a]), ""]
    return "\n".join(lines)


def _interval(i: dict[str, Any] | None) -> str:
    if not i:
        return "–"
    return f"{i['delta']:+.3f} [{i['low']:+.3f}, {i['high']:+.3f}]{'†' if i['excludes_zero'] else ''}"


def _seed_interval(paired: dict[str, Any] | None) -> str:
    """A paired difference's seeds as one interval: a training run is the unit, not an item."""
    if not paired or len(paired.get("values", [])) < 2:
        return "–"
    i = over_seeds(paired["values"])
    return _interval({"delta": i["mean"], "low": i["low"], "high": i["high"], "excludes_zero": i["low"] > 0 or i["high"] < 0})


def intervals_section(summary: dict[str, Any], ref: str) -> list[str]:
    """Each arm − reference with a paired bootstrap interval over the benchmarks' items: pooled over seeds, then seed by seed."""
    groups = [g for g in (*GROUPS, *(f"{g}_held_out" for g in GROUPS)) if any(g in v["pooled"] for v in summary["intervals"].values())]
    lines = ["## Paired differences: intervals over items and over seeds", "",
             f"Arm − `{ref}` on the same items, with the 95% paired bootstrap interval over items (the same item draws for both "
             "models and in every seed); *pooled*: the mean over seeds of each seed's difference, its interval from the same draws "
             "averaged. † marks an interval that excludes 0. These intervals say what the items allow for these trained models; "
             "*over seeds*: the mean of the seeds' differences with a 95% interval over seeds (Student's t), which says how "
             "much training runs differ.", "",
             "| arm | seed | " + " | ".join(groups) + " |", "|---|---|" + "---:|" * len(groups)]
    for arm, v in summary["intervals"].items():
        lines.append(f"| {arm} | pooled | " + " | ".join(_interval(v["pooled"].get(g)) for g in groups) + " |")
        per_seed = summary.get("paired", {}).get(arm, {})
        if any(len(per_seed.get(g, {}).get("values", [])) > 1 for g in groups):
            lines.append(f"| {arm} | over seeds | " + " | ".join(_seed_interval(per_seed.get(g)) for g in groups) + " |")
        for seed, per in v["per_seed"].items():
            lines.append(f"| {arm} | {seed} | " + " | ".join(_interval(per.get(g)) for g in groups) + " |")
    if summary.get("galleries"):
        lines += ["", "Failure galleries (each arm's first seed against the reference's): "
                  + ", ".join(f"[{page}](compare-gallery/{page})" for page in summary["galleries"]) + "."]
    return lines + [""]


def chart(summary: dict[str, Any]) -> bytes:
    """Two panels: each group's score per arm (bar: mean, dots: seeds, whisker: sd), and the paired
    differences against the reference."""
    plt = pyplot()

    arms, m, paired = summary["arms"], summary["metrics"], summary["paired"]
    groups = [*GROUPS, *(f"{g}_held_out" for g in GROUPS)]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2), dpi=100)
    width = 0.8 / len(arms)
    colors = plt.get_cmap("tab10")
    for ax, paired_panel in zip(axes, (False, True), strict=False):
        for k, arm in enumerate(arms):
            xs, means, sds, dots = [], [], [], []
            for g_i, g in enumerate(groups):
                stats = paired.get(arm, {}).get(g) if paired_panel else m[arm].get(f"summary/{g}")
                if stats:
                    x = g_i + (k - (len(arms) - 1) / 2) * width
                    xs.append(x), means.append(stats["mean"]), sds.append(stats["sd"])
                    dots += [(x, v) for v in stats["values"]]
            if not xs:
                continue
            ax.bar(xs, means, width, yerr=sds, label=arm, color=colors(k), alpha=0.8, capsize=2)
            ax.scatter([d[0] for d in dots], [d[1] for d in dots], s=6, color="black", zorder=3)
        ax.set_xticks(range(len(groups)), [g.replace("_held_out", "\n(held-out)") for g in groups], fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        if paired_panel:
            ax.axhline(0, color="black", lw=0.8)
            ax.set_title(f"paired difference vs {summary['reference']} (same seed)")
        else:
            ax.set_ylim(0, 1)
            ax.set_title("score per arm (bars: mean over seeds, dots: seeds)")
    axes[0].legend(fontsize=7, ncol=2, loc="upper left")
    fig.tight_layout()
    return figure_png(fig)




def samples_to_reach(curves: dict[str, tuple[str, list[dict]]], global_batch: int, target: float = SWAP_ATT_TARGET) -> dict[str, Any]:
    """Per arm and run (seed): the samples seen at the first tracked point from which swap_att stays ≥ ``target`` to
    the run's end (None: not within the run; on a slice of ~100 swap_att items one lucky point is not binding), with
    zero-shot, its held-out pairs and retrieval at that point; and the last point's samples and swap_att."""
    out: dict[str, Any] = {}
    for label, (arm, points) in curves.items():
        tracked = [p for p in points if "track/swap_att" in p]
        if not tracked:
            continue
        below = [k for k, p in enumerate(tracked) if p["track/swap_att"] < target]
        first = below[-1] + 1 if below else 0
        hit = tracked[first] if first < len(tracked) else None
        out.setdefault(arm, []).append({
            "run": label, "samples": None if hit is None else hit["step"] * global_batch, "auc": curve_area(tracked, global_batch),
            "last_samples": tracked[-1]["step"] * global_batch, "final_swap_att": tracked[-1]["track/swap_att"],
            **({} if hit is None else {k.removeprefix("track/"): hit[k] for k in
                                       ("track/zero_shot", "track/zero_shot_held_out", "track/retrieval") if k in hit})})
    return out


def curve_area(tracked: list[dict], global_batch: int) -> float | None:
    """The area under a run's tracking swap_att curve over the samples it saw, divided by their span: the curve's mean
    height (0.5: chance all along). Less sensitive to where a run stops than its end point, and to one noisy point than
    the first crossing."""
    if len(tracked) < 2:
        return None
    x = [p["step"] * global_batch for p in tracked]
    y = [p["track/swap_att"] for p in tracked]
    area = sum((x[k + 1] - x[k]) * (y[k + 1] + y[k]) / 2 for k in range(len(x) - 1))
    return area / (x[-1] - x[0])


def over_seeds(values: list[float]) -> dict[str, float]:
    """Mean of per-seed values with a 95% interval over seeds (Student's t; the seeds are the samples)."""
    from scipy import stats

    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return {"mean": mean, "low": mean, "high": mean, "seeds": n}
    sd = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5
    half = float(stats.t.ppf(0.975, n - 1)) * sd / n ** 0.5
    return {"mean": mean, "low": mean - half, "high": mean + half, "seeds": n}


def reach_section(reach: dict[str, Any], target: float = SWAP_ATT_TARGET, reference: str | None = None) -> list[str]:
    """The markdown table of :func:`samples_to_reach`: the headline of a learning-curve comparison; with a
    ``reference`` arm, each arm's area minus the reference's in the same seed as well."""
    paired = reference in reach
    lines = [f"## Samples to reach swap_att {target}", "",
             f"On the tracking suite (SugarCrepe swap_att on its slice of the test images; chance 0.5), the first checkpoint "
             f"from which swap_att stays at or above {target} to the run's end, per seed; zero-shot (held-out pairs) and "
             "retrieval R@1 at that checkpoint, mean over the seeds that reached it. *not reached*: the run ended below it "
             "or dipped below it after its last crossing (final swap_att given).", "",
             "*area*: the mean height of the tracking swap_att curve over the run (0.5: chance throughout), mean over seeds "
             "with a 95% interval over seeds" + (f"; *Δ area*: minus `{reference}`'s in the same seed, the interval over seeds "
                                                 "(the count says in how many seeds it was positive)." if paired else "."), "",
             "| arm | samples to reach, per seed | median | zero-shot (held-out) there | retrieval there | area under swap_att |"
             + (" Δ area |" if paired else ""),
             "|---|---|---:|---:|---:|---:|" + ("---:|" if paired else "")]
    for arm, runs in reach.items():
        per_seed = [f"{r['samples']:,}" if r["samples"] is not None else f"not reached by {r['last_samples']:,} ({r['final_swap_att']:.3f})"
                    for r in runs]
        reached = [r for r in runs if r["samples"] is not None]
        ordered = sorted(r["samples"] for r in reached) + [None] * (len(runs) - len(reached))
        median = ordered[(len(ordered) - 1) // 2]
        mean = {key: [r[key] for r in reached if key in r] for key in ("zero_shot", "zero_shot_held_out", "retrieval")}
        mean = {key: f"{sum(v) / len(v):.3f}" if v else "–" for key, v in mean.items()}
        lines.append(f"| {arm} | {'; '.join(per_seed)} | {f'{median:,}' if median is not None else 'not reached'} | "
                     f"{mean['zero_shot']} ({mean['zero_shot_held_out']}) | {mean['retrieval']} | {_area(runs)} |"
                     + (f" {_area_delta(runs, reach[reference], arm == reference)} |" if paired else ""))
    return lines + [""]


def _seed_of(run: dict) -> str:
    return run["run"].rsplit("-s", 1)[-1]  # run labels are "<arm>-s<seed>"


def _area_delta(runs: list[dict], reference: list[dict], is_reference: bool) -> str:
    if is_reference:
        return "(reference)"
    ref = {_seed_of(r): r["auc"] for r in reference if r.get("auc") is not None}
    diffs = [r["auc"] - ref[_seed_of(r)] for r in runs if r.get("auc") is not None and _seed_of(r) in ref]
    if len(diffs) < 2:
        return f"{diffs[0]:+.3f}" if diffs else "–"
    i = over_seeds(diffs)
    return f"{i['mean']:+.3f} [{i['low']:+.3f}, {i['high']:+.3f}] ({sum(d > 0 for d in diffs)}/{len(diffs)})"


def _area(runs: list[dict]) -> str:
    areas = [r["auc"] for r in runs if r.get("auc") is not None]
    if not areas:
        return "–"
    stats = over_seeds(areas)
    return f"{stats['mean']:.3f} [{stats['low']:.3f}, {stats['high']:.3f}]" if len(areas) > 1 else f"{stats['mean']:.3f}"


# --------------------------------------------------------------------------------------------------
# the report's files and its MLflow run
# --------------------------------------------------------------------------------------------------


def write_report(params: CompareParams, runs: list, results: dict[str, dict[str, float]], world: dict[str, float],
                 headlines: dict[str, str], not_applicable: list[str] | None = None, suite=None) -> dict[str, Any]:
    summary = aggregate(params, runs, results, headlines)
    summary["not_applicable"] = not_applicable or []
    t = runs[0].train
    budget = {"steps": t.steps, "global_batch": t.global_batch, "samples": t.steps * t.global_batch}
    curves = {r.label: (r.arm, json.loads(Path(r.train.plots_path).read_text())["loss"]) for r in runs if Path(r.train.plots_path).is_file()}
    summary.update(world=world, budget=budget, reach=samples_to_reach(curves, t.global_batch))
    owned, expected = report_outputs(params)
    with owned.build() as out:  # the report and its gallery swapped in at once; report_dir's other files untouched
        if suite is not None:
            summary["intervals"], summary["galleries"] = item_level(params, runs, suite.tasks, suite.params, out / "compare-gallery")
        atomic_write_json(out / "compare.json", summary)
        atomic_write_bytes(out / "compare.md", markdown(params, summary, world, budget).encode())
        atomic_write_bytes(out / "compare.png", chart(summary))
        if curves:
            atomic_write_bytes(out / "compare-logits.png", logit_chart(curves))
        if any(any(k.startswith("track/") for p in points for k in p) for _, points in curves.values()):
            atomic_write_bytes(out / "curves.png", curves_chart(curves, t.global_batch))
        owned.swap_in(out, expected)
    return summary


REPORT_FILES = ("compare.json", "compare.md", "compare.png", "compare-logits.png", "curves.png")


def report_outputs(params: CompareParams) -> tuple[OwnedOutputs, set[str]]:
    """What the comparison owns in ``report_dir`` (shared with the evaluate stage's report by default): its report
    files and ``compare-gallery/``, whose pages are named by arm (an older version's gallery is recognised by them)."""
    expected = {f"compare-gallery/{a.name}.html" for a in params.arms}
    return OwnedOutputs(params.report_dir, "compare", folders=("compare-gallery",), files=REPORT_FILES), expected


def log_to_mlflow(params: CompareParams, summary: dict[str, Any]) -> None:
    from components.shared.params import flatten_params
    from components.shared.tracking import use_experiment

    mlflow = use_experiment(params.mlflow_experiment)
    with mlflow.start_run(run_name="compare"):
        mlflow.set_tags({"stage": "compare", "reference": params.reference})
        mlflow.log_params({k: v[:500] for k, v in flatten_params(params).items()})
        flat = {}
        for arm, metrics in summary["metrics"].items():
            for key, stats in metrics.items():
                if key.startswith("summary/"):
                    flat[f"{arm}/{key}/mean"], flat[f"{arm}/{key}/sd"] = stats["mean"], stats["sd"]
        for arm, groups in summary["paired"].items():
            for group, stats in groups.items():
                flat[f"{arm}/paired_vs_{params.reference}/{group}"] = stats["mean"]
        mlflow.log_metrics(flat)
        for name in ("compare.md", "compare.png", "compare.json"):
            mlflow.log_artifact(str(params.report_dir / name))
