"""The team remote docs/gpus.md sets up: DVC pushes to and pulls from S3 (a real S3 API, moto's server, on 127.0.0.1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import HANG_S, REPO, free_port

DVC = str(Path(sys.executable).parent / "dvc")


def _run(args: list[str], cwd: Path, env: dict) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, f"{args}: {done.stdout[-1500:]}{done.stderr[-1500:]}"
    return done.stdout


@pytest.fixture
def s3(monkeypatch):
    """moto's S3 server on a free loopback port, with a bucket; yields (endpoint, env for the clients)."""
    pytest.importorskip("moto.server", reason="moto is a dev dependency: make install")
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    credentials = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    for key, value in credentials.items():
        monkeypatch.setenv(key, value)
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="team")
    try:
        yield endpoint, {**os.environ, **credentials}
    finally:
        server.stop()


def test_dvc_pushes_to_and_pulls_from_an_s3_remote(tmp_path, s3):
    import boto3

    endpoint, env = s3
    repo = tmp_path / "clone"
    repo.mkdir()
    _run(["git", "init", "-q"], repo, env)
    _run([DVC, "init", "-q"], repo, env)
    shards = repo / "data" / "captions"
    shards.mkdir(parents=True)
    for i in range(3):
        (shards / f"shard-{i:06d}.tar").write_bytes(os.urandom(2048) + bytes([i]))
    _run([DVC, "add", "data/captions"], repo, env)
    # docs/gpus.md's remote, with the endpoint of this test's server
    _run([DVC, "remote", "add", "-d", "team", "s3://team/c2lip"], repo, env)
    _run([DVC, "remote", "modify", "team", "endpointurl", endpoint], repo, env)
    out = _run([DVC, "push"], repo, env)
    assert "3 files pushed" in out or "4 files pushed" in out, out
    stored = boto3.client("s3", endpoint_url=endpoint).list_objects_v2(Bucket="team", Prefix="c2lip/")
    assert stored["KeyCount"] == 4  # the three shards and the folder's listing, by content hash

    # a teammate's clone: nothing but the .dvc file and the config; pull brings the bytes back
    before = {p.name: p.read_bytes() for p in shards.iterdir()}
    _run(["rm", "-rf", "data/captions", ".dvc/cache"], repo, env)
    _run([DVC, "pull"], repo, env)
    assert {p.name: p.read_bytes() for p in shards.iterdir()} == before
    # a second push of unchanged data uploads nothing
    assert "Everything is up to date" in _run([DVC, "push"], repo, env)


def test_checkpoints_are_not_copied_into_the_cache_nor_pushed():
    """DVC's advice for large outputs that a run rewrites: not cached (no second copy, nothing pushed each run)."""
    outs = {stage: [o if isinstance(o, str) else next(iter(o.items())) for o in spec.get("outs", [])]
            for stage, spec in yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"].items()}
    checkpoints = dict(o for o in outs["train"] if isinstance(o, tuple))["models/train/checkpoints"]
    assert checkpoints.get("cache") is False and checkpoints.get("persist") is True
