"""Output folders a stage shares with others and with its user (``reports/`` holds the evaluate stage's report, the
comparisons' reports and whatever a user keeps there): the stage owns only the entries it wrote, and replaces or
removes only those.

Its manifest (``.c2lip-<stage>-outputs.json`` in the folder, the stage's ledger: components.shared.written) lists every
file it wrote with its SHA256 and the folder's place. A file inside one of its
own folders (``items/``, ``gallery/``, ...) that the manifest does not list — a user's notes, a page of another
tool — makes the stage refuse before any work, naming the file: nothing of a user's is ever deleted. A new output
set is built in a temporary folder of the stage's own (a unique name holding a marker, never a guessable sibling)
and swapped in whole by renames, which need no disk space; a failure while building removes the temporary folder
and leaves the old outputs as they were."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from components.shared.atomic import check_entry_name
from components.shared.written import ForeignFilesError, Ledger, lock_or_holder, sha256_of

BUILD_MARKER = ".c2lip-build"  # inside every temporary build folder: the one kind of hidden folder the stage may remove
FOREIGN_SHOWN = 5


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
        self.ledger = Ledger(self.root, stage)
        self.manifest_path = self.ledger.path

    def written_before(self) -> dict[str, str | None]:
        """The files the last run recorded: path → SHA256 (None for an older version's record, names only)."""
        return {**dict.fromkeys(self.ledger.legacy_names()), **self.ledger.files()}

    def _ours(self, rel: str, written: dict[str, str | None]) -> bool:
        path = self.root / rel
        if rel not in written or path.is_symlink():
            return False
        return written[rel] is None or sha256_of(path) == written[rel]

    def foreign_files(self, expected: Iterable[str] = ()) -> list[str]:
        """Files inside the owned folders, and owned top-level files, that the record does not list with their
        content; inside the folders, a file an older version wrote under a name this run writes (``expected``) counts
        as the stage's."""
        written, expected = self.written_before(), set(expected)
        foreign = []
        for folder in self.folders:
            path = self.root / folder
            if path.is_symlink() or (path.exists() and not path.is_dir()):
                foreign.append(folder)
            elif path.is_dir():
                foreign += [f for f in _files_under(path, self.root) if f not in expected and not self._ours(f, written)]
        for file in self.files:
            path = self.root / file
            if (path.exists() or path.is_symlink()) and not self._ours(file, written):
                foreign.append(file)
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
                f"{self.root}: {len(foreign)} file(s) among the {self.stage} stage's outputs ({', '.join(self.folders + self.files)}) "
                f"were not written by it or changed since{why}: {shown}{more}. Those are replaced as a whole, so move the "
                "files elsewhere or name another output folder; nothing was changed")

    def manifest_problem(self) -> str | None:
        """Why the manifest cannot say what the stage wrote (None: readable, or absent because nothing was written)."""
        return self.ledger.problem()

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
        top-level file by an atomic rename; the record lists the new files at the end. Returns them."""
        new = sorted(f for f in _files_under(build, build) if f != BUILD_MARKER and f.split("/")[0] in self.folders + self.files)
        self.check(set(expected))  # again, just before: a file a user put there during the run is kept
        hashes = {f: sha256_of(build / f) for f in new}
        # while the renames run the record names old and new, so a kill halfway leaves nothing unowned
        self.ledger.write({**{k: v for k, v in self.ledger.files().items()}, **hashes})
        for folder in self.folders:
            target, made = self.root / folder, build / folder
            if target.exists():
                target.rename(build / f".old-{folder}")
            if made.exists():
                made.rename(target)
        for file in self.files:
            if (build / file).exists():
                os.replace(build / file, self.root / file)
        self.ledger.write(hashes)
        shutil.rmtree(build, ignore_errors=True)
        return new


class FolderBusy(RuntimeError):
    """Another process is writing the same output folder."""


@contextmanager
def one_writer(folder: Path, what: str) -> Iterator[None]:
    """Hold ``folder``'s writer lock (an OS ``flock`` on ``folder/.c2lip-<what>.lock``: released when the holder exits,
    even on a kill) for the whole block; a second writer stops at once, naming the holder, and changes nothing."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    handle, holder = lock_or_holder(folder / f".c2lip-{check_entry_name(what, 'lock')}.lock")
    if handle is None:
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
