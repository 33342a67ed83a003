"""The base and train stages: DeepSpeed training of an open_clip model with one of the methods (siglip,
c2lip, negclip, hp_hn, clic; :mod:`components.method.methods`).

    python -m components.train --params params/train.yaml            # the train stage (dvc repro train)
    python -m components.train --params params/base.yaml             # the base stage (from scratch)
    torchrun --nproc_per_node 8 -m components.train --params ...     # or: deepspeed --num_gpus 8 --module ..., or srun
    python -m components.train --params ... --set micro_batch=48 --set processes=2    # values a launch changes

The same code runs on CPU (gloo) and GPU (NCCL), in one process or many. Started with plain ``python``
and ``processes: N > 1`` it re-launches itself under torchrun; under a launcher (torchrun, ``deepspeed``, ``srun``:
:func:`~components.shared.distributed.adopt_launcher_environment`) it is one rank and dies with the launcher.
Everything that can be checked is checked before any process starts (:func:`preflight`).

Resume: DeepSpeed checkpoints (model, optimiser, scheduler) every ``checkpoint_every`` steps, with the step, the launch's
shape and each rank's RNG state beside them; the data order is one global sequence, a pure function of the seed
(:mod:`components.data.sample_order`), and each batch's augmentation of (seed, rank, batch index), so a killed run resumes
at the same sample with the same crops and ends with the weights an uninterrupted run would have. A relaunch on another
number of processes (a lost node) resumes from the same step and samples; checkpoints are never removed for it. Every
rank must see the same checkpoints (a filesystem shared by the nodes): ranks that disagree stop before training.

Layout: the launcher and DeepSpeed config (:mod:`components.shared.distributed`), the data stream
(:mod:`components.data.stream`), the method's loss and batch builder (:mod:`components.method.methods`),
the optimiser and schedule (:mod:`components.method.optim`), checkpoints and the export
(:mod:`components.shared.checkpoints`), the zero-shot probe (:mod:`components.suite.zero_shot_probe`).
This module is the stage: preflight, then :func:`train` = setup → loop → save.

Outputs (``output_dir``): ``checkpoints/``, ``export/`` (open_clip_config.json + open_clip_model.safetensors,
loadable with ``open_clip.create_model_and_transforms("local-dir:<export>")``), ``loss.png``; plus a
metrics JSON and a loss-curve plots JSON for DVC, and an MLflow run (rank 0 only).
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from components.data.phrase_table import load_phrases
from components.data.shard_index import indexing_progress, sample_counts
from components.data.stream import TrainBatches, check_phrases_field, expand_shards, inputs_identity
from components.method.methods import method_for
from components.method.models import model_config, trims_phrases
from components.method.module import TrainingModule
from components.method.optim import build_model, calibrate_logits, lr_factor, param_groups
from components.shared.atomic import CorruptFileError, atomic_write_bytes, atomic_write_json, fingerprint, write_checksums
from components.shared.checkpoints import (
    EXPORT_CONFIG,
    HISTORY_FILE,
    CheckpointsDisagree,
    agree_on_start,
    check_export,
    check_resumable_launch,
    check_weights_file,
    export_model,
    resume_or_start,
    save_checkpoint,
    start_state,
)
from components.shared.devices import batch_to_model
from components.shared.distributed import (
    adopt_launcher_environment,
    bound_logit_scale,
    deepspeed_config,
    launch,
    local_world_size,
    prepare_deepspeed_comm,
    synchronise_batch_norm,
    world_size_for,
)
from components.shared.model_card import CARD_FILE, card_facts, model_card
from components.shared.params import ParamsError, TrainParams, load_params
from components.shared.processes import die_with_parent, stage_process_setup
from components.shared.progress import TimedBar, working
from components.shared.reports import plot_losses
from components.shared.safe_load import UnsafeCheckpointError, guard_deepspeed_loads
from components.shared.stage_code import stage_code
from components.shared.tracking import start_training_run
from components.shared.written import recording_outputs
from components.suite.zero_shot_probe import ShapesWorldZeroShot

log = logging.getLogger("c2lip.train")


def needs_phrases(params: TrainParams) -> bool:
    """The run reads the concepts stage's phrases: its method trains on them, or captions are replaced by them."""
    return method_for(params.method.name).needs_phrases or params.data.phrases_as_captions > 0


