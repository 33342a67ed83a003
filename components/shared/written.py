"""The one rule for deleting and replacing: the project removes or replaces only files it wrote, known by a record of
what it wrote kept beside them — never by a folder's name, its place, or the current directory.

A record (a *ledger*) is ``<folder>/.c2lip-<stage>-outputs.json``: the folder's place (its path inside the
workspace, or its absolute path outside it) and every file the stage wrote there with its SHA256. A file is the
project's to remove only while a ledger of the folder it lies in lists it with the same content, and the ledger
stands where it was written: a folder copied or renamed (``cp -r reports reports/keep-v1``) carries its ledger to
another place, so nothing in the copy is the project's. An export folder's ``_checksums.json`` (every file's SHA256,
written last) is its record too. Anything else found where the project would delete or replace is kept and named in
one line.

Standard library only: ``infra/clean_data.py`` uses it before the project's environment exists.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

WORKSPACE = Path(__file__).resolve().parents[2]  # the checkout this module belongs to, never the current directory
LEDGER_PATTERN = re.compile(r"^\.c2lip-([A-Za-z0-9_-]+)-outputs\.json$")
CHECKSUMS_FILE = "_checksums.json"  # an export's record (components.shared.atomic.write_checksums)
SHOWN = 5


class ForeignFilesError(ValueError):
    """A folder holds files the project did not write (or that changed since); it names them and changes nothing."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def lock_or_holder(path: Path):
    """(the open file holding an exclusive OS lock on ``path``, None) — the lock lasts while the file is open and ends
    with its process, even on a kill — or (None, what the holder wrote in the file) when another process holds it."""
    import fcntl

    handle = open(path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        return None, holder
    return handle, None


def place_of(folder: Path, workspace: Path | None = None) -> str:
    """Where ``folder`` stands, as its ledger records it: relative to the workspace inside it, else absolute (links
    resolved, so a folder reached through a link is named where it really is)."""
    resolved, workspace = Path(folder).resolve(), Path(workspace or WORKSPACE).resolve()
    return resolved.relative_to(workspace).as_posix() if resolved.is_relative_to(workspace) else resolved.as_posix()


def files_under(folder: Path) -> Iterator[str]:
    """Every file and link under ``folder`` (links never followed), as sorted paths relative to it."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        here = Path(dirpath)
        found += [(here / n).relative_to(folder).as_posix() for n in filenames + [d for d in dirnames if (here / d).is_symlink()]]
    yield from sorted(found)


def named(paths: list[str], root: Path | None = None) -> str:
    """Up to five paths and how many more, for a one-line message."""
    shown = ", ".join(str(root / p) if root else p for p in paths[:SHOWN])
    return shown + (f" and {len(paths) - SHOWN} more" if len(paths) > SHOWN else "")


def _write_json(path: Path, obj) -> None:
    """Atomically (a unique temporary sibling, flushed, renamed over ``path``)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _is_sha(value) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def _plain_relative(name) -> bool:
    return isinstance(name, str) and bool(name) and not name.startswith("/") and ".." not in Path(name).parts


def _through_a_link(root: Path, rel: str) -> bool:
    """Whether ``root/rel`` is a link or lies behind one inside ``root``: a record never removes through a link."""
    path = Path(root) / rel
    return any(p.is_symlink() for p in (path, *path.parents) if p == path or Path(root) in p.parents)


class Ledger:
    """``stage``'s record of the files it wrote in ``root``. ``place``: where the folder will stand when the record is
    read (a build folder swapped in later records its final place)."""

    def __init__(self, root: Path, stage: str, place: str | None = None, workspace: Path | None = None):
        if not re.fullmatch(r"[A-Za-z0-9_-]+", stage):
            raise ValueError(f"ledger: {stage!r} is not a plain stage name")
        self.root, self.stage, self.workspace = Path(root), stage, Path(workspace or WORKSPACE)
        self.path = self.root / f".c2lip-{stage}-outputs.json"
        self._place = place

    @property
    def place(self) -> str:
        return self._place or place_of(self.root, self.workspace)

    def _read(self) -> dict | None:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def problem(self) -> str | None:
        """Why this ledger cannot say what the stage wrote here (None: it can, or there is none)."""
        if not self.path.exists() and not self.path.is_symlink():
            return None
        if self.path.is_symlink():
            return "a link, not a record the stage wrote"
        data = self._read()
        if data is None:
            return "unreadable or not a JSON object"
        if isinstance(data.get("files"), list):
            return None  # an older version's record: names only (see legacy_names)
        if not isinstance(data.get("files"), dict):
            return "not the list this stage writes"
        if data.get("place") != self.place:
            return f"written for {data.get('place')!r}, not this folder (a copy or a renamed folder)"
        return None

    def current(self) -> bool:
        """A readable record of this version (content hashes), written for this folder."""
        return self.problem() is None and isinstance((self._read() or {}).get("files"), dict)

    def legacy_names(self) -> set[str]:
        """An older version's record (a list of names without content hashes): trusted only to replace the stage's
        own outputs in the same folder, never to delete anything."""
        data = self._read() or {}
        return {f for f in data.get("files", []) if _plain_relative(f)} if isinstance(data.get("files"), list) else set()

    def files(self) -> dict[str, str]:
        """Path (relative to the folder) → SHA256 of every file the stage recorded here; empty when the record is
        missing, unreadable, an older version's or written for another place."""
        if self.problem() is not None:
            return {}
        files = (self._read() or {}).get("files", {})
        return {k: v for k, v in files.items() if _plain_relative(k) and _is_sha(v)} if isinstance(files, dict) else {}

    def unfinished(self) -> dict[str, list] | None:
        """What a run of the stage found here that was not its own (path → [size, mtime]), kept while it runs: None
        when the last run ended."""
        started = (self._read() or {}).get("started_with")
        return {k: v for k, v in started.items() if isinstance(k, str)} if isinstance(started, dict) else None

    def _stats(self) -> dict[str, list]:
        stats = (self._read() or {}).get("stat", {})
        return stats if isinstance(stats, dict) else {}

    def created(self) -> list[str]:
        """Folders the stage made and is still writing (a checkpoint being saved): wholly its own until the files in
        them are recorded."""
        made = (self._read() or {}).get("created", []) if self.current() else []
        return [f for f in made if _plain_relative(f)] if isinstance(made, list) else []

    def write(self, files: dict[str, str], started_with: dict[str, list] | None = None, created: list[str] | None = None) -> None:
        """The record: ``files`` (path → SHA256) and each one's size and modification time (so that a later run
        re-hashes only what changed); ``started_with``: what was here when a run started, until it ends."""
        self.root.mkdir(parents=True, exist_ok=True)
        stat = {}
        for rel in files:
            try:
                st = (self.root / rel).stat()
                stat[rel] = [st.st_size, st.st_mtime_ns]
            except OSError:
                pass
        record = {"stage": self.stage, "place": self.place, "files": dict(sorted(files.items())), "stat": stat}
        if started_with is not None:
            record["started_with"] = dict(sorted(started_with.items()))
        if created:
            record["created"] = sorted(set(created))
        _write_json(self.path, record)

    def add(self, hashes: dict[str, str], done: str | None = None) -> None:
        """Add files whose SHA256 the caller already has (an export's or a checkpoint's checksums); ``done``: a folder
        of :meth:`created` whose files are now all recorded."""
        self.write({**self.files(), **hashes}, self.unfinished(), [c for c in self.created() if c != done])

    def begin_folder(self, rel: str) -> bool:
        """Note that the stage makes folder ``rel`` now (it must not exist yet); False when it exists."""
        if (self.root / rel).exists() or (self.root / rel).is_symlink():
            return False
        self.write(self.files(), self.unfinished(), [*self.created(), rel])
        (self.root / rel).mkdir(parents=True)
        return True

    def _hashes(self, rels: Iterable[str], known: dict[str, str]) -> dict[str, str]:
        """SHA256 of each plain file ``rels`` names (relative to ``root``), reusing ``known`` where size and
        modification time are those recorded with it."""
        stats, out = self._stats(), {}
        for rel in rels:
            path = self.root / rel
            if path.is_symlink() or not path.is_file():
                continue
            st = path.stat()
            same = rel in known and stats.get(rel) == [st.st_size, st.st_mtime_ns]
            out[rel] = known[rel] if same else sha256_of(path)
        return out

    def record(self, rels: Iterable[str]) -> None:
        """Add files (paths relative to ``root``) with their current content."""
        files = self.files()
        files.update(self._hashes([r for r in rels if _plain_relative(r)], {}))
        self.write(files, self.unfinished(), self.created())

    def remove_files(self, tracked: frozenset[str] = frozenset(), under: str = "") -> tuple[list[str], list[str]]:
        """Remove every file this record lists with unchanged content (never one of ``tracked``: kept by version
        control), and every unfinished folder it made (:meth:`begin_folder`), then the folders that left empty; the
        record then lists what is left of it. ``under``: only inside that folder (relative to ``root``). Returns
        (removed, kept): paths relative to ``root``; kept are the listed files that changed since (or are links, or
        tracked)."""
        removed, kept = [], []
        created = [c for c in self.created() if not under or c == under or c.startswith(under + "/")]
        for rel in created:
            if (self.root / rel).is_dir() and not (self.root / rel).is_symlink():
                removed += [f"{rel}/{f}" for f in files_under(self.root / rel)]
                shutil.rmtree(self.root / rel)
        for rel, digest in self.files().items():
            if under and not rel.startswith(under + "/"):
                continue
            path = self.root / rel
            if not path.is_file() and not path.is_symlink():
                continue
            if rel in tracked or _through_a_link(self.root, rel) or sha256_of(path) != digest:
                kept.append(rel)  # committed, a link, or changed since it was written: not the stage's to remove
                continue
            path.unlink()
            removed.append(rel)
        emptied = {p for rel in removed for p in (self.root / rel).parents if self.root in p.parents}
        for path in sorted(emptied, key=lambda p: len(p.parts), reverse=True):
            try:
                path.rmdir()  # only a folder left empty goes
            except OSError:
                pass
        if removed:
            self.write({k: v for k, v in self.files().items() if k not in removed}, self.unfinished(),
                       [c for c in self.created() if c not in created])
        return removed, kept

    @contextmanager
    def recording(self, refuse_foreign: bool = False) -> Iterator[None]:
        """Around a stage's writing: a file in ``root`` that is not on the record before the run stays someone else's,
        unless the run writes it (its size or modification time changes); everything else found at the end is
        recorded as the stage's. A killed run's own files are recorded by the next run (the record keeps what was
        there, not the stage's, until a run ends). ``refuse_foreign``: a folder wholly the stage's own raises
        :class:`ForeignFilesError` naming such files, before any work, rather than mixing them with its outputs."""
        self.root.mkdir(parents=True, exist_ok=True)
        before, ours = self.unfinished(), self.files()
        foreign = {}
        for rel in files_under(self.root):
            if rel in ours or LEDGER_PATTERN.match(Path(rel).name) or (before is not None and rel not in before):
                continue
            st = (self.root / rel).lstat()
            foreign[rel] = [st.st_size, st.st_mtime_ns]
        # a killed writer's "<name>.tmp" is the stage's to overwrite (components.shared.atomic), so it stops nothing
        if refuse_foreign and (stopping := {f: v for f, v in foreign.items() if not f.endswith(".tmp")}):
            raise ForeignFilesError(
                f"{self.root}: {len(stopping)} file(s) there have no record of being written by the {self.stage} stage "
                f"(yours, or an older c2lip's): {named(sorted(stopping), self.root)}. The stage's folder holds its outputs "
                f"only: move yours elsewhere; an older c2lip's outputs (made before it kept records) go with "
                f"`rm -r {self.root}`, and the stage builds them again. Nothing was changed")
        self.write(ours, started_with=foreign)
        try:
            yield
        finally:
            now = []
            for rel in files_under(self.root):
                if LEDGER_PATTERN.match(Path(rel).name) or rel.endswith(".tmp"):
                    continue
                st = (self.root / rel).lstat()
                if rel not in foreign or foreign[rel] != [st.st_size, st.st_mtime_ns]:
                    now.append(rel)
            self.write(self._hashes(now, ours))


def _recordable(folder: Path) -> bool:
    """Never the workspace, the working folder or a folder above them (a metrics file named `x.json` has `.` as its
    folder): a record there would claim the whole checkout."""
    resolved = folder.resolve()
    return not any(resolved == p or resolved in p.parents for p in (WORKSPACE.resolve(), Path.cwd().resolve()))


@contextmanager
def recording_outputs(stage: str, folders: Iterable[Path], own: Iterable[Path] = ()) -> Iterator[None]:
    """Record what ``stage`` writes in each of ``folders`` (shared with others: ``metrics/``, ``reports/``) and ``own``
    (wholly the stage's: a file there it has no record of stops it before any work). Only the main process of a
    many-rank launch keeps the record."""
    if int(os.environ.get("RANK", "0") or 0) != 0:
        yield
        return
    with ExitStack() as stack:
        for folder in dict.fromkeys(Path(f) for f in own):
            stack.enter_context(Ledger(folder, stage).recording(refuse_foreign=True))
        for folder in dict.fromkeys(Path(f) for f in folders):
            if folder not in [Path(f) for f in own] and _recordable(folder):
                stack.enter_context(Ledger(folder, stage).recording())
        yield


def ledgers_in(folder: Path, workspace: Path | None = None) -> list[Ledger]:
    """Every stage's ledger directly in ``folder``."""
    folder = Path(folder)
    if not folder.is_dir() or folder.is_symlink():
        return []
    return [Ledger(folder, m.group(1), workspace=workspace) for e in sorted(folder.iterdir()) if (m := LEDGER_PATTERN.match(e.name)) and e.is_file()]


def checksums_record(folder: Path) -> dict[str, str]:
    """An export's ``_checksums.json`` as a record (empty when missing or not a map of plain names to SHA256s)."""
    try:
        sums = json.loads((Path(folder) / CHECKSUMS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(sums, dict) or not all(_plain_relative(k) and _is_sha(v) for k, v in sums.items()):
        return {}
    return {**sums, CHECKSUMS_FILE: sha256_of(Path(folder) / CHECKSUMS_FILE)}


def unowned_files(folder: Path) -> list[str]:
    """Files under ``folder`` that no record of the folder lists with their current content (relative paths)."""
    folder = Path(folder)
    records: dict[str, str] = checksums_record(folder)
    for ledger in ledgers_in(folder):
        records.update(ledger.files())
        if ledger.current():
            records[ledger.path.name] = ""  # the record itself
    foreign = []
    for rel in files_under(folder):
        path = folder / rel
        if rel not in records or (records[rel] and (path.is_symlink() or sha256_of(path) != records[rel])):
            foreign.append(rel)
    return foreign


def check_replaceable(folder: Path, what: str) -> None:
    """Raise :class:`ForeignFilesError` unless ``folder`` is absent, empty, or holds only files its records list
    unchanged; ``what`` names the command for the message."""
    folder = Path(folder)
    if folder.is_symlink():
        raise ForeignFilesError(f"{what}: {folder} is a symbolic link; name a real folder (nothing was changed)")
    if folder.exists() and not folder.is_dir():
        raise ForeignFilesError(f"{what}: {folder} is a file, not a folder (nothing was changed)")
    if not folder.exists():
        return
    foreign = unowned_files(folder)
    if foreign:
        raise ForeignFilesError(
            f"{what}: {folder} holds {len(foreign)} file(s) c2lip did not write there (or that changed since): "
            f"{named(foreign, folder)}; it would be replaced whole, so name a new or empty folder (nothing was changed)")


def replace_folder(build: Path, out: Path, what: str = "replace") -> None:
    """Swap the finished folder ``build`` in as ``out`` (a sibling) by renames, after :func:`check_replaceable`: the
    old ``out`` is renamed onto a fresh empty hidden sibling (rename(2) replaces an empty directory), then removed. A
    reader never sees half of either; a killed swap's leftover holds ``c2lip-old`` in its name."""
    out = Path(out)
    check_replaceable(out, what)
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.c2lip-old-", dir=out.parent))
    if out.exists():
        out.rename(old)
    Path(build).rename(out)
    shutil.rmtree(old)


def remove_recorded(folder: Path, tracked: frozenset[str] = frozenset(), workspace: Path | None = None,
                    skip: Iterable[str] = ()) -> list[str]:
    """Remove every file a current ledger of ``folder`` lists with unchanged content (never one of ``tracked``, paths
    relative to ``folder`` that version control keeps; never one of the stages in ``skip``), then those ledgers and
    the folders their removal left empty (``folder`` too). Returns the removed files' paths relative to ``folder``."""
    folder = Path(folder)
    removed = []
    for ledger in ledgers_in(folder, workspace):
        if not ledger.current() or ledger.stage in skip:
            continue  # a copy's, an older version's or an unreadable record: nothing it names is removed, and it stays
        removed += ledger.remove_files(tracked)[0]
        if ledger.path.name not in tracked:
            ledger.path.unlink()
            removed.append(ledger.path.name)
    if removed and folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
        folder.rmdir()
    return sorted(removed)
