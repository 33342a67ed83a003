"""The concepts stage: noun-phrase concepts of every training caption, with spaCy.

    python -m components.concepts [--params params/concepts.yaml]

Reads the captions manifest (never the image tars) and writes, per manifest shard,
``<output_dir>/<split>/shard-NNNNNN.parquet`` with ``key`` and ``phrases`` (a list of strings), plus a
stats JSON (DVC metrics): phrases per caption, captions with none, empty and truncated captions,
throughput, and — where the manifest knows the true object phrases (ShapesWorld) — phrase recall and
precision on the quality fields.

Speed comes from ``nlp.pipe`` with the components noun chunks don't need never loaded, batches and
worker processes. One stream runs over all unfinished shards, and each shard's file appears atomically
as soon as its last caption is parsed, so a re-run after a kill redoes only unfinished shards. The shard
list comes from the manifest, never from the process count, so any ``n_process`` gives the same files.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from components.data.phrase_quality import fallback_phrases, filter_phrases, gold_quality, normalise, phrase_key, phrase_quality  # noqa: F401  (tests, bench)
from components.shared.atomic import CorruptFileError, atomic_write_json, atomic_write_parquet, check_entry_name, fingerprint, read_parquet, resume_or_restart
from components.shared.params import ConceptsParams, ParamsError, PhraseRules, load_params
from components.shared.processes import stage_process_setup
from components.shared.progress import TimedBar, working
from components.shared.redact import one_line
from components.shared.stage_code import stage_code
from components.shared.written import ForeignFilesError, recording_outputs


class ConceptsError(ValueError):
    """Input the stage cannot use at all: names the file, the column or key, and the reason."""


# --------------------------------------------------------------------------------------------------
# phrase rules (pure functions of a parsed Doc)
# --------------------------------------------------------------------------------------------------


NOUN_TAGS = frozenset({"NN", "NNS", "NNP", "NNPS"})


def split_merged(chunk) -> list[tuple[int, int]]:
    """(start, end) token spans of the phrases inside one noun chunk that spaCy merged from a list: cut at
    'and' / 'or' / ',' right after a noun ("cheese and marinara sauce"; never "black and white", where an
    adjective comes before); the cut word is dropped."""
    doc, spans, start = chunk.doc, [], chunk.start
    for k in range(chunk.start + 1, chunk.end - 1):
        if doc[k].lower_ in ("and", "or", ",") and doc[k - 1].tag_ in NOUN_TAGS and k > start:
            spans.append((start, k))
            start = k + 1
    spans.append((start, chunk.end))
    return spans


KIND_HEADS = frozenset({"kind", "kinds", "sort", "sorts", "type", "types"})


def phrases_from_doc(doc, rules: PhraseRules) -> tuple[list[str], int]:
    """Concept phrases of a parsed caption, in order; also how many phrases were cut to max_words."""
    of_heads = {h.lower() for h in rules.of_heads}

    def candidates():
        for chunk in doc.noun_chunks:
            spans = split_merged(chunk) if rules.split_merged_chunks else [(chunk.start, chunk.end)]
            for start, end in spans:
                span = doc[start:end]
                head = span[-1] if rules.split_merged_chunks else chunk.root
                if rules.drop_pronouns and all(t.pos_ == "PRON" for t in span):
                    continue
                if any(t.lower_ == "no" and t.tag_ == "DT" for t in span):
                    continue  # "with no shoes": a thing the picture does not show
                following = doc[end] if end < len(doc) else None
                if head.lower_ in of_heads and following is not None and (following.lower_ == "of" or following.tag_ in NOUN_TAGS):
                    continue  # "a group of kids", "in front of a car": the object that follows is the concept
                if head.lower_ in KIND_HEADS and start > 0 and doc[start - 1].lower_ == "of":
                    continue  # "a tool of some kind": the head before "of" is the concept
                words = span.text.split()  # also normalises whitespace (newlines, tabs, doubled spaces)
                if not words:
                    continue
                if span[0].is_sent_start and span[0].pos_ == "DET":
                    words[0] = words[0].lower()  # "A red circle is ..." gives "a red circle"; names keep their case
                yield words, head.lower_

    return filter_phrases(candidates(), rules)


def prepare_caption(text: str | None, max_chars: int) -> tuple[str, bool]:
    """The text given to spaCy and whether it was cut (at the last space before max_chars)."""
    if not text:
        return "", False
    if len(text) <= max_chars:
        return text, False
    cut = text.rfind(" ", 0, max_chars)
    return text[: cut if cut > max_chars // 2 else max_chars], True


def load_nlp(params: ConceptsParams):
    """The extractor: the spaCy pipeline named in params, without the components noun chunks don't need; or, with
    ``extractor: llm``, the language model (:mod:`components.data.llm_phrases`)."""
    if params.extractor == "llm":
        from components.data.llm_phrases import LlmPhraseExtractor

        try:
            return LlmPhraseExtractor(params.llm)
        except (OSError, ValueError, ImportError, KeyError, TypeError, RuntimeError) as err:
            raise ConceptsError(f"llm.model {params.llm.model!r} cannot be loaded: {one_line(err)}") from None
    import spacy

    try:
        nlp = spacy.load(params.spacy_model, exclude=params.exclude)
    except OSError as err:
        raise ConceptsError(
            f"spacy_model {params.spacy_model!r} cannot be loaded ({err}); install it "
            f"(e.g. `python -m spacy download en_core_web_sm`) and name it in params/concepts.yaml"
        ) from None
    if "parser" not in nlp.pipe_names:
        raise ConceptsError(f"spacy_model {params.spacy_model!r}: noun chunks need a 'parser' component; it has {nlp.pipe_names}")
    nlp.max_length = max(nlp.max_length, params.max_chars + 1)
    return nlp


def extract(nlp, captions: Iterable[str | None], params: ConceptsParams, n_process: int = 1) -> Iterator[dict[str, Any]]:
    """Phrases of each caption, in order: ``{"phrases", "empty", "truncated", "cut", "fallback"}``."""
    if params.extractor == "llm":  # nlp is the language model; it batches on its own (n_process does not apply)
        yield from nlp.extract(captions, params, prepare_caption)
        return
    rules = params.rules

    def prepared() -> Iterator[tuple[str, tuple[bool, bool, str]]]:
        for caption in captions:
            text, truncated = prepare_caption(caption, params.max_chars)
            yield text, (not text.strip(), truncated, text)

    for doc, (empty, truncated, text) in nlp.pipe(prepared(), as_tuples=True, batch_size=params.batch_size, n_process=n_process):
        phrases, cut = ([], 0) if empty else phrases_from_doc(doc, rules)
        fallback = not phrases and not empty and rules.fallback_to_caption
        if fallback:
            phrases = fallback_phrases(text, rules)
            fallback = bool(phrases)  # a caption that is itself a stop phrase gives none
        yield {"phrases": phrases, "empty": empty, "truncated": truncated, "cut": cut, "fallback": fallback}


# --------------------------------------------------------------------------------------------------
# the stage
# --------------------------------------------------------------------------------------------------


def join_recaptions(table: pa.Table, params: ConceptsParams) -> pa.Table:
    """The captions manifest with the recaption stage's ``caption_field`` joined on by key (manifest order kept)."""
    path = params.recaptions
    if not path.is_file():
        raise ConceptsError(f"{params.manifest}: column {params.caption_field!r} not found; the manifest has {table.column_names}, "
                            f"and recaptions: {path} does not exist (for a recaption field, run the recaption stage first: "
                            "dvc repro recaption)")
    recaptions = read_parquet(path)
    if params.caption_field not in recaptions.column_names:
        return table  # read_manifest names the missing column
    by_key = dict(zip(recaptions["key"].to_pylist(), recaptions[params.caption_field].to_pylist(), strict=True))
    return table.append_column(params.caption_field, pa.array([by_key.get(k) for k in table["key"].to_pylist()], pa.string()))


