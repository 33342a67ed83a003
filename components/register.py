"""Registration and promotion in the MLflow registry (aliases, never the deprecated stages).

    python -m components.register --params params/registry.yaml               # register → alias challenger
    python -m components.register --params params/registry.yaml --promote challenger   # or a version number
    python -m components.register --publish hub/c2lip [--repo-id OWNER/NAME] [--license apache-2.0]   # for the Hub

Registering logs the train stage's export as an MLflow pyfunc (:mod:`components.shared.pyfunc_model`; the export is
its artifact, so ``models:/c2lip@champion`` loads as open_clip too) and tags the new version with the git
commit, the dvc.lock hash, the method and the evaluate stage's benchmark summary. Promotion moves the
champion alias only when the gates hold against the current champion, and otherwise says which gate
failed and by how much. Publishing writes the folder open_clip's ``push_to_hf_hub`` would — config, safetensors and
the model card completed with the benchmark suite's figures against the base — and uploads it when a repo is given.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from components.shared.atomic import CorruptFileError, atomic_write_bytes
from components.shared.checkpoints import EXPORT_CONFIG
from components.shared.hub import PublishError
from components.shared.model_card import CARD_FILE, SUMMARY_GROUPS, card_facts, card_figures, is_hub_id, model_card, read_front_matter
from components.shared.params import ROOT, ParamsError, RegistryParams, load_params
from components.shared.processes import stage_process_setup
from components.shared.redact import redact
from components.shared.written import Ledger

SUMMARY_KEYS = ("compositional", "zero_shot", "retrieval")
MODEL_CARD_REPORT = "model-card.md"  # the registered version's card, written beside the evaluate stage's report


class RegistryError(ValueError):
    """Registration or promotion that cannot go ahead: says why."""


def _git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def benchmark_summary(params: RegistryParams) -> dict[str, float]:
    """``{compositional, zero_shot, retrieval, ...}`` of ``metrics_model`` from the evaluate stage's metrics."""
    if not params.metrics_path.is_file():
        raise RegistryError(f"{params.metrics_path}: not found; run the evaluate stage first (dvc repro evaluate)")
    metrics = json.loads(params.metrics_path.read_text())
    prefix = f"{params.metrics_model}/summary/"
    summary = {k[len(prefix):]: float(v) for k, v in metrics.items() if k.startswith(prefix)}
    # a suite without zero-shot or retrieval files (your data with SugarCrepe only) still registers: the gates of the
    # groups it has apply at promotion; with none of them the report is not of this model
    if not any(k in summary for k in SUMMARY_KEYS):
        raise RegistryError(f"{params.metrics_path}: none of {[prefix + k for k in SUMMARY_KEYS]}; is metrics_model "
                            f"{params.metrics_model!r} one of the evaluated models?")
    return summary


def register(params: RegistryParams, extra_tags: dict[str, str] | None = None) -> Any:
    """Log the export as a new version of ``model_name``, tag it, give it the challenger alias. Returns the ModelVersion."""
    import mlflow

    from components.shared.pyfunc_model import log_export
    from components.shared.tracking import use_experiment

    if not (params.export_dir / EXPORT_CONFIG).is_file():
        raise RegistryError(f"{params.export_dir}: no open_clip export; run the train stage first")
    summary = benchmark_summary(params)
    lock = ROOT / "dvc.lock"
    method = "unknown"
    if params.train_params.is_file():
        method = (yaml.safe_load(params.train_params.read_text()) or {}).get("method", {}).get("name", "unknown")
    tags = {
        "git_commit": _git_commit(),
        "dvc_lock_sha256": hashlib.sha256(lock.read_bytes()).hexdigest() if lock.is_file() else "none",
        "method": method,
        "benchmark_summary": json.dumps({k: round(v, 5) for k, v in summary.items()}, sort_keys=True),
        **{f"summary.{k}": f"{v:.5f}" for k, v in summary.items()},
        **(extra_tags or {}),
    }
    mlflow_ = use_experiment(params.mlflow_experiment)
    mark_unfinished(mlflow.MlflowClient(), params.model_name)
    with mlflow_.start_run(run_name=f"register-{params.model_name}") as run:
        mlflow_.set_tags({"stage": "register", **{k: v for k, v in tags.items() if len(v) < 5000}})
        mlflow_.log_metrics({f"summary/{k}": v for k, v in summary.items()})
        info = log_export(params.export_dir, registered_model_name=params.model_name)
        card = registry_card(params)
        mlflow_.log_text(card, f"model_card/{CARD_FILE}")
    # the card with its benchmark figures beside the run's report, where a user finds it (the export's own README.md
    # is the train stage's output and keeps the training figures only)
    atomic_write_bytes(params.metrics_path.parent / MODEL_CARD_REPORT, card.encode())
    Ledger(params.metrics_path.parent, "register").record([MODEL_CARD_REPORT])  # what clean-data may remove
    client = mlflow.MlflowClient()
    version = str(info.registered_model_version)
    for key, value in tags.items():
        client.set_model_version_tag(params.model_name, version, key, value)
    # what the MLflow UI shows: the card's summary on the version, what c2lip models are on the registered model
    client.update_model_version(params.model_name, version, description=card_description(card))
    client.update_registered_model(params.model_name, description=REGISTERED_MODEL_DESCRIPTION)
    client.set_registered_model_alias(params.model_name, params.challenger_alias, version)
    print(f"register: {params.model_name} version {version} (run {run.info.run_id}), alias {params.challenger_alias}", file=sys.stderr)
    return client.get_model_version(params.model_name, version)


