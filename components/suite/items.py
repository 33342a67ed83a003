"""Per-item results: one table row per benchmark item (per query, for retrieval), every aggregate computed from
those rows, and paired bootstrap intervals over items for the difference between two models.

A task describes its rows once (:class:`Layout`: the item's id, image(s) and crop box, candidate texts and their
roles, held-out flag, ARO group, resampling unit); a model's pass adds the scores and each row's 0/1 outcome per
metric (:class:`ItemScores`). :func:`item_table` joins the two into an Arrow table whose schema metadata says how
to aggregate it, and :func:`aggregate` turns rows into the benchmark's figures — with a weight per row, so the
same code gives the figure (weights 1) and its bootstrap draws (weights = how often each item was drawn).
The aggregates therefore cannot disagree with the tables, and a reader of the Parquet files can recompute them.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from components.shared.atomic import atomic_write_parquet, read_parquet

METRIC_PREFIX = "metric."  # outcome columns: "metric.acc", "metric.itt", ... (0/1 per row, NaN where not this row's)
SPLITS = (("held_out", True), ("seen", False))


@dataclass
class Layout:
    """What each row of a task's table is, independent of any model. ``query``: "item" for the pairwise benchmarks,
    "image"/"text" for retrieval's two directions; ``unit``: the bootstrap resamples units (an item; a retrieval
    caption goes with its image); ``group``: ARO VG's relation or attribute pair (macro accuracy)."""

    item: list[str]
    images: list[list[Any]]  # ImageRef per row (Winoground: two)
    texts: list[list[str]]
    roles: list[list[str]]  # per row, what each text is: "caption", "negative_caption", ...
    held_out: list[bool]
    query: list[str] | None = None
    unit: list[int] | None = None
    group: list[str] | None = None
    aggregation: str = "mean"  # mean | macro (ARO VG) | retrieval
    counted: frozenset[str] | None = None  # macro: the groups the official figure counts
    _static: pa.Table | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.item)


@dataclass
class ItemScores:
    """One model's pass over a task: ``scores`` [rows, len(score_names)] (cosine similarities; zero-shot: logits),
    ``outcomes`` metric -> [rows] floats (1 right, 0 wrong, NaN not this row's metric), ``correct`` the headline
    outcome per row, ``predicted`` (zero-shot, retrieval) what the model ranked first."""

    score_names: list[str]
    scores: torch.Tensor
    outcomes: dict[str, torch.Tensor]
    correct: torch.Tensor
    predicted: list[str] | None = None


def _static_table(task_name: str, layout: Layout) -> pa.Table:
    """The model-independent columns, built once per task (the comparison scores many models on one suite)."""
    if layout._static is None:
        n = len(layout)
        layout._static = pa.table({
            "benchmark": pa.array([task_name] * n, pa.string()),
            "item": pa.array(layout.item, pa.string()),
            "query": pa.array(layout.query or ["item"] * n, pa.string()),
            "unit": pa.array(layout.unit if layout.unit is not None else range(n), pa.int64()),
            "images": pa.array([[str(ref.path) for ref in refs] for refs in layout.images], pa.list_(pa.string())),
            "boxes": pa.array([[list(ref.box) if ref.box is not None else None for ref in refs] for refs in layout.images],
                              pa.list_(pa.list_(pa.float64()))),
            "texts": pa.array(layout.texts, pa.list_(pa.string())),
            "roles": pa.array(layout.roles, pa.list_(pa.string())),
            "held_out": pa.array(layout.held_out, pa.bool_()),
            "group": pa.array(layout.group or [""] * n, pa.string()),
        })
    return layout._static


def item_table(task_name: str, headline: str, layout: Layout, result: ItemScores) -> pa.Table:
    """The task's rows for one model; the schema's metadata says how to aggregate them (see :func:`aggregate`)."""
    table = _static_table(task_name, layout)
    scores = result.scores.detach().float().cpu().numpy()
    if scores.shape[0] != len(layout):
        raise ValueError(f"{task_name}: {scores.shape[0]} score rows for {len(layout)} items")
    names = pa.array([result.score_names] * len(layout), pa.list_(pa.string()))
    table = table.append_column("score_names", names)
    table = table.append_column("scores", pa.FixedSizeListArray.from_arrays(pa.array(scores.reshape(-1), pa.float32()), scores.shape[1]))
    table = table.append_column("correct", pa.array(result.correct.cpu().numpy().astype(bool), pa.bool_()))
    if result.predicted is not None:
        table = table.append_column("predicted", pa.array(result.predicted, pa.string()))
    for metric, values in result.outcomes.items():
        table = table.append_column(METRIC_PREFIX + metric, pa.array(values.detach().double().cpu().numpy(), pa.float64()))
    meta = {"aggregation": layout.aggregation, "headline": headline, "metrics": list(result.outcomes),
            "counted": sorted(layout.counted) if layout.counted is not None else None}
    return table.replace_schema_metadata({b"c2lip": json.dumps(meta).encode()})