def read_manifest(params: ConceptsParams) -> pa.Table:
    """The manifest rows of the wanted splits; a missing file or column, or a non-string caption, is an error."""
    path = params.manifest
    if not path.is_file():
        raise ConceptsError(f"manifest: {path} does not exist (run the captions stage first: dvc repro captions)")
    table = read_parquet(path)
    if params.caption_field not in table.column_names and params.recaptions is not None:
        table = join_recaptions(table, params)
    names = table.column_names
    for column in ("key", "split", "shard", params.caption_field):
        if column not in names:
            raise ConceptsError(f"{path}: column {column!r} not found; the manifest has {names}")
    table = table.filter(pc.is_in(table["split"], value_set=pa.array(params.splits)))
    check_shard_names(path, table)
    captions = table[params.caption_field]
    if not (pa.types.is_string(captions.type) or pa.types.is_large_string(captions.type)):
        for key, value in zip(table["key"].to_pylist(), captions.to_pylist(), strict=True):
            if value is not None and not isinstance(value, str):
                raise ConceptsError(f"{path}: caption {params.caption_field!r} of key {key!r} is a {type(value).__name__}, not a string")
    return table


def check_shard_names(path: Path, table: pa.Table) -> None:
    """Each shard names an output file: <split>/<name>, nothing else."""
    for shard in pc.unique(table["shard"]).to_pylist():
        parts = Path(str(shard)).parts
        try:
            [check_entry_name(part, f"{path}: shard") for part in parts]
        except ValueError as err:
            raise ConceptsError(str(err)) from None
        if len(parts) != 2:
            raise ConceptsError(f"{path}: shard {shard!r} is not <split>/<file name>")


