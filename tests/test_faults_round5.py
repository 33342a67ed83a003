"""Reliability, round five: each test makes the fault first (a rebuilt base, rewritten shards, a damaged neighbours
table, a checksums file of the wrong kind, more neighbours than images) and checks what the user gets: a new run
rather than a stale one, a recomputed table, one line naming the file and the reason."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import yaml
from conftest import HANG_S, REPO
from test_neighbours import _solid_shard

from components.data import neighbours as nb
from components.shared.atomic import CorruptFileError, checksum_problem, weights_identity, write_checksums
from components.shared.checkpoints import check_export
from components.shared.params import ParamsError, validate_params


def _train_params(tmp_path, init: str, shards: list[str], **method) -> object:
    data = yaml.safe_load((REPO / "params" / "train.yaml").read_text())
    concepts = tmp_path / "concepts"
    concepts.mkdir(exist_ok=True)
    (concepts / "x.parquet").write_bytes(b"")
    data["data"].update(shards=shards, concepts_dir=str(concepts))
    data["model"]["init"] = init
    data["output_dir"] = str(tmp_path / "run")
    data["method"].update(method)
    return validate_params("train", data, "test")


def test_a_rebuilt_base_or_rewritten_shards_start_a_new_run_instead_of_resuming_the_old_one(tmp_path):
    from components.train import run_fingerprint

    base = tmp_path / "base"
    shutil.copytree(REPO / "models" / "base" / "export", base)
    shard = _solid_shard(tmp_path / "s.tar", [(200, 0, 0), (0, 0, 200)])
    params = _train_params(tmp_path, str(base), [shard])
    first = run_fingerprint(params, [shard])
    assert run_fingerprint(params, [shard]) == first  # nothing changed: the finished run is resumed
    # the base rebuilt under the same path, its checksums rewritten (what the base stage does)
    weights = next(base.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-1] + bytes([weights.read_bytes()[-1] ^ 1]))
    write_checksums(base)
    rebuilt = run_fingerprint(params, [shard])
    assert rebuilt != first
    # the shard rewritten under the same name (another world, same file names)
    _solid_shard(tmp_path / "s.tar", [(0, 200, 0), (0, 0, 200)])
    stat = os.stat(shard)
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert run_fingerprint(params, [shard]) != rebuilt


def test_a_same_size_new_base_is_another_neighbours_table(tmp_path):
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    one.write_bytes(b"a" * 64)
    two.write_bytes(b"b" * 64)
    assert weights_identity(str(one)) != weights_identity(str(two))  # same name length, same size, other weights
    assert weights_identity("scratch") == ["scratch"]


@pytest.mark.parametrize("damage", ["truncated", "a list", "no table"])
def test_a_damaged_neighbours_table_is_computed_again(tmp_path, damage):
    shard = _solid_shard(tmp_path / "s.tar", [(250, 0, 0), (0, 0, 250), (200, 20, 20), (20, 20, 200)])
    path = tmp_path / "neighbours.json"
    import numpy as np
    import torch

    calls = []

    def embed(images):
        calls.append(len(images))
        return torch.from_numpy(np.stack([np.asarray(i, dtype=np.float32).mean(axis=(0, 1)) - 85 for i in images]))

    good = nb.load_or_compute(path, [shard], 1, embed, {"model": "m"})
    text = path.read_text()
    path.write_text({"truncated": text[: len(text) // 2], "a list": "[1, 2]", "no table": json.dumps({"fingerprint": "x"})}[damage])
    calls.clear()
    again = nb.load_or_compute(path, [shard], 1, embed, {"model": "m"})
    assert calls and again.table == good.table  # computed again, the same table, and the file mended
    assert json.loads(path.read_text())["neighbours"] == good.table


def test_more_neighbours_than_images_stops_before_the_model_loads(tmp_path):
    from components.train import preflight

    shard = _solid_shard(tmp_path / "s.tar", [(250, 0, 0), (0, 0, 250), (200, 20, 20)])
    params = _train_params(tmp_path, "scratch", [shard], name="negclip",
                           hard_examples={"neighbour_images": 3})
    with pytest.raises(ParamsError, match=r"neighbour_images: 3 nearest images each, but data.shards hold 3 training image"):
        preflight(params)


@pytest.mark.parametrize("content", ["[]", '{"a.bin": 3}', '{"../outside": "00"}'])
def test_a_checksums_file_of_the_wrong_kind_is_named(tmp_path, content):
    export = tmp_path / "export"
    shutil.copytree(REPO / "models" / "base" / "export", export)
    (export / "_checksums.json").write_text(content)
    problem = checksum_problem(export)
    assert problem is not None and str(export / "_checksums.json") in problem
    with pytest.raises(CorruptFileError, match="_checksums.json"):
        check_export(export)


def test_publish_copies_the_model_files_only_and_never_follows_a_link(tmp_path):
    from components.shared.hub import PublishError, hub_folder

    export = tmp_path / "export"
    shutil.copytree(REPO / "models" / "base" / "export", export)
    (tmp_path / "secret.txt").write_text("outside")
    (export / ".env").write_text("HF_TOKEN=hf_secret")
    (export / "notes.txt").write_text("mine")
    (export / "linked.txt").symlink_to(tmp_path / "secret.txt")
    out = hub_folder(export, "# card\n", tmp_path / "hub")
    assert sorted(p.name for p in out.iterdir()) == [".c2lip-publish-outputs.json", "README.md", "open_clip_config.json", "open_clip_model.safetensors"]
    weights = export / "open_clip_model.safetensors"
    weights.rename(tmp_path / "w.safetensors")
    weights.symlink_to(tmp_path / "w.safetensors")
    with pytest.raises(PublishError, match="open_clip_model.safetensors: a symbolic link"):
        hub_folder(export, "# card\n", tmp_path / "hub2")
    assert not (tmp_path / "hub2").exists()


def test_publish_to_a_link_or_under_a_file_is_refused_and_leaves_nothing(tmp_path):
    from components.shared.hub import PublishError, hub_folder

    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "file").write_text("x")
    for out, reason in ((tmp_path / "link", "a symbolic link"), (tmp_path / "file" / "hub", "a path under a file")):
        with pytest.raises(PublishError, match=reason):
            hub_folder(REPO / "models" / "base" / "export", "# card\n", out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "link", "real"]  # no .X.c2lip-old-* or build folder


@pytest.mark.parametrize("repo_id", ["alice/..", "alice/model\n", "alice/" + "x" * 97, "alice/-x", "al/x--y", "a/b/c"])
def test_a_repo_id_the_hub_would_refuse_is_refused_before_any_work(tmp_path, repo_id):
    from components import register as reg
    from components.shared.params import RegistryParams

    params = RegistryParams(export_dir=REPO / "models" / "base" / "export", metrics_path=tmp_path / "none.json")
    with pytest.raises(reg.RegistryError, match="not a Hub repository id"):
        reg.publish(params, tmp_path / "hub", repo_id=repo_id)
    assert not (tmp_path / "hub").exists()


@pytest.mark.parametrize("secret, text", [
    ("S3cr3t", "http://alice:S3cr3t@mlflow.example.org:5000"),
    ("pa/ss", "http://alice:pa/ss@host/x"),
    ("p@ss", "http://alice:p@ss@host/x"),
    ("S3cr3t", "postgresql://host/db?password=S3cr3t"),
    ("S3cr3t", "host=db user=alice password=S3cr3t dbname=mlflow"),
    ("abc.def-123", "Authorization: Bearer abc.def-123"),
])
def test_every_form_of_credential_is_redacted(secret, text):
    from components.shared.redact import redact

    assert secret not in redact(text) and ("<redacted>" in redact(text) or "***@" in redact(text))


def test_a_tracking_uris_password_reaches_neither_the_watch_line_nor_a_childs_log(tmp_path):
    import sys

    from components.shared.processes import call_logged
    from components.shared.tracking import where_to_watch

    uri = "http://alice:S3cr3t@mlflow.example.org:5000"
    assert "S3cr3t" not in where_to_watch(uri, "1", "abc") and "mlflow.example.org:5000/#/experiments/1/runs/abc" in where_to_watch(uri, "1", "abc")
    with open(tmp_path / "train.log", "ab") as log:
        code = call_logged([sys.executable, "-c", f"import sys; print('View run at: {uri}/#/x'); sys.exit(3)"], log)
    assert code == 3 and "S3cr3t" not in (tmp_path / "train.log").read_text() and "mlflow.example.org" in (tmp_path / "train.log").read_text()


@pytest.mark.parametrize("raw", [
    "\x1b]0;evil title\x07train: done",                       # OSC: a window title
    "\x1b]8;;http://evil.example\x1b\\train: done\x1b]8;;\x1b\\",  # OSC 8: a hyperlink
    "\x1bPq#0;2;0;0;0\x1b\\train: done",                       # DCS: sixel graphics
    "\x1bctrain: done\x1b[0m",                                # RIS (reset) and a colour
    "train:\x08\x08 done\x9b",                                # backspaces, a C1 control
])
def test_the_flow_log_keeps_no_terminal_sequence(raw):
    from flows.progress import readable

    line = readable(raw)
    assert line is not None and "\x1b" not in line and not any(ord(c) < 32 or 127 <= ord(c) < 160 for c in line)
    assert "train:" in line and "done" in line and "evil" not in line


def test_the_flow_log_redacts_credentials_and_a_bar_description_is_inert_markdown():
    from flows.progress import readable

    assert "S3cr3t" not in readable("MLflow run x: http://alice:S3cr3t@host:5000/#/experiments/1")
    from components.shared.markdown_text import md_text

    assert "<img" not in md_text("<img src=x onerror=alert(1)>") and "[x](javascript" not in md_text("[x](javascript:alert(1))")


@pytest.mark.parametrize("output_dir, name, owner", [
    (".", "reports", "the evaluate stage's report folder"),
    ("reports", "example-run", "a folder of committed files"),
    ("data", "captions", "the captions stage's output data/captions"),
    ("reports", "items", "the evaluate stage's output reports/items"),
])
def test_an_adhoc_evaluation_never_writes_a_folder_the_pipeline_owns(output_dir, name, owner):
    from flows.workspace import output_dir_inside

    with pytest.raises(ParamsError, match=owner):
        output_dir_inside(REPO, output_dir, name)
    assert output_dir_inside(REPO, "reports/adhoc", "mine") == (REPO / "reports" / "adhoc" / "mine").resolve()


def test_a_second_evaluation_of_the_same_folder_stops_and_names_the_first(tmp_path, capsys, monkeypatch):
    from components import evaluate
    from components.shared.owned_outputs import one_writer

    # a suite and a model that pass the checks (the lock is taken once the input is known to be good)
    monkeypatch.setattr(evaluate, "load_suite", lambda params: [])
    monkeypatch.setattr(evaluate, "resolve_model", lambda spec, where: ("export", REPO / "models" / "base" / "export"))
    monkeypatch.setattr(evaluate, "evaluate_model", lambda *a, **k: pytest.fail("evaluated while another run writes"))

    params = tmp_path / "evaluate.yaml"
    params.write_text(yaml.safe_dump({"output_dir": str(tmp_path / "out"), "cache_dir": str(tmp_path / "cache")}))
    with one_writer(tmp_path / "out", "evaluate"):  # the first evaluation, still writing
        assert evaluate.main(["--params", str(params)]) == 2
    assert "another evaluate is writing this folder (pid" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [".c2lip-evaluate.lock"]  # nothing else written


def _compare_report() -> dict:
    figures = {k: {"values": [0.5]} for k in ("sugarcrepe/swap_att/acc", "zero_shot/top1")}
    return {"arms": ["a"], "metrics": {"a": figures}}


@pytest.mark.parametrize("case, message", [
    ("base is a list", "base.json: a JSON list, not a report"),
    ("arms is a list", "arms.json: a JSON list, not a report"),
    ("arms is malformed", "arms.json: not valid JSON"),
    ("arms is an evaluate metrics file", "arms.json: not a comparison's compare.json"),
    ("out is a folder", "--out .*: a folder"),
    ("out is under a file", "--out .*: .* is a file, not a folder"),
    ("published-as names no arm", "--published-as names 'c2lip_typo', not an arm of --arms"),
])
def test_the_calibration_cli_names_each_bad_input_and_writes_nothing(tmp_path, capsys, case, message):
    from components.suite import calibration as cal

    base, arms, out = tmp_path / "base.json", tmp_path / "arms.json", tmp_path / "calibration.json"
    base.write_text(json.dumps(_compare_report()))
    arms.write_text(json.dumps(_compare_report()))
    extra = []
    if case == "base is a list":
        base.write_text("[1, 2]")
    elif case == "arms is a list":
        arms.write_text("[]")
    elif case == "arms is malformed":
        arms.write_text('{"arms": [')
    elif case == "arms is an evaluate metrics file":
        arms.write_text(json.dumps({"a/zero_shot/top1": 0.5}))
    elif case == "out is a folder":
        out.mkdir()
    elif case == "out is under a file":
        (tmp_path / "file").write_text("x")
        out = tmp_path / "file" / "calibration.json"
    else:
        extra = ["--published-as", "c2lip_typo=c2lip"]
    before = sorted(p.name for p in tmp_path.iterdir())
    assert cal.main(["--base", str(base), "--base-arm", "a", "--arms", str(arms), "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("calibration: ") and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    import re

    assert re.search(message, err), err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no <out>.tmp, nothing written


def test_a_reports_relative_links_open_from_the_prefect_ui(monkeypatch):
    from flows.run_page import absolute_links

    monkeypatch.setenv("C2LIP_REPORTS_URL", "http://127.0.0.1:4201")
    text = ("What changed: [the failure gallery](gallery/index.html); [chart](benchmarks.png); "
            "[site](https://example.org/x) and [here](#summary) stay")
    out = absolute_links(text, REPO / "reports")
    assert "[the failure gallery](http://127.0.0.1:4201/gallery/index.html)" in out
    assert "[chart](http://127.0.0.1:4201/benchmarks.png)" in out
    assert "[site](https://example.org/x)" in out and "[here](#summary)" in out


def test_the_champion_before_any_promotion_says_to_promote_first(tmp_path, monkeypatch):
    from components.shared.params import EvalModelSpec
    from components.suite.loading import SuiteError
    from components.suite.model_loading import resolve_model

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    mlflow.MlflowClient().create_registered_model("c2lip")
    with pytest.raises(SuiteError, match="promote it first"):
        resolve_model(EvalModelSpec(name="champion", uri="models:/c2lip@champion"), tmp_path / "downloads")


def test_the_reports_server_lists_nothing_follows_no_link_and_answers_only_loopback_names(tmp_path):
    import functools
    import http.client
    import http.server
    import threading

    from flows.reports_server import ReportsHandler

    root = tmp_path / "reports"
    (root / "gallery").mkdir(parents=True)
    (root / "benchmarks.md").write_text("# report\n\n| group | Δ tuned − base |\n|---|---|\n| binding | −0.010 |\n\n![chart](benchmarks.png)\n"
                                        "<script>alert(1)</script> per item: `items/<model>/x.parquet`\n", encoding="utf-8")
    (root / "items").mkdir()
    (tmp_path / "secret.txt").write_text("outside")
    (root / "leak.txt").symlink_to(tmp_path / "secret.txt")
    (root / "linked").symlink_to(tmp_path)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(ReportsHandler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]

    kinds = {}

    def get(path, host=f"127.0.0.1:{port}"):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=HANG_S)
        conn.request("GET", path, headers={"Host": host})
        response = conn.getresponse()
        kinds[path] = response.getheader("Content-Type")
        return response.status, response.read().decode("utf-8", errors="replace")

    try:
        # a report is an HTML page in UTF-8: its table a table, its picture shown, its Δ and − intact, its HTML inert
        status, page = get("/benchmarks.md")
        assert status == 200 and kinds["/benchmarks.md"] == "text/html; charset=utf-8"
        assert '<meta charset="utf-8">' in page and "<h1>report</h1>" in page and "<th>Δ tuned − base</th>" in page
        assert '<img alt="chart" src="benchmarks.png"' in page and "<script>" not in page and "&lt;script&gt;" in page
        assert "<code>items/&lt;model&gt;/x.parquet</code>" in page  # a code span reads as written
        assert get("/benchmarks.md?raw")[1].startswith("# report") and kinds["/benchmarks.md?raw"].endswith("charset=utf-8")
        assert get("/benchmarks.md", host=f"localhost:{port}")[0] == 200
        assert get("/benchmarks.md", host=f"evil.example:{port}")[0] == 403  # DNS rebinding: another site's name
        assert get("/items/")[0] == 404 and get("/")[0] == 404  # no listings
        assert get("/leak.txt")[0] == 404 and get("/linked/secret.txt")[0] == 404  # no links followed
        assert get("/../secret.txt")[0] == 404
    finally:
        server.shutdown()


@pytest.mark.skipif(shutil.which("chromium") is None, reason="no chromium on this machine (Debian: apt-get install chromium); the "
                    "report page's browser check needs it")
def test_a_report_opens_in_a_browser_as_a_page_with_its_chart(tmp_path):
    """The link the flow's artifact points to, as Chromium shows it: the shipped report rendered as a page in UTF-8 (Δ and −
    intact, no "Î”"), its tables as tables, and its chart loaded at a width a reader reads without zooming."""
    import functools
    import http.server
    import threading

    from playwright.sync_api import sync_playwright

    from flows.reports_server import ReportsHandler

    root = tmp_path / "reports"
    root.mkdir()
    for name in ("benchmarks.md", "benchmarks.png"):
        shutil.copy(REPO / "reports" / "example-run" / name, root / name)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(ReportsHandler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"], timeout=HANG_S * 1000)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(HANG_S * 1000)
            page.goto(f"http://127.0.0.1:{server.server_address[1]}/benchmarks.md")
            page.wait_for_load_state("load")
            seen = page.evaluate("""() => ({charset: document.characterSet, text: document.body.innerText,
                tables: document.querySelectorAll('table').length,
                chart: [...document.images].filter(i => i.getAttribute('src') === 'benchmarks.png')
                    .map(i => ({natural: i.naturalWidth, shown: i.getBoundingClientRect().width}))[0]})""")
            browser.close()
    finally:
        server.shutdown()
    assert seen["charset"] == "UTF-8" and "Δ finetuned − base" in seen["text"] and "Î" not in seen["text"], seen["text"][:300]
    assert seen["tables"] >= 2 and "| group |" not in seen["text"]  # the Markdown's tables are tables, not pipes
    assert seen["chart"] and seen["chart"]["natural"] > 0 and 700 <= seen["chart"]["shown"] <= 1280, seen["chart"]


@pytest.mark.parametrize("stage, values, where", [
    ("train", {"model": {"init": "/etc/ssl/certs"}}, "train.model.init"),
    ("train", {"data": {"shards": ["data/captions/train/*.tar", "../elsewhere/*.tar"]}}, r"train.data.shards"),
    ("evaluate", {"models": [{"name": "m", "uri": "/root/secret/export"}]}, r"evaluate.models\[0\].uri"),
])
def test_text_fields_that_name_files_stay_inside_the_workspace(stage, values, where):
    from components.shared.params import STAGES
    from flows.workspace import confine_paths

    with pytest.raises(ParamsError, match=f"{where}: .* outside the workspace"):
        confine_paths(REPO, values, STAGES[stage], stage)
    fine = {"model": {"init": "models/base/export"}, "data": {"shards": ["data/captions/train/*.tar"]}}
    confine_paths(REPO, fine, STAGES["train"], "train")
    confine_paths(REPO, {"models": [{"name": "c", "uri": "models:/c2lip@champion"}]}, STAGES["evaluate"], "evaluate")
    confine_paths(REPO, {"model": {"init": "scratch"}}, STAGES["train"], "train")


@pytest.mark.parametrize("entry, message", [("..", "relative"), ("/", "the whole file system"), ("data", "relative")])
def test_an_outside_root_that_admits_everything_or_depends_on_the_cwd_is_refused(monkeypatch, entry, message):
    from flows.workspace import OUTSIDE_ROOTS_ENV, path_inside

    monkeypatch.setenv(OUTSIDE_ROOTS_ENV, entry)
    with pytest.raises(ParamsError, match=f"{OUTSIDE_ROOTS_ENV}: .*{message}"):
        path_inside(REPO, "/etc/passwd", "output_dir")


def test_an_unreadable_manifest_is_named_when_the_stage_cannot_tell_its_own_files(tmp_path):
    from components.shared.owned_outputs import ForeignFilesError, OwnedOutputs

    owned = OwnedOutputs(tmp_path, "evaluate", folders=("gallery",))
    (tmp_path / "gallery" / "thumbs").mkdir(parents=True)
    (tmp_path / "gallery" / "thumbs" / "a.png").write_bytes(b"png")
    owned.manifest_path.write_text('{"files": ["gallery/thumbs/a.p')  # truncated by a full disk, say
    with pytest.raises(ForeignFilesError, match=r"\.c2lip-evaluate-outputs\.json, is unreadable"):
        owned.check()


def test_make_serve_stops_every_process_it_started_on_sigterm_even_one_that_ignores_the_first(tmp_path):
    """infra/serve.sh with stand-ins for prefect, python and mlflow on PATH (the real ones take minutes to start):
    the deployments' stand-in ignores SIGTERM, as `python -m flows.serve` once did."""
    import signal
    import stat
    import subprocess
    import time

    bin_dir, pids = tmp_path / "bin", tmp_path / "pids"
    bin_dir.mkdir()
    pids.mkdir()
    stub = """#!/usr/bin/env bash
    case "$*" in
      *urllib.request*) exit 0 ;;                       # the health check: the server is up
      *flows.serve*) trap '' TERM; echo $$ > {pids}/serve; while true; do sleep 0.2; done ;;
      *) echo $$ > {pids}/$(basename "$0")-$RANDOM; exec sleep 600 ;;
    esac
    """.replace("\n    ", "\n").format(pids=pids)
    for name in ("prefect", "python", "mlflow"):
        (bin_dir / name).write_text(stub)
        (bin_dir / name).chmod((bin_dir / name).stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PREFECT_HOME": str(tmp_path / "prefect"),
           "PREFECT_PORT": "4999", "C2LIP_REPORTS_PORT": "4998"}
    env.pop("MLFLOW_TRACKING_URI", None)
    serving = subprocess.Popen(["bash", str(REPO / "infra" / "serve.sh")], cwd=tmp_path, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + HANG_S  # only a hang fails it
        while not (pids / "serve").exists() or len(list(pids.iterdir())) < 4:  # server, reports, MLflow UI, deployments
            assert time.time() < deadline and serving.poll() is None
            time.sleep(0.1)
        started = [int(p.read_text()) for p in pids.iterdir()]
        serving.send_signal(signal.SIGTERM)  # to the script alone, not its group: it must stop what it started
        assert serving.wait(timeout=HANG_S) == 143

        def alive(pid):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            return not open(f"/proc/{pid}/stat").read().split(")")[-1].split()[0] == "Z"

        while any(alive(pid) for pid in started) and time.time() < deadline:
            time.sleep(0.2)
        assert not any(alive(pid) for pid in started)
    finally:
        os.killpg(serving.pid, signal.SIGKILL) if serving.poll() is None else None


def test_the_prefect_server_of_make_serve_answers_only_requests_addressed_to_this_machine(tmp_path):
    import http.client
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_SERVER_UI_ENABLED": "false"}
    server = subprocess.Popen([sys.executable, "-m", "flows.prefect_server", "--port", str(port)], cwd=REPO, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def status(host: str) -> int | None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=HANG_S)
            conn.request("GET", "/api/health", headers={"Host": host})
            return conn.getresponse().status
        except OSError:
            return None

    try:
        deadline = time.time() + HANG_S  # only a hang fails it: a loaded machine may take minutes to start it
        while status(f"127.0.0.1:{port}") != 200:
            assert time.time() < deadline and server.poll() is None, "the server did not start"
            time.sleep(0.5)
        assert status(f"localhost:{port}") == 200
        assert status(f"rebound.example:{port}") == 400  # DNS rebinding: same origin for the browser, another Host
    finally:
        server.kill()
        server.wait()


def test_a_failed_deployment_run_carries_its_reason_in_the_state_name_the_watching_terminal_prints(tmp_path, monkeypatch):
    from prefect import flow

    from flows.run_page import reason_in_state

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))

    @flow(name="c2lip-test")
    @reason_in_state
    def evaluate_champion():
        raise ValueError("model 'champion': cannot download models:/c2lip@champion from http://alice:S3cr3t@host: "
                         "alias champion not found; promote it first")

    state = evaluate_champion(return_state=True)
    assert state.is_failed() and state.name.startswith("Failed: model 'champion'") and "promote it first" in state.name
    assert "S3cr3t" not in state.name and "S3cr3t" not in (state.message or "")
    with pytest.raises(ValueError, match="alias champion not found"):  # in this process, the exception as it was
        evaluate_champion()


