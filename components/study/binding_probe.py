"""Where binding is lost: probes of a model's frozen towers on ShapesWorld.

    python -m components.study.binding_probe --model base=models/base/export --model tuned=models/train/export \\
        [--out reports/binding-probe] [--scenes 6000] [--shape circle]

Image side, "which colour is the <shape>?": a linear probe (logistic regression) on frozen image features of the
world's test scenes that hold exactly one such shape and at least one object of another colour — on the pooled
embedding (what every benchmark scores) and on the spatial token features before pooling (each position through the
pooling layer's value path, concatenated in grid order). A representation that keeps only the bag of colours and
shapes can do no better than guess among the colours present (the "bag-of-colours" figure); one that keeps which
colour is where can do better. A control probe asks "is colour c in the picture?" of the pooled embedding.

Text side, on the suite's SugarCrepe++ swap_att items: the cosine of a caption with its attribute swap (1.0: the
text tower cannot tell them apart) and with its paraphrase, and the share of items whose paraphrase is nearer than
the swap (SugarCrepe++'s text-only TOT).

Writes ``probe.json`` and ``probe.md`` under ``--out``. Probes are fit on 70% of the scenes and scored on the rest
(seeded split); every model sees the same scenes and split.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from components.shared.atomic import atomic_write_bytes, atomic_write_json

TRAIN_SHARE = 0.7


def probe_scenes(count: int, shape: str, captions_params: Path) -> tuple[list, np.ndarray, np.ndarray, list[str]]:
    """(images, label: the colour index of the one ``shape``, colours present [N, colours] 0/1, colour names) of the
    first ``count`` test scenes that hold exactly one ``shape`` and another object of another colour."""
    from components.data import shapesworld
    from components.shared.params import load_params

    captions = load_params("captions", captions_params)
    world, seed = captions.shapesworld, captions.seed
    colors = list(world.colors)
    if shape not in world.shapes:
        raise ValueError(f"--shape {shape!r} is not a shape of the world ({', '.join(world.shapes)})")
    held_out = shapesworld.held_out_pairs(world, seed)
    images, labels, present = [], [], []
    for index in range(world.test_images):
        scene = shapesworld.sample_scene(world, seed, "test", index, held_out)
        objects = scene["objects"]
        targets = [o for o in objects if o.shape == shape]
        if len(targets) != 1 or not any(o.color != targets[0].color for o in objects):
            continue
        images.append(shapesworld.render(world, scene))
        labels.append(colors.index(targets[0].color))
        present.append([float(any(o.color == c for o in objects)) for c in colors])
        if len(images) == count:
            break
    return images, np.array(labels), np.array(present), colors


@torch.no_grad()
def image_features(model, preprocess, images: list, batch: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """(pooled [N, D], spatial tokens flattened [N, J*D]) of the frozen image tower, L2-normalised per vector."""
    from components.method.models import image_features_and_tokens
    from components.shared.devices import to_model

    pooled, tokens = [], []
    for start in range(0, len(images), batch):
        x = torch.stack([preprocess(im) for im in images[start:start + batch]])
        p, t = image_features_and_tokens(model, to_model(x, model))
        pooled.append(torch.nn.functional.normalize(p.float(), dim=-1).cpu())
        tokens.append(torch.nn.functional.normalize(t.float(), dim=-1).flatten(1).cpu())
    return torch.cat(pooled).numpy(), torch.cat(tokens).numpy()


def fit_probe(features: np.ndarray, labels: np.ndarray, train: np.ndarray) -> float:
    """Held-out accuracy of a multinomial logistic regression on standardised features."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=3000, C=1.0))
    probe.fit(features[train], labels[train])
    return float((probe.predict(features[~train]) == labels[~train]).mean())


def control_probe(features: np.ndarray, present: np.ndarray, train: np.ndarray) -> float:
    """Mean held-out accuracy over colours of "is this colour in the picture?"."""
    return float(np.mean([fit_probe(features, present[:, c].astype(int), train) for c in range(present.shape[1])]))


def text_side(model, tokenizer, suite_file: Path) -> dict[str, float]:
    """Cosines of caption with swap and with paraphrase on SugarCrepe++ swap_att items, and the TOT share."""
    from components.suite.scoring import encode_texts

    items = json.loads(suite_file.read_text())
    c, p, s = (encode_texts(model, tokenizer, [item[k] for item in items], 256, k, progress=False)
               for k in ("caption", "caption2", "negative_caption"))
    cs, cp, ps = (c * s).sum(-1), (c * p).sum(-1), (p * s).sum(-1)
    return {"cos_caption_swap": float(cs.mean()), "cos_caption_paraphrase": float(cp.mean()),
            "text_only_tot": float(((cp > cs) & (cp > ps)).float().mean()), "items": float(len(items))}


MIN_SCENES = 10


