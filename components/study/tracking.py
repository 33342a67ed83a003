"""Learning curves: a small, fixed slice of ShapesWorld's benchmark suite scored while a model trains — at step 0 and
at every checkpoint — so a run shows *when* binding, composition, zero-shot and retrieval move, not only where they end.

The train stage calls :class:`TrackingSuite` (``curves.enabled``); the figures go to MLflow as step metrics
(``track/<group>``, drawn by the MLflow UI), onto the points of the run's plots file and, through the comparison, to
``curves.png``. The slice is the benchmarks stage's own suite built from the first ``curves.images`` test images of
the world (every format, the same rules, held-out items included), written once under the run's output folder.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import torch

from components.shared.atomic import fingerprint
from components.shared.params import BenchmarksParams, EvaluateParams, TrainParams, load_params, validate_params

SUITE_DIR = "tracking_suite"


def suite_params(root: Path) -> EvaluateParams:
    """The evaluate params of a tracking suite at ``root``: the benchmarks the tracked groups need (SugarCrepe,
    SugarCrepe++, Winoground, zero-shot, retrieval); ARO, the hard positives and long captions are left to the
    final evaluation."""
    r = str(root)
    return validate_params("evaluate", {
        "models": [{"name": "tracked", "uri": "unused"}], "workers": 0,
        "benchmarks": {
            "sugarcrepe": {"data_root": f"{r}/sugar_crepe", "image_root": f"{r}/images"},
            "sugarcrepe_pp": {"data_root": f"{r}/sugar_crepe_pp", "image_root": f"{r}/images"},
            "winoground": {"data_root": f"{r}/winoground", "image_root": f"{r}/images"},
            "zero_shot": {"data_root": f"{r}/zero_shot"},
            "retrieval": {"data_root": f"{r}/retrieval", "image_root": f"{r}/images"},
            **{name: {"enabled": False, "data_root": "unused"} for name in ("hard_positives", "aro", "long_captions")},
        }}, "the tracking suite")


def build_tracking_suite(params: TrainParams) -> Path:
    """The run's tracking suite (built once; rebuilt when the world or its size changed)."""
    from components.suite.shapesworld_suite import build_suite

    bench = BenchmarksParams(captions_params=params.curves.captions_params, images=params.curves.images, seed=params.curves.seed)
    captions = load_params("captions", bench.captions_params)
    stamp = fingerprint({"bench": bench.model_dump(mode="json"), "world": captions.shapesworld.model_dump(mode="json"),
                         "seed": captions.seed}, [])
    root = params.output_dir / SUITE_DIR
    marker = root / "_suite.json"
    if marker.is_file() and json.loads(marker.read_text()).get("fingerprint") == stamp:
        return root
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    build_suite(bench, captions, tmp)
    (tmp / "_suite.json").write_text(json.dumps({"fingerprint": stamp}))
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)
    return root


class TrackingSuite:
    """The tracking suite, loaded once; called with the model in training, returns ``track/<group>`` figures."""

    def __init__(self, params: TrainParams, preprocess):
        from components.suite.applicable import applicable_suite
        from components.suite.loading import check_images, load_suite

        self.params = suite_params(build_tracking_suite(params))
        applicable_suite(self.params)  # a small world may have no items for some benchmark: it is left out
        self.tasks = load_suite(self.params)
        check_images(self.tasks)
        self.preprocess = preprocess
        self.seconds = 0.0  # time spent scoring, for the cost the run reports

    @torch.no_grad()
    def __call__(self, model, tokenizer) -> dict[str, float]:
        from components.suite.report import tracked_figures
        from components.suite.scoring import evaluate_shared, results_of

        started = time.perf_counter()
        was_training = model.training
        model.eval()
        try:
            tables = evaluate_shared(model, self.preprocess, tokenizer, self.tasks, self.params, progress=False)
        finally:
            model.train(was_training)
        figures = tracked_figures(self.tasks, results_of(tables))
        self.seconds += time.perf_counter() - started
        return {f"track/{name}": round(value, 5) for name, value in figures.items()}