def test_a_failed_stage_is_summed_up_by_its_own_error_line():
    from flows.run_page import failure_reason

    err = RuntimeError("`python -m components.evaluate --params /tmp/x/evaluate.yaml` failed with exit code 2:\n"
                       "evaluate: scoring on cpu in fp32\nerror: model 'champion': cannot download models:/c2lip@champion: "
                       "no such alias or model yet; a run registers its version as `challenger`, promote it first "
                       "(http://alice:S3cr3t@host: RESOURCE_DOES_NOT_EXIST)")
    reason = failure_reason(err)
    assert reason.startswith("model 'champion': cannot download") and "promote it first" in reason and "S3cr3t" not in reason
    assert failure_reason(ValueError("x" * 1000)).endswith("…") and len(failure_reason(ValueError("x" * 1000))) == 300


def test_a_report_folder_named_with_hash_or_question_mark_still_builds_the_site(tmp_path):
    import subprocess
    import sys

    pytest.importorskip("mkdocs", reason="mkdocs is in the dev group: `make test` installs it")
    site = tmp_path / "clone"
    site.mkdir()
    for name in ("mkdocs.yml", "docs", "reports", "params", "models/base/loss.png"):
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if (REPO / name).is_dir() else shutil.copy)(REPO / name, site / name)
    odd = site / "reports" / "run#1?x"
    shutil.rmtree(odd, ignore_errors=True)
    odd.mkdir()
    for name in ("compare.md", "compare.png"):
        shutil.copy(REPO / "reports" / "compare-single" / name, odd / name)
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=site,
                           capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"})
    assert built.returncode == 0, built.stderr[-2000:]
    page = (tmp_path / "site" / "results" / "reports" / "run#1?x" / "index.html").read_text()
    assert "run%231%3Fx.png" in page  # the chart's link, encoded: not an anchor, not a query