def run(models: dict[str, str], out: Path, scenes: int, shape: str, seed: int, captions_params: Path, suite_file: Path,
        device: str = "auto") -> dict:
    from components.shared.params import EvalModelSpec
    from components.suite.model_loading import load_model, resolve_model

    if scenes < 1:
        raise ValueError(f"--scenes {scenes}: the probe needs a positive number of scenes")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: a file, not a folder (probe.json and probe.md are written into it)")
    images, labels, present, colors = probe_scenes(scenes, shape, captions_params)
    train = np.random.default_rng(seed).random(len(labels)) < TRAIN_SHARE
    test = ~train
    if len(labels) < MIN_SCENES or len(set(labels[train].tolist())) < 2 or not test.any():
        raise ValueError(f"{captions_params}: {len(labels)} test scene(s) hold exactly one {shape} and another object of another "
                         f"colour (first {scenes} asked); a probe needs at least {MIN_SCENES}, with two colours among the fitted "
                         "ones: give the world more test images or objects per scene, or probe another --shape")
    bag = float(np.mean(1.0 / present[test].sum(axis=1)))  # guessing among the colours present
    result = {"scenes": len(labels), "shape": shape, "colors": colors, "bag_of_colours_accuracy": round(bag, 4),
              "majority_accuracy": round(float(np.bincount(labels[test]).max() / test.sum()), 4), "models": {}}
    for name, uri in models.items():
        spec = EvalModelSpec(name=name, uri=uri) if Path(uri).is_dir() else EvalModelSpec(name=name, uri=uri, arch="c2lip-tiny-rn")
        model, preprocess, tokenizer = load_model(*resolve_model(spec, out / "downloads"), spec, device)
        pooled, tokens = image_features(model, preprocess, images)
        figures = {"which_colour_pooled": fit_probe(pooled, labels, train), "which_colour_tokens": fit_probe(tokens, labels, train),
                   "colour_present_pooled": control_probe(pooled, present, train), **text_side(model, tokenizer, suite_file)}
        result["models"][name] = {k: round(v, 4) for k, v in figures.items()}
        print(f"binding probe: {name}: {result['models'][name]}", file=sys.stderr)
    atomic_write_json(out / "probe.json", result)
    atomic_write_bytes(out / "probe.md", markdown(result).encode())
    return result


def markdown(result: dict) -> str:
    shape = result["shape"]
    lines = [f"# Binding probe: which colour is the {shape}?", "",
             f"{result['scenes']} ShapesWorld test scenes with one {shape} and another object of another colour; linear probes "
             f"fit on 70%, scored on 30%. Guessing among the colours present: {result['bag_of_colours_accuracy']:.3f}; the most "
             f"frequent colour: {result['majority_accuracy']:.3f}. Text side: SugarCrepe++ swap_att captions.", "",
             f"| model | which colour is the {shape}: pooled | … spatial tokens | colour present (pooled) | cos(caption, swap) | "
             "cos(caption, paraphrase) | text-only TOT |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, m in result["models"].items():
        lines.append(f"| {name} | {m['which_colour_pooled']:.3f} | {m['which_colour_tokens']:.3f} | {m['colour_present_pooled']:.3f} | "
                     f"{m['cos_caption_swap']:.3f} | {m['cos_caption_paraphrase']:.3f} | {m['text_only_tot']:.3f} |")
    return "\n".join(lines) + "\n"


def named_models(parser: argparse.ArgumentParser, items: list[str]) -> dict[str, str]:
    """The study tools' repeated ``--model NAME=PATH`` as {name: path}; a malformed or repeated name is a usage error."""
    models: dict[str, str] = {}
    for item in items:
        name, sep, uri = item.partition("=")
        if not sep or not name or not uri:
            parser.error(f"--model {item!r}: expected NAME=PATH")
        if name in models:
            parser.error(f"--model {item!r}: the name {name!r} is given twice (each model needs its own name)")
        models[name] = uri
    return models


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", action="append", required=True, metavar="NAME=PATH",
                        help="an export folder or a checkpoint file of c2lip-tiny-rn (repeat for several)")
    parser.add_argument("--out", type=Path, default=Path("reports/binding-probe"))
    parser.add_argument("--scenes", type=int, default=6000, help="probe scenes (at most the world's test images that qualify)")
    parser.add_argument("--shape", default="circle")
    parser.add_argument("--seed", type=int, default=0, help="seed of the 70/30 split")
    parser.add_argument("--captions-params", type=Path, default=Path("params/captions.yaml"), help="the world the scenes come from")
    parser.add_argument("--suite-file", type=Path, default=Path("data/benchmarks/shapesworld/sugar_crepe_pp/swap_att.json"))
    parser.add_argument("--device", default="auto", help="where the models run: auto (a GPU when present), cpu, cuda or cuda:N")
    args = parser.parse_args(argv)
    models = named_models(parser, args.model)
    try:
        result = run(models, args.out, args.scenes, args.shape, args.seed, args.captions_params, args.suite_file, args.device)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
