"""Progress in time, not only in work done: a long step says what it is doing when it starts and then at least every
``C2LIP_PROGRESS_EVERY_S`` seconds (default 20), whether or not a unit of work finished, so a slow run never reads as a
hung one (a first train step on a loaded machine took minutes; a bar redrawn only when a step ends was silent that long).

- :class:`TimedBar` is tqdm's bar with a timer that redraws it (elapsed, rate, ETA move) when nothing else did;
- :func:`working` wraps a step without a count ("building the model"): its name now, a "still ..." line while it runs,
  and its time at the end.

The flow's log (flows/progress.py) passes these lines on at the same pace."""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

from tqdm import tqdm

DEFAULT_EVERY_S = 20.0


def every_s() -> float:
    """The longest silence a long step allows itself (``C2LIP_PROGRESS_EVERY_S``; tests make it short)."""
    try:
        value = float(os.environ.get("C2LIP_PROGRESS_EVERY_S", DEFAULT_EVERY_S))
    except ValueError:
        return DEFAULT_EVERY_S
    return value if value > 0 else DEFAULT_EVERY_S


def _repeat(interval: float, stop: threading.Event, action) -> threading.Thread:
    def beat() -> None:
        while not stop.wait(interval):
            action()

    thread = threading.Thread(target=beat, daemon=True, name="progress-heartbeat")
    thread.start()
    return thread


class TimedBar(tqdm):
    """A tqdm bar redrawn at least every :func:`every_s` seconds while it is open. The timer holds the bar by a weak
    reference: a bar left behind unclosed (an iteration broken off by an error) is collected and closed as tqdm's are,
    instead of being redrawn for the rest of a long-lived process."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._stop_beat = threading.Event()
        if not self.disable:
            bar = weakref.ref(self)

            def beat() -> None:
                alive = bar()
                if alive is not None and not alive._stop_beat.is_set():
                    alive.refresh()

            _repeat(every_s(), self._stop_beat, beat)

    def close(self) -> None:
        stop = getattr(self, "_stop_beat", None)
        if stop is not None:
            stop.set()
        super().close()


def duration(seconds: float) -> str:
    """A time as a person says it: "8 min 50 s", "40 s"."""
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


@contextmanager
def working(what: str, enabled: bool = True, file=None) -> Iterator[None]:
    """``what`` now ("train: building the model ..."), "... still ..., 40 s" every :func:`every_s` seconds while the
    block runs, and the time it took at the end."""
    out = file or sys.stderr
    if not enabled:
        yield
        return
    started = time.monotonic()
    print(f"{what} ...", file=out, flush=True)
    stop = threading.Event()
    _repeat(every_s(), stop, lambda: print(f"{what}: still working, {duration(time.monotonic() - started)}", file=out, flush=True))
    try:
        yield
    finally:
        stop.set()
    print(f"{what}: done in {duration(time.monotonic() - started)}", file=out, flush=True)
