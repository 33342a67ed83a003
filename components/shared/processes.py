"""Child processes that never outlive the run that started them.

A killed stage or flow must not leave workers behind (two spaCy workers of a kill -9'd concepts stage held
~520 MB each forever; a kill -9'd flow left ``dvc repro``, training and its Prefect server running). Three
mechanisms, from narrow to wide:

- :func:`die_with_parent`: Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG)``): the kernel sends
  SIGKILL to this process when its parent exits, however the parent died.
- :func:`forked_children_die_with_this_process`: the same for every child this process forks afterwards
  (spaCy's and the DataLoader's workers, the captions pool).
- a run id in the environment (:data:`RUN_ENV`) that every descendant inherits: :func:`leftovers` finds
  and :func:`reap` ends the processes of a run that is gone, whichever process tree they ended up in.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
import traceback
import uuid

RUN_ENV = "C2LIP_RUN_ID"
_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent exits; False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:  # the parent died while the request was being made: act on it now
        os.kill(os.getpid(), sig)
    # (a parent that died before this call leaves an orphan the next run reaps by its run id: :func:`reap`)
    return True


_hooked = False


def forked_children_die_with_this_process() -> None:
    """Every process forked from this one from now on gets :func:`die_with_parent` (idempotent)."""
    global _hooked
    if not _hooked and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=die_with_parent)
        _hooked = True


def stage_process_setup() -> None:
    """What every stage's entry point calls first: its forked workers die with it, and inside a flow run
    (:data:`RUN_ENV` set) it dies with the process that started it (dvc, torchrun), so a killed run's
    process tree comes down as a whole. A stage run by hand outlives its shell as usual (nohup works).
    An uncaught error's traceback is printed with credentials removed (an MLflow error names its URI)."""
    sys.excepthook = _redacted_traceback
    forked_children_die_with_this_process()
    if os.environ.get(RUN_ENV):
        die_with_parent()


def _redacted_traceback(kind, value, tb) -> None:
    from components.shared.redact import redact

    sys.stderr.write(redact("".join(traceback.format_exception(kind, value, tb))))


def mark_run() -> str:
    """This process's run id (created once; inherited by every child started afterwards)."""
    os.environ.setdefault(RUN_ENV, uuid.uuid4().hex)
    return os.environ[RUN_ENV]


def _ancestors() -> set[int]:
    """This process and every process above it (never reaped, whatever their environment says)."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def leftovers(run_id: str) -> list[int]:
    """Live processes whose environment carries ``run_id``, other than this process and its ancestors."""
    if not run_id or not os.path.isdir("/proc"):
        return []
    needle = f"{RUN_ENV}={run_id}".encode()
    found, mine = [], _ancestors()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:  # gone meanwhile, or another user's
            continue
    return found


def reap(run_id: str, grace_s: float = 10.0) -> list[int]:
    """End every leftover process of ``run_id``: SIGTERM, then SIGKILL to those still there after
    ``grace_s`` seconds. Returns the pids found."""
    pids = leftovers(run_id)
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.2)
    for pid in pids:
        if _alive(pid):
            _signal(pid, signal.SIGKILL)
    return pids


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited
    except OSError:
        return False
