"""A stage's output as a flow run shows it: a bar's log line at every tenth of the bar and at least every
``C2LIP_PROGRESS_EVERY_S`` seconds (count, rate, elapsed, ETA and the bar's own figures such as the loss), a Prefect
progress artifact per bar, and a "still running" line whenever a command says nothing for that long, so the flow-run
page moves while a long stage runs and a slow run never looks like a hung one.

tqdm redraws its bar with a carriage return, which the flow's text-mode pipe turns into one line per redraw: logging
each would flood the log; logging a tenth at a time left 20 minutes of silence on a slow train run. The stages redraw
their bars at least every ``C2LIP_PROGRESS_EVERY_S`` seconds (components/shared/progress.py), and a redraw that long
after the bar's last logged line is logged. A bar is known by its description (the text before the colon)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from components.shared.markdown_text import md_text
from components.shared.progress import every_s
from components.shared.redact import redact

# "train c2lip:  45%|████▌     | 1350/3000 [20:00<15:00,  1.50it/s, loss=1.2]" (tqdm's default format)
BAR = re.compile(r"^(?P<desc>.*?):?\s*(?P<pct>\d{1,3})%\|[^|]*\|\s*(?P<n>[\d.]+\w?)/(?P<total>[\d.]+\w?)\s*"
                 r"\[(?P<elapsed>[\d:]+)<(?P<eta>[\d:?]+)(?:,\s*(?P<rest>.*))?\]\s*$")
TENTHS = 10
# every terminal escape sequence, not only colours: CSI (colours, cursor), OSC (window titles, hyperlinks) and DCS/PM/APC
# strings up to their terminator, other two-byte escapes; then any other control character but a tab
ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|[\]P^_X][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])|[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# lines a user of the flow cannot act on: DVC's advice after every stage (the flow commits and pushes itself) and
# DeepSpeed's accelerator notice
NOISE = re.compile(r"^(To track the changes with git, run:|\s*git add .*dvc\.lock|To enable auto staging, run:|\s*dvc config core\.autostage"
                   r"|Use `dvc push` to send your updates|.*\[real_accelerator\.py:\d+:get_accelerator\] Setting ds_accelerator)")


def readable(line: str) -> str | None:
    """``line`` as the flow's log shows it: without terminal colour codes; None for a line of :data:`NOISE`."""
    line = redact(ANSI.sub("", line)).rstrip()
    return None if not line.strip() or NOISE.match(line) else line


@dataclass
class ProgressLog:
    """Feed it a command's output lines; it says which are bars and logs a bar's line once per tenth."""

    logger: Any
    artifacts: bool = True  # a Prefect progress artifact per bar (only inside a flow or task run)
    clock: Callable[[], float] = time.monotonic
    every: float = field(default_factory=every_s)  # C2LIP_PROGRESS_EVERY_S, read once
    _tenth: dict[str, int] = field(default_factory=dict)
    _logged_at: dict[str, float] = field(default_factory=dict)
    _artifact: dict[str, Any] = field(default_factory=dict)
    logged: int = 0  # bar lines logged so far (follow() counts the log's silence from the last one)

    def feed(self, line: str) -> bool:
        """True when ``line`` is a tqdm bar (then logged when it reaches a new tenth or has not been logged for about
        ``C2LIP_PROGRESS_EVERY_S`` seconds), False for any other line."""
        match = BAR.match(line.strip())
        if not match:
            return False
        desc = match["desc"].strip() or "progress"
        pct = min(int(match["pct"]), 100)
        tenth = pct * TENTHS // 100
        now = self.clock()
        # 0.9: the stage's timer redraws every C2LIP_PROGRESS_EVERY_S; a redraw a little early still counts
        quiet = now - self._logged_at.get(desc, now) >= 0.9 * self.every
        if self._tenth.get(desc, -1) >= tenth and not quiet:
            return True
        self._tenth[desc] = max(tenth, self._tenth.get(desc, -1))
        self._logged_at[desc] = now
        self.logged += 1
        rate_and_rest = f", {match['rest'].strip()}" if match["rest"] else ""
        eta = "" if pct == 100 else f", ETA {match['eta']}"
        self.logger.info("%s: %s/%s (%d%%), elapsed %s%s%s", desc, match["n"], match["total"], pct, match["elapsed"], eta, rate_and_rest)
        if self.artifacts:
            self._show(desc, float(pct))
        return True

    def _show(self, desc: str, pct: float) -> None:
        from prefect.artifacts import create_progress_artifact, update_progress_artifact
        from prefect.context import FlowRunContext, TaskRunContext

        if FlowRunContext.get() is None and TaskRunContext.get() is None:
            self.artifacts = False  # outside a run (a test, a script): the log line is the progress
            return
        try:
            if desc not in self._artifact:  # the description is rendered as Markdown: a bar's text is made inert
                self._artifact[desc] = create_progress_artifact(progress=pct, description=md_text(desc))
            else:
                update_progress_artifact(self._artifact[desc], progress=pct)
        except Exception as err:  # noqa: BLE001 - the page's progress is a nicety: a failing API call never fails the stage
            self.artifacts = False
            self.logger.warning("progress artifacts are off for this command: %s", err)


def follow(lines: Iterable[str], logger: Any, command: str, progress: ProgressLog, other: Callable[[str], bool] = lambda line: True,
           clock: Callable[[], float] = time.monotonic) -> list[str]:
    """Log a command's output ``lines`` (bars through ``progress``; any other line when ``other(line)``) and, while the
    log has had nothing from it for ``C2LIP_PROGRESS_EVERY_S`` seconds, a line saying it is still running (a bar of
    another format redraws without being logged: the log's silence counts, not the command's). Returns every raw line,
    for the error message of a command that fails."""
    kept: list[str] = []
    state = {"last": clock(), "started": clock()}
    done = threading.Event()

    every = progress.every

    def watch() -> None:
        while not done.wait(min(1.0, every / 4)):
            silent = clock() - state["last"]
            if silent >= every:
                logger.info("%s: still running (%d s in, %d s since the log's last line from it)", command, clock() - state["started"], silent)
                state["last"] = clock()

    watcher = threading.Thread(target=watch, daemon=True, name="still-running")
    watcher.start()
    try:
        for raw in lines:
            kept.append(raw.rstrip())
            line = readable(raw)
            if line is None:
                continue
            before = progress.logged
            if progress.feed(redact(line)):
                if progress.logged != before:
                    state["last"] = clock()
                continue
            if other(line):
                logger.info(redact(line))
                state["last"] = clock()
    finally:
        done.set()
        watcher.join()
    return kept