def preflight(params: TrainParams) -> dict[str, Any]:
    """Every check that needs no model: config, batch arithmetic, data, concepts, init path."""
    world = world_size_for(params)
    config = deepspeed_config(params, world, torch.cuda.is_available())
    if params.curves.enabled:  # the tracking suite's world, read now: a missing or binary file stops here, not after the model loaded
        try:
            load_params("captions", params.curves.captions_params)
        except ParamsError as err:
            raise ParamsError(f"curves.captions_params: {err}") from None
    shards = expand_shards(params.data.shards)
    if needs_phrases(params):
        if params.data.concepts_dir is None or not any(Path(params.data.concepts_dir).glob("*.parquet")):
            raise ParamsError(f"data.concepts_dir: no Parquet files in {params.data.concepts_dir} (run the concepts stage first)")
        check_phrases_field(params.data)  # a run that learns phrases learns those of the caption it trains on
    init = params.model.init
    if init != "scratch" and _looks_like_path(init) and not Path(init).exists():
        raise ParamsError(f"model.init: {init} does not exist (a checkpoint path, an open_clip tag, or 'scratch')")
    if init != "scratch" and Path(init).is_dir():
        check_export(Path(init))  # a truncated or changed init export is named here, not in a traceback
    elif init != "scratch" and Path(init).is_file():
        check_weights_file(Path(init))  # likewise a damaged checkpoint file
    # every shard's table (its samples' offsets), read from the tar headers once per shard content and cached: a
    # damaged shard is named here; a relaunch reads one small file (components.data.shard_index)
    total = sum(sample_counts(shards, progress=indexing_progress(shards)))
    if k := params.method.hard_examples.neighbour_images:  # before the model loads: each image needs k others
        from components.data.neighbours import too_few_images

        if problem := too_few_images(shards, k):
            raise ParamsError(f"method.hard_examples.neighbour_images: {problem}")
    if total < params.global_batch:  # an epoch is whole global batches (components.data.sample_order)
        raise ParamsError(f"data.shards: {total} samples in {len(shards)} shard(s), fewer than one global batch ({params.global_batch})")
    return config


def _looks_like_path(init: str) -> bool:
    return "/" in init or init.endswith((".safetensors", ".pt", ".pth", ".bin"))


# the params that do not change what a step computes (bookkeeping): a checkpoint made with other values resumes
BOOKKEEPING_KEYS = {"output_dir", "checkpoint_every", "keep_checkpoints", "log_every", "zero_shot_eval", "zero_shot_every",
                    "curves", "torch_threads", "metrics_path", "plots_path", "export_dtype", "test_shards", "mlflow_experiment"}
# the launch's shape: a relaunch on fewer or more processes (a lost node) resumes the run (see :func:`setup`)
LAUNCH_KEYS = {"processes", "micro_batch"}


def run_fingerprint(params: TrainParams, shards: list[str]) -> str:
    """What a checkpoint must match to be resumed: the params but the bookkeeping and launch keys, the shards, the
    stage's code (as the captions stage does: a resumed run never mixes two versions) and what it is made from
    (:func:`components.data.stream.inputs_identity`)."""
    payload = params.model_dump(mode="json", exclude=BOOKKEEPING_KEYS | LAUNCH_KEYS)
    payload["data"].pop("workers")
    return fingerprint({"params": payload, "shards": shards, **inputs_identity(params, shards)}, stage_code("components.train"))


@dataclass
class Run:
    """One rank's training run, as :func:`setup` leaves it for :func:`loop` and :func:`save`."""

    params: TrainParams
    stage: str
    rank: int
    main: bool
    device: torch.device
    engine: Any
    scheduler: Any
    tokenizer: Any
    loader_iter: Any
    accumulation: int
    ckpt_dir: Path
    start_step: int
    zero_shot: ShapesWorldZeroShot | None
    tracker: Any
    plot_points: list[dict] = field(default_factory=list)
    throughput: float = 0.0
    losses: dict[str, float] = field(default_factory=dict)
    curves: Any = None  # components.study.tracking.TrackingSuite when params.curves.enabled (rank 0)
    started: float = 0.0  # wall clock when tracking began (the curves' share of the run)


def train(params: TrainParams, stage: str) -> dict[str, float]:
    """Train on this rank (the launcher started the others); rank 0 writes every output."""
    run = setup(params, stage)
    loop(run)
    return save(run)


