"""The recaption stage: a new caption for every training sample, from a captioner, next to the shards.

    python -m components.recaption [--params params/recaption.yaml]
    torchrun --nproc_per_node 8 -m components.recaption --params ...   (one process per GPU: shards dealt out)

Replacing alt-text with a strong captioner's captions is what moves compositionality most in arXiv 2412.15396
(C2LIP trains on DreamLIP's recaptions for the same reason). The captioners are in
:mod:`components.data.captioners`: ``shapesworld`` (the scene's dense description, the default) or
``transformers`` (any Hugging Face image-to-text model).

Outputs under ``output_dir`` — the captions stage's shards are never rewritten:
  <split>/<shard>.parquet   key, <field> (the new caption), status ("ok" or why it failed: the source caption is kept)
  <split>/<shard>.done.json that shard's sample and failure counts (written last: the shard is finished)
  manifest.parquet          key, split, <field>, status — what the concepts stage joins onto the captions manifest
plus the stats JSON (DVC metrics: failures by reason, this run's samples/s, words per caption, vocabulary, old vs
new) and a contact sheet of images with their old and new captions. A killed run resumes at the first unfinished shard; a change of
the params that shape the output, of the stage's code or of the captions manifest starts afresh.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from components.data.captioners import CaptionInput, Failure, make_captioner
from components.shared.atomic import (
    CorruptFileError,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_parquet,
    check_entry_name,
    fingerprint,
    read_parquet,
    resume_or_restart,
)
from components.shared.params import ParamsError, RecaptionParams, load_params
from components.shared.processes import stage_process_setup
from components.shared.progress import TimedBar
from components.shared.redact import one_line, redact
from components.shared.reports import figure_png, pyplot
from components.shared.stage_code import stage_code
from components.shared.written import ForeignFilesError, recording_outputs

FAILURE_EXAMPLES = 3  # per reason, kept in the stats
SHAPESWORLD_BATCH = 1000  # the oracle needs no model: large batches, one per shard at the default size


class RecaptionError(Exception):
    """Bad input (manifest, shards, model): the message names the file, key or setting."""


def read_manifest(params: RecaptionParams) -> dict[str, dict[str, str]]:
    """shard (relative to the manifest's folder) -> {key: source caption}, for the wanted splits, in manifest order."""
    path = params.manifest
    if not path.is_file():
        raise RecaptionError(f"manifest: {path} does not exist (run the captions stage first: dvc repro captions)")
    table = read_parquet(path)
    for column in ("key", "split", "shard", params.source_field):
        if column not in table.column_names:
            raise RecaptionError(f"{path}: column {column!r} not found (source_field?); the manifest has {table.column_names}")
    rows = table.select(["key", "split", "shard", params.source_field]).to_pydict()
    missing = set(params.splits) - set(rows["split"])
    if missing:
        raise RecaptionError(f"{path}: no rows of split(s) {sorted(missing)}; it has {sorted(set(rows['split']))}")
    shards: dict[str, dict[str, str]] = {}
    for key, split, shard, text in zip(rows["key"], rows["split"], rows["shard"], rows[params.source_field], strict=True):
        if split in params.splits:
            parts = Path(str(shard)).parts  # each names an output file: <split>/<name>, nothing else (as concepts checks)
            try:
                [check_entry_name(part, f"{path}: shard of key {key!r}") for part in parts]
            except ValueError as err:
                raise RecaptionError(str(err)) from None
            if len(parts) != 2:
                raise RecaptionError(f"{path}: shard {shard!r} of key {key!r} is not <split>/<file name>")
            shards.setdefault(shard, {})[key] = text or ""
    return shards


def part_paths(params: RecaptionParams, shard: str) -> tuple[Path, Path]:
    """(parquet, done-marker) of a shard: ``train/shard-000003.tar`` -> ``<output_dir>/train/shard-000003.*``."""
    stem = params.output_dir / Path(shard).with_suffix("")
    return stem.with_suffix(".parquet"), stem.with_suffix(".done.json")


def prepare_output(params: RecaptionParams) -> None:
    """Keep finished shards made by the same params, code and captions; start afresh otherwise."""
    shaping = params.model_dump(mode="json", exclude={"stats_path", "contact_sheet", "contact_sheet_images", "max_failure_rate"})
    if params.transformers is not None:  # where and how fast it runs does not change the captions' meaning
        shaping["transformers"].pop("device")
        shaping["transformers"].pop("batch_size")
    shaping["manifest_sha"] = fingerprint(None, [params.manifest])
    resume_or_restart(params.output_dir, fingerprint(shaping, stage_code("components.recaption")), "recaption")


def samples(tar: Path, wanted: dict[str, str], needs_images: bool):
    """The shard's samples as CaptionInputs, or Failures for the unreadable ones; keys must be the manifest's."""
    import webdataset as wds
    from PIL import Image

    if not tar.is_file():
        raise RecaptionError(f"{tar}: shard listed in the manifest does not exist")
    seen = 0
    for sample in wds.tariterators.tarfile_samples([{"url": str(tar)}]):
        key = sample["__key__"]
        if key not in wanted:
            raise RecaptionError(f"{tar}: sample {key!r} is not in the manifest (a stale manifest? re-run the captions stage)")
        seen += 1
        item = CaptionInput(key, wanted[key])
        try:
            item.meta = json.loads(sample["json"]) if "json" in sample else {}
            if needs_images:
                item.image = Image.open(io.BytesIO(sample["jpg"])).convert("RGB")
        except Exception as err:  # noqa: BLE001 - any unreadable sample is counted, named and skipped
            yield item, Failure("unreadable_sample", f"{key}: {str(err)[:200]}")
            continue
        yield item, None
    if seen != len(wanted):
        raise RecaptionError(f"{tar}: {len(wanted) - seen} of the manifest's {len(wanted)} samples are missing from the shard")


def load_captioner(params: RecaptionParams):
    """The captioner, loaded and checked; any failure to load is one RecaptionError naming the setting."""
    try:
        return make_captioner(params)
    except Exception as err:  # noqa: BLE001 - transformers, torch and the hub raise many types; each is a bad setting here
        model = params.transformers.model if params.transformers is not None else params.captioner
        raise RecaptionError(f"transformers.model {model!r} cannot be used as a captioner: {one_line(err)}") from None


def caption_batch(captioner, batch: list[CaptionInput]) -> list[str | Failure]:
    """The captioner on a batch; if the batch fails as a whole, each sample alone, so one bad input costs one caption.
    When every sample of a batch then fails alone with the same error, the error is the captioner's, not the
    data's (a missing chat template, an out-of-memory GPU): it is raised once, not counted per sample."""
    try:
        return captioner.caption(batch)
    except Exception as err:  # noqa: BLE001 - a model error is a counted failure, not a lost shard
        if len(batch) == 1:
            return [Failure(f"error:{type(err).__name__}", redact(f"{batch[0].key}: {str(err)[:200]}"))]
        results = [result for item in batch for result in caption_batch(captioner, [item])]
        details = {(r.reason, r.detail.split(": ", 1)[-1]) for r in results if isinstance(r, Failure)}
        if len(details) == 1 and all(isinstance(r, Failure) for r in results):
            raise RecaptionError(f"the captioner fails on every sample of a batch of {len(batch)} with the same error "
                                 f"({type(err).__name__}: {one_line(err)}): a setting or the model, not the data") from None
        return results


def check_failure_rate(params: RecaptionParams, samples: int, failures: Counter, examples: dict[str, list[str]]) -> None:
    """Stop the stage when more than ``max_failure_rate`` of a shard's samples kept their source caption: a
    captioner that fails everywhere must not leave the alt-text posing as recaptions for concepts and train."""
    failed = sum(failures.values())
    if samples and failed / samples > params.max_failure_rate:
        first = "; ".join(f"{reason} ({n}): {examples.get(reason, [''])[0]}" for reason, n in failures.most_common(3))
        raise RecaptionError(f"{failed} of {samples} samples failed to caption (over max_failure_rate "
                             f"{params.max_failure_rate:g}); first errors: {first}")


def recaption_shard(params: RecaptionParams, captioner, shard: str, wanted: dict[str, str]) -> dict[str, Any]:
    """Caption one shard and write its Parquet, then its done-marker; returns the marker's content. A shard whose
    failure rate is over the limit is not written (:func:`check_failure_rate`)."""
    size = params.transformers.batch_size if params.transformers is not None else SHAPESWORLD_BATCH
    keys, captions, status, examples = [], [], [], {}

    def record(item: CaptionInput, result: str | Failure) -> None:
        keys.append(item.key)
        if isinstance(result, Failure):
            captions.append(item.source_caption)
            status.append(result.reason)
            if len(examples.setdefault(result.reason, [])) < FAILURE_EXAMPLES:
                examples[result.reason].append(redact(result.detail))  # the stats are a git-tracked metric
        else:
            captions.append(result)
            status.append("ok")

    batch: list[CaptionInput] = []

    def flush() -> None:
        for item, result in zip(batch, caption_batch(captioner, batch), strict=True):
            record(item, result)
        batch.clear()

    for item, failure in samples(params.manifest.parent / shard, wanted, captioner.needs_images):
        if failure is not None:
            record(item, failure)
            continue
        batch.append(item)
        if len(batch) == size:
            flush()
    if batch:
        flush()
    check_failure_rate(params, len(keys), Counter(s for s in status if s != "ok"), examples)
    parquet, marker = part_paths(params, shard)
    atomic_write_parquet(parquet, pa.table({"key": keys, params.field: captions, "status": status}))
    # counts only, never timings: the files are functions of their inputs, so a rebuild is byte-identical and DVC
    # does not see the train stage's input change
    done = {"samples": len(keys), "failures": dict(Counter(s for s in status if s != "ok")), "failure_examples": examples}
    atomic_write_json(marker, done)
    return done


def distributed() -> tuple[int, int]:
    """(rank, world size): torchrun's, or (0, 1). Ranks take shards i ≡ rank (mod world)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo")
        return dist.get_rank(), world
    return 0, 1



def run(params: RecaptionParams) -> dict[str, Any] | None:
    """The stage, recording what it writes (components.shared.written): its own folder, which holds nothing else, and
    the stats beside other stages' in metrics/."""
    with recording_outputs("recaption", folders=[params.stats_path.parent], own=[params.output_dir]):
        return _run(params)


def _run(params: RecaptionParams) -> dict[str, Any] | None:
    """Caption every unfinished shard (this rank's share), then (rank 0) the manifest, stats and contact sheet."""
    started = time.perf_counter()
    shards = read_manifest(params)
    # loaded (or refused) before any output is touched: a misspelt model must not cost the finished shards
    captioner = load_captioner(params)
    rank, world = distributed()
    if rank == 0:
        prepare_output(params)
    if world > 1:
        import torch.distributed as dist

        dist.barrier()  # nobody writes before rank 0 has kept or cleared the old output
    mine = [s for i, s in enumerate(shards) if i % world == rank]
    todo = [s for s in mine if not part_paths(params, s)[1].is_file()]
    if len(todo) < len(mine):
        print(f"recaption: {len(mine) - len(todo)} of {len(mine)} shards already finished", file=sys.stderr)
    captioned, seconds = 0, 0.0
    if todo:
        bar = TimedBar(total=sum(len(shards[s]) for s in todo), desc=f"recaption ({params.captioner})", unit="sample", file=sys.stderr)
        began = time.perf_counter()
        for shard in todo:
            done = recaption_shard(params, captioner, shard, shards[shard])
            captioned += done["samples"]
            bar.update(done["samples"])
        seconds = time.perf_counter() - began
        bar.close()
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
    if rank != 0:
        return None
    stats = finish(params, shards)
    # this run's work (rank 0's share under torchrun): finished shards of an earlier run are not timed again
    stats.update(run_samples=captioned, run_samples_per_second=round(captioned / seconds, 1) if seconds else None,
                 run_seconds=round(time.perf_counter() - started, 3))
    atomic_write_json(params.stats_path, stats)
    if params.contact_sheet is not None and stats["samples"]:
        contact_sheet(params, shards)
    return stats


WORD = re.compile(r"[a-z0-9']+")


def text_figures(texts: list[str]) -> dict[str, Any]:
    """Words per caption (mean, median, p95), characters per caption (mean) and vocabulary (distinct lower-case words)."""
    words = [WORD.findall(t.lower()) for t in texts]
    counts = np.array([len(w) for w in words]) if words else np.zeros(0)
    return {
        "words_per_caption": {"mean": round(float(counts.mean()), 2) if counts.size else 0.0,
                              "median": float(np.median(counts)) if counts.size else 0.0,
                              "p95": float(np.percentile(counts, 95)) if counts.size else 0.0},
        "chars_per_caption": round(float(np.mean([len(t) for t in texts])), 1) if texts else 0.0,
        "vocabulary": len({w for ws in words for w in ws}),
    }


def finish(params: RecaptionParams, shards: dict[str, dict[str, str]]) -> dict[str, Any]:
    """Join the shards' Parquet files into the manifest and add up their stats."""
    tables, failures, examples, by_split = [], Counter(), {}, Counter()
    for shard in shards:
        parquet, marker = part_paths(params, shard)
        done = json.loads(marker.read_text())
        table = read_parquet(parquet)
        split = Path(shard).parts[0]
        tables.append(table.append_column("split", pa.array([split] * table.num_rows, pa.string())))
        by_split[split] += table.num_rows
        failures.update(done["failures"])
        for reason, ex in done["failure_examples"].items():
            examples.setdefault(reason, []).extend(ex[: FAILURE_EXAMPLES - len(examples.get(reason, []))])
    manifest = pa.concat_tables(tables) if tables else pa.table({"key": [], params.field: [], "status": [], "split": []},
                                                                   schema=pa.schema([(c, pa.string()) for c in ("key", params.field, "status", "split")]))
    manifest = manifest.select(["key", "split", params.field, "status"])
    atomic_write_parquet(params.output_dir / "manifest.parquet", manifest)
    total = manifest.num_rows
    old = [t for shard in shards.values() for t in shard.values()]
    return {
        "captioner": params.captioner,
        "model": params.transformers.model if params.transformers is not None else None,
        "field": params.field,
        "source_field": params.source_field,
        "samples": total,
        "samples_by_split": dict(by_split),
        "failures": dict(sorted(failures.items())),
        "failures_total": sum(failures.values()),
        "failure_examples": examples,
        "source": text_figures(old),
        "recaption": text_figures(manifest[params.field].to_pylist()),
    }


def contact_sheet(params: RecaptionParams, shards: dict[str, dict[str, str]], columns: int = 4) -> None:
    """The first samples' images with their source caption and their new one."""
    import webdataset as wds
    from PIL import Image

    plt = pyplot()
    first = next(iter(shards))
    new = dict(zip(*read_parquet(part_paths(params, first)[0], columns=["key", params.field]).to_pydict().values(), strict=True))
    shown = []
    for sample in wds.tariterators.tarfile_samples([{"url": str(params.manifest.parent / first)}]):
        shown.append((sample["__key__"], sample["jpg"]))
        if len(shown) == params.contact_sheet_images:
            break
    rows = (len(shown) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(4.0 * columns, 5.0 * rows + 1.0), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, (key, jpg) in zip(axes.flat, shown, strict=False):
        try:
            ax.imshow(Image.open(io.BytesIO(jpg)).convert("RGB"), interpolation="nearest")
        except Exception:  # noqa: BLE001 - an unreadable image (counted in the stats) is shown as such
            ax.text(0.5, 0.5, "unreadable image", ha="center", transform=ax.transAxes)
        lines = [f"[{params.source_field}] {shards[first][key]}", f"[{params.field}] {new[key]}"]
        ax.set_title(key, fontsize=9)
        ax.text(0.0, -0.03, "\n".join(textwrap.fill(line, 46) for line in lines), transform=ax.transAxes, fontsize=7.5, va="top",
                family="monospace")
    name = params.transformers.model if params.transformers is not None else params.captioner
    fig.suptitle(f"recaption ({name}): {params.source_field} → {params.field}", fontsize=13)
    fig.subplots_adjust(left=0.02, right=0.98, top=0.95, bottom=0.08, wspace=0.15, hspace=0.9)
    atomic_write_bytes(params.contact_sheet, figure_png(fig, dpi=72))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", default=None, help="params YAML (default: params/recaption.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one value of the params file, a dotted key and a YAML value (table.path=data/sources/x.csv); repeatable")
    args = parser.parse_args(argv)
    stage_process_setup()
    try:
        params = load_params("recaption", args.params, args.overrides)
        stats = run(params)
    except (ParamsError, RecaptionError, CorruptFileError, ForeignFilesError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if stats is not None:
        print(json.dumps({k: stats[k] for k in ("samples", "failures", "run_samples_per_second", "run_seconds")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
