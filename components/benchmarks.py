"""The benchmarks stage: ShapesWorld's benchmark suite, written in the official file formats.

    python -m components.benchmarks [--params params/benchmarks.yaml]

From the held-out test split of the world in ``params/captions.yaml`` (the same images, rebuilt from
(seed, split, index)), it writes under ``output_dir``:

  images/                     test_NNNNNN.jpg, plus wino_NNNNNN_{color,position}.jpg (Winoground partners)
  sugar_crepe/<subset>.json   SugarCrepe: dict "0".. → {filename, caption, negative_caption}
  sugar_crepe_pp/<subset>.json  SugarCrepe++: list of {id, filename, caption, caption2, negative_caption}
  hard_positives/{data,swapped_data}/<file>   the release's layout and file names (vl_checklist_attributes,
                              vl_checklist_relations, visual_genome_attribution .json): aligned lists of
                              {image_id, true_caption, false_caption, image_path}, (c, c_n) under data/ and
                              (c_p, c_n) under swapped_data/; c_p replaces the size words (replace_att) or the
                              relation (replace_rel) by synonyms, or reorders the caption ("X left of Y" →
                              "Y right of X", swap; whole images: a reordered caption names every object)
  aro/visual_genome_{relation,attribution}.json   ARO with bboxes (the two objects' union box)
  winoground/examples.jsonl   {id, caption_0, caption_1, image_0, image_1, tag}
  zero_shot/<color>_<shape>/  single-object images by class; classnames.txt, held_out_classes.txt
  retrieval/karpathy_test.json  Karpathy format (short, long and a relational caption per image);
  long_captions/docci_descriptions.jsonlines  DOCCI format (one long description per image: every fact of the scene);
                              ARO's order benchmark reads it too
  stats.json                  item counts

Every item also carries ``held_out``: it names or shows a (color, shape) pair never drawn in training, so
generalisation to unseen combinations is reported apart. Every caption is checked with the world's
exact rules (:mod:`components.data.shapesworld_rules`): positives hold, negatives do not.
The whole folder is built under a temporary name and renamed into place, so it is complete or absent.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from components.shared.owned_outputs import BUILD_MARKER
from components.shared.params import BenchmarksParams, ParamsError, load_params
from components.shared.processes import stage_process_setup
from components.shared.written import ForeignFilesError, Ledger, check_replaceable, files_under, place_of, replace_folder
from components.suite.shapesworld_suite import build_suite

SUITE_MARKER = ".c2lip-benchmarks-suite"  # in every suite this stage writes: the one kind of folder it may replace


def check_output_dir(out: Path) -> Path:
    """``out`` resolved, if the stage may write it: a new or empty folder, or a suite it wrote before (its marker).
    Anything else — a user's folder, ``data/``, the workspace itself — is refused, since writing the suite
    replaces the folder as a whole."""
    resolved = Path(out).resolve()
    if not resolved.name or Path.cwd().resolve().is_relative_to(resolved):
        raise ParamsError(f"output_dir: {out} is the working folder or one of its parents; name a folder of its own "
                          "(default data/benchmarks/shapesworld)")
    if resolved.exists() and not resolved.is_dir():
        raise ParamsError(f"output_dir: {out} is a file, not a folder")
    try:
        check_replaceable(resolved, "benchmarks")  # only what the stage recorded writing there, unchanged
    except ForeignFilesError as err:
        raise ParamsError(f"output_dir: {err}") from None
    return resolved


def remove_own_leftovers(out: Path) -> None:
    """What a killed run left beside ``out``: its build folders (marker inside) and old suites (the suite marker)."""
    for entry in out.parent.glob(f".{out.name}.c2lip-*-*"):
        if entry.is_dir() and not entry.is_symlink() and any((entry / m).is_file() for m in (BUILD_MARKER, SUITE_MARKER)):
            shutil.rmtree(entry)
        elif entry.is_dir() and not entry.is_symlink() and not any(entry.iterdir()):
            entry.rmdir()


def run(params: BenchmarksParams) -> dict[str, Any]:
    out = check_output_dir(params.output_dir)  # before any work: nothing of a user's is ever replaced
    captions = load_params("captions", params.captions_params)
    if captions.source != "shapesworld":
        print(f"benchmarks: {params.captions_params} trains on {captions.source!r}; the ShapesWorld suite is "
              "built from its shapesworld section all the same", file=sys.stderr)
    started = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_own_leftovers(out)
    # temporary and old folders are the stage's own: unique hidden names holding a marker, never a guessable
    # sibling such as <output_dir>.tmp that a user may keep
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.c2lip-build-", dir=out.parent))
    (tmp / BUILD_MARKER).write_text("a temporary build of the benchmarks stage; removed when it ends\n")
    try:
        stats = build_suite(params, captions, tmp)  # (no timing in stats.json: the same suite must hash the same for DVC)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    (tmp / BUILD_MARKER).unlink()
    (tmp / SUITE_MARKER).write_text("written by components.benchmarks; the stage replaces this folder as a whole\n")
    Ledger(tmp, "benchmarks", place=place_of(out)).record(files_under(tmp))
    replace_folder(tmp, out, "benchmarks")
    stats["seconds"] = round(time.perf_counter() - started, 2)
    return stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", default=None, help="params YAML (default: params/benchmarks.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one value of the params file, a dotted key and a YAML value (table.path=data/sources/x.csv); repeatable")
    args = parser.parse_args(argv)
    stage_process_setup()  # its workers die with it; inside a flow run, it dies with the run
    try:
        params = load_params("benchmarks", args.params, args.overrides)
        stats = run(params)
    except ParamsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps({k: stats[k] for k in ("images", "sugar_crepe", "winoground", "seconds")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