def setup(params: TrainParams, stage: str) -> Run:
    """Process group, model, logit calibration, loss, DeepSpeed engine, resume, data loader, probe, MLflow."""
    import deepspeed

    cuda = torch.cuda.is_available()
    prepare_deepspeed_comm(int(os.environ.get("WORLD_SIZE", 1)))
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.set_num_threads(params.torch_threads or max(1, (os.cpu_count() or 1) // local_world_size()))
    shards = expand_shards(params.data.shards)
    ckpt_dir = params.output_dir / "checkpoints"
    current = run_fingerprint(params, shards)
    state = start_state(params.output_dir, current)
    agree_on_start(state, params.output_dir)  # the first collective: before any rank acts on what it read
    # denormal floats (weights and gradients decaying to 0) slow x86 matrix products several-fold; flushed (bench/train.py)
    torch.set_flush_denormal(True)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    main = rank == 0
    ds_config = deepspeed_config(params, world, cuda)
    method = method_for(params.method.name)
    resume_tag = state.resume_tag
    if resuming := resume_tag is not None:
        check_resumable_launch(ckpt_dir / resume_tag, world)

    random.seed(params.seed)
    np.random.seed(params.seed)
    torch.manual_seed(params.seed)  # identical initial weights on every rank
    with working("train: building the model", enabled=main):
        model, transform_train, transform_eval, tokenizer = build_model(params)
    model = synchronise_batch_norm(model, world, cuda, main)
    neighbours = None
    if params.method.hard_examples.neighbour_images:  # NegCLIP's hard-negative images, by the weights the run starts from
        from components.data.neighbours import for_run

        neighbours = for_run(params, model, transform_eval, shards, rank, world, device)
    if params.model.calibrate_logits and not resuming:  # a resumed run has its s and b in the checkpoint
        with working("train: fitting the logit scale and bias on the first batches", enabled=main):
            calibrate(model, params, shards, rank, world, transform_train, tokenizer, main)
    module = TrainingModule(model, method.make_loss(params.method, model), freeze_image_tower=method.freezes_image_tower(params.method))
    optim = params.optim
    # fused: one kernel per step instead of a dozen elementwise passes over every parameter (bench/train.py)
    optimizer = torch.optim.AdamW(param_groups(module, optim), betas=optim.betas, eps=optim.eps, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, params.steps, optim.warmup_steps, optim.min_lr_ratio)
    )
    with working("train: starting the DeepSpeed engine", enabled=main):
        engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config)
    guard_deepspeed_loads(engine)  # resumed checkpoints load as weights only: a crafted file runs no code

    # resume (at this launch's shape), or start afresh when the checkpoints belong to other params
    start_step, resumed_figures = resume_or_start(engine, params.output_dir, state, current, params.micro_batch)
    dist.barrier()

    with working("train: loading the noun phrases", enabled=main and needs_phrases(params)):
        phrases = load_phrases(params.data.concepts_dir) if needs_phrases(params) else None
    accumulation = ds_config["gradient_accumulation_steps"]
    trim = phrases is not None and trims_phrases(params.method.phrase_context, model)
    if main and phrases is not None:
        log.info("phrases encoded at %s (method.phrase_context: %s)", "their own length" if trim else "the context length",
                 params.method.phrase_context)
    batches = TrainBatches(params, shards, rank, world, start_step * accumulation, transform_train, tokenizer, phrases,
                           method.make_batch, accumulation, trim_phrases=trim, neighbours=neighbours)
    # pinned batches on a GPU: the copy to the device then overlaps the step before it (non_blocking in the loop)
    loader = DataLoader(batches, batch_size=None, num_workers=params.data.workers, persistent_workers=False, pin_memory=cuda)

    zero_shot = None
    if main and params.zero_shot_eval:
        test_shards = [s for pattern in params.test_shards for s in sorted(glob.glob(pattern))]
        zero_shot = ShapesWorldZeroShot(test_shards, transform_eval) if test_shards else None
    tracker = start_training_run(params, stage) if main else None
    if main and start_step:
        tracker.set_tag("resumed_from_step", start_step)
    plot_points: list[dict] = []
    history = ckpt_dir / str(resume_tag) / HISTORY_FILE
    if start_step and history.is_file():  # the curve of the steps before the kill (DVC removed the plots file)
        plot_points = [p for p in json.loads(history.read_text()) if p["step"] <= start_step]
    curves, started = None, time.time()
    if main and params.curves.enabled:
        from components.study.tracking import TrackingSuite

        curves = TrackingSuite(params, transform_eval)
        if start_step == 0:  # the curve starts where the model starts
            figures = curves(engine.module.model, tokenizer)
            plot_points.append({"step": 0, **figures})
            tracker.log_metrics(figures, step=0)
    # a run resumed at its last step reports the figures its checkpoint recorded
    return Run(params, stage, rank, main, device, engine, scheduler, tokenizer, iter(loader), accumulation, ckpt_dir,
               start_step, zero_shot, tracker, plot_points, resumed_figures.get("samples_per_s", 0.0),
               dict(resumed_figures.get("losses", {})), curves, started)


