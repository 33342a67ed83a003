"""`make example-run`: keep the latest run's report (reports/benchmarks.md, .png, metrics.json, intervals.json, plots/)
as the shipped example run that README and the docs show (reports/example-run/, committed).

The copy is built in a fresh unique folder with its record of what it wrote (components/shared/written.py) and swapped
in whole; the folder it replaces must hold only what an earlier `make example-run` recorded there, unchanged, so a
file of yours in reports/example-run/ stops it, named, and nothing is changed. Standard library only.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from components.shared.written import ForeignFilesError, Ledger, files_under, place_of, replace_folder  # noqa: E402

REPORT = ("benchmarks.md", "benchmarks.png", "metrics.json", "intervals.json", "plots")
TARGET = "reports/example-run"


def keep_example_run(root: Path = ROOT) -> Path:
    reports, out = root / "reports", root / TARGET
    missing = [name for name in REPORT if not (reports / name).exists()]
    if missing:
        raise FileNotFoundError(f"no {', '.join('reports/' + m for m in missing)} yet: run 'make run' first")
    build = Path(tempfile.mkdtemp(prefix=".example-run.c2lip-build-", dir=reports))
    try:
        build.chmod(0o755)
        for name in REPORT:
            source = reports / name
            if source.is_symlink():
                raise FileNotFoundError(f"{source}: a symbolic link; the example run copies a run's own files")
            if source.is_dir():
                shutil.copytree(source, build / name, symlinks=True)
            else:
                shutil.copy2(source, build / name)
        Ledger(build, "example-run", place=place_of(out, root), workspace=root).record(files_under(build))
        replace_folder(build, out, "make example-run")
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        raise
    return out


def main() -> int:
    try:
        out = keep_example_run()
    except (FileNotFoundError, ForeignFilesError) as err:
        print(f"example-run: {err}", file=sys.stderr)
        return 1
    print(f"example-run: the latest report is now {out.relative_to(ROOT)}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
