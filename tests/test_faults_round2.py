"""Fault injection, round two: the flow's overrides under the workspace lock, the model-backed stages (recaption,
LLM phrases, Hugging Face towers), DNS rebinding, outputs that are not a stage's own, malformed tables, damaged
weights and images, prompt injection, full disks and YAML merge keys. As in test_faults.py, each test makes the
fault first, then checks that nothing ran, nothing was lost, and the error is one line naming the file, key or item."""

import base64
import json
import shutil
import threading
from pathlib import Path

import pytest
from conftest import HANG_S, REPO

from flows import workspace

# --------------------------------------------------------------------------------------------------
# overrides are merged only under the workspace lock
# --------------------------------------------------------------------------------------------------


def _params_workspace(tmp_path: Path) -> Path:
    work = tmp_path / "ws"
    shutil.copytree(REPO / "params", work / "params")
    return work


def _train_yaml(work: Path) -> dict:
    import yaml

    return yaml.safe_load((work / "params" / "train.yaml").read_text())


def test_a_killed_runs_overrides_do_not_leak_into_the_next_run(tmp_path):
    work = _params_workspace(tmp_path)
    original = (work / "params" / "train.yaml").read_bytes()
    # the fault: run A was killed with its override (seed 2) on disk and its journal of the originals left behind
    (work / ".c2lip-params-journal.json").write_text(json.dumps({"params/train.yaml": base64.b64encode(original).decode()}))
    (work / "params" / "train.yaml").write_bytes(original.replace(b"\nseed: 0\n", b"\nseed: 2\n"))
    assert _train_yaml(work)["seed"] == 2
    with workspace.run_with_overrides(work, {"train": {"log_every": 10}}, "flow run B") as merged:
        seen = _train_yaml(work)
    assert merged["train"]["seed"] == 0 and seen["seed"] == 0 and seen["log_every"] == 10
    assert (work / "params" / "train.yaml").read_bytes() == original


def test_a_queued_run_does_not_inherit_the_overrides_of_the_run_ahead_of_it(tmp_path):
    work = _params_workspace(tmp_path)
    original = (work / "params" / "train.yaml").read_bytes()
    a_applied, release_a, seen_by_b = threading.Event(), threading.Event(), {}

    def run_a():
        with workspace.run_with_overrides(work, {"train": {"seed": 2}}, "flow run A"):
            a_applied.set()
            release_a.wait(HANG_S)

    def run_b():
        with workspace.run_with_overrides(work, {"train": {"log_every": 10}}, "flow run B", wait_s=HANG_S, poll_s=0.05) as merged:
            seen_by_b.update(file=_train_yaml(work), merged=merged["train"])

    a = threading.Thread(target=run_a)
    a.start()
    assert a_applied.wait(HANG_S)
    assert _train_yaml(work)["seed"] == 2  # A's overrides are on disk while B queues
    b = threading.Thread(target=run_b)
    b.start()
    b.join(0.5)
    assert b.is_alive() and not seen_by_b  # B waits for the lock
    release_a.set()
    a.join(HANG_S)
    b.join(HANG_S)
    assert seen_by_b["file"]["seed"] == 0 and seen_by_b["file"]["log_every"] == 10
    assert seen_by_b["merged"]["seed"] == 0
    assert (work / "params" / "train.yaml").read_bytes() == original


# --------------------------------------------------------------------------------------------------
# DNS rebinding: the connection goes to the address that was checked
# --------------------------------------------------------------------------------------------------


def _serve(address: str, port: int, body: bytes, hits: list):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the http.server API
            hits.append(self.headers.get("Host"))
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer((address, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_resolver_that_answers_differently_the_second_time_cannot_redirect_the_connection(monkeypatch):
    import socket

    from components.data import download as dl
    from components.shared.params import DownloadParams

    victim_hits, mirror_hits = [], []
    victim = _serve("127.0.0.1", 0, b"this machine's secret", victim_hits)  # what rebinding would reach
    port = victim.server_address[1]
    mirror = _serve("127.0.0.2", port, b"the mirror's image", mirror_hits)  # the address the check admits
    real, answers = socket.getaddrinfo, []

    def rebinding(host, *args, **kwargs):  # first answer: the admitted mirror; every later one: loopback
        if host != "images.rebind.test":
            return real(host, *args, **kwargs)
        answers.append(host)
        address = "127.0.0.2" if len(answers) == 1 else "127.0.0.1"
        return real(address, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    cfg = DownloadParams(allow_hosts=["127.0.0.2"], retries=0)
    session = dl.make_session(cfg)
    try:
        body = dl.download(session, f"http://images.rebind.test:{port}/a.jpg", cfg)
        assert body == b"the mirror's image" and victim_hits == []
        assert mirror_hits == [f"images.rebind.test:{port}"]  # the name stays in the Host header
        # a second request resolves again: now loopback, which the check refuses before any connection
        again = dl.download(session, f"http://images.rebind.test:{port}/b.jpg", cfg)
        assert isinstance(again, dl.Skip) and again.reason == "refused_address" and victim_hits == []
    finally:
        session.close()
        victim.shutdown()
        mirror.shutdown()
