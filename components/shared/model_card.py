"""Model cards: a README.md in the Hugging Face model-card format (YAML front matter + markdown body) for every export.

The train stage writes one into each export folder with what it knows — the architecture, the start, the method and
its recipe, the data and samples seen, its own zero-shot check — and the register stage completes it with the
benchmark suite's summary against the base, logs it with the registered version and sets its summary as the
version's MLflow description. Pure functions of params and figures (no timings: a rebuilt export is identical).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from components.shared.markdown_text import md_literal, md_text

CARD_FILE = "README.md"

# The train stage's own figures that go into the card (metrics/train.json names → what the card calls them)
TRAIN_FIGURES = {
    "zero_shot_top1": "zero-shot top-1 (ShapesWorld single-object test images)",
    "zero_shot_top1_held_out_pairs": "zero-shot top-1 on held-out (colour, shape) pairs",
    "zero_shot_top1_seen_pairs": "zero-shot top-1 on seen pairs",
}
# The evaluate stage's summary groups that go into the registered card (reports/metrics.json <model>/summary/<group>)
SUMMARY_GROUPS = {
    "binding": "binding (SugarCrepe swap_att, SugarCrepe++ swap_att, Winoground group)",
    "compositional": "compositional (mean of the compositional benchmarks)",
    "zero_shot": "zero-shot top-1",
    "retrieval": "retrieval mean R@1",
    "long_retrieval": "long-caption retrieval mean R@1",
}

# The whole suite's figures a card can list (a compare run's done.json / the evaluate stage's keys → what the card calls them)
SUITE_FIGURES = {
    "sugarcrepe/swap_att/acc": "SugarCrepe swap_att",
    "sugarcrepe/swap_obj/acc": "SugarCrepe swap_obj",
    "sugarcrepe/replace_att/acc": "SugarCrepe replace_att",
    "sugarcrepe_pp/swap_att/itt": "SugarCrepe++ swap_att (ITT)",
    "sugarcrepe_pp/swap_obj/itt": "SugarCrepe++ swap_obj (ITT)",
    "aro/vg_relation/macro_acc": "ARO VG-Relation",
    "aro/vg_attribution/macro_acc": "ARO VG-Attribution",
    "summary/binding": SUMMARY_GROUPS["binding"],
    "zero_shot/top1": "zero-shot top-1",
    "summary/retrieval": SUMMARY_GROUPS["retrieval"],
}


def card_facts(params) -> dict[str, Any]:
    """What a card says about the training run, from its TrainParams: the model, the start, the method and recipe,
    the data and the samples it saw."""
    method = params.method
    facts = {
        "architecture": params.model.name,
        "text_tower": params.model.text_tower.hf_model_name if params.model.text_tower else None,
        "init": str(params.model.init),
        "method": method.name,
        "contrastive": method.contrastive,
        "lambda_npc": method.lambda_npc if method.name.startswith("c2lip") else None,
        "lambda_xac": method.lambda_xac if method.name.startswith("c2lip") else None,
        "lr": params.optim.lr,
        "warmup_steps": params.optim.warmup_steps,
        "weight_decay": params.optim.weight_decay,
        "steps": params.steps,
        "global_batch": params.global_batch,
        "samples_seen": params.steps * params.global_batch,
        "seed": params.seed,
        "shards": list(params.data.shards),
        "caption_field": _named_caption(params.data.caption_field),
        "export_dtype": params.export_dtype,
    }
    return {k: v for k, v in facts.items() if v is not None}


def _named_caption(field: str | list[str]) -> str | list[str]:
    """``txt`` is the caption the captions stage chose: the card says which (``txt (long)``), as params/captions.yaml does."""
    if field != "txt":
        return field
    try:
        from components.shared.params import load_params

        return f"txt ({load_params('captions').caption_field})"
    except Exception:  # noqa: BLE001 - no readable captions params here: the field as the train params name it
        return field


def _result(name: str, value: float, dataset: str, task: str) -> dict[str, Any]:
    return {"task": {"type": task}, "dataset": {"name": dataset, "type": dataset.lower().replace(" ", "-")},
            "metrics": [{"type": "accuracy" if "top-1" in name or "binding" in name or "compositional" in name else "recall",
                         "name": name, "value": round(float(value), 5)}]}


def is_hub_id(name: str) -> bool:
    """``owner/name`` as the Hub accepts it (huggingface_hub's own check: its characters, no ``..`` or ``--``, at most
    96 characters, nothing after the name), the owner required."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not isinstance(name, str) or name.count("/") != 1:
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def hub_base_model(init: str) -> str | None:
    """The Hub id of the start, when it is one (``hf-hub:org/name`` or ``org/name``); a local path or ``scratch`` has
    none, and the Hub's ``base_model`` field takes only ids."""
    name = init[len("hf-hub:"):] if init.startswith("hf-hub:") else init
    if init.startswith("hf-hub:") or (is_hub_id(name) and not Path(name).exists() and name.split("/")[0] not in ("models", "data")):
        return name if is_hub_id(name) else None
    return None


