"""Which code a stage runs: the import closure of its entry point inside ``components/``, read from the
source (every ``import``, also those inside functions), plus the data files a module reads.

One list per stage, computed, never kept by hand: the stages fingerprint it (a checkpoint or a finished
comparison run made by other code is not reused) and a test checks that dvc.yaml's deps cover it.
"""

from __future__ import annotations

import ast
import threading
from functools import cache
from pathlib import Path

from components.shared.params import ROOT

# data files a module reads at run time (they change what it computes like code does)
DATA_FILES = {"components.shared.architectures": ["components/shared/model_configs"]}
# one parse at a time: CPython 3.11's parser keeps its recursion depth per interpreter, so two threads parsing at once
# fail with "AST constructor recursion depth mismatch" (a comparison fingerprints its runs in threads)
_PARSING = threading.Lock()


def module_path(module: str) -> Path | None:
    """``components.x.y`` -> its file (``x/y.py``, or the package's ``__init__.py``); None if neither exists."""
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(path: Path) -> set[str]:
    """``components.*`` modules named by the file's imports (``from a import b`` names ``a.b`` when that is
    a module, else ``a``)."""
    found: set[str] = set()
    with _PARSING:
        tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.split(".")[0] == "components" and module_path(name) is not None}


@cache
def stage_modules(entry: str) -> tuple[str, ...]:
    """Every ``components`` module ``entry`` imports, directly or not, ``entry`` included; sorted."""
    seen, todo = set(), [entry]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo.extend(_imports(module_path(module)) - seen)
    return tuple(sorted(seen))


def stage_code(entry: str) -> list[Path]:
    """The files of :func:`stage_modules` (package ``__init__`` files, which hold only a docstring, left
    out) and the data files they read, as absolute paths; sorted."""
    files = {module_path(m) for m in stage_modules(entry)}
    files = {f for f in files if f.name != "__init__.py"}
    for module in stage_modules(entry):
        for rel in DATA_FILES.get(module, []):
            files.update(p for p in (ROOT / rel).rglob("*") if p.is_file())
    return sorted(files)
