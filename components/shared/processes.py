"""Child processes that never outlive the run that started them.

A killed stage or flow must not leave workers behind (two spaCy workers of a kill -9'd concepts stage held
~520 MB each forever; a kill -9'd flow left ``dvc repro``, training and its Prefect server running). Three
mechanisms, from narrow to wide:

- :func:`die_with_parent`: Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG)``): the kernel sends
  SIGKILL to this process when its parent exits, however the parent died.
- :func:`forked_children_die_with_this_process`: the same for every child this process forks afterwards
  (spaCy's and the DataLoader's workers, the captions pool).
- a run id in the environment (:data:`RUN_ENV`, ``<root pid>-<random>``) that every descendant inherits:
  :func:`leftovers` finds and :func:`reap` ends the processes of runs whose root is gone, whichever process
  tree they ended up in (a Prefect server started by a ``kill -9``'d flow, say).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
import traceback
import uuid
from pathlib import Path

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
    from components.shared.atomic import STORAGE_ERRNOS, OutputWriteError, storage_message
    from components.shared.redact import redact

    # a full or read-only disk is the machine's state, not a bug: one line naming the file, no traceback
    if isinstance(value, OutputWriteError):
        sys.stderr.write(redact(f"error: {value.strerror}\n"))
        return
    if isinstance(value, OSError) and value.errno in STORAGE_ERRNOS:
        # the system names the file on open, not on write: then the last frame of ours says where it was written
        where = Path(str(value.filename)) if value.filename else Path.cwd() / "(an output of this stage)"
        frame = next((f for f in reversed(traceback.extract_tb(tb)) if "/components/" in f.filename), None)
        written_at = f" (written by {Path(frame.filename).name}:{frame.lineno} {frame.name})" if frame and not value.filename else ""
        sys.stderr.write(redact(f"error: {storage_message(where, value)}{written_at}\n"))
        return
    sys.stderr.write(redact("".join(traceback.format_exception(kind, value, tb))))


def mark_run() -> str:
    """This process's run id, ``<pid>-<random>`` (created once; inherited by every child started afterwards).
    The pid names the run's root process: once it is gone, whatever still carries the id is a leftover."""
    os.environ.setdefault(RUN_ENV, f"{os.getpid()}-{uuid.uuid4().hex[:12]}")
    return os.environ[RUN_ENV]


def _root_pid(run_id: str) -> int | None:
    head = run_id.split("-", 1)[0]
    return int(head) if head.isdigit() else None


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


def leftovers() -> dict[str, list[int]]:
    """Live processes of runs whose root process is gone, by run id: a killed run's dvc, stages, workers and
    Prefect server, wherever they were re-parented. Never this process, its ancestors, or its own run."""
    if not os.path.isdir("/proc"):
        return {}
    prefix = f"{RUN_ENV}=".encode()
    found: dict[str, list[int]] = {}
    mine, own_run = _ancestors(), os.environ.get(RUN_ENV)
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                values = [v[len(prefix):].decode(errors="replace") for v in f.read().split(b"\0") if v.startswith(prefix)]
        except OSError:  # gone meanwhile, or another user's
            continue
        if values and values[0] != own_run:
            found.setdefault(values[0], []).append(int(entry))
    # a run whose root is alive is running (an id without a root pid is never reaped)
    return {run: pids for run, pids in found.items() if (root := _root_pid(run)) is not None and not _alive(root)}


def reap(grace_s: float = 10.0) -> dict[str, list[int]]:
    """End every process of :func:`leftovers`: SIGTERM, then SIGKILL to those still there after ``grace_s``
    seconds. Returns what was found, by run id."""
    runs = leftovers()
    pids = [pid for found in runs.values() for pid in found]
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.2)
    for pid in pids:
        if _alive(pid):
            _signal(pid, signal.SIGKILL)
    return runs


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


def call_logged(args: list[str], log, **popen) -> int:
    """Run ``args`` with its stdout and stderr appended to the binary file ``log`` line by line, credentials redacted
    (a tracking URI's password in a child's message never reaches the file); returns its exit status."""
    import subprocess

    from components.shared.redact import redact

    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **popen) as child:
        for raw in child.stdout:
            log.write(redact(raw.decode(errors="replace")).encode())
            log.flush()
    return child.returncode