def table_meta(table: pa.Table) -> dict[str, Any]:
    raw = (table.schema.metadata or {}).get(b"c2lip")
    if raw is None:
        raise ValueError("not a per-item table written by the evaluate stage (no 'c2lip' schema metadata)")
    return json.loads(raw)


def table_path(folder: Path, task_name: str) -> Path:
    return folder / f"{task_name}.parquet"  # "sugarcrepe/swap_att" -> sugarcrepe/swap_att.parquet


def write_tables(folder: Path, tables: dict[str, pa.Table]) -> None:
    """One Parquet file per benchmark, each written atomically. Nothing else in ``folder`` is touched: the evaluate
    stage writes into a folder of its own build (:mod:`components.shared.owned_outputs`), its cache into a new one."""
    for name, table in tables.items():
        atomic_write_parquet(table_path(folder, name), table)


def table_problem(table: pa.Table, task_name: str, headline: str, layout: Layout) -> str | None:
    """None when ``table`` is a whole per-item table of this task as the suite now reads it: the evaluate stage's
    metadata with this headline, every row of the layout with the same items, images and texts, and every outcome
    column its metadata names; else what differs (a cached table of another suite, a damaged or edited file)."""
    try:
        meta = table_meta(table)
    except ValueError as err:
        return str(err)
    if meta.get("headline") != headline:
        return f"headline {meta.get('headline')!r}, the suite's is {headline!r}"
    static = _static_table(task_name, layout)
    if table.num_rows != static.num_rows:
        return f"{table.num_rows} rows, the suite has {static.num_rows}"
    needed = static.column_names + ["score_names", "scores", "correct"] + [METRIC_PREFIX + m for m in meta.get("metrics") or []]
    if missing := [c for c in needed if c not in table.column_names]:
        return f"no column {missing[0]!r}"
    for column in static.column_names:
        if table.column(column).to_pylist() != static.column(column).to_pylist():
            return f"column {column!r} differs from the suite's items"
    return None


def read_tables(folder: Path, names: list[str]) -> dict[str, pa.Table]:
    """The tables :func:`write_tables` wrote, by benchmark name (a damaged file is named)."""
    return {name: read_parquet(table_path(folder, name)) for name in names}


# --------------------------------------------------------------------------------------------------
# aggregates: the figures of a set of rows, each row weighted
# --------------------------------------------------------------------------------------------------


@dataclass
class Rows:
    """A table's columns as arrays, for fast weighted aggregation (optionally a subset of its rows)."""

    meta: dict[str, Any]
    outcomes: dict[str, np.ndarray]
    unit: np.ndarray
    group: np.ndarray
    held_out: np.ndarray

    @classmethod
    def of(cls, table: pa.Table) -> Rows:
        meta = table_meta(table)
        return cls(meta, {m: table.column(METRIC_PREFIX + m).to_numpy() for m in meta["metrics"]},
                   table.column("unit").to_numpy(), np.asarray(table.column("group").to_pylist()), table.column("held_out").to_numpy(zero_copy_only=False))

    def subset(self, mask: np.ndarray) -> Rows:
        return Rows(self.meta, {m: v[mask] for m, v in self.outcomes.items()}, self.unit[mask], self.group[mask], self.held_out[mask])

    @property
    def items(self) -> int:
        return int(len(np.unique(self.unit)))

    def splits(self) -> list[tuple[str, np.ndarray | None]]:
        """(prefix, row mask) of every part the report shows: all rows, then — when the task flags held-out items —
        the held-out and the seen rows (``held_out/``, ``seen/``); parts with no rows left out."""
        parts: list[tuple[str, np.ndarray | None]] = [("", None)]
        if self.held_out.any():
            parts += [(f"{label}/", self.held_out == flag) for label, flag in SPLITS if (self.held_out == flag).any()]
        return parts


