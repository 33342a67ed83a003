"""The captions stage: any source in; WebDataset shards, a Parquet manifest and stats out.

    python -m components.captions [--params params/captions.yaml]

Outputs under ``output_dir``:
  <split>/shard-NNNNNN.tar   jpg (the image), txt (the training caption), json (every caption field + metadata)
  manifest.parquet           key, split, shard, one column per caption field, txt (the training caption again:
                             what concepts and train read by default), object_phrases (the true ones,
                             ShapesWorld only) — later text-only stages read this, never the tars
  parts/                     per-shard manifest parts and done-markers (how a killed run resumes)
plus the stats JSON (DVC metrics) and, optionally, a contact-sheet PNG.

Every file appears atomically (written under a temporary name, then renamed), and a shard counts as
finished only once its done-marker exists, so a re-run after a kill keeps finished shards and rewrites
the rest. A change of the params that shape the data, or of the stage's code, starts afresh.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import multiprocessing as mp
import os
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from components.data.sources import RawSample, ShardPlan, Skip, SourceError, TableSource, WebDatasetSource, make_source
from components.shared.atomic import atomic_write_bytes, atomic_write_json, atomic_write_parquet, fingerprint, resume_or_restart
from components.shared.params import CaptionsParams, ParamsError, load_params
from components.shared.processes import stage_process_setup
from components.shared.progress import TimedBar, working
from components.shared.redact import redact
from components.shared.reports import figure_png, pyplot
from components.shared.stage_code import stage_code
from components.shared.written import ForeignFilesError, recording_outputs

SKIP_EXAMPLES = 3  # per reason, kept in the stats so a user can look at what was skipped


# --------------------------------------------------------------------------------------------------
# shards
# --------------------------------------------------------------------------------------------------


def source_signature(source) -> dict[str, Any]:
    """What the source's local files hold, for the fingerprint: an edited table or a replaced shard must start
    afresh, not resume with the old captions. A table is hashed whole (tables are small next to their images);
    tar shards, which can be terabytes, by path, size and modification time."""
    if isinstance(source, TableSource):
        digest = hashlib.sha256()
        with open(source.cfg.path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
        return {"table_sha256": digest.hexdigest(), "local_images": local_images_signature(source)}
    if isinstance(source, WebDatasetSource):
        return {"shards": [[path, (st := os.stat(path)).st_size, st.st_mtime_ns] for path in source.paths]}
    return {}


def local_images_signature(source: TableSource) -> str:
    """The table's local image files by name, size and modification time: an image replaced under the same name (the
    table unchanged) starts afresh too. URLs are the download's business; a missing file is the row's skip."""
    digest = hashlib.sha256()
    root = Path(source.root)
    for row in source.rows():
        location = row.get(source.cfg.image_column)
        if not isinstance(location, str) or not location.strip() or location.strip().startswith(("http://", "https://")):
            continue
        try:
            st = os.stat(root / location.strip())
        except (OSError, ValueError):
            continue
        digest.update(json.dumps([location.strip(), st.st_size, st.st_mtime_ns]).encode())
    return digest.hexdigest()


def prepare_output(params: CaptionsParams, source=None) -> None:
    """Keep finished shards made by the same params, code and source files; start afresh otherwise."""
    shaping = params.model_dump(mode="json", exclude={"workers", "stats_path", "contact_sheet"})
    shaping["source_files"] = source_signature(source)
    resume_or_restart(params.output_dir, fingerprint(shaping, stage_code("components.captions")), "captions")


def part_paths(out: Path, plan: ShardPlan) -> tuple[Path, Path, Path]:
    """(tar, manifest part, done-marker) of a shard."""
    stem = f"{plan.split}-{plan.index:06d}"
    return out / f"{plan.name}.tar", out / "parts" / f"{stem}.parquet", out / "parts" / f"{stem}.done.json"


def write_shard(params: CaptionsParams, plan: ShardPlan, samples: Iterable[RawSample | Skip]) -> dict[str, Any]:
    """Write one shard (tar, then manifest part, then done-marker) and return its stats."""
    import webdataset as wds

    tar_path, part_path, done_path = part_paths(params.output_dir, plan)
    tar_path.parent.mkdir(parents=True, exist_ok=True)
    waited = [0.0]  # seconds spent waiting on the source: a URL table's downloads
    fields = params.caption_fields()
    columns: dict[str, list] = {"key": [], "split": [], "shard": [], **{f: [] for f in manifest_fields(params)}, "object_phrases": []}
    skipped: Counter[str] = Counter()
    examples: dict[str, list[str]] = {}
    started = time.perf_counter()
    tmp = tar_path.with_name(tar_path.name + ".tmp")
    with open(tmp, "wb") as stream:
        # mtime fixed: the same samples give byte-identical tars, so DVC sees no spurious change
        writer = wds.TarWriter(stream, mtime=0)
        for position, sample in enumerate(_timed(samples, waited)):
            if isinstance(sample, Skip):
                skipped[sample.reason] += 1
                examples.setdefault(sample.reason, [])
                if len(examples[sample.reason]) < SKIP_EXAMPLES and sample.detail:
                    examples[sample.reason].append(redact(sample.detail)[:300])  # no credentials in the stats
                continue
            # keys are stable: the position in the shard's input, whether or not earlier rows were skipped
            key = f"{plan.split}-{plan.index:06d}-{position:06d}"
            meta = {"key": key, "split": plan.split, "captions": sample.captions, **sample.meta}
            writer.write({"__key__": key, "jpg": sample.jpg, "txt": sample.captions[params.caption_field], "json": meta})
            columns["key"].append(key)
            columns["split"].append(plan.split)
            columns["shard"].append(f"{plan.name}.tar")
            for f in fields:
                columns[f].append(sample.captions.get(f, ""))
            if "txt" not in fields:  # the sample's txt, as the shard holds it: what the later stages read by default
                columns["txt"].append(sample.captions[params.caption_field])
            # the true object phrases where the source knows them (ShapesWorld): concept-quality figures
            columns["object_phrases"].append(sample.meta.get("object_phrases"))
        writer.close()
        stream.flush()
        os.fsync(stream.fileno())
    os.replace(tmp, tar_path)
    atomic_write_parquet(part_path, manifest_table(columns))
    stats = {
        "split": plan.split,
        "written": len(columns["key"]),
        "skipped": dict(skipped),
        "skip_examples": examples,
        "seconds": round(time.perf_counter() - started, 3),
        "source_seconds": round(waited[0], 3),
    }
    atomic_write_json(done_path, stats)
    return stats


def _timed(samples: Iterable, waited: list[float]):
    """``samples``, adding the time spent waiting for each to ``waited[0]``."""
    iterator = iter(samples)
    while True:
        start = time.perf_counter()
        sample = next(iterator, _END)
        waited[0] += time.perf_counter() - start
        if sample is _END:
            return
        yield sample


_END = object()


def manifest_fields(params: CaptionsParams) -> list[str]:
    """The manifest's caption columns: every caption field of the source, and ``txt`` — the caption each shard writes as
    its sample's txt (``caption_field``) — so that the concepts and train stages, which read ``txt`` by default, follow
    this stage's one ``caption_field``."""
    fields = params.caption_fields()
    return fields if "txt" in fields else [*fields, "txt"]


