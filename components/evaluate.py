"""The evaluate stage: the whole benchmark suite for every listed model, one report.

    python -m components.evaluate [--params params/evaluate.yaml]

Models: an export folder (the train and base stages' ``export/``), a checkpoint file, an MLflow registry
URI (``models:/c2lip@champion``) or an open_clip architecture + pretrained tag. Benchmarks: SugarCrepe,
SugarCrepe++, hard positives, ARO, Winoground-style pairs, zero-shot classification and retrieval, read
from their official file formats (:mod:`components.suite.formats`); by default ShapesWorld's, written by
the benchmarks stage.

Each distinct image (file + crop box) is encoded once per model and shared by every benchmark that uses
it; each distinct text likewise. Every figure is aggregated from per-item tables (:mod:`components.suite.items`).
Outputs under ``output_dir``: ``items/<model>/<benchmark>.parquet``,
``metrics.json`` (flat keys ``<model>/<benchmark>/<metric>``, DVC metrics), ``plots/<model>.json`` (DVC plots),
``benchmarks.md`` (benchmark × metric, the models side by side, differences against the first with paired bootstrap
intervals over items), ``intervals.json``, ``benchmarks.png`` and the failure gallery ``gallery/``; the same numbers
and files go to one MLflow run. A model's per-item tables are cached under ``cache_dir`` by a fingerprint of its
weights, the suite's files and this code, so a killed run resumes where it stopped.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch
from PIL import Image
from tqdm import tqdm

from components.shared.atomic import CorruptFileError, atomic_write_bytes, atomic_write_json
from components.shared.checkpoints import EXPORT_CONFIG, check_export, refuse_export_code  # what our exports (and MLflow-registered models) hold
from components.shared.owned_outputs import ForeignFilesError, OwnedOutputs
from components.shared.params import EvalModelSpec, EvaluateParams, ParamsError, flatten_params, load_params
from components.shared.processes import stage_process_setup
from components.shared.redact import redact
from components.shared.safe_load import RemoteCodeRefused, UnsafeCheckpointError, load_torch_file
from components.shared.stage_code import stage_code
from components.suite import formats, gallery, items, results_cache
from components.suite.loading import SuiteError, check_images, load_suite, load_tagger  # noqa: F401 - the stage's API
from components.suite.report import bar_chart, flat_metrics, interval_json, markdown_report, paired_intervals

EvaluateError = SuiteError  # a model or benchmark that cannot be evaluated: says which, and why


# --------------------------------------------------------------------------------------------------
# the suite
# --------------------------------------------------------------------------------------------------


def suite_fingerprint(params: EvaluateParams, tasks: list[formats.Task]) -> str:
    digest = hashlib.sha256(params.benchmarks.model_dump_json().encode())
    digest.update(json.dumps([params.order_seed, params.spacy_model]).encode())
    for task in tasks:
        digest.update(task.name.encode())
        digest.update(json.dumps(task.texts).encode())
        digest.update(json.dumps([(str(r.path), r.box) for r in task.images]).encode())
    digest.update(results_cache.images_digest(tasks).encode())  # the pixels, not only the names
    for path in stage_code("components.evaluate"):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


# --------------------------------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------------------------------


def _find_export(root: Path) -> Path | None:
    hits = sorted(root.rglob(EXPORT_CONFIG))
    return hits[0].parent if hits else None


def resolve_model(spec: EvalModelSpec, download_dir: Path) -> tuple[str, Any]:
    """("export", folder) | ("checkpoint", file) | ("pretrained", (arch, tag)). An MLflow URI is downloaded
    and must contain an open_clip export (open_clip_config.json + weights)."""
    if spec.pretrained is not None:
        return "pretrained", (spec.arch, spec.pretrained)
    uri = spec.uri
    if uri.startswith("models:/") or uri.startswith("runs:/"):
        import mlflow

        from components.shared.tracking import default_tracking_uri

        mlflow.set_tracking_uri(default_tracking_uri())
        target = download_dir / spec.name
        try:
            local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(target)))
        except Exception as err:  # MLflow raises several types for an unknown name, alias or version
            raise EvaluateError(redact(f"model {spec.name!r}: cannot download {uri} from {default_tracking_uri()}: {err}")) from None
        export = _find_export(local)
        if export is None:
            raise EvaluateError(f"model {spec.name!r}: {uri} holds no {EXPORT_CONFIG} (not an open_clip export)")
        return "export", export
    path = Path(uri)
    if path.is_dir():
        if not (path / EXPORT_CONFIG).is_file():
            raise EvaluateError(f"model {spec.name!r}: {path} has no {EXPORT_CONFIG}; an export folder is written by the train stage")
        return "export", path
    if path.is_file():
        if spec.arch is None:
            raise EvaluateError(f"model {spec.name!r}: checkpoint file {path} needs 'arch' (its open_clip architecture)")
        return "checkpoint", path
    raise EvaluateError(f"model {spec.name!r}: {uri} is neither a folder, a file nor a models:/ URI (not found)")


def model_fingerprint(kind: str, where: Any) -> str:
    digest = hashlib.sha256(kind.encode())
    if kind == "export":
        for file in sorted(Path(where).iterdir()):
            if file.is_file():
                digest.update(file.name.encode())
                digest.update(file.read_bytes())
    elif kind == "checkpoint":
        digest.update(Path(where).read_bytes())
    else:
        digest.update(json.dumps(where).encode())
    return digest.hexdigest()[:16]


def load_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """Weights of a checkpoint file: safetensors, a plain state dict, or one under 'state_dict' /
    'module' (DeepSpeed's mp_rank_00_model_states.pt) / 'model'; DDP's 'module.' prefix removed, and the train
    stage's 'model.' (its DeepSpeed module is the model with its loss)."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        if not path.is_file():
            raise CorruptFileError(f"{path}: checkpoint file does not exist")
        try:
            state = load_file(str(path))
        except Exception as err:  # noqa: BLE001 - safetensors raises its own error types (truncated header, bad JSON, ...)
            raise CorruptFileError(f"{path}: not a readable safetensors file ({str(err).splitlines()[0][:200]})") from None
    else:
        state = load_torch_file(path)  # weights only: a crafted checkpoint runs no code
        for key in ("state_dict", "module", "model"):
            if isinstance(state, dict) and isinstance(state.get(key), dict):
                state = state[key]
                break
    if not isinstance(state, dict) or not state:
        raise EvaluateError(f"{path}: no state dict found in the checkpoint")
    prefix = "module."
    state = {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in state.items()}
    # c2lip's own DeepSpeed checkpoints hold the TrainingModule (the model under "model.", the loss's buffers beside it)
    if any(k.startswith("model.") for k in state) and not any(k.startswith(("visual.", "text.", "transformer.")) for k in state):
        state = {k[len("model."):]: v for k, v in state.items() if k.startswith("model.")}
    return state


def load_model(kind: str, where: Any, spec: EvalModelSpec):
    """(model in eval mode, preprocess, tokenizer)."""
    import open_clip

    from components.method import models  # registers our tiny configs (and their timm towers)

    if kind == "export":
        check_export(Path(where))  # checksums and a readable safetensors file, else the file is named
        try:
            refuse_export_code(Path(where), f"model {spec.name!r}")
        except RemoteCodeRefused as err:
            raise EvaluateError(str(err)) from None
        model, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{where}")
        tokenizer = open_clip.get_tokenizer(f"local-dir:{where}")
    elif kind == "checkpoint":
        model, _, preprocess, tokenizer = models.create_model(spec.arch)
        state = load_state_dict(Path(where))
        for key in ("logit_scale", "logit_bias"):  # 0-dim in open_clip's own checkpoints, 1-dim in ours
            if key in state and hasattr(model, key):
                state[key] = state[key].reshape(getattr(model, key).shape)
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing:
            raise EvaluateError(f"model {spec.name!r}: {where} lacks {len(missing)} weights of {spec.arch} (first: {missing[:3]})")
        if unexpected:
            print(f"evaluate: {spec.name}: ignored {len(unexpected)} unexpected keys of {where} (first: {unexpected[:3]})", file=sys.stderr)
    else:
        arch, tag = where
        try:
            model, _, preprocess, tokenizer = models.create_model(arch, pretrained=tag)
        except Exception as err:  # the hub is unreachable offline; say so plainly
            raise EvaluateError(f"model {spec.name!r}: open_clip cannot load {arch} / {tag}: {err}") from None
    return model.eval(), preprocess, tokenizer


# --------------------------------------------------------------------------------------------------
# encoding
# --------------------------------------------------------------------------------------------------


class _Images(torch.utils.data.Dataset):
    def __init__(self, refs: list[formats.ImageRef], preprocess):
        self.refs, self.preprocess = refs, preprocess

    def __len__(self) -> int:
        return len(self.refs)

    def __getitem__(self, k: int) -> torch.Tensor:
        ref = self.refs[k]
        try:
            image = Image.open(ref.path).convert("RGB")
        except Exception as err:
            raise EvaluateError(f"{ref.path}: cannot read the image ({err})") from None
        if ref.box is not None:
            x, y, w, h = ref.box
            image = image.crop((x, y, x + w, y + h))
        return self.preprocess(image)


@torch.no_grad()
def encode_images(model, preprocess, refs: list[formats.ImageRef], batch: int, workers: int, desc: str, progress: bool = True) -> torch.Tensor:
    """L2-normalised embeddings [len(refs), D], in order."""
    loader = torch.utils.data.DataLoader(_Images(refs, preprocess), batch_size=batch, num_workers=workers)
    out = [model.encode_image(x, normalize=True).float()
           for x in tqdm(loader, desc=desc, unit="batch", file=sys.stderr, leave=False, disable=not progress)]
    return torch.cat(out)


@torch.no_grad()
def encode_texts(model, tokenizer, texts: list[str], batch: int, desc: str, progress: bool = True) -> torch.Tensor:
    out = [model.encode_text(tokenizer(texts[k:k + batch]), normalize=True).float()
           for k in tqdm(range(0, len(texts), batch), desc=desc, unit="batch", file=sys.stderr, leave=False, disable=not progress)]
    return torch.cat(out)


def build_classifiers(model, tokenizer, tasks: list[formats.Task]) -> dict[str, torch.Tensor]:
    """This model's class embeddings [classes, D] per zero-shot task name (open_clip's classifier:
    templates averaged per class). Returned, never stored on the shared tasks: see formats.Task."""
    import open_clip

    return {
        task.name: open_clip.build_zero_shot_classifier(
            model, tokenizer, classnames=task.needs_classifier["classnames"], templates=task.needs_classifier["templates"],
            num_classes_per_batch=16, device="cpu",
        ).float().T
        for task in tasks if task.needs_classifier is not None
    }


def score_task(task: formats.Task, images: torch.Tensor, texts: torch.Tensor) -> pa.Table:
    """The task's per-item table for one model: every item's scores and outcomes (:mod:`components.suite.items`)."""
    return items.item_table(task.name, task.headline, task.layout, task.score_items(images, texts))


def results_of(tables: dict[str, pa.Table]) -> dict[str, dict[str, float]]:
    """Each task's figures, aggregated from its per-item table: all items, then the held-out and the seen apart."""
    return {name: items.results_of(table) for name, table in tables.items()}


def evaluate_shared(model, preprocess, tokenizer, tasks: list[formats.Task], params: EvaluateParams, label: str = "",
                    progress: bool = True) -> dict[str, pa.Table]:
    """Every task's per-item table, with each distinct image and text encoded once for all of them."""
    image_index: dict[formats.ImageRef, int] = {}
    text_index: dict[str, int] = {}
    for task in tasks:
        for ref in task.images:
            image_index.setdefault(ref, len(image_index))
        for text in task.texts:
            text_index.setdefault(text, len(text_index))
    images = encode_images(model, preprocess, list(image_index), params.image_batch, params.workers, f"{label} images", progress)
    texts = (encode_texts(model, tokenizer, list(text_index), params.text_batch, f"{label} texts", progress) if text_index
             else torch.zeros(0, images.shape[1]))
    classifiers = build_classifiers(model, tokenizer, tasks)
    results = {}
    for task in tasks:
        I = images[torch.tensor([image_index[r] for r in task.images], dtype=torch.long)]
        if task.needs_classifier is not None:
            T = classifiers[task.name]
        else:
            T = texts[torch.tensor([text_index[t] for t in task.texts], dtype=torch.long)] if task.texts else texts
        results[task.name] = score_task(task, I, T)
    return results


# --------------------------------------------------------------------------------------------------
# the stage
# --------------------------------------------------------------------------------------------------


def evaluate_model(spec: EvalModelSpec, tasks: list[formats.Task], params: EvaluateParams, suite_fp: str, quiet: bool = False,
                   resolved: tuple[str, Any] | None = None) -> dict[str, pa.Table]:
    """One model's per-item tables on the loaded suite (task name -> table), from the cache when the same weights met
    the same suite (``resolved``: :func:`resolve_model`'s answer when the caller has it)."""
    kind, where = resolved or resolve_model(spec, params.cache_dir / "downloads")
    fp = hashlib.sha256(f"{model_fingerprint(kind, where)}:{suite_fp}".encode()).hexdigest()[:16]
    if (tables := results_cache.read(params.cache_dir, spec.name, fp, tasks)) is not None:  # a damaged entry is re-evaluated
        return tables
    model, preprocess, tokenizer = load_model(kind, where, spec)
    t0 = time.perf_counter()
    # quiet: a caller evaluating several models at once keeps one progress bar of its own
    tables = evaluate_shared(model, preprocess, tokenizer, tasks, params, label=spec.name, progress=not quiet)
    print(f"evaluate: {spec.name}: {len(tasks)} benchmarks in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    results_cache.write(params.cache_dir, spec.name, fp, tables)
    return tables


def run(params: EvaluateParams, log_mlflow: bool = True) -> dict[str, float]:
    started = time.perf_counter()
    if params.torch_threads:
        torch.set_num_threads(params.torch_threads)
    tasks = load_suite(params)
    check_images(tasks)
    names = [m.name for m in params.models]
    owned, expected = owned_outputs(params.output_dir, names, tasks)
    owned.check(expected)  # before any work: a file of the user's in items/, gallery/ or plots/ stops the run, untouched
    suite_fp = suite_fingerprint(params, tasks)
    # every model is found before any is evaluated: a misspelt second model costs no time and touches nothing
    resolved = {spec.name: resolve_model(spec, params.cache_dir / "downloads") for spec in params.models}
    tables: dict[str, dict[str, pa.Table]] = {}
    meta: dict[str, str] = {}
    for spec in params.models:
        meta[spec.name] = spec.uri or f"{spec.arch} / {spec.pretrained}"
        tables[spec.name] = evaluate_model(spec, tasks, params, suite_fp, resolved=resolved[spec.name])
    per_model = {name: results_of(tables[name]) for name in names}  # the figures, aggregated from the per-item tables
    flat = flat_metrics(tasks, per_model)
    intervals = paired_intervals(tasks, tables, names, params.bootstrap.resamples, params.bootstrap.seed)
    out = params.output_dir
    with owned.build() as build:  # the whole output set, then swapped in at once: a failure leaves the old one
        galleries = write_outputs(build, params, tasks, names, tables, per_model, flat, intervals, meta)
        owned.swap_in(build, expected)
    if log_mlflow:
        log_to_mlflow(params, flat, out, names, suite_fp)
    print(f"evaluate: wrote {out}/benchmarks.md, benchmarks.png, metrics.json, intervals.json, items/"
          + (", gallery/index.html" if galleries else "") + f" in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return flat


REPORT_FILES = ("benchmarks.md", "benchmarks.png", "metrics.json", "intervals.json")


def owned_outputs(out: Path, names: list[str], tasks: list[formats.Task]) -> tuple[OwnedOutputs, set[str]]:
    """What this stage owns in ``out`` (a folder it may share: reports/ holds the comparisons' reports too) and the
    files this run writes under fixed names (the committed example report, an older version's outputs)."""
    expected = {f"plots/{n}.json" for n in names} | {f"items/{n}/{t.name}.parquet" for n in names for t in tasks}
    expected |= {"gallery/index.html"} | {f"gallery/{n}.html" for n in names[2:]}
    return OwnedOutputs(out, "evaluate", folders=("items", "plots", "gallery"), files=REPORT_FILES), expected


def write_outputs(build: Path, params: EvaluateParams, tasks, names, tables, per_model, flat, intervals, meta) -> list[Path]:
    """Every output into the new folder ``build``; returns the gallery's pages."""
    for name in names:
        items.write_tables(build / "items" / name, tables[name])
    atomic_write_json(build / "metrics.json", flat)
    for name in names:
        rows = [{"benchmark": t.name, "metric": t.headline, "value": round(per_model[name][t.name][t.headline], 5)} for t in tasks]
        atomic_write_json(build / "plots" / f"{name}.json", {"benchmarks": rows})
    atomic_write_json(build / "intervals.json", interval_json(intervals))
    galleries = []
    if params.gallery.enabled and len(names) > 1:
        g = params.gallery
        pages = [gallery.Page("index.html" if k == 1 else f"{name}.html", names[0], name, tables[names[0]], tables[name])
                 for k, name in enumerate(names) if k > 0]
        galleries = gallery.write_gallery(build / "gallery", pages, tasks, g.per_outcome, g.seed, g.thumbnail_px)
    report = markdown_report(tasks, per_model, names, meta, intervals, params.bootstrap.resamples,
                             "gallery/index.html" if galleries else None)
    atomic_write_bytes(build / "benchmarks.md", report.encode())
    atomic_write_bytes(build / "benchmarks.png", bar_chart(tasks, per_model, names))
    return galleries


def log_to_mlflow(params: EvaluateParams, flat: dict[str, float], out: Path, names: list[str], suite_fp: str) -> None:
    from components.shared.tracking import use_experiment

    mlflow = use_experiment(params.mlflow_experiment)
    with mlflow.start_run(run_name=f"evaluate-{'-vs-'.join(names)}"):
        mlflow.set_tags({"stage": "evaluate", "models": ",".join(names), "suite_fingerprint": suite_fp})
        mlflow.log_params({k: v[:500] for k, v in flatten_params(params).items()})
        mlflow.log_metrics(flat)
        for file in REPORT_FILES:
            mlflow.log_artifact(str(out / file))
        if (out / "gallery").is_dir():
            mlflow.log_artifacts(str(out / "gallery"), artifact_path="gallery")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", default=None, help="params YAML (default: params/evaluate.yaml)")
    args = parser.parse_args(argv)
    stage_process_setup()  # its workers die with it; inside a flow run, it dies with the run
    try:
        params = load_params("evaluate", args.params)
        flat = run(params)
    except (ParamsError, EvaluateError, formats.BenchmarkError, CorruptFileError, UnsafeCheckpointError, ForeignFilesError) as err:
        print(f"error: {redact(str(err))}", file=sys.stderr)
        return 2
    print(json.dumps({k: v for k, v in flat.items() if "/summary/" in k}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
