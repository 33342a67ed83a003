"""The captions and concepts stages sharded over a Dask cluster by Prefect task mapping.

    python -m flows.sharded --address tcp://scheduler:8786      # an existing cluster
    python -m flows.sharded --workers 8                         # a local cluster of 8 processes

Each shard is one Prefect task (the stage's own ``write_shard`` / per-shard extraction), mapped over
the shard plan and run by ``prefect_dask.DaskTaskRunner``, so thousands of shards spread over a
cluster; the stage's own ``finish`` / ``summarise`` then writes the manifest and the stats. The outputs
are the stages' outputs, byte for byte: the same params give the same shards whichever path wrote them
(tested with a local cluster of 2 workers), so DVC and the train stage cannot tell them apart. Finished
shards are skipped, as in the stages. Sources that fetch from the network in bulk (``source: table``)
keep the stage's own concurrent download path.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from prefect import flow, task, unmapped
from prefect.cache_policies import NO_CACHE

from components import captions, concepts
from components.shared.params import CaptionsParams, ConceptsParams, load_params

_NLP: dict[str, Any] = {}  # one spaCy pipeline per worker process, loaded by its first shard


@task(cache_policy=NO_CACHE, retries=2, task_run_name="captions shard {plan_index}")
def caption_shard(params_json: str, plan: dict, plan_index: int) -> dict[str, Any]:
    from components.data.sources import ShardPlan, make_source

    params = CaptionsParams.model_validate_json(params_json)
    source = make_source(params)
    shard = ShardPlan(**plan)
    return captions.write_shard(params, shard, source.samples(shard))


@task(cache_policy=NO_CACHE, retries=2, task_run_name="concepts {shard}")
def concept_shard(params_json: str, shard: str, keys: list[str], texts: list[str | None], parsed_from: list[str]) -> int:
    params = ConceptsParams.model_validate_json(params_json)
    if params.spacy_model not in _NLP:
        _NLP[params.spacy_model] = concepts.load_nlp(params)
    return concepts.extract_shard(_NLP[params.spacy_model], params, shard, keys, texts, parsed_from)


def sharded_captions(params: CaptionsParams) -> dict[str, Any]:
    """The captions stage with its shards as mapped tasks (parallel sources)."""
    source, plans, todo = captions.plan(params)
    if not source.parallel:
        return captions.run(params)  # bulk downloads: the stage's own concurrent path
    futures = caption_shard.map(params.model_dump_json(), [vars(p) for p in todo], list(range(len(todo))))
    futures.wait()
    futures.result()  # raises the first failure
    return captions.complete(params, plans, source.summary())


def sharded_concepts(params: ConceptsParams) -> dict[str, Any]:
    """The concepts stage with its shards as mapped tasks."""
    work = concepts.plan(params)
    futures = concept_shard.map(params.model_dump_json(), work.todo, [work.keys(s) for s in work.todo],
                                [work.texts(s, params.caption_field) for s in work.todo], unmapped(work.parsed_from))
    futures.wait()
    futures.result()
    return concepts.complete(params, work, concepts.load_nlp(params) if params.quality_samples else None)


@flow(name="c2lip-data-sharded", log_prints=True)
def sharded_data(captions_params: str = "params/captions.yaml", concepts_params: str = "params/concepts.yaml") -> dict[str, Any]:
    """Captions, then concepts, each shard a mapped task on the flow's task runner."""
    cap = sharded_captions(load_params("captions", captions_params))
    con = sharded_concepts(load_params("concepts", concepts_params))
    return {"samples_written": cap["samples_written"], "captions_with_phrases": con["captions"]}


def with_dask(address: str | None = None, workers: int = 2):
    """``sharded_data`` on a Dask cluster: an existing scheduler, or a local cluster of ``workers`` processes."""
    from prefect_dask import DaskTaskRunner

    runner = (DaskTaskRunner(address=address) if address
              else DaskTaskRunner(cluster_kwargs={"n_workers": workers, "threads_per_worker": 1, "processes": True}))
    return sharded_data.with_options(task_runner=runner)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--address", default=None, help="Dask scheduler address (default: a local cluster)")
    parser.add_argument("--workers", type=int, default=2, help="local cluster processes")
    parser.add_argument("--captions-params", default="params/captions.yaml")
    parser.add_argument("--concepts-params", default="params/concepts.yaml")
    args = parser.parse_args(argv)
    print(with_dask(args.address, args.workers)(args.captions_params, args.concepts_params))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