def output_path(params: ConceptsParams, shard: str) -> Path:
    """``train/shard-000003.tar`` → ``<output_dir>/train/shard-000003.parquet``."""
    return params.output_dir / Path(shard).with_suffix(".parquet")


def caption_names(manifest: pa.Table, field: str) -> list[str]:
    """``field`` and every other caption column of ``manifest`` that holds the same text in every row (``txt`` is
    the captions stage's chosen field written again: ``long`` in the default world): the names a run may train on
    with these phrases."""
    text = manifest[field]
    return [field, *(name for name in manifest.column_names
                     if name not in (field, "key", "split", "shard") and manifest[name].type == text.type and manifest[name].equals(text))]


def write_shard(params: ConceptsParams, shard: str, keys: list[str], results: list[dict[str, Any]], parsed_from: list[str]) -> None:
    """One shard's phrases as Parquet (key, phrases), with its counts and the caption fields it was parsed from
    (``parsed_from``, :func:`caption_names`) in the file's metadata — never timings: the file is a function of its
    inputs, so a rebuild is byte-identical and DVC does not see the train stage's input change."""
    counts = {
        "empty": sum(r["empty"] for r in results),
        "truncated": sum(r["truncated"] for r in results),
        "phrases_cut": sum(r["cut"] for r in results),
        "fallback": sum(r["fallback"] for r in results),
    }
    table = pa.table({"key": pa.array(keys, pa.string()), "phrases": pa.array([r["phrases"] for r in results], pa.list_(pa.string()))})
    # per-shard counts travel in the file's own metadata, so stats survive a resumed run
    # the caption fields, so a run that trains on another caption is stopped instead of learning these phrases
    # (the train stage reads them with components.data.stream.phrases_parsed_from)
    table = table.replace_schema_metadata({"c2lip_counts": json.dumps(counts), "c2lip_caption_fields": json.dumps(parsed_from)})
    atomic_write_parquet(output_path(params, shard), table)


def prepare_output(params: ConceptsParams) -> None:
    """Keep finished shards made by the same params, code and captions; start afresh otherwise."""
    shaping = params.model_dump(mode="json", exclude={"n_process", "batch_size", "stats_path", "quality_fields", "quality_samples"})
    if shaping.get("llm"):  # where and how fast the model runs does not change its phrases
        shaping["llm"].pop("device")
        shaping["llm"].pop("batch_size")
    shaping["manifest_sha"] = fingerprint(None, [params.manifest])  # new captions make old phrases stale
    if params.recaptions is not None and params.caption_field not in pq.read_schema(params.manifest).names:
        shaping["recaptions_sha"] = fingerprint(None, [params.recaptions])  # the captions parsed are the recaptions
    resume_or_restart(params.output_dir, fingerprint(shaping, stage_code("components.concepts")), "concepts")