def calibrate(model, params: TrainParams, shards: list[str], rank: int, world: int, transform, tokenizer, main: bool) -> None:
    """Fit the logit scale and bias on the first batches (:func:`~components.method.optim.calibrate_logits`);
    every rank starts from rank 0's fit, so the replicas stay identical."""
    calibration = TrainBatches(params, shards, rank, world, 0, transform, tokenizer, None, build=None)
    batches = list(islice(iter(calibration), params.model.calibrate_logits))
    log_scale, bias = calibrate_logits(model, batches, math.log(params.optim.max_logit_scale))
    fitted = torch.tensor([log_scale, bias])
    if dist.get_world_size() > 1:
        dist.broadcast(fitted, src=0)
    with torch.no_grad():
        model.logit_scale.fill_(float(fitted[0]))
        if getattr(model, "logit_bias", None) is not None:
            model.logit_bias.fill_(float(fitted[1]))
    if main:
        log.info("calibrated on %d batches: logit scale %.2f, bias %.2f", len(batches), math.exp(fitted[0]), fitted[1])


def loop(run: Run) -> None:
    """Optimiser steps from ``run.start_step`` to ``params.steps``: logging, the zero-shot probe, checkpoints."""
    params, engine = run.params, run.engine
    max_scale = math.log(params.optim.max_logit_scale)
    bar = TimedBar(total=params.steps, initial=run.start_step, desc=f"{run.stage} {params.method.name}", disable=not run.main, dynamic_ncols=True)
    t0, samples_done, step = time.time(), 0, run.start_step
    while step < params.steps:
        sums: dict[str, torch.Tensor] = {}  # on the device: read back (a wait for the GPU) only on logged steps, below
        for _ in range(run.accumulation):  # pixels in the model's dtype too: DeepSpeed's bf16 engine casts only weights
            batch = batch_to_model(next(run.loader_iter), engine.module, non_blocking=True)
            terms = engine(**batch)
            total = sum(terms.values())
            engine.backward(total)
            engine.step()
            for k, v in {**terms, "loss": total}.items():
                sums[k] = sums.get(k, 0.0) + v.detach().float() / run.accumulation
        step += 1
        bound_logit_scale(engine, max_scale)
        if step == run.start_step + 1:  # throughput leaves out the first step (warm-up, first data reads)
            t0, samples_done = time.time(), 0
        else:
            samples_done += params.global_batch
            run.throughput = samples_done / (time.time() - t0)
        saves = step % params.checkpoint_every == 0 or step == params.steps
        check = bool(run.zero_shot) and params.zero_shot_every and step % params.zero_shot_every == 0 and step < params.steps
        track = run.curves is not None and saves  # (zero_shot and curves are rank 0's only)
        logs = check or track or step % params.log_every == 0 or step == params.steps
        if logs or saves:  # the one host synchronisation of a step (bench/train_gpu.py --levers sync-every-step)
            run.losses = {k: float(v) for k, v in sums.items()}
        if run.main:
            bar.update(1)
            if logs:
                losses = run.losses
                bar.set_postfix(loss=f"{losses['loss']:.3f}", samples_s=f"{run.throughput:.0f}")
                model = engine.module.model
                # s and b per logged step: their trajectories are part of the diagnosis (docs/results/what-this-shows.md "What this shows")
                logits = {"logit_scale": model.logit_scale.exp().item(),
                          **({"logit_bias": model.logit_bias.item()} if getattr(model, "logit_bias", None) is not None else {})}
                point = {"step": step, **{k: round(v, 5) for k, v in {**losses, **logits}.items()}}
                metrics = {**losses, "lr": run.scheduler.get_last_lr()[0], "samples_per_s": run.throughput, **logits}
                if check:  # rank 0 evaluates; the others wait at the next collective
                    started = time.time()
                    figures = run.zero_shot(engine.module.model, run.tokenizer)
                    t0 += time.time() - started  # not training time
                    metrics.update(figures)
                    point["zero_shot_top1"] = round(figures["zero_shot_top1"], 4)
                if track:  # the learning curves: the tracking suite at every checkpoint (not training time either)
                    started = time.time()
                    figures = run.curves(engine.module.model, run.tokenizer)
                    t0 += time.time() - started
                    metrics.update(figures)
                    point.update(figures)
                run.plot_points.append(point)
                run.tracker.log_metrics(metrics, step=step)
        if saves:
            save_checkpoint(engine, run.ckpt_dir, step, run.rank, params.keep_checkpoints, run.main,
                            figures={"losses": run.losses, "samples_per_s": run.throughput}, history=run.plot_points,
                            launch={"processes": dist.get_world_size(), "micro_batch": params.micro_batch})
            if run.main:
                atomic_write_json(params.plots_path, {"loss": run.plot_points})
    bar.close()