def manifest_table(columns: dict[str, list]) -> pa.Table:
    """The manifest's schema: strings, plus ``object_phrases`` as a list of strings (null if unknown)."""
    return pa.table({
        k: pa.array(v, pa.list_(pa.string()) if k == "object_phrases" else pa.string()) for k, v in columns.items()
    })


_WORKER_SOURCE = None


def _init_worker(params_json: str) -> None:
    global _WORKER_SOURCE
    _WORKER_SOURCE = make_source(CaptionsParams.model_validate_json(params_json))


def build_shard(source, plan: ShardPlan) -> dict[str, Any]:
    """One shard from its source (in this process, a pool worker or a Dask worker)."""
    return write_shard(source.params, plan, source.samples(plan))


def _build_in_worker(plan: ShardPlan) -> tuple[ShardPlan, dict[str, Any]]:
    return plan, build_shard(_WORKER_SOURCE, plan)


# --------------------------------------------------------------------------------------------------
# the stage
# --------------------------------------------------------------------------------------------------



def run(params: CaptionsParams) -> dict[str, Any]:
    """The stage, recording what it writes (components.shared.written): its own folder, which holds nothing else, and
    the stats beside other stages' in metrics/."""
    with recording_outputs("captions", folders=[params.stats_path.parent], own=[params.output_dir]):
        return _run(params)