@dataclass
class ConceptsPlan:
    """The manifest's rows grouped by shard (in Arrow: the captions never become a Python list of the whole
    manifest), and the shards still to parse."""

    manifest: pa.Table
    grouped: pa.Table  # key, shard and the caption columns, each shard's rows together and in the manifest's order
    shards: dict[str, tuple[int, int]]  # shard -> (its first row in ``grouped``, its rows), in manifest order
    todo: list[str]
    parsed_from: list[str]  # the caption fields the phrases come from (caption_names)

    def size(self, shard: str) -> int:
        return self.shards[shard][1]

    def keys(self, shard: str) -> list[str]:
        return self.grouped["key"].slice(*self.shards[shard]).to_pylist()

    def texts(self, shard: str, field: str) -> list[str | None]:
        return self.grouped[field].slice(*self.shards[shard]).to_pylist()


def plan(params: ConceptsParams, nlp=None) -> ConceptsPlan:
    """Read the manifest, keep finished shards made by the same params and code (else start afresh), and
    list the shards to parse. Used by :func:`run` and by the sharded flow (flows/sharded.py).

    Everything is checked before any output is touched: the manifest, and the spaCy model (loaded here
    unless the caller passes it), so a misspelt model name removes no finished shard."""
    manifest = read_manifest(params)
    if nlp is None:
        load_nlp(params)
    prepare_output(params)
    work = group_by_shard(params, manifest, ["key", "shard", params.caption_field], manifest)
    work.parsed_from = caption_names(manifest, params.caption_field)
    return work


def group_by_shard(params: ConceptsParams, manifest: pa.Table, columns: list[str], source: pa.Table) -> ConceptsPlan:
    """The plan of ``manifest``'s rows grouped by shard (``columns`` of ``source`` kept), the shards still to parse."""
    column = manifest["shard"]
    # Arrow's sort is stable: each shard's rows stay in manifest order; UTF-8 byte order is str order, so the
    # sorted names give each shard's first row
    grouped = source.select(columns).take(pc.sort_indices(column))
    counts = {v["values"]: v["counts"] for v in pc.value_counts(column).to_pylist()}
    first, starts = 0, {}
    for name in sorted(counts):
        starts[name], first = first, first + counts[name]
    shards = {name: (starts[name], counts[name]) for name in pc.unique(column).to_pylist()}
    todo = [s for s in shards if not output_path(params, s).is_file()]
    return ConceptsPlan(manifest, grouped, shards, todo, [])


def extract_shard(nlp, params: ConceptsParams, shard: str, keys: list[str], texts: list[str | None], parsed_from: list[str]) -> int:
    """Parse one shard's captions in this process and write its output; returns the captions parsed."""
    results = list(extract(nlp, texts, params, n_process=1))
    write_shard(params, shard, keys, results, parsed_from)
    return len(keys)


