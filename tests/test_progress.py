"""Progress in time: a long step says what it does when it starts and then at least every C2LIP_PROGRESS_EVERY_S seconds,
in the stage's own output and in the flow's log, whether or not a unit of work finished.

The integration test slows a real stage down (a URL table whose images a loopback server answers 2.5 s each) and runs
it as the flow runs a command, with the interval at 1 s. The bounds leave a loaded machine four times the interval: the
largest gap between the log's lines must be under one image's answer (4 s) while the stage's slow part lasts 16 s, and
the bar must be logged at least once per 4 s of it; a bar drawn only per finished shard is logged 3 times in all."""

import csv
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import BytesIO

import pytest
import yaml
from conftest import HANG_S, REPO
from PIL import Image

from components.shared import progress
from flows.progress import ProgressLog, follow

SLOW_S = 4.0  # each image's answer: 8 s a shard of two


class Lines:
    """A logger that keeps (time, message) of each line."""

    def __init__(self):
        self.lines: list[tuple[float, str]] = []

    def info(self, message, *args):
        self.lines.append((time.monotonic(), message % args if args else message))

    warning = info


def _bar(n, total, elapsed="00:01", eta="00:09"):
    return f"train c2lip:  {100 * n // total}%|#   | {n}/{total} [{elapsed}<{eta},  1.00it/s, loss=1.2]"


def test_a_bar_is_logged_at_each_tenth_and_after_a_quiet_interval(monkeypatch):
    """A redraw of the same tenth is logged only once the bar has been quiet in the log for about the interval."""
    monkeypatch.setenv("C2LIP_PROGRESS_EVERY_S", "20")
    now = [0.0]
    log = Lines()
    bars = ProgressLog(log, artifacts=False, clock=lambda: now[0])
    assert bars.feed(_bar(0, 300)) and len(log.lines) == 1  # the first draw
    now[0] = 5.0
    assert bars.feed(_bar(0, 300)) and len(log.lines) == 1  # a redraw 5 s later: nothing new to say
    now[0] = 19.0
    assert bars.feed(_bar(1, 300)) and len(log.lines) == 2  # 19 s after the last logged line (the timer's redraw, early)
    assert "1/300 (0%)" in log.lines[-1][1] and "ETA 00:09" in log.lines[-1][1]
    now[0] = 20.0
    assert bars.feed(_bar(30, 300)) and len(log.lines) == 3  # a new tenth is logged at once
    now[0] = 21.0
    assert bars.feed(_bar(31, 300)) and len(log.lines) == 3
    assert not bars.feed("an ordinary line")


def test_a_silent_command_is_said_to_be_running_and_a_slow_step_to_be_working(monkeypatch, capsys):
    monkeypatch.setenv("C2LIP_PROGRESS_EVERY_S", "1")
    log = Lines()
    command = [sys.executable, "-c", "import time; print('first', flush=True); time.sleep(4); print('last', flush=True)"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    kept = follow(proc.stdout, log, "the command", ProgressLog(log, artifacts=False))
    assert proc.wait(timeout=HANG_S) == 0 and kept == ["first", "last"]
    said = [message for _, message in log.lines]
    assert said[0] == "first" and said[-1] == "last"
    assert any(m.startswith("the command: still running") for m in said[1:-1]), said
    # a command that prints all the time but nothing the log keeps (a bar of another format): the log's silence counts
    log = Lines()
    chatty = [sys.executable, "-c", "import time\nfor _ in range(20): print('tick', flush=True); time.sleep(0.2)"]
    proc = subprocess.Popen(chatty, stdout=subprocess.PIPE, text=True)
    follow(proc.stdout, log, "the chatty command", ProgressLog(log, artifacts=False), other=lambda line: False)
    assert proc.wait(timeout=HANG_S) == 0
    assert any(m.startswith("the chatty command: still running") for _, m in log.lines), log.lines
    with progress.working("stage: building the model"):
        time.sleep(4)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "stage: building the model ..." and err[-1].startswith("stage: building the model: done in")
    assert any(line.startswith("stage: building the model: still working, ") for line in err[1:-1]), err


class _SlowImages(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        time.sleep(SLOW_S)
        buffer = BytesIO()
        Image.new("RGB", (16, 16), (200, 30, 30)).save(buffer, format="JPEG")
        body = buffer.getvalue()
        self.send_response(200)
        self.send_header("Content-Type", "image/jpeg")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.mark.slow
def test_a_slowed_stage_is_never_silent_for_long_in_the_flow_log(tmp_path, monkeypatch):
    monkeypatch.setenv("C2LIP_PROGRESS_EVERY_S", "1")  # the flow's side and, through the environment, the stage's
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _SlowImages)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    rows = 4
    with open(tmp_path / "table.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["url", "text"])
        writer.writerows([f"{base}/image.jpg?{i}", f"a red square {i}"] for i in range(rows))
    params = {"output_dir": str(tmp_path / "captions"), "stats_path": str(tmp_path / "captions.json"), "contact_sheet": None,
              "workers": 1, "source": "table", "caption_field": "text", "shard_size": 2,
              "table": {"path": str(tmp_path / "table.csv"), "image_column": "url", "caption_columns": {"text": "text"},
                        "download": {"concurrency": 1, "timeout_s": 60, "allow_hosts": ["127.0.0.1"]}}}
    (tmp_path / "captions.yaml").write_text(yaml.safe_dump(params))
    log = Lines()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "components.captions", "--params", str(tmp_path / "captions.yaml")], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        kept = follow(proc.stdout, log, "captions", ProgressLog(log, artifacts=False))
        assert proc.wait(timeout=HANG_S) == 0, "\n".join(kept[-30:])
    finally:
        httpd.shutdown()
    said = [message for _, message in log.lines]
    start = next(k for k, m in enumerate(said) if m.startswith("captions: reading the source"))
    times = [t for t, _ in log.lines[start:]]
    assert times[-1] - times[0] >= rows * SLOW_S * 0.9  # the stage was slow ...
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert max(gaps) <= SLOW_S, list(zip(gaps, said[start + 1:], strict=False))  # ... and never silent for long
    bars = [m for m in said if m.startswith("captions (table): ") and "ETA" in m]
    assert len(bars) >= rows * SLOW_S // 4, said  # the bar itself, redrawn in time (not only per shard), with its ETA
    assert any("samples_written=2" in m for m in said), said  # the counter counts samples, not shards