def _run(params: CaptionsParams) -> dict[str, Any]:
    """Build every missing shard, then the manifest, the stats and the contact sheet. Returns the stats."""
    started = time.perf_counter()
    with working(f"captions: reading the source ({params.source}) and planning the shards"):
        source, plans, todo = plan(params)
    kept = len(plans) - len(todo)
    if kept:
        print(f"captions: {kept} of {len(plans)} shards already finished, building {len(todo)}", file=sys.stderr)

    workers = params.workers or os.cpu_count() or 1
    built = 0
    bar = TimedBar(total=len(todo), desc=f"captions ({params.source})", unit="shard", file=sys.stderr)
    if workers > 1 and len(todo) > 1:
        ctx = mp.get_context("fork")  # the stage imports no threads-holding library before forking
        with ctx.Pool(min(workers, len(todo)), initializer=_init_worker, initargs=(params.model_dump_json(),)) as pool:
            for _plan, stats in pool.imap_unordered(_build_in_worker, todo):
                built += stats["written"]
                bar.set_postfix(samples_written=built, refresh=False)  # shown by the update's redraw, not one shard late
                bar.update()
    else:
        for shard_plan in todo:
            built += build_shard(source, shard_plan)["written"]
            bar.set_postfix(samples_written=built, refresh=False)
            bar.update()
    bar.close()

    source.finish()  # what the source staged for the shards (a URL table's rows files), by the stage's record
    return complete(params, plans, source.summary(), time.perf_counter() - started, built)


def plan(params: CaptionsParams) -> tuple[Any, list[ShardPlan], list[ShardPlan]]:
    """(the source, every shard's plan, the plans not finished yet), after keeping finished shards made by
    the same params and code (else starting afresh). Used by :func:`run` and the sharded flow."""
    source = make_source(params)  # the source is opened, read through and checked before any output is touched
    plans = source.plan()
    prepare_output(params, source)
    todo = [p for p in plans if not part_paths(params.output_dir, p)[2].is_file()]
    source.prepare(todo)  # a URL table's rows, one small file per shard: any process can build any shard
    return source, plans, todo


def complete(params: CaptionsParams, plans: list[ShardPlan], source_summary: dict[str, Any], seconds: float | None = None,
             built: int = 0) -> dict[str, Any]:
    """The manifest and stats of finished shards (:func:`finish`), written with the contact sheet; returns the stats."""
    stats = finish(params, plans, source_summary)
    if seconds is not None:  # this run's wall time, and what it built in it (a resumed run builds fewer shards)
        stats["run_seconds"] = round(seconds, 3)
        stats["run_samples"] = built
        stats["run_samples_per_second"] = round(built / seconds, 1) if seconds > 0 else None
    atomic_write_json(params.stats_path, stats)
    if params.contact_sheet is not None and stats["samples_written"] > 0:
        contact_sheet(params, params.contact_sheet)
    return stats


