"""Presets that compose: a params file names the file it extends, the merge rule (mappings merged, lists and values
replaced) is applied before validation, a cycle or a missing parent is named, and `show` prints the result."""

import subprocess
import sys

import pytest
import yaml
from conftest import HANG_S, REPO

from components import compare
from components.shared.params import PARAMS_DIR, ParamsError, flatten_params, load_params, read_yaml, show, stage_of_file

STUDIES = ("binding", "calibration", "diagnosis", "methods", "recipe", "your-data")


def _write(path, data) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False)
    path.write_text(text)
    return str(path)


def test_a_child_merges_mappings_and_replaces_lists_and_values(tmp_path):
    _write(tmp_path / "parent.yaml", {"steps": 60, "data": {"shards": ["a/*.tar", "b/*.tar"], "workers": 1, "caption_field": "long"},
                                      "optim": {"lr": 1e-4, "betas": [0.9, 0.98]}})
    _write(tmp_path / "sub" / "child.yaml", {"extends": "../parent.yaml", "steps": 120, "data": {"shards": ["c/*.tar"], "workers": 0},
                                             "optim": {"betas": [0.8, 0.9]}})
    merged = read_yaml(tmp_path / "sub" / "child.yaml")
    assert merged == {"steps": 120, "data": {"shards": ["c/*.tar"], "workers": 0, "caption_field": "long"},
                      "optim": {"lr": 1e-4, "betas": [0.8, 0.9]}}  # no `extends` key left for pydantic to refuse
    # a grandchild: the chain is applied root first, nearest last
    _write(tmp_path / "sub" / "grandchild.yaml", {"extends": "child.yaml", "data": {"caption_field": "short"}})
    train = load_params("train", tmp_path / "sub" / "grandchild.yaml")
    assert (train.steps, train.data.shards, train.data.caption_field, train.data.workers, train.optim.lr) == (120, ["c/*.tar"], "short", 0, 1e-4)


def test_the_merged_whole_is_validated_and_errors_name_the_file(tmp_path):
    _write(tmp_path / "parent.yaml", {"steps": 60})
    _write(tmp_path / "child.yaml", {"extends": "parent.yaml", "optim": {"lr": -1}})
    with pytest.raises(ParamsError, match=r"child\.yaml.*\n  optim\.lr: Input should be greater than 0"):
        load_params("train", tmp_path / "child.yaml")


@pytest.mark.parametrize("case, reason", [
    ("missing", r"child\.yaml: extends: 'nowhere\.yaml' not found .*relative to the file's folder"),
    ("cycle", r"b\.yaml: extends: 'a\.yaml' closes a cycle \(.*a\.yaml -> .*b\.yaml -> .*a\.yaml\)"),
    ("self", r"self\.yaml: extends: 'self\.yaml' closes a cycle"),
    ("not a path", r"child\.yaml: extends: expected the path of the params file it extends, got \['x'\]"),
])
def test_a_missing_parent_or_a_cycle_is_a_clear_error(tmp_path, case, reason):
    start = {"missing": "child", "cycle": "a", "self": "self", "not a path": "child"}[case]
    if case == "missing":
        _write(tmp_path / "child.yaml", {"extends": "nowhere.yaml", "steps": 1})
    elif case == "cycle":
        _write(tmp_path / "a.yaml", {"extends": "b.yaml", "steps": 1})
        _write(tmp_path / "b.yaml", {"extends": "a.yaml", "steps": 2})
    elif case == "self":
        _write(tmp_path / "self.yaml", {"extends": "self.yaml"})
    else:
        _write(tmp_path / "child.yaml", {"extends": ["x"]})
    with pytest.raises(ParamsError, match=reason):
        load_params("train", tmp_path / f"{start}.yaml")


def test_presets_live_in_one_folder_per_study_each_with_its_question():
    loose = sorted(p.name for p in (PARAMS_DIR / "presets").glob("*.yaml"))
    assert not loose, f"presets outside a study folder: {loose}"
    index = (PARAMS_DIR / "presets" / "README.md").read_text()
    for study in STUDIES:
        folder = PARAMS_DIR / "presets" / study
        readme = (folder / "README.md").read_text()
        assert "Question:" in readme and "Report" in readme, f"{folder}/README.md names no question or report"
        for preset in folder.glob("*.yaml"):
            assert preset.name in readme, f"{folder}/README.md does not list {preset.name}"
        assert f"({study}/README.md)" in index, f"params/presets/README.md does not link {study}/"


