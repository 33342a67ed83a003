"""How long README's commands take on a fresh clone, as a newcomer runs them: the install, `make run`, a second
`make run` with nothing changed, then `make test`; each stage's time from the flow's log. Records the figures in
bench/measured.json, which README and the docs show (docs/tools/findings.py --write).

    python bench/timings.py [--load "an idle machine"] [--compare]

Run it on an otherwise idle machine for the figures README states (a busy one makes every step slower). The clone is
made from this checkout's committed HEAD in a new folder beside it, as CI's clone sits beside ../shared; the script
deletes nothing: the clone (with its .venv, a few GB) and the logs stay, named at the end, for you to remove. The end
of a failing command's log is printed. ``--compare`` also times `make compare` (about an hour on 2 cores). Takes as
long as the commands: about half an hour on 2 cores."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measured import ROOT, record_compare, record_timings, this_machine  # noqa: E402

# the flow's console lines: "13:58:32.591 | INFO    | Task run 'dvc repro captions' - Running stage 'captions':"
TASK_LINE = re.compile(r"^(?P<clock>\d\d:\d\d:\d\d\.\d+) \| \w+\s*\| Task run 'dvc repro (?P<stage>[\w-]+)' - (?P<text>.*)$")
PASSED = re.compile(r"=+ (?P<passed>\d+) passed(?:, (?P<skipped>\d+) skipped)?.* in [\d.]+s")


def stage_seconds(log: str) -> dict[str, float]:
    """Each `dvc repro` stage that ran: from its "Running stage" line to its task's end, by the log's clock."""
    start: dict[str, float] = {}
    out: dict[str, float] = {}
    for line in log.splitlines():
        match = TASK_LINE.match(line)
        if not match:
            continue
        h, m, s = match["clock"].split(":")
        clock = int(h) * 3600 + int(m) * 60 + float(s)
        if match["text"].startswith("Running stage"):
            start.setdefault(match["stage"], clock)
        elif match["text"].startswith("Finished in state") and match["stage"] in start:
            out[match["stage"]] = round((clock - start[match["stage"]]) % 86400, 1)  # past midnight too
    return out


def timed(command: list[str], cwd: Path, log: Path) -> tuple[float, str]:
    started = time.monotonic()
    with open(log, "w") as out:
        done = subprocess.run(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "CI": "true"})
    seconds = time.monotonic() - started
    text = log.read_text(errors="replace")
    if done.returncode:
        sys.exit(f"timings: `{' '.join(command)}` failed (exit {done.returncode}); the end of {log}:\n{text[-4000:]}")
    print(f"timings: {' '.join(command)}: {seconds:.0f} s", flush=True)
    return seconds, text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compare", action="store_true", help="also time `make compare` in the clone (about an hour on 2 cores)")
    parser.add_argument("--load", default="an otherwise idle machine", help="how loaded the machine was, as README states it")
    args = parser.parse_args(argv)
    # the clone beside this checkout, as CI's is: the tests that read ../shared (the real benchmark files) run, not skip
    clone = Path(tempfile.mkdtemp(prefix="c2lip-timings-", dir=ROOT.parent))
    folder = Path(tempfile.mkdtemp(prefix="c2lip-timings-logs-"))
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    uv_cache = Path(os.environ.get("UV_CACHE_DIR", Path.home() / ".cache" / "uv"))
    warm = uv_cache.is_dir() and any(uv_cache.iterdir())
    install, _ = timed(["make", "install"], clone, folder / "install.log")
    run, run_log = timed(["make", "run"], clone, folder / "run.log")
    again, _ = timed(["make", "run"], clone, folder / "run-again.log")
    test, test_log = timed(["make", "test"], clone, folder / "test.log")
    if args.compare:
        compare, _ = timed(["make", "compare"], clone, folder / "compare.log")
        compared = yaml.safe_load((clone / "params" / "compare.yaml").read_text())
        record_compare(arms=len(compared["arms"]), seeds=len(compared["seeds"]), make_compare_s=round(compare, 1),
                       note=f"on {this_machine()}, {args.load}, after the other commands")
    # nothing is deleted: the folders are this run's, but what is in them by the end is not this script's to judge
    print(f"timings: the clone is {clone} and its logs are in {folder}; remove them when you no longer need them")
    counts = PASSED.search(test_log)
    record_timings(hardware=this_machine(), load=args.load, uv_cache="warm" if warm else "cold", install_s=round(install, 1),
                   make_run_s=round(run, 1), make_run_again_s=round(again, 1), make_test_s=round(test, 1),
                   tests_passed=int(counts["passed"]) if counts else None,
                   tests_skipped=int(counts["skipped"] or 0) if counts else None, stages_s=stage_seconds(run_log))
    return 0


if __name__ == "__main__":
    sys.exit(main())
