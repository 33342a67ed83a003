"""The captions and concepts stages sharded over a Dask cluster by Prefect task mapping.

    python -m flows.sharded --address tcp://scheduler:8786      # an existing cluster (or DASK_SCHEDULER)
    python -m flows.sharded --workers 8                         # a local cluster of 8 processes

Each shard is one Prefect task (the stage's own ``build_shard`` / per-shard extraction), mapped over
the shard plan and run by ``prefect_dask.DaskTaskRunner``, so thousands of shards spread over a
cluster; the stage's own ``finish`` / ``summarise`` then writes the manifest and the stats. The outputs
are the stages' outputs, byte for byte: the same params give the same shards whichever path wrote them
(tested with a scheduler and two workers started as the docs say), so DVC and the train stage cannot tell
them apart. Finished shards are skipped, as in the stages. A URL table's shards download on the workers, each
with its own download threads.

Workers on other machines write where the driver will read: every path of the params is made absolute
against the driver's working directory (the workspace) before a task is sent, and before any work each
worker must read a file the driver wrote there (a worker that sees another filesystem stops the flow at
once, named). A concepts task reads its own shard's captions from the manifest (no caption passes through
the scheduler); the driver reads the manifest a row group at a time and keeps only its key, split and shard
columns (:func:`plan_without_captions`).
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from prefect import flow, task, unmapped
from prefect.cache_policies import NO_CACHE

from components import captions, concepts
from components.shared.atomic import CorruptFileError
from components.shared.params import CaptionsParams, ConceptsParams, load_params
from components.shared.written import recording_outputs

SCHEDULER_VARIABLE = "DASK_SCHEDULER"  # the deployment's default scheduler address (infra/prefect.yaml)

_NLP: dict[str, Any] = {}  # one spaCy pipeline per worker process, loaded by its first shard


@task(cache_policy=NO_CACHE, retries=2, task_run_name="captions shard {plan_index}")
def caption_shard(params_json: str, plan: dict, plan_index: int) -> dict[str, Any]:
    from components.data.sources import ShardPlan, make_source

    params = CaptionsParams.model_validate_json(params_json)
    source = make_source(params)
    shard = ShardPlan(**plan)
    return captions.build_shard(source, shard)


@task(cache_policy=NO_CACHE, retries=2, task_run_name="concepts {shard}")
def concept_shard(params_json: str, shard: str, parsed_from: list[str], captions: tuple[list[str], list[str | None]] | None = None) -> int:
    """Parse one shard. ``captions`` (keys, texts) only when the caption field is not a manifest column (a recaption
    field, joined by the driver); otherwise the task reads its shard's rows itself."""
    params = ConceptsParams.model_validate_json(params_json)
    keys, texts = captions if captions is not None else shard_rows(params, shard)
    if params.spacy_model not in _NLP:
        _NLP[params.spacy_model] = concepts.load_nlp(params)
    return concepts.extract_shard(_NLP[params.spacy_model], params, shard, keys, texts, parsed_from)