def model_card(facts: dict[str, Any], train_figures: dict[str, float] | None = None,
               summary: dict[str, tuple[float, float]] | None = None, name: str = "c2lip", repo_id: str | None = None,
               license: str = "other", suite: dict[str, float] | None = None) -> str:
    """The card's text, in the layout of open_clip's cards on the Hub (model details, uses, training, evaluation, how
    to load it, citation). ``train_figures``: the train stage's metrics (metrics/train.json); ``summary``: group →
    (base, this model) from the evaluate stage, when the model has been through the benchmark suite; ``suite``: the
    model's own figures on the whole suite (:data:`SUITE_FIGURES` keys), for a model with no base to compare with;
    ``repo_id``: the Hub repository it is published to (its ``hf-hub:`` line); ``license``: an SPDX id, or ``other``."""
    train_figures = {k: v for k, v in (train_figures or {}).items() if k in TRAIN_FIGURES}
    summary = {k: v for k, v in (summary or {}).items() if k in SUMMARY_GROUPS}
    suite = {k: v for k, v in (suite or {}).items() if k in SUITE_FIGURES}
    results = [_result(TRAIN_FIGURES[k], v, "ShapesWorld test", "zero-shot-image-classification") for k, v in train_figures.items()]
    results += [_result(SUMMARY_GROUPS[k], model, "ShapesWorld benchmark suite", "zero-shot-image-classification")
                for k, (_, model) in summary.items()]
    front: dict[str, Any] = {"library_name": "open_clip", "license": license}
    if license == "other":  # the Hub asks a name and a link for a licence that is not an SPDX id
        front.update(license_name="unspecified", license_link="README.md")
    front.update({
        "tags": list(dict.fromkeys(["clip", "siglip", "compositionality", "c2lip", facts["method"], "zero-shot-image-classification"])),
        "pipeline_tag": "zero-shot-image-classification",
    })
    if (base := hub_base_model(facts["init"])) is not None:
        front["base_model"] = base
    front["model-index"] = [{"name": name, "results": results}]
    method = facts["method"]
    lambdas = f" (λ_npc = {facts['lambda_npc']}, λ_xac = {facts['lambda_xac']})" if "lambda_npc" in facts else ""
    where = f"hf-hub:{repo_id}" if repo_id else "local-dir:<this folder>"
    lines = [
        "---", yaml.safe_dump(front, sort_keys=False, allow_unicode=True).strip(), "---", "",
        f"# {md_text(name)}: {md_text(facts['architecture'])} fine-tuned with {md_text(method)}", "",
        summary_paragraph(facts, summary), "",
        "## Model details", "",
        "| what | value |", "|---|---|",
        f"| architecture | {md_literal(facts['architecture'])}"
        + (f" with the Hugging Face text tower {md_literal(facts['text_tower'])}" if "text_tower" in facts else "") + " (open_clip) |",
        f"| started from | {md_literal(facts['init'])} |",
        f"| method | {md_literal(method)}{lambdas}, {md_text(facts['contrastive'])} contrastive loss |",
        f"| weights | `{facts['export_dtype']}` safetensors |",
        f"| licence | {md_text(license) if license != 'other' else 'not specified by whoever trained it: ask them before reuse'} |", "",
        "## Uses", "",
        "A research model for studying compositional binding in contrastive vision–language training. Trained on",
        "ShapesWorld, a synthetic world of coloured shapes: its figures say how a method changes binding, composition,",
        "zero-shot and retrieval *in that world* under this recipe, with one seed unless the comparison says otherwise;",
        "they say nothing about natural images, and the model is not meant for any use beyond that research.", "",
        "## Training", "",
        "| what | value |", "|---|---|",
        f"| recipe | AdamW lr {facts['lr']:g}, weight decay {facts['weight_decay']:g}, {facts['warmup_steps']} warm-up steps then cosine, "
        f"{facts['steps']} steps of {facts['global_batch']}, seed {facts['seed']} |",
        f"| data | {', '.join(md_literal(s) for s in facts['shards'])}, caption field {md_literal(facts['caption_field'])} |",
        f"| samples seen | {facts['samples_seen']:,} |", "",
        "## Evaluation", "",
    ]
    if train_figures:
        lines += ["The train stage's own check:", "", "| figure | value |", "|---|---|"]
        lines += [f"| {TRAIN_FIGURES[k]} | {v:.3f} |" for k, v in train_figures.items()] + [""]
    if summary:
        lines += ["### Benchmarks against the base", "",
                  "The benchmark suite (SugarCrepe, SugarCrepe++, ARO, Winoground-style pairs, zero-shot, retrieval, in their",
                  "official formats) on ShapesWorld's held-out test images, this model beside the model it started from:", "",
                  "| group | base | this model | Δ |", "|---|---|---|---|"]
        lines += [f"| {SUMMARY_GROUPS[k]} | {b:.3f} | {m:.3f} | {m - b:+.3f} |" for k, (b, m) in summary.items()] + [""]
    if suite:
        lines += ["### The benchmark suite", "",
                  "The benchmark suite (SugarCrepe, SugarCrepe++, ARO, zero-shot, retrieval, in their official formats) on",
                  "ShapesWorld's held-out test images; chance is 0.5 for SugarCrepe and ARO:", "",
                  "| figure | value |", "|---|---|"]
        lines += [f"| {SUITE_FIGURES[k]} | {v:.3f} |" for k, v in suite.items()] + [""]
    if not train_figures and not summary and not suite:
        lines += ["Not evaluated yet: the register stage adds the benchmark suite's figures against the base.", ""]
    lines += [
        "## How to load it", "",
        "Plain open_clip loads it (no other package needed):", "",
        "```python",
        "import open_clip",
        f'model, _, preprocess = open_clip.create_model_and_transforms("{where}")',
        f'tokenizer = open_clip.get_tokenizer("{where}")',
        "```", "",
        "A version in c2lip's MLflow registry loads the same way from its `export` artifact, or as an MLflow pyfunc that",
        'embeds images or texts: `mlflow.pyfunc.load_model("models:/c2lip/1")` (a version number, or an alias the registry',
        "set: `challenger` after registration, `champion` after a promotion).", "",
        "## Citation", "",
        "The method: C2LIP (CVPR 2026), noun-phrase concept losses and cross-attention pooling for compositional",
        "contrastive fine-tuning. The models and training code: OpenCLIP (Ilharco et al., 2021, doi:10.5281/zenodo.5143773).",
        "",
    ]
    return "\n".join(lines)