def test_presets_that_share_runs_resolve_them_identically():
    """A comparison extending another keeps the shared arms' runs byte-for-byte the same train params, so their
    finished runs are reused (compare.finished matches on the run fingerprint, which hashes these params)."""
    pairs = [("calibration/control-calibrated.yaml", "calibration/paper-calibrated.yaml"),
             ("calibration/control-calibrated-short-480.yaml", "calibration/paper-calibrated-short-480.yaml"),
             ("calibration/control-calibrated.yaml", "calibration/control-neighbours.yaml")]
    for control, study in pairs:
        runs = {(r.arm, r.seed): (r.dir, r.train) for r in compare.plan(load_params("compare", PARAMS_DIR / "presets" / control))}
        extended = {(r.arm, r.seed): (r.dir, r.train) for r in compare.plan(load_params("compare", PARAMS_DIR / "presets" / study))}
        shared = set(runs) & set(extended)
        assert len(shared) == len(runs), (control, study, sorted(set(runs) - set(extended)))
        for key in shared:
            if study.endswith("neighbours.yaml"):  # its own folder: the same params, not the same runs
                assert runs[key][1].model_dump(exclude={"output_dir", "metrics_path", "plots_path"}) == \
                    extended[key][1].model_dump(exclude={"output_dir", "metrics_path", "plots_path"}), key
            else:
                assert runs[key][0] == extended[key][0] and runs[key][1] == extended[key][1], (control, study, key)


def test_show_prints_a_preset_resolved_and_valid(tmp_path):
    path = PARAMS_DIR / "presets" / "calibration" / "control-calibrated-480.yaml"
    assert stage_of_file(path) == "compare"
    shown = show(path)
    header, body = shown.split("\n", 2)[:2], yaml.safe_load(shown)
    assert "control-calibrated-480.yaml extends params/presets/calibration/control-calibrated.yaml extends params/compare.yaml" in header[0]
    assert body["common"]["steps"] == 480 and body["common"]["global_batch"] == 64  # its own value over one from two files up
    assert body["seeds"] == [0, 1] and body["arms"][1]["name"] == "negclip" and "extends" not in body
    every = yaml.safe_load(show(path, every_value=True))
    assert every["world"] is None and every["parallel"] == 2 and "global_batch" in every["common"]
    # the command line: by name or path; a name no preset has is an error, exit status 2
    cli = [sys.executable, "-m", "components.shared.params", "show"]
    done = subprocess.run([*cli, "base-calibrated"], cwd=REPO, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["data"]["binding_alt_text_share"] == 0.5
    assert yaml.safe_load(done.stdout)["model"]["name"] == "c2lip-tiny-rn"  # from params/base.yaml, the preset's parent
    missing = subprocess.run([*cli, "no-such-preset"], cwd=REPO, capture_output=True, text=True, timeout=HANG_S)
    assert missing.returncode == 2 and "no-such-preset: no such file and no preset of that name" in missing.stderr
    _write(tmp_path / "odd.yaml", "{}\n")
    with pytest.raises(ParamsError, match="cannot tell which stage"):
        stage_of_file(tmp_path / "odd.yaml")


def test_the_default_setting_comparison_trains_what_make_run_trains():
    """The comparison that decides the default base must fine-tune in `make run`'s own setting: every training value of
    params/train.yaml is the same in each of its runs, save the base it starts from, the arm's method and bookkeeping
    (where it writes, how often it checks, threads and loader workers, which change no update)."""
    default = flatten_params(load_params("train"))
    preset = load_params("compare", PARAMS_DIR / "presets" / "calibration" / "control-calibrated-default.yaml")
    bookkeeping = {"preset", "seed", "output_dir", "metrics_path", "plots_path", "mlflow_experiment", "torch_threads",
                   "data.workers", "zero_shot_every", "curves.enabled"}
    runs = compare.plan(preset)
    assert {r.arm for r in runs} == {"siglip", "negclip", "c2lip"} and len(runs) == 3 * len(preset.seeds)
    for run in runs:
        trained = flatten_params(run.train)
        differ = {key for key in default.keys() | trained.keys() if default.get(key) != trained.get(key)} - bookkeeping
        expected = {"model.init"} | ({"method.name"} if run.arm != "c2lip" else set())
        assert differ == expected, (run.arm, {key: (default.get(key), trained.get(key)) for key in differ})
        assert trained["model.init"] == "models/base-calibrated/export" and trained["method.name"] == run.arm