def plan_without_captions(params: ConceptsParams) -> concepts.ConceptsPlan:
    """The concepts stage's plan for a driver whose workers read their own shards' captions: the manifest is read a
    row group at a time, and only its key, split and shard columns are kept whole; the captions are never held. The
    caption columns that share the phrases' text (:func:`components.concepts.caption_names`) are found batch by
    batch, and only the first ``quality_samples`` rows with true phrases are kept for the quality figures. A manifest
    that needs the whole read (a recaption field, a caption column that is not text) goes through the stage's
    :func:`~components.concepts.plan`."""
    path = params.manifest
    if not path.is_file():
        raise concepts.ConceptsError(f"manifest: {path} does not exist (run the captions stage first: dvc repro captions)")
    try:
        schema = pq.read_schema(path)
    except (OSError, ValueError) as err:
        raise CorruptFileError(f"{path}: not a readable Parquet file ({err})") from None
    field = schema.field(params.caption_field) if params.caption_field in schema.names else None
    if field is None or not (pa.types.is_string(field.type) or pa.types.is_large_string(field.type)):
        return concepts.plan(params)
    concepts.load_nlp(params)
    for column in ("key", "split", "shard"):
        if column not in schema.names:
            raise concepts.ConceptsError(f"{path}: column {column!r} not found; the manifest has {schema.names}")
    texts = [f.name for f in schema if f.name not in ("key", "split", "shard") and f.type == field.type]
    quality = [c for c in dict.fromkeys(["key", "object_phrases", *params.quality_fields]) if c in schema.names]
    same = set(texts) - {params.caption_field}
    index, sample, kept = [], [], 0
    wanted = pa.array(params.splits)
    for batch in pq.ParquetFile(path).iter_batches(columns=list(dict.fromkeys(["key", "split", "shard", *texts, *quality]))):
        batch = pa.Table.from_batches([batch])
        batch = batch.filter(pc.is_in(batch["split"], value_set=wanted))
        index.append(batch.select(["key", "split", "shard"]))
        same = {name for name in same if batch[name].equals(batch[params.caption_field])}
        if "object_phrases" in quality and kept < params.quality_samples:
            known = batch.select(quality).filter(pc.invert(pc.is_null(batch["object_phrases"])))
            sample.append(known.slice(0, params.quality_samples - kept))
            kept += sample[-1].num_rows
    manifest = pa.concat_tables(index) if index else pa.table({c: pa.array([], pa.string()) for c in ("key", "split", "shard")})
    concepts.check_shard_names(path, manifest)
    concepts.prepare_output(params)
    work = concepts.group_by_shard(params, manifest, ["key", "shard"], manifest)
    work.parsed_from = [params.caption_field, *(n for n in texts if n in same)]
    if sample:
        work.manifest = pa.concat_tables(sample)
    return work


def shard_rows(params: ConceptsParams, shard: str) -> tuple[list[str], list[str | None]]:
    """One shard's keys and captions, read from the manifest by the process that parses them (a Dask worker):
    Parquet's row-group statistics skip the other shards' rows. Only for a caption column of the manifest itself."""
    table = pq.read_table(params.manifest, columns=["key", "split", "shard", params.caption_field],
                          filters=[("shard", "=", shard), ("split", "in", list(params.splits))])
    return table["key"].to_pylist(), table[params.caption_field].to_pylist()


def absolute(params):
    """``params`` with every relative path made absolute against this process's working directory: a Dask worker
    started in another folder, or on another machine with the workspace at the same path, writes where this
    process will read."""
    def resolve(value):
        if isinstance(value, Path):
            return value if value.is_absolute() else Path.cwd() / value
        if isinstance(value, dict):
            return {k: resolve(v) for k, v in value.items()}
        if isinstance(value, list):
            return [resolve(v) for v in value]
        return value

    return type(params).model_validate(resolve(params.model_dump()))


def sharded_captions(params: CaptionsParams) -> dict[str, Any]:
    """The captions stage with its shards as mapped tasks (a URL table's rows split into a file per shard first)."""
    params = absolute(params)
    # the stage's record of its outputs, as `python -m components.captions` keeps it: a file of yours in its folder
    # stops the flow before any work, and only what the record lists is ever removed
    with recording_outputs("captions", folders=[params.stats_path.parent], own=[params.output_dir]):
        source, plans, todo = captions.plan(params)
        futures = caption_shard.map(params.model_dump_json(), [vars(p) for p in todo], list(range(len(todo))))
        futures.wait()
        futures.result()  # raises the first failure
        source.finish()
        return captions.complete(params, plans, source.summary())


def sharded_concepts(params: ConceptsParams) -> dict[str, Any]:
    """The concepts stage with its shards as mapped tasks."""
    params = absolute(params)
    with recording_outputs("concepts", folders=[params.stats_path.parent], own=[params.output_dir]):
        work = plan_without_captions(params)
        in_manifest = params.caption_field in pq.read_schema(params.manifest).names
        captions = [None if in_manifest else (work.keys(s), work.texts(s, params.caption_field)) for s in work.todo]
        futures = concept_shard.map(params.model_dump_json(), work.todo, unmapped(work.parsed_from), captions)
        futures.wait()
        futures.result()
        return concepts.complete(params, work, concepts.load_nlp(params) if params.quality_samples else None)