UNFINISHED_TAG = "c2lip.unfinished"


def mark_unfinished(client, name: str) -> list[str]:
    """Versions a killed registration left (created by a c2lip register run, never given their tags: no
    ``benchmark_summary``) are tagged and described as unfinished, so no one takes them for a candidate; never deleted
    (a registry version is the user's record too). Returns their numbers."""
    from mlflow.exceptions import MlflowException

    try:
        versions = client.search_model_versions(f"name = '{name}'")
    except MlflowException:
        return []
    marked = []
    for version in versions:
        if "benchmark_summary" in version.tags or UNFINISHED_TAG in version.tags or not version.run_id:
            continue
        try:
            run = client.get_run(version.run_id)
        except MlflowException:
            continue
        if run.data.tags.get("stage") != "register":
            continue  # not one of ours
        client.set_model_version_tag(name, version.version, UNFINISHED_TAG, "registration stopped before its tags and alias")
        client.update_model_version(name, version.version, description="Unfinished: the registration that created this "
                                    "version stopped before it was tagged; it is not a candidate. Register again.")
        marked.append(str(version.version))
    if marked:
        print(f"register: {name} version(s) {', '.join(marked)} left by a stopped registration: tagged {UNFINISHED_TAG}, "
              "kept", file=sys.stderr)
    return marked


REGISTERED_MODEL_DESCRIPTION = (
    "Contrastive vision–language models (open_clip) fine-tuned by c2lip for compositional understanding — C2LIP's "
    "noun-phrase concept losses and cross-attention pooling, or a sibling method — on ShapesWorld by default. Each "
    "version's description is its model card's summary (the full card is the run's `model_card/README.md` artifact); "
    "its tags hold the git commit, the dvc.lock hash, the method and the benchmark summary. Load a version with "
    "`mlflow.pyfunc.load_model('models:/<name>@champion')` (embeddings), or as open_clip from its `export` artifact "
    "(`open_clip.create_model_and_transforms('local-dir:<artifact>/export')`). Promotion moves the `champion` alias "
    "only when the gates of params/registry.yaml hold.")


def registry_card(params: RegistryParams, repo_id: str | None = None, license: str = "other") -> str:
    """The export's model card completed with the evaluate stage's summary against the base (reports/metrics.json)."""
    train = load_params("train", params.train_params)
    card_path = params.export_dir / CARD_FILE
    train_figures = card_figures(read_front_matter(card_path)) if card_path.is_file() else {}
    model = benchmark_summary(params)  # names a missing metrics file before it is read
    metrics = json.loads(params.metrics_path.read_text())
    base = {k[len("base/summary/"):]: float(v) for k, v in metrics.items() if k.startswith("base/summary/")}
    summary = {k: (base[k], model[k]) for k in SUMMARY_GROUPS if k in base and k in model}
    return model_card(card_facts(train), train_figures, summary, name=params.model_name, repo_id=repo_id, license=license)


def publish(params: RegistryParams, out: Path, repo_id: str | None = None, license: str = "other", private: bool = True, api=None) -> str:
    """The Hub folder of ``params.export_dir`` at ``out`` (card: :func:`registry_card`), uploaded to ``repo_id`` when
    given; returns where it went."""
    from components.shared.hub import hub_folder, upload

    if repo_id is not None and not is_hub_id(repo_id):
        raise RegistryError(f"--repo-id {repo_id!r}: not a Hub repository id (owner/name)")  # before any work
    folder = hub_folder(params.export_dir, registry_card(params, repo_id, license), out)
    return upload(folder, repo_id, private, api) if repo_id else str(folder)


def card_description(card: str) -> str:
    """The card's title, summary paragraph and benchmark table: the version's description in the MLflow UI."""
    body = card.split("\n---\n", 1)[-1].strip()
    sections = body.split("\n## ")
    keep = [sections[0]] + [f"## {s}" for s in sections[1:] if s.startswith(("Model details", "Training", "Evaluation"))]
    return "\n\n".join(part.strip() for part in keep)


@dataclass
class Gate:
    name: str
    value: float
    required: float

    @property
    def ok(self) -> bool:
        return self.value >= self.required

    def line(self) -> str:
        if self.value == float("-inf"):
            return f"{self.name}: not measured on this version (the champion's gives {self.required:.4f} to reach) — FAILS"
        verdict = "passes" if self.ok else f"FAILS by {self.required - self.value:.4f}"
        return f"{self.name}: {self.value:.4f} vs required {self.required:.4f} — {verdict}"


