"""The params schema: shipped files validate, dvc.yaml agrees with it, bad files say what is wrong."""

import subprocess
import sys
import typing

import pytest
import yaml
from conftest import HANG_S, REPO

from components.shared.params import (
    PARAMS_DIR,
    STAGES,
    CaptionsParams,
    ParamsError,
    flatten_params,
    load_params,
)


def test_every_shipped_params_file_validates():
    files = sorted(PARAMS_DIR.glob("*.yaml"))
    assert files, "params/ holds no YAML"
    for path in files:
        assert path.stem in STAGES, f"{path.name} names no stage in components.shared.params.STAGES"
        assert isinstance(load_params(path.stem, path), STAGES[path.stem])


def test_every_params_file_starts_with_the_command_that_uses_it():
    for path in PARAMS_DIR.glob("*.yaml"):
        first = path.read_text().splitlines()[0]
        assert first.startswith("# python -m components."), f"{path.name}: first line is {first!r}"


def _has_key(model_cls, dotted: str) -> bool:
    cls = model_cls
    for part in dotted.split("."):
        if not (isinstance(cls, type) and part in cls.model_fields):
            return False
        annotation = cls.model_fields[part].annotation
        # descend into a nested model (also through `Model | None`)
        nested = [a for a in getattr(annotation, "__args__", (annotation,)) if isinstance(a, type) and hasattr(a, "model_fields")]
        cls = nested[0] if nested else None
    return True


def test_every_dvc_params_key_exists_in_the_schema():
    dvc = yaml.safe_load((REPO / "dvc.yaml").read_text())
    checked = 0
    for stage_name, stage in dvc["stages"].items():
        for entry in stage.get("params", []):
            assert isinstance(entry, dict), f"stage {stage_name}: params must name their file ({entry!r})"
            for file, keys in entry.items():
                stem = file.removeprefix("params/").removesuffix(".yaml")
                assert stem in STAGES, f"stage {stage_name}: {file} is not a stage params file"
                load_params(stem, REPO / file)  # the file itself validates
                for key in keys or []:  # no keys: the whole file is a dependency
                    assert _has_key(STAGES[stem], key), f"stage {stage_name}: {file}:{key} is not in the schema"
                    checked += 1
    assert checked > 0


def test_schema_key_check_rejects_unknown_keys():
    # the check above must be able to fail
    assert not _has_key(CaptionsParams, "shapesworld.colour")
    assert _has_key(CaptionsParams, "shapesworld.colors")
    assert _has_key(CaptionsParams, "table.download.retries")


def test_every_field_has_a_description():
    seen = set()

    def walk(cls):
        if cls in seen:
            return
        seen.add(cls)
        for name, info in cls.model_fields.items():
            assert info.description, f"{cls.__name__}.{name} has no description"
            for arg in getattr(info.annotation, "__args__", (info.annotation,)):
                if isinstance(arg, type) and hasattr(arg, "model_fields"):
                    walk(arg)

    for cls in STAGES.values():
        walk(cls)
    assert len(seen) >= 4


def _write(tmp_path, text):
    path = tmp_path / "captions.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text, key, reason",
    [
        ("shapesworld:\n  colour: {red: [255, 0, 0]}\n", "shapesworld.colour", "Extra inputs are not permitted"),
        ("shapesworld:\n  image_size: big\n", "shapesworld.image_size", "valid integer"),
        ("shapesworld:\n  image_size: 8\n", "shapesworld.image_size", "greater than or equal to 32"),
        ("shard_size: 0\n", "shard_size", "greater than or equal to 1"),
        ("shapesworld:\n  colors: {red: [300, 0, 0], blue: [0, 0, 255]}\n", "shapesworld", "colors.red"),
        ("source: table\ntable:\n  path: /nonexistent/cc3m.csv\n", "table", "/nonexistent/cc3m.csv"),
        ("source: webdataset\n", "(top level)", "'webdataset' section is missing"),
        ("caption_field: medium\n", "(top level)", "'medium' is not one of this source's fields"),
        ("shapesworld:\n  min_objects: 3\n  max_objects: 2\n", "shapesworld", "min_objects (3) is larger"),
    ],
)
def test_bad_values_name_file_key_and_reason(tmp_path, text, key, reason):
    path = _write(tmp_path, text)
    with pytest.raises(ParamsError) as info:
        load_params("captions", path)
    message = str(info.value)
    assert str(path) in message
    line = next(text for text in message.splitlines() if text.strip().startswith(key + ":"))
    assert reason in line, message


def test_not_yaml_and_not_a_mapping(tmp_path):
    with pytest.raises(ParamsError, match="not valid YAML"):
        load_params("captions", _write(tmp_path, "seed: [1, 2\n"))
    with pytest.raises(ParamsError, match="expected a mapping"):
        load_params("captions", _write(tmp_path, "- 1\n- 2\n"))
    with pytest.raises(ParamsError, match="params file not found"):
        load_params("captions", tmp_path / "absent.yaml")


def test_bad_params_stop_the_stage_before_any_work(tmp_path):
    out = tmp_path / "out"
    path = _write(tmp_path, f"output_dir: {out}\nshapesworld:\n  train_images: -5\n")
    proc = subprocess.run(
        [sys.executable, "-m", "components.captions", "--params", str(path)],
        cwd=REPO, capture_output=True, text=True, timeout=HANG_S,
    )
    assert proc.returncode == 2
    assert "shapesworld.train_images" in proc.stderr and str(path) in proc.stderr
    assert not out.exists()


def test_flatten_params_gives_dotted_string_keys():
    flat = flatten_params(CaptionsParams())
    assert flat["shapesworld.image_size"] == "64"
    assert flat["shapesworld.colors.red"] == "[220, 30, 30]"
    assert flat["source"] == "shapesworld"
    assert all(isinstance(v, str) for v in flat.values())


def test_no_param_description_holds_an_html_like_placeholder():
    """Prefect's run form renders descriptions as HTML: a '<name>' placeholder vanishes there ('models:/@')."""
    import re

    from pydantic import BaseModel

    from components.shared.params import STAGES

    seen, bad, todo = set(), [], list(STAGES.values())
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        for name, field in model.model_fields.items():
            if field.description and re.search(r"<[A-Za-z_][\w ]*>", field.description):
                bad.append(f"{model.__name__}.{name}: {field.description}")
            for arg in typing.get_args(field.annotation) or (field.annotation,):
                for inner in typing.get_args(arg) or (arg,):
                    if isinstance(inner, type) and issubclass(inner, BaseModel):
                        todo.append(inner)
    assert not bad, bad
