"""Fault injection: crafted pickles, traversal names, killed runs, dripping and redirecting loopback
servers, corrupted checkpoints, exports, shards and manifests, bad params files, credentials. Each test
makes the fault first and then checks that nothing executed, nothing outside the output was touched,
nothing was lost, and the error names the file, key or item (docs/reliability.md "Reliability and security")."""

import csv
import importlib
import io
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import HANG_S, REPO, concepts_manifest, sentences, tiny_captions
from PIL import Image

from components import concepts
from components.captions import run as run_captions
from components.data.download import refused_address
from components.shared import processes
from components.shared.atomic import CorruptFileError, resume_or_restart, write_checksums
from components.shared.checkpoints import EXPORT_WEIGHTS, check_export, intact_checkpoint, rng_state, set_rng_state
from components.shared.params import CaptionsParams, ConceptsParams, DownloadParams, ParamsError, load_params, read_yaml
from components.shared.redact import redact
from components.shared.safe_load import UnsafeCheckpointError, guard_deepspeed_loads, load_torch_file


def _until(condition, what: str):
    """Wait for ``condition()`` (a hang guard only: never a wall-clock expectation)."""
    deadline = time.monotonic() + HANG_S
    while not condition():
        assert time.monotonic() < deadline, f"hung waiting for {what}"
        time.sleep(0.05)


# --------------------------------------------------------------------------------------------------
# 1. nothing we load executes code
# --------------------------------------------------------------------------------------------------