def complete(params: ConceptsParams, work: ConceptsPlan, nlp, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The stats over every shard (:func:`summarise`) and ``extra``, written to ``stats_path``; returns them."""
    stats = summarise(params, list(work.shards), nlp if params.quality_samples else None, work.manifest)
    stats.update(extra or {})
    atomic_write_json(params.stats_path, stats)
    return stats



def run(params: ConceptsParams) -> dict[str, Any]:
    """The stage, recording what it writes (components.shared.written): its own folder, which holds nothing else, and
    the stats beside other stages' in metrics/."""
    with recording_outputs("concepts", folders=[params.stats_path.parent], own=[params.output_dir]):
        return _run(params)


def _run(params: ConceptsParams) -> dict[str, Any]:
    """Parse every unfinished shard (spaCy's worker processes over the whole stream), then write the stats.
    Returns the stats."""
    with working("concepts: loading the noun-phrase extractor"):
        nlp = load_nlp(params)
    with working("concepts: reading the captions and planning the shards"):
        work = plan(params, nlp)
    shards, todo = work.shards, work.todo
    if len(todo) < len(shards):
        print(f"concepts: {len(shards) - len(todo)} of {len(shards)} shards already finished", file=sys.stderr)

    n_process = params.n_process or os.cpu_count() or 1
    captions = (text for s in todo for text in work.texts(s, params.caption_field))
    total = sum(work.size(s) for s in todo)
    started = time.perf_counter()
    bar = TimedBar(total=total, desc="concepts", unit="caption", file=sys.stderr, smoothing=0.1)
    results = extract(nlp, captions, params, n_process=n_process if total > params.batch_size else 1)
    for shard in todo:
        shard_results = [next(results) for _ in range(work.size(shard))]
        write_shard(params, shard, work.keys(shard), shard_results, work.parsed_from)
        bar.update(work.size(shard))
    if next(results, None) is not None:  # runs the stream to its end, which also stops spaCy's workers
        raise RuntimeError("spaCy returned more results than captions were sent")
    bar.close()
    run_seconds = time.perf_counter() - started

    return complete(params, work, nlp, {"run_captions": total,
                                        "run_captions_per_second": round(total / run_seconds, 1) if total and run_seconds > 0 else None})


def summarise(params: ConceptsParams, shards: list[str], nlp, manifest: pa.Table) -> dict[str, Any]:
    """Stats over every shard's output (finished in this run or an earlier one), plus phrase quality."""
    counts = {"empty": 0, "truncated": 0, "phrases_cut": 0, "fallback": 0}
    per_caption: list[int] = []
    known = manifest.filter(pc.invert(pc.is_null(manifest["object_phrases"]))) if "object_phrases" in manifest.column_names else None
    sample = known.slice(0, params.quality_samples) if known is not None and nlp is not None else None
    wanted = set(sample["key"].to_pylist()) if sample is not None else set()
    parsed: dict[str, list[str]] = {}  # the quality sample's phrases of caption_field, already in the outputs
    for shard in shards:
        table = read_parquet(output_path(params, shard))
        for k, v in json.loads(table.schema.metadata[b"c2lip_counts"]).items():
            counts[k] += v
        per_caption.extend(pc.list_value_length(table["phrases"]).to_pylist())
        if wanted:
            parsed.update((r["key"], r["phrases"]) for r in table.to_pylist() if r["key"] in wanted)
    n = np.array(per_caption) if per_caption else np.zeros(0)
    stats: dict[str, Any] = {
        "captions": len(per_caption),
        "caption_field": params.caption_field,
        "extractor": params.extractor,
        "spacy_model": params.spacy_model if params.extractor == "spacy" else None,
        "llm_model": params.llm.model if params.extractor == "llm" else None,
        "phrases_per_caption": {
            "mean": round(float(n.mean()), 3) if n.size else 0.0,
            "p50": float(np.percentile(n, 50)) if n.size else 0.0,
            "p95": float(np.percentile(n, 95)) if n.size else 0.0,
            "max": int(n.max()) if n.size else 0,
        },
        "captions_without_phrases": int((n == 0).sum()) + counts["fallback"],
        "captions_empty": counts["empty"],
        "captions_truncated": counts["truncated"],
        "captions_fallback_to_caption": counts["fallback"],
        "phrases_cut_to_max_words": counts["phrases_cut"],
    }
    if sample is not None:
        quality = {}
        for field in params.quality_fields:
            if field in sample.column_names and sample.num_rows:
                if field == params.caption_field:  # parsed once already: read, don't parse again
                    extracted = [parsed[k] for k in sample["key"].to_pylist()]
                else:
                    extracted = [r["phrases"] for r in extract(nlp, sample[field].to_pylist(), params)]
                quality[field] = phrase_quality(extracted, sample["object_phrases"].to_pylist())
        stats["quality"] = quality
    return stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", default=None, help="params YAML (default: params/concepts.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one value of the params file, a dotted key and a YAML value (table.path=data/sources/x.csv); repeatable")
    args = parser.parse_args(argv)
    stage_process_setup()  # its workers die with it; inside a flow run, it dies with the run
    try:
        params = load_params("concepts", args.params, args.overrides)
        stats = run(params)
    except (ParamsError, ConceptsError, CorruptFileError, ForeignFilesError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps({k: stats[k] for k in ("captions", "phrases_per_caption", "run_captions_per_second")} | {"quality": stats.get("quality")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