def save(run: Run) -> dict[str, float]:
    """Rank 0: the export, the final figures (zero-shot on the exported weights), metrics, plots, MLflow."""
    params = run.params
    result: dict[str, float] = {}
    if run.main:
        model = run.engine.module.model
        export_dir = export_model(model, params.model.name, params.output_dir / "export", params.export_dtype,
                                  model_cfg=model_config(params.model.name, params.model.text_tower), tokenizer=run.tokenizer)
        if params.export_dtype != "float32":  # the figures below describe the exported (rounded) weights
            with torch.no_grad():
                for tensor in [*model.parameters(), *model.buffers()]:
                    if tensor.is_floating_point():
                        tensor.copy_(tensor.to(getattr(torch, params.export_dtype)))
        result = {"steps": float(params.steps), "samples_per_s": run.throughput,
                  **{f"final_{k}": v for k, v in run.losses.items()},
                  "logit_scale": model.logit_scale.exp().item()}
        if getattr(model, "logit_bias", None) is not None:
            result["logit_bias"] = model.logit_bias.item()
        if run.zero_shot:
            result.update(run.zero_shot(model, run.tokenizer))
        if run.curves is not None:  # what the curves cost: seconds scoring against seconds training (this process)
            result["curves_seconds"] = run.curves.seconds
            result["curves_share"] = run.curves.seconds / max(time.time() - run.started, 1e-9)
        points = run.plot_points
        if "zero_shot_top1" in result and points and points[-1]["step"] == params.steps:
            points[-1]["zero_shot_top1"] = round(result["zero_shot_top1"], 4)
        atomic_write_json(params.plots_path, {"loss": points})
        if points:
            plot_losses(points, params.output_dir / "loss.png")
        atomic_write_json(params.metrics_path, {k: round(v, 5) for k, v in result.items()})
        # the model card (README.md), then the checksums again so that they cover it
        atomic_write_bytes(export_dir / CARD_FILE, model_card(card_facts(params), {k: round(v, 5) for k, v in result.items()}).encode())
        write_checksums(export_dir)
        run.tracker.log_metrics({k: v for k, v in result.items() if k.startswith("zero_shot")})
        run.tracker.log_artifact(str(export_dir / EXPORT_CONFIG), "export")
        run.tracker.log_artifact(str(export_dir / CARD_FILE), "export")
        if (params.output_dir / "loss.png").is_file():
            run.tracker.log_artifact(str(params.output_dir / "loss.png"))
        run.tracker.end_run()
        log.info("exported %s; %s", export_dir, {k: round(v, 4) for k, v in result.items()})
    dist.barrier()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=Path, default=Path("params/train.yaml"), help="params YAML (train.yaml, base.yaml, or a preset)")
    parser.add_argument("--stage", default=None, help="name recorded in MLflow (default: the params file's stem)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one value of the params file, a dotted key and a YAML value (micro_batch=48, "
                             "processes=16, data.workers=4); repeatable. Every rank gets the same command line")
    # the deepspeed launcher appends --local_rank=N to the module's arguments; the rank reads LOCAL_RANK as torchrun's do
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    stage_process_setup()  # its workers die with it; inside a flow run, it dies with the run
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    stage = args.stage or args.params.stem
    try:
        launcher = adopt_launcher_environment()
        if args.local_rank is not None:
            os.environ.setdefault("LOCAL_RANK", str(args.local_rank))
        params = load_params("train", args.params, args.overrides)
        with working("train: checking the data and the params", enabled=int(os.environ.get("RANK", 0)) == 0):
            preflight(params)
    except (ParamsError, CorruptFileError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if launcher is not None:  # a rank dies with its launcher (torchrun starts each rank in a session of its own)
        die_with_parent()
    # the figures beside other stages' in metrics/ are recorded as the train stage's (components.shared.written)
    with recording_outputs("train", folders=[params.metrics_path.parent, params.plots_path.parent]):
        relaunch = ["--params", str(args.params), "--stage", stage, *(f"--set={o}" for o in args.overrides)]
        code = launch("components.train", relaunch, params.processes)
        if code is not None:  # the torchrun children did the work
            return code
        try:
            train(params, stage)
        except (CorruptFileError, UnsafeCheckpointError, CheckpointsDisagree) as err:
            print(f"error: {err}", file=sys.stderr)
            if dist.is_initialized():  # a live process group at exit aborts the process ("terminate called ..."): rc 2, not 134
                dist.destroy_process_group()
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