@pytest.mark.parametrize("changes, where", [
    ({"common": {"data": {"shards": ["/srv/elsewhere/*.tar"]}}}, r"compare.common.data.shards"),
    ({"arms": [{"name": "a", "overrides": {"model": {"init": "../../outside"}}},
               {"name": "b", "overrides": {}}]}, r"compare.arms\[0\].overrides.model.init"),
])
def test_the_compare_deployments_train_mappings_stay_inside_the_workspace(monkeypatch, changes, where):
    from flows import c2lip

    monkeypatch.delenv("C2LIP_OUTSIDE_ROOTS", raising=False)
    with pytest.raises(ParamsError, match=f"{where}: .* outside the workspace"):
        c2lip.compare_methods.fn(overrides=changes)


def test_a_comparison_trains_its_runs_again_when_the_base_they_started_from_is_replaced(tmp_path):
    """A finished comparison run is reused only while its start weights are the same: shipping another build of a
    base under the same path (what ship_base does) makes every run that started from it train again."""
    from components import compare

    base = tmp_path / "base"
    shutil.copytree(REPO / "models" / "base" / "export", base)
    shard = _solid_shard(tmp_path / "s.tar", [(200, 0, 0), (0, 0, 200)])
    run = compare.Run("siglip", 0, tmp_path / "run", _train_params(tmp_path, str(base), [shard]))
    suite = compare.Suite(None, [], "suite-fingerprint", [])
    first = compare.run_fingerprint(run, suite)
    assert compare.run_fingerprint(run, suite) == first
    weights = next(base.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-1] + bytes([weights.read_bytes()[-1] ^ 1]))
    write_checksums(base)
    assert compare.run_fingerprint(run, suite) != first
    # a run from scratch has no start weights to read; what it is made from still counts: a rewritten shard trains it again
    scratch = compare.Run("base", 0, tmp_path / "scratch", _train_params(tmp_path, "scratch", [shard]))
    before = compare.run_fingerprint(scratch, suite)
    assert compare.run_fingerprint(scratch, suite) == before
    _solid_shard(tmp_path / "s.tar", [(0, 200, 0), (0, 0, 200)])
    assert compare.run_fingerprint(scratch, suite) != before