def summary_paragraph(facts: dict[str, Any], summary: dict[str, tuple[float, float]] | None) -> str:
    """Two sentences: what the model is, and (when benchmarked) how it moved against its base."""
    text = (f"{md_literal(facts['architecture'])} started from {md_literal(facts['init'])} and fine-tuned with "
            f"{md_literal(facts['method'])} for {facts['samples_seen']:,} samples ({facts['steps']} steps of {facts['global_batch']}) on the "
            f"{md_literal(facts['caption_field'])} captions.")
    if summary:
        moved = ", ".join(f"{k} {b:.3f} → {m:.3f}" for k, (b, m) in summary.items())
        text += f" Against its base on the benchmark suite: {moved}."
    return text


def read_front_matter(path: Path) -> dict[str, Any]:
    """A card's YAML front matter ({} when the file has none)."""
    text = Path(path).read_text()
    if not text.startswith("---\n"):
        return {}
    return yaml.safe_load(text[4:text.index("\n---", 4)]) or {}


def card_figures(front: dict[str, Any]) -> dict[str, float]:
    """The train stage's figures back from a card's model-index (metric name → value, the TRAIN_FIGURES keys)."""
    by_name = {v: k for k, v in TRAIN_FIGURES.items()}
    out = {}
    for index in front.get("model-index", []):
        for result in index.get("results", []):
            for metric in result.get("metrics", []):
                if metric.get("name") in by_name:
                    out[by_name[metric["name"]]] = metric["value"]
    return out