class _RunsCode:
    """Unpickling this calls os.system: what a crafted checkpoint does."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _crafted(path: Path, marker: Path, wrap=lambda payload: payload) -> Path:
    torch.save(wrap(_RunsCode(marker)), path)
    return path


def test_a_crafted_pickle_is_refused_naming_the_file_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    for name, wrap in [("rng_rank0.pt", lambda p: {"python": p}),
                       ("model.pt", lambda p: {"state_dict": {"w": torch.zeros(2)}, "extra": p})]:
        path = _crafted(tmp_path / name, marker, wrap)
        with pytest.raises(UnsafeCheckpointError, match=f"{name}: refused to load"):
            load_torch_file(path)
        assert not marker.exists()
    # the evaluate stage's checkpoint loader goes through it too
    from components.evaluate import load_state_dict

    with pytest.raises(UnsafeCheckpointError, match="model.pt: refused"):
        load_state_dict(tmp_path / "model.pt")
    # and DeepSpeed's own loads, once guarded (its engine calls torch.load(weights_only=False))
    engine = type("Engine", (), {})()
    engine.checkpoint_engine = type("CheckpointEngine", (), {"load": lambda self, path, map_location=None: torch.load(path, weights_only=False)})()
    guard_deepspeed_loads(engine)
    with pytest.raises(UnsafeCheckpointError):
        engine.checkpoint_engine.load(str(tmp_path / "model.pt"), map_location="cpu")
    assert not marker.exists()
    plain = tmp_path / "plain.pt"
    torch.save({"state_dict": {"w": torch.ones(3)}}, plain)
    assert torch.equal(load_state_dict(plain)["w"], torch.ones(3))  # real weights still load


def test_rng_state_round_trips_through_weights_only_loading(tmp_path):
    import random

    import numpy as np

    torch.save(rng_state(), tmp_path / "rng.pt")
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    set_rng_state(load_torch_file(tmp_path / "rng.pt"))
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected


# --------------------------------------------------------------------------------------------------
# 2. names are not paths; nothing is removed outside a stage's own output
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["../victim", "", ".", "..", "/abs", "a/b", ".hidden"])
def test_split_names_that_are_paths_are_refused_before_any_work(tmp_path, name):
    with pytest.raises(ParamsError, match="splits.0"):
        _validate_concepts({"splits": [name]})
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ValueError, match="not a plain stage name"):
        resume_or_restart(out, "fingerprint", name or "x/y")
    assert (victim / "keep.txt").read_text() == "mine" and out.is_dir()


def _validate_concepts(data):
    from components.shared.params import validate_params

    return validate_params("concepts", data)


def test_a_record_never_removes_through_a_link_or_outside_its_folder(tmp_path):
    import json

    from components.shared.written import Ledger, place_of, sha256_of

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    out = tmp_path / "out"
    out.mkdir()
    (out / "train").symlink_to(victim)
    digest = sha256_of(victim / "keep.txt")
    (out / ".c2lip-concepts-outputs.json").write_text(json.dumps({"stage": "concepts", "place": place_of(out), "files": {
        "train/keep.txt": digest, "../victim/keep.txt": digest, "train": digest}}))
    removed, kept = Ledger(out, "concepts").remove_files()
    assert removed == [] and (victim / "keep.txt").read_text() == "mine" and (out / "train").is_symlink()


def test_a_manifest_shard_that_is_a_path_is_refused(tmp_path):
    manifest = concepts_manifest(tmp_path, ["A red ball."])
    table = pq.read_table(manifest).to_pydict()
    table["shard"] = ["train/../../escaped.tar"]
    pq.write_table(pa.table(table), manifest)
    with pytest.raises(concepts.ConceptsError, match=r"manifest.parquet: shard: '..' is not a plain name"):
        concepts.run(ConceptsParams(manifest=manifest, output_dir=tmp_path / "out", stats_path=tmp_path / "s.json", n_process=1))
    assert not (tmp_path / "escaped.parquet").exists()


# --------------------------------------------------------------------------------------------------
# 3. everything is validated before any output is cleared
# --------------------------------------------------------------------------------------------------


def test_a_misspelt_spacy_model_removes_no_finished_shard(tmp_path):
    manifest = concepts_manifest(tmp_path, sentences(12))
    good = ConceptsParams(manifest=manifest, output_dir=tmp_path / "out", stats_path=tmp_path / "s.json", n_process=1)
    concepts.run(good)
    finished = {p: p.read_bytes() for p in sorted((tmp_path / "out" / "train").glob("*.parquet"))}
    assert len(finished) == 3
    # other params (a new fingerprint: the stage would start afresh) and a model name that does not exist
    bad = good.model_copy(update={"spacy_model": "en_core_web_sm_misspelt", "max_chars": 500})
    with pytest.raises(concepts.ConceptsError, match="en_core_web_sm_misspelt.*cannot be loaded"):
        concepts.run(bad)
    assert {p: p.read_bytes() for p in finished} == finished


# --------------------------------------------------------------------------------------------------
# 4. a killed flow run's params overrides do not survive it
# --------------------------------------------------------------------------------------------------


def _workspace_copy(tmp_path: Path) -> Path:
    work = tmp_path / "ws"
    for name in ("components", "flows", "params"):
        shutil.copytree(REPO / name, work / name, ignore=shutil.ignore_patterns("__pycache__"))
    return work


def test_kill_9_during_overrides_leaves_nothing_a_later_run_uses(tmp_path):
    work = _workspace_copy(tmp_path)
    original = (work / "params" / "train.yaml").read_bytes()
    script = ("import sys, time; sys.path.insert(0, sys.argv[1]); from pathlib import Path\n"
              "from flows.workspace import params_overridden, workspace_lock\n"
              "with workspace_lock(Path(sys.argv[1]), 'flow run doomed'):\n"
              "    with params_overridden(Path(sys.argv[1]), {'train': {'steps': 7}}):\n"
              "        print('overridden', flush=True); time.sleep(3600)\n")
    doomed = subprocess.Popen([sys.executable, "-c", script, str(work)], stdout=subprocess.PIPE, text=True,
                              env={k: v for k, v in os.environ.items() if k != processes.RUN_ENV})
    assert doomed.stdout.readline().strip() == "overridden"
    doomed.kill()
    doomed.wait()
    assert b"steps: 7" in (work / "params" / "train.yaml").read_bytes()  # the fault: the overrides are on disk
    # a stage started by hand refuses them, naming the way back
    check = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                            "from components.shared.params import load_params; load_params('train')", str(work)],
                           capture_output=True, text=True, timeout=HANG_S)
    assert check.returncode != 0 and "interrupted flow run" in check.stderr and "--restore" in check.stderr
    # the next run (anything that takes the workspace lock) puts the original back, byte for byte
    restore = subprocess.run([sys.executable, "-m", "flows.workspace", "--restore"], cwd=work, capture_output=True, text=True, timeout=HANG_S)
    assert restore.returncode == 0 and "put back params/train.yaml" in restore.stdout, restore.stderr
    assert (work / "params" / "train.yaml").read_bytes() == original
    assert not (work / ".c2lip-params-journal.json").exists()


# --------------------------------------------------------------------------------------------------
# 5. children die with their parent; a new run reaps a killed run's leftovers
# --------------------------------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _alive(pid: int) -> bool:
    return processes._alive(pid)


def test_kill_9_of_concepts_takes_its_spacy_workers_with_it(tmp_path):
    manifest = concepts_manifest(tmp_path, sentences(3000), shard_size=500)
    cfg = {"manifest": str(manifest), "output_dir": str(tmp_path / "out"), "stats_path": str(tmp_path / "s.json"),
           "n_process": 2, "batch_size": 20, "quality_samples": 0}
    (tmp_path / "c.yaml").write_text(json.dumps(cfg))
    stage = subprocess.Popen([sys.executable, "-m", "components.concepts", "--params", str(tmp_path / "c.yaml")], cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _until(lambda: len(_children(stage.pid)) >= 2 or stage.poll() is not None, "spaCy's workers")
    workers = _children(stage.pid)
    assert stage.poll() is None and len(workers) >= 2
    stage.kill()
    stage.wait()
    _until(lambda: not any(_alive(w) for w in workers), "the workers to die with the stage")


def test_a_flow_process_tree_dies_with_it_and_the_next_run_reaps_what_did_not(tmp_path):
    work = _workspace_copy(tmp_path)
    leftover_pid = tmp_path / "leftover.pid"
    # a "flow": takes the lock, starts a stage-like child (dies with it) and a detached server-like process
    # (its own session, like Prefect's server: only the run id finds it), then is killed
    script = ("import os, subprocess, sys, time; sys.path.insert(0, sys.argv[1]); from pathlib import Path\n"
              "from flows.workspace import workspace_lock\n"
              "with workspace_lock(Path(sys.argv[1]), 'flow run doomed'):\n"
              "    child = subprocess.Popen([sys.executable, '-c', 'import sys; sys.path.insert(0, sys.argv[1]);"
              " from components.shared.processes import stage_process_setup; stage_process_setup();"
              " print(flush=True); import time; time.sleep(3600)', sys.argv[1]], stdout=subprocess.PIPE)\n"
              "    child.stdout.readline()  # set up (a parent killed before that is handled by die_with_parent itself)\n"
              "    server = subprocess.Popen(['sleep', '3600'], start_new_session=True)\n"
              "    Path(sys.argv[2]).write_text(f'{child.pid} {server.pid}')\n"
              "    print('running', flush=True); time.sleep(3600)\n")
    doomed = subprocess.Popen([sys.executable, "-c", script, str(work), str(leftover_pid)], stdout=subprocess.PIPE, text=True,
                              env={k: v for k, v in os.environ.items() if k != processes.RUN_ENV})
    assert doomed.stdout.readline().strip() == "running"
    child, server = map(int, leftover_pid.read_text().split())
    doomed.kill()
    doomed.wait()
    _until(lambda: not _alive(child), "the stage to die with its flow (parent-death signal)")
    assert _alive(server)  # the fault: a process outside the tree outlives the killed run
    reaped = subprocess.run([sys.executable, "-m", "flows.workspace", "--restore"], cwd=work, capture_output=True, text=True,
                            timeout=HANG_S, env={k: v for k, v in os.environ.items() if k != processes.RUN_ENV})
    assert reaped.returncode == 0 and f"[{server}]" in reaped.stdout and f"{doomed.pid}-" in reaped.stdout, reaped.stdout + reaped.stderr
    _until(lambda: not _alive(server), "the leftover to be reaped")


def test_reaping_never_ends_the_reaper_or_its_ancestors():
    # a parent and its child both carry the id (inherited from a killed run, say); the child looks for leftovers
    inner = ("import os, sys; sys.path.insert(0, sys.argv[1]); from components.shared.processes import leftovers; "
             "os.environ['C2LIP_RUN_ID'] = 'a-run-of-its-own'; print(os.getppid(), os.getpid(), leftovers())")
    outer = "import subprocess, sys; subprocess.run([sys.executable, '-c', sys.argv[1], sys.argv[2]])"
    out = subprocess.run([sys.executable, "-c", outer, inner, str(REPO)], capture_output=True, text=True, timeout=HANG_S,
                         env={**os.environ, processes.RUN_ENV: "999999999-gone"}).stdout.split(maxsplit=2)  # its root is gone
    parent, child, found = int(out[0]), int(out[1]), out[2]
    assert str(parent) not in found and str(child) not in found, (parent, child, found)


# --------------------------------------------------------------------------------------------------
# 6. damaged checkpoints, exports, init weights, shards and manifests
# --------------------------------------------------------------------------------------------------


def _fake_checkpoint(ckpt_dir: Path, step: int) -> Path:
    tag = ckpt_dir / f"step{step:08d}"
    tag.mkdir(parents=True)
    torch.save({"w": torch.full((64,), float(step))}, tag / "mp_rank_00_model_states.pt")
    write_checksums(tag)
    return tag


def test_a_truncated_latest_checkpoint_falls_back_to_the_intact_earlier_one(tmp_path):
    ckpt = tmp_path / "checkpoints"
    _fake_checkpoint(ckpt, 1)
    latest = _fake_checkpoint(ckpt, 2)
    assert intact_checkpoint(ckpt) == ("step00000002", [])
    weights = latest / "mp_rank_00_model_states.pt"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated
    tag, problems = intact_checkpoint(ckpt)
    assert tag == "step00000001" and "mp_rank_00_model_states.pt: checksum mismatch" in problems[0]
    unfinished = _fake_checkpoint(ckpt, 3)
    (unfinished / "_checksums.json").unlink()  # killed between DeepSpeed's save and the checksums
    assert intact_checkpoint(ckpt)[0] == "step00000001"
    (ckpt / "step00000001" / "mp_rank_00_model_states.pt").unlink()
    tag, problems = intact_checkpoint(ckpt)
    assert tag is None and len(problems) == 3 and "step00000001/mp_rank_00_model_states.pt: missing" in problems[2]


def test_a_damaged_export_or_init_is_named_not_a_traceback(tmp_path):
    import components.method.models  # noqa: F401  (registers the tiny configs with open_clip)
    from components.shared.checkpoints import export_model
    from components.train import preflight

    model = torch.nn.Linear(2, 2)
    model.visual = torch.nn.Identity()
    export = export_model(model, "c2lip-tiny-rn", tmp_path / "export")
    assert check_export(export) == export
    weights = export / EXPORT_WEIGHTS
    intact = weights.read_bytes()
    weights.write_bytes(intact[: len(intact) // 2])
    with pytest.raises(CorruptFileError, match=f"{weights}: checksum mismatch"):
        check_export(export)
    (export / "_checksums.json").unlink()  # an export from elsewhere: safetensors itself notices
    with pytest.raises(CorruptFileError, match=f"{export}: unreadable export"):
        check_export(export)
    # as train's init: named in preflight, before any process starts
    data = tiny_captions(tmp_path, shapesworld={"train_images": 4, "test_images": 0}, shard_size=4)
    run_captions(data)
    params = load_params("train").model_copy(deep=True)
    params.data.shards = [str(data.output_dir / "train" / "*.tar")]
    params.model.init = str(export)
    params.method.name = "siglip"
    params.data.phrases_as_captions = 0
    with pytest.raises(CorruptFileError, match="unreadable export"):
        preflight(params)
    # a cut-off shard, likewise
    params.model.init = "scratch"
    shard = next((data.output_dir / "train").glob("*.tar"))
    shard.write_bytes(shard.read_bytes()[:3000])
    with pytest.raises(CorruptFileError, match=f"{shard}: not a readable tar shard"):
        preflight(params)


def test_a_manifest_that_is_not_parquet_is_named(tmp_path):
    manifest = tmp_path / "manifest.parquet"
    manifest.write_text("key,split\nk,train\n")
    result = subprocess.run([sys.executable, "-m", "components.concepts", "--params", str(_yaml(tmp_path, {"manifest": str(manifest)}))],
                            cwd=REPO, capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 2 and f"{manifest}: not a readable Parquet file" in result.stderr and "Traceback" not in result.stderr


def _yaml(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(json.dumps(data))
    return path


# --------------------------------------------------------------------------------------------------
# 7. the downloader: public addresses only, an overall deadline, odd encodings, confined local paths
# --------------------------------------------------------------------------------------------------


def _jpeg() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (10, 200, 10)).save(buf, format="JPEG")
    return buf.getvalue()


class _Hostile(BaseHTTPRequestHandler):
    hits: dict = {}
    release = threading.Event()  # set when the test's server shuts down: /stall.jpg's body stays stalled until then

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.hits[self.path] = self.hits.get(self.path, 0) + 1
        port = self.server.server_address[1]
        if self.path == "/good.jpg":
            body = _jpeg()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/to-loopback.jpg":  # a redirect from an allowed name to a refused address
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{port}/good.jpg")
            self.end_headers()
        elif self.path in ("/stall.jpg", "/cut.jpg"):  # 10 of 1000 bytes, then silence or a closed connection
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b"\xff" * 10)
            self.wfile.flush()
            if self.path == "/stall.jpg":
                self.release.wait(HANG_S)  # stalls until the test ends: past any timeout_s, however slow the machine
            self.close_connection = True
        elif self.path == "/drip.jpg":  # one byte every 0.2 s, each well within the read timeout
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            try:
                for _ in range(100000):
                    self.wfile.write(b"\xff")
                    self.wfile.flush()
                    time.sleep(0.2)
            except OSError:
                pass


@pytest.fixture
def hostile():
    _Hostile.hits, _Hostile.release = {}, threading.Event()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_address[1], _Hostile.hits
    _Hostile.release.set()
    httpd.shutdown()
    httpd.server_close()


def _table_run(tmp_path, rows, download, encoding="utf-8", image_root=None):
    with open(tmp_path / "t.csv", "w", newline="", encoding=encoding) as f:
        writer = csv.writer(f)
        writer.writerow(["url", "caption"])
        writer.writerows(rows)
    table = {"path": str(tmp_path / "t.csv"), "caption_columns": {"long": "caption"}, "image_column": "url",
             "download": {"timeout_s": 20, "retries": 0, **download}}  # 20 s: a loaded machine's answers come in time
    if image_root:
        table["image_root"] = str(image_root)
    params = CaptionsParams.model_validate({"source": "table", "caption_field": "long", "shard_size": 10, "workers": 1,
                                            "contact_sheet": None, "output_dir": str(tmp_path / "out"),
                                            "stats_path": str(tmp_path / "stats.json"), "table": table})
    return run_captions(params), params


def test_non_public_addresses_and_redirects_to_them_are_refused(tmp_path, hostile):
    port, hits = hostile
    rows = [(f"http://127.0.0.1:{port}/good.jpg", "loopback"), (f"http://localhost:{port}/to-loopback.jpg", "redirected")]
    stats, _ = _table_run(tmp_path, rows, {"allow_hosts": ["localhost"]})  # the name only, not 127.0.0.1
    assert stats["skipped"] == {"refused_address": 2} and stats["samples_written"] == 0
    assert hits == {"/to-loopback.jpg": 1}  # the loopback URL was never fetched, the redirect never followed
    cfg = DownloadParams()
    for url in ("http://10.1.2.3/x.jpg", "http://192.168.0.1/x.jpg", "http://169.254.169.254/latest/meta-data",
                "http://[::1]/x.jpg", "http://0.0.0.0/x.jpg", "ftp://example.org/x.jpg"):
        assert refused_address(url, cfg), url
    assert refused_address("http://10.1.2.3/x.jpg", DownloadParams(allow_hosts=["10.0.0.0/8"])) is None  # a team's mirror
    (tmp_path / "allowed").mkdir()
    stats, _ = _table_run(tmp_path / "allowed", [(f"http://127.0.0.1:{port}/good.jpg", "mirror")], {"allow_hosts": ["127.0.0.1"]})
    assert stats["samples_written"] == 1


def test_a_dripping_server_cannot_outlast_the_download_deadline(tmp_path, hostile):
    port, _ = hostile
    stats, _ = _table_run(tmp_path, [(f"http://127.0.0.1:{port}/drip.jpg", "slow")], {"allow_hosts": ["127.0.0.1"], "deadline_s": 3})
    assert stats["skipped"] == {"deadline": 1}  # not timeout: every single read came within timeout_s


def test_a_body_that_stalls_or_is_cut_off_is_a_counted_skip_not_a_crash(tmp_path, hostile):
    port, _ = hostile
    rows = [(f"http://127.0.0.1:{port}/stall.jpg", "stalls"), (f"http://127.0.0.1:{port}/cut.jpg", "cut off"),
            (f"http://127.0.0.1:{port}/good.jpg", "fine")]
    stats, _ = _table_run(tmp_path, rows, {"allow_hosts": ["127.0.0.1"]})  # /stall.jpg stalls until the test ends
    assert stats["skipped"] == {"timeout": 1, "connection_error": 1} and stats["samples_written"] == 1


def test_undecodable_text_and_paths_outside_the_image_root_are_counted_skips(tmp_path):
    root = tmp_path / "images"
    root.mkdir()
    (root / "ok.jpg").write_bytes(_jpeg())
    (tmp_path / "secret.jpg").write_bytes(_jpeg())
    rows = [("ok.jpg", "caf\u00e9 in Latin-1"), ("ok.jpg", "plain"), ("../secret.jpg", "escape"), (str(tmp_path / "secret.jpg"), "absolute")]
    stats, params = _table_run(tmp_path, rows, {}, encoding="latin-1", image_root=root)
    assert stats["skipped"] == {"undecodable_text": 1, "outside_image_root": 2} and stats["samples_written"] == 1
    assert [r["long"] for r in pq.read_table(params.output_dir / "manifest.parquet").to_pylist()] == ["plain"]


# --------------------------------------------------------------------------------------------------
# 8. params files: empty and duplicate keys are errors
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, message", [
    ("", "no params in the file"),
    ("# only a comment\n\n", "no params in the file"),
    ("shard_size: 10\nseed: 1\nshard_size: 20\n", "duplicate key 'shard_size' \\(first at line 1\\)"),
    ("shapesworld:\n  train_images: 5\n  train_images: 6\n", "duplicate key 'train_images'"),
])
def test_empty_and_duplicate_key_params_files_are_errors(tmp_path, text, message):
    path = tmp_path / "captions.yaml"
    path.write_text(text)
    with pytest.raises(ParamsError, match=f"{path}: .*{message}"):
        load_params("captions", path)
    path.write_text("{}\n")
    assert read_yaml(path) == {}  # all defaults, said explicitly


# --------------------------------------------------------------------------------------------------
# 9. credentials never reach files or messages
# --------------------------------------------------------------------------------------------------


def test_credentials_are_redacted_from_urls_and_messages():
    assert redact("postgresql://alice:s3cret@db:5432/mlflow") == "postgresql://***@db:5432/mlflow"
    text = redact("GET https://bucket.s3.amazonaws.com/a.jpg?X-Amz-Signature=abc123&X-Amz-Credential=k failed")
    assert "abc123" not in text and text == "GET https://bucket.s3.amazonaws.com/a.jpg?<redacted> failed"
    assert redact("sqlite:////tmp/mlflow.db and data/x.jpg") == "sqlite:////tmp/mlflow.db and data/x.jpg"


def test_a_signed_table_url_leaves_no_secret_in_stats_or_samples(tmp_path):
    rows = [("https://user:p4ss@127.0.0.1:9/a.jpg?sig=T0KEN", "refused"), ("http://127.0.0.1:9/b.jpg?token=T0KEN2", "refused too")]
    stats, params = _table_run(tmp_path, rows, {})
    written = (tmp_path / "stats.json").read_text()
    assert stats["skipped"] == {"refused_address": 2}
    assert "T0KEN" not in written and "p4ss" not in written and "<redacted>" in written


def test_an_mlflow_error_does_not_carry_the_tracking_password(tmp_path, monkeypatch):
    from components.evaluate import EvaluateError, resolve_model
    from components.shared.params import EvalModelSpec

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://alice:s3cretpw@127.0.0.1:9")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with pytest.raises(EvaluateError) as refused:
        resolve_model(EvalModelSpec(name="m", uri="models:/nothing@champion"), tmp_path)
    assert "127.0.0.1:9" in str(refused.value) and "s3cretpw" not in str(refused.value)


def test_an_uncaught_error_in_a_stage_prints_no_credentials():
    script = ("from components.shared.processes import stage_process_setup; stage_process_setup()\n"
              "raise ConnectionError('API request to http://alice:s3cretpw@mlflow.internal/api failed')")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 1 and "ConnectionError" in result.stderr and "http://***@mlflow.internal/api" in result.stderr
    assert "s3cretpw" not in result.stderr


# --------------------------------------------------------------------------------------------------
# 12. one-process runs do not compile DeepSpeed's shared-memory op
# --------------------------------------------------------------------------------------------------


def test_a_one_process_world_needs_no_deepspeed_comm_op():
    ds_torch_comm = importlib.import_module("deepspeed.comm.torch")  # (deepspeed.comm.torch, the attribute, is torch itself)

    from components.shared.distributed import prepare_deepspeed_comm

    original = ds_torch_comm.build_shm_op
    try:
        prepare_deepspeed_comm(1)
        assert ds_torch_comm.build_shm_op() is None
    finally:
        ds_torch_comm.build_shm_op = original
