"""The house rules of docs/architecture.md, checked: every shipped params file validates, the stage YAMLs
never disagree with the schema's defaults, dvc.yaml's deps cover each stage's code, libraries never import
a stage, methods are the registry's."""

import ast
import re
import typing

import yaml
from conftest import REPO

from components.method.methods import METHODS
from components.shared.params import MODULE_STAGES, PARAMS_DIR, STAGES, MethodParams, load_params
from components.shared.stage_code import stage_code, stage_modules

STAGE_MODULES = {p.stem for p in (REPO / "components").glob("*.py") if p.stem != "__init__"}
LIBRARIES = ("method", "data", "suite", "shared", "study")
# the entry points that orchestrate stages (each runs several of them), not stages themselves
ORCHESTRATORS = {"compare"}


def _stage_of(path) -> str:
    """A params file's stage, from its first line: "# python -m components.<stage> --params ..."."""
    first = path.read_text().splitlines()[0]
    m = re.search(r"(?:-m|--module) components\.(\w+)", first)
    assert m, f"{path}: first line {first!r} does not name the command that uses it"
    return MODULE_STAGES.get(m[1], m[1])


def test_every_preset_validates_for_the_stage_its_first_line_names():
    presets = sorted((PARAMS_DIR / "presets").rglob("*.yaml"))
    assert presets
    for path in presets:
        stage = _stage_of(path)
        assert isinstance(load_params(stage, path), STAGES[stage]), path


def test_a_stage_params_file_states_the_schema_defaults_and_nothing_else():
    """One source of defaults: params/<stage>.yaml, validated, equals the schema's defaults (a test that
    builds params from a partial mapping gets what the shipped stage runs with)."""
    for stage in ("captions", "recaption", "concepts", "train", "benchmarks", "evaluate", "registry"):
        shipped = load_params(stage, PARAMS_DIR / f"{stage}.yaml").model_dump(mode="json")
        defaults = STAGES[stage]().model_dump(mode="json")
        differing = sorted(k for k in shipped if shipped[k] != defaults[k])
        assert not differing, f"params/{stage}.yaml disagrees with the schema on {differing}"


def _dvc_stages() -> dict[str, tuple[str, list[str]]]:
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    out = {}
    for name, stage in stages.items():
        m = re.match(r"\.venv/bin/python -m (components\.\w+)", stage["cmd"])
        assert m, (f"dvc.yaml stage {name}: cmd {stage['cmd']!r} is not `.venv/bin/python -m components.<stage>` "
                   "(the project's interpreter, whatever PATH dvc runs with)")
        out[name] = (m[1], stage.get("deps", []))
    return out


def test_dvc_deps_cover_each_stages_code():
    stages = _dvc_stages()
    assert {"captions", "recaption", "concepts", "base", "train", "benchmarks", "evaluate"} <= set(stages)
    for name, (module, deps) in stages.items():
        for path in stage_code(module):
            rel = path.relative_to(REPO).as_posix()
            assert any(rel == d or rel.startswith(d.rstrip("/") + "/") for d in deps), \
                f"dvc.yaml stage {name}: {rel} (imported by {module}) is not a dep"


def test_stage_code_follows_imports_inside_functions_and_data_files():
    evaluate = {p.relative_to(REPO).as_posix() for p in stage_code("components.evaluate")}
    # evaluate imports the model configs only inside load_model; they are code it runs all the same
    assert "components/method/models.py" in evaluate
    assert any(p.startswith("components/shared/model_configs/") for p in evaluate)
    assert "components/method/losses.py" not in evaluate  # and nothing it never imports


def test_libraries_never_import_a_stage():
    for package in LIBRARIES:
        for path in sorted((REPO / "components" / package).glob("*.py")):
            module = f"components.{package}.{path.stem}" if path.stem != "__init__" else f"components.{package}"
            stages = [m for m in stage_modules(module) if m.count(".") == 1 and m.split(".")[1] in STAGE_MODULES]
            assert not stages, f"{module} imports the stage module(s) {stages}"


def test_package_inits_hold_only_a_docstring():
    """stage_code leaves __init__ files out: they must not hold code."""
    for path in (REPO / "components").rglob("__init__.py"):
        body = ast.parse(path.read_text()).body
        assert all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body), path


def test_method_names_are_the_methods_table():
    names = typing.get_args(MethodParams.model_fields["name"].annotation)
    assert set(names) == set(METHODS), "MethodParams.name's Literal and method/methods.py's METHODS differ"
    for name, method in METHODS.items():
        assert callable(method.make_loss) and callable(method.make_batch), name


def test_no_module_is_much_longer_than_400_lines():
    long = {p.relative_to(REPO).as_posix(): n for p in (REPO / "components").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 450}
    assert not long, f"split these (docs/architecture.md keeps modules under ~400 lines): {long}"


def test_no_stage_imports_another_stage():
    """A stage is one module and one entry point; what two stages share sits in a library (the suite's builder, its
    scoring and model loading, the learning curves), so a stage's code and its DVC deps are its own. Only the
    comparison, which runs stages, imports them."""
    for stage in sorted(STAGE_MODULES - ORCHESTRATORS):
        imported = [m for m in stage_modules(f"components.{stage}") if m.count(".") == 1 and m.split(".")[1] in STAGE_MODULES]
        others = [m for m in imported if m != f"components.{stage}"]
        assert not others, f"the stage components.{stage} imports the stage module(s) {others}"


# the floors of the house, ground floor first: a library imports its own floor and those below, never one above
FLOORS = ("shared", "data", "method", "suite", "study")


def _library_modules() -> dict[str, str]:
    """Every library module's name -> its floor."""
    return {f"components.{floor}.{p.stem}": floor for floor in FLOORS for p in sorted((REPO / "components" / floor).glob("*.py"))
            if p.stem != "__init__"}


def test_libraries_import_only_their_floor_and_those_below():
    from components.shared.stage_code import _imports, module_path

    modules = _library_modules()
    upward = []
    for module, floor in modules.items():
        for imported in sorted(_imports(module_path(module))):
            other = imported.split(".")[1]
            if other in FLOORS and FLOORS.index(other) > FLOORS.index(floor):
                upward.append(f"{module} imports {imported}")
    assert not upward, "imports that reach up a floor (docs/architecture.md):\n" + "\n".join(upward)


def test_no_two_modules_import_each_other_even_lazily():
    from components.shared.stage_code import _imports, module_path

    graph = {m: {i for i in _imports(module_path(m)) if i in _library_modules() or i.count(".") == 1} - {m} for m in _library_modules()}
    circles = []
    for start in graph:  # a depth-first walk from each module back to itself
        todo, seen = [(start, (start,))], set()
        while todo:
            module, path = todo.pop()
            for nxt in graph.get(module, ()):
                if nxt == start:
                    circles.append(" -> ".join((*path, start)))
                elif nxt not in seen:
                    seen.add(nxt)
                    todo.append((nxt, (*path, nxt)))
    assert not circles, "import circles:\n" + "\n".join(sorted(set(circles))[:10])
