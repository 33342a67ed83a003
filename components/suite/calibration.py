"""The calibration table: our testbed's figures beside the published ones, family by family and arm by arm.

The published rows are anchors of direction and size (the C2LIP paper's Table 1 for SigLIP B/16 and its fine-tune;
NegCLIP's figures as arXiv 2412.15396 tabulates them, from CLIP), never targets to fit. Ours come from comparison
reports (``components.compare``'s compare.json): the base's figure from one arm of a base sweep, or from the evaluate
stage's metrics.json of the base itself (``--base-arm``: its model name); each fine-tune arm's change against that base
as the mean over seeds with a 95% interval over seeds.

    python -m components.suite.calibration --base reports/base-calibrated/metrics.json --base-arm base-calibrated \\
        --arms reports/paper-calibrated/compare.json short-480=reports/paper-calibrated-short-480/compare.json \\
        --published-as c2lip_short=c2lip negclip_short=negclip --out reports/calibration.json

A report given as ``LABEL=PATH`` keys its arms ``<arm>@<LABEL>``, so two settings that name their arms alike (the same
method on other captions or at another budget) both stay in the table. An arm is set beside the published row of its
own name, or of the method ``--published-as ARM=METHOD`` names for it (an arm's name says what it is, not which
paper's row it stands for).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from components.shared.atomic import atomic_write_json
from components.suite.compare_report import over_seeds

# family -> (what it reads from a run's flat metrics: one key, or several averaged, e.g. both SC++ swap subsets)
FAMILIES: dict[str, tuple[str, ...]] = {
    "swap_att": ("sugarcrepe/swap_att/acc",),
    "sc_pp_swap": ("sugarcrepe_pp/swap_att/itt", "sugarcrepe_pp/swap_obj/itt"),
    "vg_relation": ("aro/vg_relation/macro_acc",),
    "vg_attribution": ("aro/vg_attribution/macro_acc",),
    "zero_shot": ("zero_shot/top1",),
    "retrieval": ("retrieval/shapesworld/mean_r1",),
}

# The published anchors. base: a web-pretrained model (SigLIP B/16 where the C2LIP paper reports it; CLIP for ARO).
# arms: the published figure after fine-tuning and, where the paper gives both ends, its change; "sign" is the
# direction every published row agrees on.
PUBLISHED: dict[str, Any] = {
    "base": {"swap_att": 0.658, "sc_pp_swap": 0.628, "vg_relation": 0.59, "vg_attribution": 0.63, "zero_shot": 0.761,
             "retrieval": 0.789},
    "arms": {
        "c2lip": {"swap_att": {"value": 0.731, "delta": 0.073, "sign": 1}, "sc_pp_swap": {"value": 0.753, "delta": 0.125, "sign": 1},
                  "zero_shot": {"value": 0.735, "delta": -0.026, "sign": -1}, "retrieval": {"value": 0.827, "delta": 0.038, "sign": 1}},
        "negclip": {"swap_att": {"value": 0.753, "sign": 1}, "sc_pp_swap": {"value": 0.709, "sign": 1},
                    "vg_relation": {"value": 0.71, "delta": 0.12, "sign": 1}, "vg_attribution": {"value": 0.81, "delta": 0.18, "sign": 1},
                    "zero_shot": {"value": 0.557, "sign": -1}},
    },
    "sources": {"base, c2lip": "C2LIP (CVPR 2026) Table 1: SigLIP ViT-B/16 (WebLI) and its C2LIP fine-tune on CC3M",
                "negclip, ARO base": "arXiv 2412.15396's table: NegCLIP and CLIP ViT-B/32"},
}


class CalibrationError(ValueError):
    """A comparison report that cannot fill the table (missing arm or metric), named."""


def family_values(metrics: dict[str, Any], arm: str, where: Path) -> dict[str, list[float]]:
    """Per family, the arm's per-seed values (several keys: their mean, seed by seed)."""
    if arm not in metrics:
        raise CalibrationError(f"{where}: no arm {arm!r} (arms: {', '.join(metrics)})")
    out = {}
    for family, keys in FAMILIES.items():
        missing = [k for k in keys if k not in metrics[arm]]
        if missing:
            continue  # a suite without ARO, say: the family is left out, not invented
        columns = [metrics[arm][k]["values"] for k in keys]
        out[family] = [sum(seed) / len(seed) for seed in zip(*columns, strict=True)]
    return out


def as_comparison(report: dict[str, Any]) -> dict[str, Any]:
    """A comparison's report as it is; the evaluate stage's flat metrics (``<model>/<benchmark>/<metric>``: value) as a
    comparison of one seed per model, so either can be the base."""
    if "metrics" in report and "arms" in report:
        return report
    metrics: dict[str, dict[str, Any]] = {}
    for key, value in report.items():
        model, sep, rest = key.partition("/")
        if sep and isinstance(value, (int, float)):
            metrics.setdefault(model, {})[rest] = {"values": [float(value)]}
    return {"arms": list(metrics), "metrics": metrics}


