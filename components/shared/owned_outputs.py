"""Output folders a stage shares with others and with its user (``reports/`` holds the evaluate stage's report, the
comparisons' reports and whatever a user keeps there): the stage owns only the entries it wrote, and replaces or
removes only those.

Its manifest (``.c2lip-<stage>-outputs.json`` in the folder) lists every file it wrote. A file inside one of its
own folders (``items/``, ``gallery/``, ...) that the manifest does not list — a user's notes, a page of another
tool — makes the stage refuse before any work, naming the file: nothing of a user's is ever deleted. A new output
set is built in a temporary folder of the stage's own (a unique name holding a marker, never a guessable sibling)
and swapped in whole by renames, which need no disk space; a failure while building removes the temporary folder
and leaves the old outputs as they were."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from components.shared.atomic import atomic_write_json, check_entry_name

BUILD_MARKER = ".c2lip-build"  # inside every temporary build folder: the one kind of hidden folder the stage may remove
FOREIGN_SHOWN = 5


class ForeignFilesError(ValueError):
    """An output folder holds files the stage did not write; it names them and changes nothing."""


def _files_under(folder: Path, root: Path) -> Iterator[str]:
    """Every file and link under ``folder`` (links never followed), as paths relative to ``root``."""
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        here = Path(dirpath)
        for name in filenames + [d for d in dirnames if (here / d).is_symlink()]:
            yield (here / name).relative_to(root).as_posix()


class OwnedOutputs:
    """The entries of ``root`` that ``stage`` owns: ``folders`` (wholly its own: replaced as a whole) and ``files``
    (top-level files with fixed names, replaced one by one)."""

    def __init__(self, root: Path, stage: str, folders: Iterable[str], files: Iterable[str] = ()):
        self.root, self.stage = Path(root), check_entry_name(stage, "stage")
        self.folders = [check_entry_name(f, f"{stage}: owned folder") for f in folders]
        self.files = [check_entry_name(f, f"{stage}: owned file") for f in files]
        self.manifest_path = self.root / f".c2lip-{stage}-outputs.json"

    def written_before(self) -> set[str]:
        """The files the last run listed (empty when there is no readable manifest)."""
        try:
            listed = json.loads(self.manifest_path.read_text()).get("files", [])
        except (OSError, ValueError, AttributeError):
            return set()
        return {f for f in listed if isinstance(f, str)}

    def foreign_files(self, expected: Iterable[str] = ()) -> list[str]:
        """Files inside the owned folders that neither the manifest lists nor this run writes under the same name
        (``expected``: an older version's outputs, the committed example report)."""
        ours = self.written_before() | set(expected)
        foreign = []
        for folder in self.folders:
            path = self.root / folder
            if path.is_symlink() or (path.exists() and not path.is_dir()):
                foreign.append(folder)
            elif path.is_dir():
                foreign += [f for f in _files_under(path, self.root) if f not in ours]
        return sorted(foreign)

    def check(self, expected: Iterable[str] = ()) -> None:
        """Raise :class:`ForeignFilesError` naming the files this stage did not write (before any work)."""
        foreign = self.foreign_files(expected)
        if foreign:
            shown = ", ".join(str(self.root / f) for f in foreign[:FOREIGN_SHOWN])
            more = f" and {len(foreign) - FOREIGN_SHOWN} more" if len(foreign) > FOREIGN_SHOWN else ""
            unreadable = self.manifest_problem()
            why = (f" (its list of what it wrote, {self.manifest_path}, is {unreadable}: if these are the stage's own, "
                   "remove them or that file)") if unreadable else ""
            raise ForeignFilesError(
                f"{self.root}: {len(foreign)} file(s) in the {self.stage} stage's own folders ({', '.join(self.folders)}) were not "
                f"written by it{why}: {shown}{more}. Those folders are replaced as a whole, so move the files elsewhere or name "
                "another output folder; nothing was changed")

    def manifest_problem(self) -> str | None:
        """Why the manifest cannot say what the stage wrote (None: readable, or absent because nothing was written)."""
        if not self.manifest_path.exists():
            return None
        try:
            listed = json.loads(self.manifest_path.read_text())
        except (OSError, ValueError) as err:
            return f"unreadable ({type(err).__name__})"
        return None if isinstance(listed, dict) and isinstance(listed.get("files", []), list) else "not the list this stage writes"

    def _remove_stale_builds(self) -> None:
        """Temporary folders a killed run left: only hidden folders of this stage's prefix that hold the marker."""
        if not self.root.is_dir():
            return
        for entry in self.root.glob(f".c2lip-{self.stage}-build-*"):
            if entry.is_dir() and not entry.is_symlink() and (entry / BUILD_MARKER).is_file():
                shutil.rmtree(entry)

    @contextmanager
    def build(self) -> Iterator[Path]:
        """A fresh temporary folder inside ``root`` to write the whole output set into; removed on any failure."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._remove_stale_builds()
        folder = Path(tempfile.mkdtemp(prefix=f".c2lip-{self.stage}-build-", dir=self.root))
        (folder / BUILD_MARKER).write_text(f"a temporary build of the {self.stage} stage's outputs; removed when it ends\n")
        try:
            yield folder
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise

    def swap_in(self, build: Path, expected: Iterable[str] = ()) -> list[str]:
        """Move the built outputs into place: each owned folder as a whole (the old one, all ours, removed), each
        top-level file by an atomic rename; the manifest lists the new files at the end. Returns them."""
        new = sorted(f for f in _files_under(build, build) if f != BUILD_MARKER and f.split("/")[0] in self.folders + self.files)
        self.check(set(expected) | set(new))  # again, just before: a file a user put there during the run is kept
        # while the renames run the manifest names old and new, so a kill halfway leaves nothing unowned
        atomic_write_json(self.manifest_path, {"stage": self.stage, "files": sorted(self.written_before() | set(new))})
        for folder in self.folders:
            target, made = self.root / folder, build / folder
            if target.exists():
                target.rename(build / f".old-{folder}")
            if made.exists():
                made.rename(target)
        for file in self.files:
            if (build / file).exists():
                os.replace(build / file, self.root / file)
        atomic_write_json(self.manifest_path, {"stage": self.stage, "files": new})
        shutil.rmtree(build, ignore_errors=True)
        return new


class FolderBusy(RuntimeError):
    """Another process is writing the same output folder."""


@contextmanager
def one_writer(folder: Path, what: str) -> Iterator[None]:
    """Hold ``folder``'s writer lock (an OS ``flock`` on ``folder/.c2lip-<what>.lock``: released when the holder exits,
    even on a kill) for the whole block; a second writer stops at once, naming the holder, and changes nothing."""
    import fcntl

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    handle = open(folder / f".c2lip-{check_entry_name(what, 'lock')}.lock", "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise FolderBusy(f"{folder}: another {what} is writing this folder ({holder}); nothing was changed. Wait for it, "
                         "or give this one another output folder") from None
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
        yield
    finally:
        handle.close()