@dataclass
class Promotion:
    promoted: bool
    version: str
    champion_before: str | None
    gates: list[Gate]
    message: str

    def markdown(self) -> str:
        rows = "\n".join(f"| {g.name} | {'not measured' if g.value == float('-inf') else f'{g.value:.4f}'} | {g.required:.4f} | "
                         f"{'yes' if g.ok else 'no'} |" for g in self.gates)
        table = f"\n\n| gate | candidate | required | holds |\n|---|---|---|---|\n{rows}" if self.gates else ""
        return f"**{self.message}**{table}\n"


class PromotionRefused(RegistryError):
    def __init__(self, promotion: Promotion):
        super().__init__(promotion.message)
        self.promotion = promotion


def _summary_of(version) -> dict[str, float]:
    """The gate groups the version was measured on (its summary.* tags)."""
    out = {key: float(version.tags[f"summary.{key}"]) for key in SUMMARY_KEYS if f"summary.{key}" in version.tags}
    if not out:
        raise RegistryError(f"version {version.version} of {version.name} has no tag summary.* of {list(SUMMARY_KEYS)} (not registered by c2lip?)")
    return out


def promote(params: RegistryParams, candidate: str = "challenger") -> Promotion:
    """Move the champion alias to ``candidate`` (an alias or a version number) if the gates hold; raises
    :class:`PromotionRefused` (whose message names each failed gate and by how much) otherwise."""
    import mlflow
    from mlflow.exceptions import MlflowException

    from components.shared.tracking import default_tracking_uri

    mlflow.set_tracking_uri(default_tracking_uri())
    client = mlflow.MlflowClient()
    try:
        version = (client.get_model_version(params.model_name, candidate) if candidate.isdigit()
                   else client.get_model_version_by_alias(params.model_name, candidate))
    except MlflowException as err:
        raise RegistryError(f"{params.model_name}: no version {candidate!r} ({err.message})") from None
    if "benchmark_summary" not in version.tags:  # a stopped registration's version: never a champion
        raise RegistryError(f"{params.model_name}: version {version.version} was never finished by a registration (no "
                            "benchmark_summary tag); register the model again and promote that version")
    try:
        champion = client.get_model_version_by_alias(params.model_name, params.champion_alias)
    except MlflowException:
        champion = None
    number = str(version.version)
    if champion is None:
        client.set_registered_model_alias(params.model_name, params.champion_alias, number)
        return Promotion(True, number, None, [], f"version {number} is the first {params.champion_alias} of {params.model_name}")
    if str(champion.version) == number:
        return Promotion(False, number, number, [], f"version {number} already is the {params.champion_alias}")
    mine, theirs = _summary_of(version), _summary_of(champion)
    g = params.gates
    allowance = {"compositional": g.compositional_margin, "zero_shot": -g.zero_shot_tolerance, "retrieval": -g.retrieval_tolerance}
    # a gate compares what both versions were measured on; a group the champion has and the candidate lacks fails (-inf:
    # not shown to hold); one neither has is not a gate
    gates = [Gate(key, mine.get(key, float("-inf")), theirs[key] + allowance[key]) for key in SUMMARY_KEYS if key in theirs]
    failed = [x for x in gates if not x.ok]
    if failed:
        promotion = Promotion(False, number, str(champion.version), gates,
                              f"version {number} not promoted over {params.champion_alias} version {champion.version}: "
                              + "; ".join(x.line() for x in failed))
        raise PromotionRefused(promotion)
    client.set_registered_model_alias(params.model_name, params.champion_alias, number)
    return Promotion(True, number, str(champion.version), gates,
                     f"version {number} is the new {params.champion_alias} (was version {champion.version})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", default=None, help="params YAML (default: params/registry.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one value of the params file, a dotted key and a YAML value (table.path=data/sources/x.csv); repeatable")
    parser.add_argument("--promote", metavar="VERSION_OR_ALIAS", default=None, help="promote instead of register")
    parser.add_argument("--publish", metavar="FOLDER", type=Path, default=None,
                        help="instead of registering: write the export as a Hugging Face Hub model folder (config, safetensors, "
                             "model card with the benchmark figures) into FOLDER")
    parser.add_argument("--repo-id", default=None, help="with --publish: upload FOLDER to this Hub model repository (OWNER/NAME; "
                        "token: HF_TOKEN or `hf auth login`)")
    parser.add_argument("--license", default="other", help="with --publish: the card's licence, an SPDX id such as apache-2.0 "
                        "(default: other, unspecified)")
    parser.add_argument("--public", action="store_true", help="with --repo-id: create the repository public (default: private)")
    args = parser.parse_args(argv)
    stage_process_setup()  # its workers die with it; inside a flow run, it dies with the run
    try:
        params = load_params("registry", args.params, args.overrides)
        if args.publish is not None:
            print(f"published: {publish(params, args.publish, args.repo_id, args.license, private=not args.public)}")
        elif args.promote:
            result = promote(params, args.promote)
            print(result.message)
        else:
            version = register(params)
            print(json.dumps({"model": params.model_name, "version": str(version.version), "aliases": list(version.aliases)}))
    except (ParamsError, RegistryError, PublishError, CorruptFileError) as err:
        print(f"error: {redact(str(err))}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
