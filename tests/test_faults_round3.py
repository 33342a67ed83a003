"""Fault injection, round three: what the newer outputs (per-item tables, the evaluate cache, the galleries, the
comparison, generated pages) delete, trust and let in. As in test_faults.py, each test makes the fault first, then
checks that nothing of the user's was lost, nothing stale was trusted, and the error names the file, key or item."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import HANG_S, REPO, tiny_captions
from PIL import Image

from components import evaluate as ev
from components.shared.atomic import OutputWriteError, write_checksums
from components.shared.owned_outputs import FolderBusy, ForeignFilesError, OwnedOutputs, one_writer
from components.shared.params import EvaluateParams, ParamsError

BASE = REPO / "models" / "base" / "export"


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    """A small ShapesWorld suite written by the benchmarks stage."""
    from components import benchmarks
    from components.shared.params import BenchmarksParams

    root = tmp_path_factory.mktemp("suite")
    captions = tiny_captions(root, shapesworld={"test_images": 16})
    (root / "captions.yaml").write_text(json.dumps(captions.model_dump(mode="json")))
    benchmarks.run(BenchmarksParams(captions_params=root / "captions.yaml", output_dir=root / "sw"))
    return root / "sw"


def _params(suite: Path, out: Path, cache: Path, models=("base", "twin")) -> EvaluateParams:
    off = {"enabled": False, "data_root": "unused"}
    return EvaluateParams.model_validate({
        "models": [{"name": n, "uri": str(BASE)} for n in models],
        "benchmarks": {"sugarcrepe": {"data_root": str(suite / "sugar_crepe"), "image_root": str(suite / "images"), "subsets": ["swap_att"]},
                       "zero_shot": {"data_root": str(suite / "zero_shot")},
                       **{k: off for k in ("sugarcrepe_pp", "hard_positives", "aro", "winoground", "retrieval", "long_captions")}},
        "output_dir": str(out), "cache_dir": str(cache), "bootstrap": {"resamples": 100}, "gallery": {"per_outcome": 2},
    })


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------------------------------
# evaluate owns only what it wrote
# --------------------------------------------------------------------------------------------------


def test_evaluate_never_deletes_a_users_files_in_its_output_folder_and_names_them(suite, tmp_path, capsys):
    out, cache = tmp_path / "reports", tmp_path / "cache"
    (out / "compare-binding").mkdir(parents=True)
    (out / "compare-binding" / "compare.md").write_text("another tool's report")  # a shared folder, as reports/ is
    ev.run(_params(suite, out, cache), log_mlflow=False)
    assert (out / "gallery" / "index.html").is_file() and (out / "items" / "twin" / "sugarcrepe" / "swap_att.parquet").is_file()
    # the fault: a user keeps files inside the stage's own folders
    mine = {out / "gallery" / "mywork.txt": "notes", out / "items" / "notes" / "thesis.tex": "years of work",
            out / "items" / "base" / "mine.parquet": "my table", out / "plots" / "album.html": "<p>mine</p>"}
    for path, text in mine.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    before = _tree(out)
    with pytest.raises(ForeignFilesError, match=r"4 file\(s\).*gallery/mywork.txt.*items/base/mine.parquet"):
        ev.run(_params(suite, out, cache), log_mlflow=False)
    assert _tree(out) == before  # nothing removed, nothing rewritten
    file = tmp_path / "evaluate.yaml"
    file.write_text(json.dumps(_params(suite, out, cache).model_dump(mode="json")))
    assert ev.main(["--params", str(file)]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "thesis.tex" in errors[0] and "nothing was changed" in errors[0] and "Traceback" not in err
    assert _tree(out) == before
    for path in mine:
        path.unlink()
    # what it wrote itself it still cleans up: one model fewer, and its tables and the gallery go
    ev.run(_params(suite, out, cache, models=("base",)), log_mlflow=False)
    assert not (out / "items" / "twin").exists() and not (out / "gallery").exists() and not (out / "plots" / "twin.json").exists()
    assert (out / "compare-binding" / "compare.md").read_text() == "another tool's report"
    assert not list(out.glob(".c2lip-evaluate-build-*"))


def test_a_full_disk_while_the_gallery_is_written_leaves_the_old_outputs_whole_and_no_temporary_folder(suite, tmp_path, monkeypatch):
    from components.suite import gallery

    out, cache = tmp_path / "reports", tmp_path / "cache"
    ev.run(_params(suite, out, cache), log_mlflow=False)
    before = _tree(out)

    def full_disk(*args, **kwargs):
        raise OutputWriteError(28, "thumbs/x.jpg: cannot be written (No space left on device)")

    monkeypatch.setattr(gallery, "thumbnail", full_disk)
    params = _params(suite, out, cache)
    params.bootstrap.seed = 7  # other intervals: every output would change
    with pytest.raises(OutputWriteError):
        ev.run(params, log_mlflow=False)
    assert _tree(out) == before
    assert not [p for p in out.iterdir() if p.name.startswith(".c2lip-evaluate-build-")]


def test_the_evaluate_cache_sees_replaced_images(suite, tmp_path, monkeypatch, capsys):
    copy = tmp_path / "sw"
    shutil.copytree(suite, copy)
    out, cache = tmp_path / "reports", tmp_path / "cache"
    first = ev.run(_params(copy, out, cache, models=("base",)), log_mlflow=False)
    capsys.readouterr()
    for image in [p for p in (copy / "images").rglob("*") if p.is_file()]:  # the fault: new pixels under the same names
        Image.new("RGB", Image.open(image).size, (0, 0, 0)).save(image)
    loaded = []
    real = ev.load_model
    monkeypatch.setattr(ev, "load_model", lambda *a: loaded.append(a[2].name) or real(*a))
    second = ev.run(_params(copy, out, cache, models=("base",)), log_mlflow=False)
    assert loaded == ["base"] and "same weights and suite" not in capsys.readouterr().err
    assert second != first  # black images score otherwise


def _damage(kind: str, folder: Path, other: Path) -> None:
    table_file = folder / "sugarcrepe" / "swap_att.parquet"
    table = pq.read_table(table_file)
    if kind == "column":
        pq.write_table(table.drop_columns(["correct"]), table_file)
    elif kind == "metadata":
        pq.write_table(table.replace_schema_metadata({}), table_file)
    elif kind == "rows":
        pq.write_table(table.slice(0, table.num_rows - 3), table_file)
    elif kind == "flipped":
        flipped = table.set_column(table.column_names.index("correct"), "correct", pa.array([not c for c in table.column("correct").to_pylist()]))
        pq.write_table(flipped.replace_schema_metadata(table.schema.metadata), table_file)
        return  # checksums left as written: the content no longer matches them
    elif kind == "another_model":
        shutil.rmtree(folder)
        shutil.copytree(other, folder)
        return
    write_checksums(folder)  # a readable, checksummed table that is still not this suite's


@pytest.mark.parametrize("kind", ["column", "metadata", "rows", "flipped", "another_model"])
def test_a_damaged_or_foreign_cache_entry_is_named_and_evaluated_again(suite, tmp_path, monkeypatch, capsys, kind):
    out, cache = tmp_path / "reports", tmp_path / "cache"
    flat = ev.run(_params(suite, out, cache), log_mlflow=False)
    folder = next(cache.glob("base-*"))
    _damage(kind, folder, next(cache.glob("twin-*")))
    capsys.readouterr()
    loaded = []
    real = ev.load_model
    monkeypatch.setattr(ev, "load_model", lambda *a: loaded.append(a[2].name) or real(*a))
    assert ev.run(_params(suite, out, cache), log_mlflow=False) == flat
    err = capsys.readouterr().err
    assert loaded == ["base"] and "cached results unusable" in err and str(folder) in err


def test_benchmark_items_that_name_images_outside_the_image_root_are_refused(suite, tmp_path):
    from components.suite.formats import BenchmarkError

    copy = tmp_path / "sw"
    shutil.copytree(suite, copy)
    secret = tmp_path / "secret.png"
    Image.new("RGB", (4, 4)).save(secret)
    file = copy / "sugar_crepe" / "swap_att.json"
    items = json.loads(file.read_text())
    first, second = sorted(items)[:2]
    items[first]["filename"], items[second]["filename"] = str(secret), "../../secret.png"
    file.write_text(json.dumps(items))
    with pytest.raises(BenchmarkError, match=r"swap_att.json: 2 image\(s\) outside the image root .*outside_image_root"):
        ev.run(_params(copy, tmp_path / "reports", tmp_path / "cache"), log_mlflow=False)
    assert not (tmp_path / "reports").exists()


# --------------------------------------------------------------------------------------------------
# benchmarks: temporary and old folders are the stage's own
# --------------------------------------------------------------------------------------------------


def test_the_benchmarks_stage_leaves_a_users_neighbouring_tmp_and_old_folders(tmp_path):
    from components import benchmarks
    from components.shared.params import BenchmarksParams

    captions = tiny_captions(tmp_path, shapesworld={"test_images": 6})
    (tmp_path / "captions.yaml").write_text(json.dumps(captions.model_dump(mode="json")))
    out = tmp_path / "suite"
    for name in ("suite.old", "suite.tmp"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "keep.txt").write_text("a user's folder")
    for _ in range(2):
        benchmarks.run(BenchmarksParams(captions_params=tmp_path / "captions.yaml", output_dir=out))
    assert (tmp_path / "suite.old" / "keep.txt").is_file() and (tmp_path / "suite.tmp" / "keep.txt").is_file()
    assert (out / benchmarks.SUITE_MARKER).is_file()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


# --------------------------------------------------------------------------------------------------
# the comparison: one writer per output folder, children that die with it, logs that keep what they said
# --------------------------------------------------------------------------------------------------


def test_a_second_comparison_on_the_same_output_folder_stops_at_once(tmp_path, capsys):
    import yaml

    from components import compare

    data = yaml.safe_load((REPO / "params" / "compare.yaml").read_text())
    data.update(output_dir=str(tmp_path / "runs"), report_dir=str(tmp_path / "reports"))
    file = tmp_path / "compare.yaml"
    file.write_text(yaml.safe_dump(data))
    with one_writer(tmp_path / "runs", "compare"):  # the first comparison, still running
        assert compare.main(["--params", str(file), "--no-mlflow"]) == 2
    err = capsys.readouterr().err
    assert "another compare is writing this folder" in err and f"pid {os.getpid()}" in err
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [".c2lip-compare.lock"]
    with one_writer(tmp_path / "runs", "compare"), pytest.raises(FolderBusy):  # and the flow's path (compare.run) likewise
        with one_writer(tmp_path / "runs", "compare"):
            pass


def test_the_compare_cli_marks_its_run_so_training_children_die_with_it(tmp_path):
    """compare.main gives its process tree a run id; a stage started under it (as the training subprocess is) asks the
    kernel to kill it when its parent dies: kill -9 of the comparison leaves no training running."""
    pid_file = tmp_path / "child.pid"
    child = ("import sys, time, pathlib; from components.shared.processes import stage_process_setup; stage_process_setup(); "
             f"pathlib.Path({str(pid_file)!r}).write_text(str(__import__('os').getpid())); time.sleep({HANG_S})")
    parent = ("import subprocess, sys; from components import compare; "
              "compare.stage_process_setup(); compare.mark_run(); "  # what compare.main does first
              f"subprocess.call([sys.executable, '-c', {child!r}])")
    source = (REPO / "components" / "compare.py").read_text()
    assert "    stage_process_setup()" in source and "    mark_run()" in source.split("def main(")[1]
    proc = subprocess.Popen([sys.executable, "-c", parent], cwd=REPO, env={k: v for k, v in os.environ.items() if k != "C2LIP_RUN_ID"})
    deadline = time.monotonic() + HANG_S
    while not pid_file.is_file() or not pid_file.read_text():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    child_pid = int(pid_file.read_text())
    proc.send_signal(signal.SIGKILL)
    proc.wait(HANG_S)
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{child_pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    break
        except OSError:
            break
        time.sleep(0.1)
    else:
        os.kill(child_pid, signal.SIGKILL)
        pytest.fail("the training child outlived the killed comparison")


def test_a_rerun_appends_to_the_runs_training_log(tmp_path, monkeypatch):
    from components import compare

    calls = []
    monkeypatch.setattr(compare, "call_logged", lambda args, log, **k: calls.append(log.write(b"line\n")) or 1)
    run = SimpleNamespace(label="a-s0", arm="a", dir=tmp_path / "a", train=SimpleNamespace(model_dump=lambda mode: {"steps": 1}))
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "train.log").write_text("the killed run's lines\n")
    with pytest.raises(RuntimeError, match="training failed"):
        compare.train_and_evaluate(run, None, log=print)
    log = (tmp_path / "a" / "train.log").read_text()
    assert log.startswith("the killed run's lines\n") and log.endswith("line\n")


def test_the_comparison_keeps_a_users_files_in_its_gallery_folder(tmp_path):
    from components import compare

    params = SimpleNamespace(report_dir=tmp_path, arms=[SimpleNamespace(name="clic")])
    owned, expected = compare.report_outputs(params)
    (tmp_path / "compare-gallery").mkdir()
    (tmp_path / "compare-gallery" / "clic.html").write_text("an older version's page")
    owned.check(expected)  # its own page by name is fine
    (tmp_path / "compare-gallery" / "album.html").write_text("mine")
    with pytest.raises(ForeignFilesError, match="compare-gallery/album.html"):
        owned.check(expected)


def test_a_build_folder_is_the_stages_own_and_swapped_in_whole(tmp_path):
    owned = OwnedOutputs(tmp_path, "demo", folders=("items",), files=("report.md",))
    (tmp_path / ".c2lip-demo-build-old").mkdir()  # a user's folder with the prefix but without the marker
    with owned.build() as build:
        (build / "items").mkdir()
        (build / "items" / "a.txt").write_text("a")
        (build / "report.md").write_text("r")
        assert owned.swap_in(build) == ["items/a.txt", "report.md"]
    assert (tmp_path / ".c2lip-demo-build-old").is_dir() and (tmp_path / "items" / "a.txt").read_text() == "a"
    with pytest.raises(RuntimeError), owned.build() as build:
        raise RuntimeError("a failure while building")
    assert not build.exists() and (tmp_path / "items" / "a.txt").is_file()


# --------------------------------------------------------------------------------------------------
# the deployments: paths inside the workspace, the API closed to other origins
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stage, override", [
    ("evaluate", {"output_dir": "/tmp/elsewhere"}), ("evaluate", {"cache_dir": "../outside"}),
    ("train", {"output_dir": "/srv/models"}), ("registry", {"export_dir": "/etc/c2lip"}),
    ("evaluate", {"benchmarks": {"sugarcrepe": {"data_root": "/etc"}}}),
])
def test_the_full_deployment_refuses_paths_outside_the_workspace(stage, override, monkeypatch):
    from flows import c2lip

    monkeypatch.delenv("C2LIP_OUTSIDE_ROOTS", raising=False)
    key = next(iter(override))
    with pytest.raises(ParamsError, match=rf"{stage}\.{key}.*outside the workspace"):
        c2lip.full.fn(overrides={stage: override}, register_version=False, push=False)


@pytest.mark.parametrize("override", [{"report_dir": "/tmp/r"}, {"output_dir": "../../runs"}, {"evaluate_params": "/etc/passwd"}])
def test_the_compare_and_evaluate_deployments_refuse_paths_outside_the_workspace(override, monkeypatch):
    from components.shared.params import EvalModelSpec, SuiteParams
    from flows import c2lip

    monkeypatch.delenv("C2LIP_OUTSIDE_ROOTS", raising=False)
    with pytest.raises(ParamsError, match="outside the workspace"):
        c2lip.compare_methods.fn(overrides=override)
    with pytest.raises(ParamsError, match="output_dir: .*outside the workspace"):
        c2lip.evaluate.fn(model=EvalModelSpec(name="m", uri=str(BASE)), output_dir="/tmp")
    with pytest.raises(ParamsError, match="benchmarks.zero_shot.data_root"):
        c2lip.evaluate.fn(model=EvalModelSpec(name="m", uri=str(BASE)), benchmarks=SuiteParams.model_validate({"zero_shot": {"data_root": "/etc"}}))
    import inspect

    assert "allow_outside_workspace" not in inspect.signature(c2lip.evaluate.fn).parameters  # no waiver among a run's parameters


def test_the_served_api_answers_only_its_own_origin(tmp_path):
    settings = subprocess.run(["bash", "infra/serve.sh", "--print-settings"], cwd=REPO, capture_output=True, text=True, timeout=HANG_S,
                              env={**os.environ, "PREFECT_PORT": "4200"})
    assert settings.returncode == 0, settings.stderr
    env = dict(line.split("=", 1) for line in settings.stdout.split())
    script = ("from fastapi.testclient import TestClient; from prefect.server.api.server import create_app; import json; "
              "c = TestClient(create_app(ephemeral=True)); out = {}\n"
              "for origin in ('http://127.0.0.1:4200', 'https://evil.example'):\n"
              "    r = c.options('/api/health', headers={'Origin': origin, 'Access-Control-Request-Method': 'POST'})\n"
              "    out[origin] = r.headers.get('access-control-allow-origin')\n"
              "print(json.dumps(out))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG_S,
                          env={**os.environ, **env, "PREFECT_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    assert answers == {"http://127.0.0.1:4200": "http://127.0.0.1:4200", "https://evil.example": None}


# --------------------------------------------------------------------------------------------------
# small holes: the binding probe's arguments, the curves' world, NAT64, a table source's local images
# --------------------------------------------------------------------------------------------------


def test_the_binding_probe_refuses_bad_arguments_in_one_line(tmp_path, capsys):
    from components.study import binding_probe

    captions = tiny_captions(tmp_path, shapesworld={"test_images": 3})
    (tmp_path / "captions.yaml").write_text(json.dumps(captions.model_dump(mode="json")))
    (tmp_path / "afile").write_text("x")
    cases = [(["--scenes", "0"], "--scenes 0"), (["--out", str(tmp_path / "afile")], "a file, not a folder"),
             (["--captions-params", str(tmp_path / "captions.yaml")], "a probe needs at least 10")]
    for extra, message in cases:
        assert binding_probe.main(["--model", f"base={BASE}", *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err
    with pytest.raises(SystemExit):
        binding_probe.main(["--model", f"a={BASE}", "--model", f"a={BASE}"])
    assert "the name 'a' is given twice" in capsys.readouterr().err


@pytest.mark.parametrize("content", [None, b"\x00\xff\xfe binary"])
def test_a_missing_or_binary_curves_world_stops_train_preflight(tmp_path, content):
    from components import train
    from components.shared.params import validate_params

    world = tmp_path / "world.yaml"
    if content is not None:
        world.write_bytes(content)
    params = validate_params("train", {**json.loads(json.dumps(_train_defaults())), "curves": {"enabled": True, "captions_params": str(world)}})
    with pytest.raises(ParamsError, match="curves.captions_params: .*world.yaml"):
        train.preflight(params)


def _train_defaults() -> dict:
    import yaml

    data = yaml.safe_load((REPO / "params" / "train.yaml").read_text())
    data["model"]["init"] = "scratch"
    data["data"]["shards"] = [str(REPO / "params" / "train.yaml")]  # preflight checks the world before reading shards
    return data


def test_nat64_and_6to4_addresses_of_private_hosts_are_not_public():
    import ipaddress

    from components.data.download import is_public

    for private in ("64:ff9b::7f00:1", "64:ff9b::a00:1", "64:ff9b::a9fe:a9fe", "2002:7f00:1::1", "64:ff9b:1::808:808"):
        assert not is_public(ipaddress.ip_address(private)), private
    for public in ("64:ff9b::808:808", "2606:4700::1111", "8.8.8.8"):
        assert is_public(ipaddress.ip_address(public)), public


def test_a_replaced_local_image_of_a_table_source_changes_the_captions_fingerprint(tmp_path):
    from components import captions
    from components.data.sources import TableSource

    (tmp_path / "img").mkdir()
    Image.new("RGB", (8, 8), (255, 0, 0)).save(tmp_path / "img" / "a.jpg")
    (tmp_path / "t.csv").write_text("Image Path,raw_caption,shortLLA_captions,longLLA_captions\na.jpg,red,a red square,a red square.\n")
    params = tiny_captions(tmp_path, source="table", table={"path": str(tmp_path / "t.csv"), "image_root": str(tmp_path / "img")})
    before = captions.source_signature(TableSource(params))
    time.sleep(0.01)
    Image.new("RGB", (8, 8), (0, 0, 255)).save(tmp_path / "img" / "a.jpg")  # the table unchanged
    os.utime(tmp_path / "img" / "a.jpg", ns=(time.time_ns(), time.time_ns() + 1_000_000))
    assert captions.source_signature(TableSource(params)) != before


# --------------------------------------------------------------------------------------------------
# user text in generated pages: shown, never run, never fetched
# --------------------------------------------------------------------------------------------------

HOSTILE = ('<script>window.__pwned = 1</script><img src="http://127.0.0.1:9/pixel.png" onerror="window.__pwned = 2"> '
           '![x](http://127.0.0.1:9/image.png) [link](javascript:alert(1)) `tick` | pipe')


def _hostile_pages() -> dict[str, str]:
    from components.shared.model_card import model_card
    from components.suite.compare_report import markdown as compare_markdown
    from components.suite.report import markdown_report

    facts = {"architecture": "c2lip-tiny-rn", "init": HOSTILE, "method": "c2lip", "contrastive": "sigmoid", "lr": 1e-4, "warmup_steps": 1,
             "weight_decay": 0.1, "steps": 1, "global_batch": 2, "samples_seen": 2, "seed": 0, "shards": [HOSTILE], "caption_field": "long",
             "export_dtype": "float32"}
    summary = {"arms": ["a", "b"], "reference": "a", "seeds": [0], "metrics": {"a": {}, "b": {}}, "paired": {}, "headlines": {}}
    arms = SimpleNamespace(arms=[SimpleNamespace(name="a", description=HOSTILE), SimpleNamespace(name="b", description="")])
    return {"benchmarks.md": markdown_report([], {"base": {}, "tuned": {}}, ["base", "tuned"], {"base": HOSTILE, "tuned": "models/train/export"}),
            "compare.md": compare_markdown(arms, summary, {}, {"steps": 1, "global_batch": 2, "samples": 2}),
            "card.md": model_card(facts).split("---", 2)[2]}  # the card's body (its front matter is YAML, tested apart)


def test_hostile_params_text_is_escaped_by_every_markdown_writer():
    for name, text in _hostile_pages().items():
        assert "<script" not in text and "<img" not in text and "](http" not in text, name
        assert "&lt;script&gt;" in text, name  # shown, not dropped


@pytest.mark.skipif(shutil.which("chromium") is None, reason="no chromium on this machine (Debian: apt-get install chromium); "
                    "the docs' browser check needs it")
def test_hostile_params_text_runs_no_script_and_fetches_nothing_in_the_docs_site(tmp_path):
    from playwright.sync_api import sync_playwright

    docs = tmp_path / "docs"
    docs.mkdir()
    pages = _hostile_pages()
    for name, text in pages.items():
        (docs / name).write_text(text)
    (docs / "index.md").write_text("# Reports\n")
    # the project's own Markdown extensions and theme; no web fonts (they would be a request of the theme's own)
    import yaml

    site_cfg = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    config = {"site_name": "hostile", "docs_dir": str(docs), "site_dir": str(tmp_path / "site"), "theme": {"name": "material", "font": False},
              "markdown_extensions": site_cfg["markdown_extensions"]}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "-f", str(tmp_path / "mkdocs.yml")], capture_output=True, text=True,
                           timeout=HANG_S, env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"})
    assert built.returncode == 0, built.stderr[-2000:]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"], timeout=HANG_S * 1000)
        page = browser.new_page()
        page.set_default_timeout(HANG_S * 1000)
        requests = []
        page.on("request", lambda r: requests.append(r.url))
        for name in pages:
            page.goto((tmp_path / "site" / name.replace(".md", "") / "index.html").as_uri())
            page.wait_for_load_state("load")
            assert page.evaluate("window.__pwned") is None, name
            assert "<script>window.__pwned = 1</script>" in page.inner_text("article"), name  # the text is shown as typed
        browser.close()
    assert not [u for u in requests if not u.startswith("file://")], requests