def _weighted_mean(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Per draw (row of ``weights`` [B, rows]), the weighted mean of ``values`` over rows where it is defined."""
    defined = ~np.isnan(values)
    w = weights[:, defined]
    with np.errstate(invalid="ignore", divide="ignore"):
        return (w @ values[defined]) / w.sum(axis=1)


def aggregate(rows: Rows, weights: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The benchmark's figures from its rows: metric -> [B] (one per row of ``weights`` [B, rows]; None: the figure
    itself, B = 1). "mean": each metric's mean over the rows that have it (retrieval's two directions are two sets
    of rows; ``mean_r1`` is their R@1s' mean). "macro" (ARO VG-Relation/Attribution): each group's accuracy, then
    the mean over the counted groups (``macro_acc``, left out when none is present), over every group present
    (``macro_acc_all_groups``), the items' accuracy (``micro_acc``) and the number of counted groups (``groups``)."""
    w = np.ones((1, len(rows.unit))) if weights is None else weights
    meta = rows.meta
    if meta["aggregation"] == "macro":
        correct = rows.outcomes["micro_acc"]
        names = list(dict.fromkeys(rows.group.tolist()))
        per_group = np.stack([_weighted_mean(np.where(rows.group == g, correct, np.nan), w) for g in names], axis=1)  # [B, groups]
        present = ~np.isnan(per_group)
        counted = np.array([meta["counted"] is None or g in meta["counted"] for g in names])
        with np.errstate(invalid="ignore"):
            out = {"macro_acc_all_groups": np.nanmean(np.where(present, per_group, np.nan), axis=1),
                   "micro_acc": _weighted_mean(correct, w),
                   "groups": (present & counted).sum(axis=1).astype(float)}
            chosen = np.where(present & counted, per_group, np.nan)
            if (present & counted).any():
                out["macro_acc"] = np.nanmean(chosen, axis=1)
        return out
    out = {m: _weighted_mean(v, w) for m, v in rows.outcomes.items()}
    if meta["aggregation"] == "retrieval":
        out["mean_r1"] = (out["image_to_text_r1"] + out["text_to_image_r1"]) / 2
    return out


def results_of(table: pa.Table) -> dict[str, float]:
    """The figures the report shows for one task and model: every metric over all items, the item count, and (when
    the task flags held-out items) the same over the held-out and over the seen items, prefixed ``held_out/``, ``seen/``."""
    rows = Rows.of(table)
    out = {}
    for prefix, mask in rows.splits():
        part = rows if mask is None else rows.subset(mask)
        out.update({f"{prefix}{k}": float(v[0]) for k, v in aggregate(part).items()})
        out[f"{prefix}items"] = float(part.items)
    return out


# --------------------------------------------------------------------------------------------------
# paired bootstrap over items
# --------------------------------------------------------------------------------------------------


@dataclass
class Interval:
    """A difference (b − a) and its 95% paired-bootstrap interval; ``draws`` keeps every resample's difference, so
    group means and pooled seeds combine the same resamples."""

    delta: float
    low: float
    high: float
    draws: np.ndarray

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    @classmethod
    def of(cls, delta: float, draws: np.ndarray) -> Interval:
        kept = draws[~np.isnan(draws)]
        low, high = (np.percentile(kept, [2.5, 97.5]) if len(kept) else (np.nan, np.nan))
        return cls(float(delta), float(low), float(high), draws)

    def as_dict(self) -> dict[str, float]:
        return {"delta": round(self.delta, 6), "low": round(self.low, 6), "high": round(self.high, 6), "excludes_zero": self.excludes_zero}


def resample_weights(unit: np.ndarray, resamples: int, seed: int | list[int], chunk: int = 200) -> Iterator[np.ndarray]:
    """Row weights [b, rows] of ``resamples`` bootstrap draws of the units (items) with replacement, ``chunk`` draws
    at a time: each row weighs as often as its unit was drawn. Seeded: the same seed and units give the same draws."""
    ids, inverse = np.unique(unit, return_inverse=True)
    rng = np.random.default_rng(seed)
    n = len(ids)
    for start in range(0, resamples, chunk):
        counts = rng.multinomial(n, np.full(n, 1.0 / n), size=min(chunk, resamples - start))  # [b, units]
        yield counts[:, inverse].astype(np.float64)


def task_seed(seed: int, task_name: str, split: str = "") -> list[int]:
    """The draws of one task (and split) are fixed by the seed and its name, whichever other tasks are in the suite."""
    return [seed, zlib.crc32(f"{task_name}|{split}".encode())]


def paired_differences(a: pa.Table, b: pa.Table, resamples: int = 1000, seed: int = 0) -> dict[str, Interval]:
    """b − a for every figure of :func:`results_of` (counts excepted), each with its paired bootstrap interval: the same
    items are drawn for both models, so item difficulty cancels. The two tables must hold the same items in the same order."""
    if a.num_rows != b.num_rows or not a.column("item").equals(b.column("item")) or not a.column("query").equals(b.column("query")):
        raise ValueError(f"{a.column('benchmark')[0]}: the two models' per-item tables hold different items; a paired difference needs the same items")
    ra, rb = Rows.of(a), Rows.of(b)
    name = str(a.column("benchmark")[0])
    out: dict[str, Interval] = {}
    for prefix, mask in ra.splits():
        pa_, pb = (ra, rb) if mask is None else (ra.subset(mask), rb.subset(mask))
        fa, fb = aggregate(pa_), aggregate(pb)
        point = {k: fb[k][0] - v[0] for k, v in fa.items() if k in fb}
        draws: dict[str, list[np.ndarray]] = {k: [] for k in point}
        for w in resample_weights(pa_.unit, resamples, task_seed(seed, name, prefix)):
            da, db = aggregate(pa_, w), aggregate(pb, w)
            for k in point:
                draws[k].append(db[k] - da[k])
        for k, d in point.items():
            if k != "groups":
                out[f"{prefix}{k}"] = Interval.of(d, np.concatenate(draws[k]))
    return out


def mean_interval(intervals: list[Interval]) -> Interval:
    """The difference of a mean of figures (a summary group; the mean over seeds), its draws the mean of theirs."""
    return Interval.of(float(np.mean([i.delta for i in intervals])), np.mean(np.stack([i.draws for i in intervals]), axis=0))
