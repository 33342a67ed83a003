"""Ship one build of a base as the committed base a user and every preset start from: its fp16 export copied into
``--to`` (the layout of ``models/base/export``) with a model card that gives its recipe, its build seed and its own
figures on the whole benchmark suite.

    python -m components.study.ship_base --build models/calibrated-builds-candidate/share0.75-4000/seed1 \\
        --to models/base-calibrated/export

``--build`` is one run of a comparison (``<output_dir>/<arm>/seed<N>``): the comparison wrote its train params
(``train.yaml``), its export (``train/export``), the train stage's figures (``train_metrics.json``) and its figures on
the whole suite (``done.json``). The new folder is written beside ``--to`` and swapped in whole, so a reader (a
training run starting from it) never sees half of either, and a stopped copy leaves the old export as it was.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from components.shared.atomic import CorruptFileError, atomic_write_bytes, write_checksums
from components.shared.checkpoints import EXPORT_CONFIG, EXPORT_WEIGHTS, check_export
from components.shared.model_card import CARD_FILE, SUITE_FIGURES, card_facts, model_card
from components.shared.params import ParamsError, load_params
from components.shared.written import ForeignFilesError, check_replaceable, replace_folder


def build_files(build: Path) -> tuple[Path, Path, Path, Path]:
    """The build's train params, export, train figures and suite figures; a missing one is named with what makes it."""
    files = (build / "train.yaml", build / "train" / "export", build / "train_metrics.json", build / "done.json")
    for path in files:
        if not path.exists():
            raise FileNotFoundError(f"{path}: missing — not a finished comparison run (its comparison writes it; "
                                    "run the comparison to the end first)")
    return files


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except ValueError as err:
        raise CorruptFileError(f"{path}: not JSON ({err})") from None
    if not isinstance(data, dict):
        raise CorruptFileError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def ship(build: Path, to: Path, name: str = "c2lip calibrated base") -> dict[str, float]:
    """Copy ``build``'s export into ``to`` with its card; returns the suite figures the card gives."""
    check_replaceable(Path(to), "ship_base --to")  # before any work: only an export of ours is replaced
    params_path, export, train_path, done_path = build_files(Path(build))
    check_export(export)  # a damaged build is named here, never shipped
    train = load_params("train", params_path)
    train_figures = read_json(train_path)
    suite_figures = read_json(done_path).get("metrics", {})
    suite = {k: suite_figures[k] for k in SUITE_FIGURES if k in suite_figures}
    if "sugarcrepe/swap_att/acc" not in suite or "zero_shot/top1" not in suite:
        raise CorruptFileError(f"{done_path}: has no SugarCrepe swap_att or zero-shot figure (a run of another suite)")
    to = Path(to)
    to.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{to.name}.c2lip-new-", dir=to.parent))
    try:
        for file in (EXPORT_CONFIG, EXPORT_WEIGHTS):
            shutil.copy2(export / file, staging / file)
        card = model_card(card_facts(train), {k: round(v, 5) for k, v in train_figures.items()}, name=name, suite=suite)
        atomic_write_bytes(staging / CARD_FILE, card.encode())
        write_checksums(staging)
        check_export(staging)
        replace_folder(staging, to, "ship_base --to")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return suite


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", type=Path, required=True, help="a finished comparison run: <output_dir>/<arm>/seed<N>")
    parser.add_argument("--to", type=Path, required=True, help="the export folder to write: new, empty, or an export of "
                        "c2lip's (every file its _checksums.json lists, unchanged), which is replaced whole")
    parser.add_argument("--name", default="c2lip calibrated base", help="the model's name on its card")
    args = parser.parse_args(argv)
    try:
        suite = ship(args.build, args.to, args.name)
    except (FileNotFoundError, CorruptFileError, ParamsError, ForeignFilesError) as err:
        print(f"ship_base: {err}", file=sys.stderr)
        return 1
    figures = ", ".join(f"{SUITE_FIGURES[k]} {v:.3f}" for k, v in suite.items() if k in ("sugarcrepe/swap_att/acc", "zero_shot/top1"))
    print(f"ship_base: {args.build} → {args.to} ({figures}); card {args.to / CARD_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