def finish(params: CaptionsParams, plans: list[ShardPlan], extra: dict[str, Any]) -> dict[str, Any]:
    """Join the manifest parts in shard order and add up the per-shard stats."""
    out = params.output_dir
    tables, written, skipped, examples, build_seconds, source_seconds = [], Counter(), Counter(), {}, 0.0, 0.0
    for plan in plans:
        _, part, done = part_paths(out, plan)
        shard_stats = json.loads(done.read_text())
        tables.append(pq.read_table(part))
        written[plan.split] += shard_stats["written"]
        skipped.update(shard_stats["skipped"])
        for reason, ex in shard_stats["skip_examples"].items():
            examples.setdefault(reason, []).extend(ex[: SKIP_EXAMPLES - len(examples.get(reason, []))])
        build_seconds += shard_stats["seconds"]
        source_seconds += shard_stats.get("source_seconds", 0.0)
    if tables:
        manifest = pa.concat_tables(tables)
    else:
        manifest = manifest_table({f: [] for f in ["key", "split", "shard", *manifest_fields(params), "object_phrases"]})
    # row groups of about a shard: a reader of one shard's rows (a Dask worker of the concepts stage) skips the rest
    atomic_write_parquet(out / "manifest.parquet", manifest, row_group_size=max(1, params.shard_size))
    total = sum(written.values())
    return {
        "source": params.source,
        "caption_field": params.caption_field,
        "shards": len(plans),
        "samples_written": total,
        "samples_by_split": dict(written),
        "skipped": dict(sorted(skipped.items())),
        "skipped_total": sum(skipped.values()),
        "skip_examples": examples,
        # per shard, added over the shards (over processes, so more than the run's wall time when several ran at once)
        "build_seconds": round(build_seconds, 3),
        "source_seconds": round(source_seconds, 3),  # of which waiting on the source: a URL table's downloads
        "samples_per_second_per_process": round(total / build_seconds, 1) if build_seconds else None,
        **extra,
    }


def contact_sheet(params: CaptionsParams, path: Path, count: int = 12, columns: int = 4) -> None:
    """A grid of the first training samples, each with its short and long caption (read from the tars)."""
    plt = pyplot()
    import webdataset as wds
    from PIL import Image

    manifest = pq.read_table(params.output_dir / "manifest.parquet", columns=["split", "shard"]).to_pylist()
    train = [row["shard"] for row in manifest if row["split"] == "train"] or [row["shard"] for row in manifest]
    shards = list(dict.fromkeys(train))[:2]  # keeps shard order
    samples = []
    for sample in wds.WebDataset([str(params.output_dir / s) for s in shards], shardshuffle=False, empty_check=False):
        samples.append(sample)
        if len(samples) == count:
            break
    rows = (len(samples) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(4.0 * columns, 5.2 * rows + 1.2), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, sample in zip(axes.flat, samples, strict=False):
        meta = json.loads(sample["json"])
        ax.imshow(Image.open(io.BytesIO(sample["jpg"])), interpolation="nearest")
        caps = meta["captions"]
        lines = [f"[{name}] {text}" for name, text in caps.items() if name != params.caption_field]
        lines.insert(0, f"[{params.caption_field}] {caps[params.caption_field]}")
        text = "\n".join(textwrap.fill(line, 46) for line in lines)
        ax.set_title(meta["key"], fontsize=9)
        ax.text(0.0, -0.03, text, transform=ax.transAxes, fontsize=7.5, va="top", family="monospace")
    fig.suptitle(f"{params.source}: training samples with their caption fields", fontsize=13)
    fig.subplots_adjust(left=0.02, right=0.98, top=0.95, bottom=0.1, wspace=0.15, hspace=0.9)
    atomic_write_bytes(path, figure_png(fig, dpi=72))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", default=None, help="params YAML (default: params/captions.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one value of the params file, a dotted key and a YAML value (table.path=data/sources/x.csv); repeatable")
    args = parser.parse_args(argv)
    stage_process_setup()  # its workers die with it; inside a flow run, it dies with the run
    try:
        params = load_params("captions", args.params, args.overrides)
    except ParamsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        stats = run(params)
    except (SourceError, ForeignFilesError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    summary = {k: stats[k] for k in ("samples_written", "samples_by_split", "skipped", "run_seconds")}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