class WorkersCannotSeeTheWorkspace(RuntimeError):
    pass


def _reads(path: str, expected: str) -> str | None:
    """On a worker: None when it reads ``expected`` from ``path``, else why not."""
    try:
        got = Path(path).read_text()
    except OSError as err:
        return f"{err.strerror or err} (working directory {os.getcwd()})"
    return None if got == expected else "it reads other content there"


def check_workers_see_workspace(address: str, workspace: Path) -> int:
    """Every worker of the scheduler at ``address`` must read a file this process writes in ``workspace`` (a shared
    filesystem at the same path); returns the number of workers. Raises WorkersCannotSeeTheWorkspace naming them."""
    from distributed import Client

    token = workspace / f".c2lip-dask-check-{uuid.uuid4().hex}"
    secret = uuid.uuid4().hex
    token.write_text(secret)
    try:
        with Client(address, timeout="600s") as client:
            answers = client.run(_reads, str(token), secret)
    finally:
        token.unlink(missing_ok=True)
    if not answers:
        raise WorkersCannotSeeTheWorkspace(f"the Dask scheduler at {address} has no workers; start them with "
                                           f"`dask worker {address}` from this checkout (docs/stages/captions.md)")
    blind = {worker: why for worker, why in answers.items() if why}
    if blind:
        raise WorkersCannotSeeTheWorkspace(
            f"{len(blind)} of {len(answers)} Dask worker(s) cannot read {token} that this process wrote: "
            + "; ".join(f"{w}: {why}" for w, why in sorted(blind.items()))
            + f". Every worker needs the workspace {workspace} at the same path (a shared filesystem) and this checkout on "
            "its PYTHONPATH; nothing was written.")
    return len(answers)


@flow(name="c2lip-data-sharded", log_prints=True)
def sharded_data(captions_params: str = "params/captions.yaml", concepts_params: str = "params/concepts.yaml") -> dict[str, Any]:
    """Captions, then concepts, each shard a mapped task on the flow's task runner."""
    cap = sharded_captions(load_params("captions", captions_params))
    con = sharded_concepts(load_params("concepts", concepts_params))
    return {"samples_written": cap["samples_written"], "captions_with_phrases": con["captions"]}


def with_dask(address: str | None = None, workers: int = 2):
    """``sharded_data`` on a Dask cluster: an existing scheduler (checked first: every worker must see this
    workspace), or a local cluster of ``workers`` processes."""
    from prefect_dask import DaskTaskRunner

    if address:
        check_workers_see_workspace(address, Path.cwd())
    runner = (DaskTaskRunner(address=address) if address
              else DaskTaskRunner(cluster_kwargs={"n_workers": workers, "threads_per_worker": 1, "processes": True}))
    return sharded_data.with_options(task_runner=runner)


@flow(name="c2lip-data-on-dask", log_prints=True)
def data_on_dask(captions_params: str = "params/captions.yaml", concepts_params: str = "params/concepts.yaml",
                 scheduler: str | None = None, workers: int = 2) -> dict[str, Any]:
    """The ``data-sharded`` deployment: captions and concepts on the Dask scheduler ``scheduler`` (default: the
    DASK_SCHEDULER variable; neither: a local cluster of ``workers`` processes)."""
    address = scheduler or os.environ.get(SCHEDULER_VARIABLE) or None
    print(f"data on Dask: {address or f'a local cluster of {workers} processes'}")
    return with_dask(address, workers)(captions_params, concepts_params)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--address", default=None, help=f"Dask scheduler address (default: ${SCHEDULER_VARIABLE}, else a local cluster)")
    parser.add_argument("--workers", type=int, default=2, help="local cluster processes")
    parser.add_argument("--captions-params", default="params/captions.yaml")
    parser.add_argument("--concepts-params", default="params/concepts.yaml")
    args = parser.parse_args(argv)
    print(data_on_dask(args.captions_params, args.concepts_params, args.address, args.workers))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