def calibration(base_report: dict[str, Any], base_arm: str, arm_reports: list[dict[str, Any]], where: Path,
                labels: list[str | None] | None = None, published_as: dict[str, str] | None = None) -> dict[str, Any]:
    """``{"base": {family: figure}, "published": {...}, "arms": {arm: {family: {"delta", "low", "high", "seeds",
    "sign_agrees"}}}}``: each arm's change against the base (mean over seeds, 95% interval over seeds). ``labels``
    (one per report, or None) key a report's arms ``<arm>@<label>``; ``published_as`` maps an arm to the published
    method whose sign it is checked against (default: its own name)."""
    base_report = as_comparison(base_report)
    base = {family: sum(v) / len(v) for family, v in family_values(base_report["metrics"], base_arm, where).items()}
    labels = labels or [None] * len(arm_reports)
    published_as = published_as or {}
    arms: dict[str, Any] = {}
    for report, label in zip(arm_reports, labels, strict=True):
        for arm in report["arms"]:
            key = f"{arm}@{label}" if label else arm
            if key in arms:
                raise CalibrationError(f"arm {key!r} is in two reports: give one of them a label (LABEL=PATH)")
            values = family_values(report["metrics"], arm, where)
            method = published_as.get(arm, arm)
            row = {}
            for family, seeds in values.items():
                if family not in base:
                    continue
                stats = over_seeds([v - base[family] for v in seeds])
                published = PUBLISHED["arms"].get(method, {}).get(family)
                agrees = None
                if published is not None:
                    # the sign agrees when the interval lies on the published side of 0 (an interval holding 0: no)
                    agrees = stats["low"] > 0 if published["sign"] > 0 else stats["high"] < 0
                row[family] = {"delta": round(stats["mean"], 5), "low": round(stats["low"], 5), "high": round(stats["high"], 5),
                               "seeds": stats["seeds"], "sign_agrees": agrees}
            arms[key] = row
    return {"base": {k: round(v, 5) for k, v in base.items()}, "base_arm": base_arm, "published": PUBLISHED, "arms": arms}


def read_report(path: Path, comparison: bool) -> dict[str, Any]:
    """A report read and checked: a JSON object; with ``comparison``, a comparison's (``arms`` and ``metrics``)."""
    try:
        report = json.loads(Path(path).read_text())
    except ValueError as err:
        raise CalibrationError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(report, dict):
        raise CalibrationError(f"{path}: a JSON {type(report).__name__}, not a report (a compare.json or an evaluate metrics.json)")
    if comparison and not (isinstance(report.get("arms"), list) and isinstance(report.get("metrics"), dict)):
        raise CalibrationError(f"{path}: not a comparison's compare.json (it needs 'arms' and 'metrics'; --arms takes "
                               "the reports of fine-tunes)")
    return report


def check_out(out: Path) -> None:
    """``--out`` must name a file that can be written: not a folder, not under a file (checked before any work)."""
    if out.is_dir():
        raise CalibrationError(f"--out {out}: a folder; name the JSON file to write (e.g. {out / 'calibration.json'})")
    if under := next((p for p in out.parents if p.exists() and not p.is_dir()), None):
        raise CalibrationError(f"--out {out}: {under} is a file, not a folder")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m components.suite.calibration", description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="compare.json of the base sweep, or the evaluate stage's metrics.json of the base")
    parser.add_argument("--base-arm", required=True, help="the sweep's arm (or the evaluated model's name) that is the base")
    parser.add_argument("--arms", nargs="+", required=True, metavar="[LABEL=]PATH",
                        help="compare.json of fine-tunes from that base; LABEL= keys its arms <arm>@LABEL")
    parser.add_argument("--published-as", nargs="*", default=[], metavar="ARM=METHOD",
                        help=f"check an arm against a published method's sign ({', '.join(PUBLISHED['arms'])})")
    parser.add_argument("--out", type=Path, default=Path("reports/calibration.json"))
    args = parser.parse_args(argv)
    labels, paths = [], []
    for entry in args.arms:
        label, _, path = entry.partition("=") if "=" in entry else ("", "", entry)
        labels.append(label or None)
        paths.append(Path(path))
    published_as = {}
    for entry in args.published_as:
        arm, sep, method = entry.partition("=")
        if not sep or method not in PUBLISHED["arms"]:
            parser.error(f"--published-as {entry!r}: expected ARM=METHOD with METHOD one of {', '.join(PUBLISHED['arms'])}")
        published_as[arm] = method
    try:
        check_out(args.out)
        reports = [read_report(p, comparison=k > 0) for k, p in enumerate((args.base, *paths))]
        named = {arm for report in reports[1:] for arm in report["arms"]}
        if unknown := sorted(set(published_as) - named):
            raise CalibrationError(f"--published-as names {', '.join(map(repr, unknown))}, not an arm of --arms "
                                   f"(arms: {', '.join(sorted(named))})")
        table = calibration(reports[0], args.base_arm, reports[1:], args.base, labels, published_as)
    except (OSError, CalibrationError) as err:
        print(f"calibration: {err}", file=sys.stderr)
        return 2
    except (KeyError, TypeError) as err:  # an entry of a report not shaped as compare.json writes it
        print(f"calibration: a report entry is malformed ({type(err).__name__}: {err}); nothing was written", file=sys.stderr)
        return 2
    atomic_write_json(args.out, table)
    print(f"calibration: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
