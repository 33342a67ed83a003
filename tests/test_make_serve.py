"""`make serve` on a fresh clone, end to end: the Prefect server, the deployments and the reports server that
infra/serve.sh starts, then an evaluate deployment run of the committed base. Its own file, apart from the reproduced
clone's tests, so that pytest-xdist (a file per worker) runs it beside them."""

import json
import os
import re
import subprocess
import time
import urllib.request

import pytest
from conftest import HANG_S, REPO, free_port, is_served, make_clone


@pytest.mark.slow
def test_make_serve_on_a_fresh_clone_evaluates_the_committed_base(tmp_path):
    """`make serve`'s script on a fresh clone (no data, no .prefect/): the server, the deployments and the reports
    server come up; the evaluate deployment of the committed base builds the ShapesWorld suite it needs, writes its
    report, serves it over http, and its Prefect artifact names the MLflow run that logged it."""
    import signal

    from components.benchmarks import SUITE_MARKER

    work, env = make_clone(tmp_path)
    assert not (work / "data" / "benchmarks").exists() and not (work / ".prefect").exists()
    port, reports_port = free_port(), free_port()
    env = {k: v for k, v in env.items() if k != "PREFECT_HOME"}  # the script's own default: the clone's .prefect/
    env.update(PREFECT_PORT=str(port), C2LIP_REPORTS_PORT=str(reports_port), PREFECT_UI_ENABLED="false", PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_RUNNER_POLL_FREQUENCY="1")  # the runner picks a run up within 1 s, not 10
    api = f"http://127.0.0.1:{port}/api"
    client_env = {**env, "PREFECT_API_URL": api, "PREFECT_HOME": str(work / ".prefect")}
    prefect = str(REPO / ".venv" / "bin" / "prefect") if (REPO / ".venv" / "bin" / "prefect").exists() else "prefect"
    serving = subprocess.Popen(
        ["bash", "infra/serve.sh"], cwd=work, env=env, stdout=open(tmp_path / "serve.log", "w"), stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        deadline = time.time() + HANG_S
        # the copy-paste line is printed only once the deployments exist: a paste the moment it shows never gets
        # "deployment not found"
        while "In another shell:" not in (tmp_path / "serve.log").read_text():
            assert time.time() < deadline and serving.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            time.sleep(0.2)
        assert all(is_served(api, f"c2lip/{name}") for name in ("full", "evaluate", "promote", "compare"))
        assert f"PREFECT_API_URL={api} .venv/bin/prefect deployment run c2lip/full" in (tmp_path / "serve.log").read_text()
        assert (work / ".prefect" / "server.log").is_file()  # the log the script names exists
        model = json.dumps({"name": "base", "uri": "models/base/export"})
        done = subprocess.run(
            [prefect, "deployment", "run", "c2lip/evaluate", "--watch", "--watch-timeout", str(HANG_S), "--param", f"model={model}"],
            env=client_env,
            capture_output=True,
            text=True,
            timeout=HANG_S + 60,
        )
        log = (tmp_path / "serve.log").read_text()
        assert done.returncode == 0 and "Completed" in done.stdout, done.stdout + done.stderr + log[-4000:]
        assert "building it (dvc repro benchmarks)" in log and (work / "data" / "benchmarks" / "shapesworld" / SUITE_MARKER).is_file()
        # the evaluation runs as a task whose bars reach the flow's log a tenth at a time, not the worker's stderr
        assert re.search(r"base images: \d+/\d+ \(\d+%\), elapsed", log), log[-4000:]
        report = work / "reports" / "adhoc" / "base"
        metrics = json.loads((report / "metrics.json").read_text())
        suite = json.loads((work / "data" / "benchmarks" / "shapesworld" / "stats.json").read_text())
        assert metrics["base/zero_shot/items"] == suite["zero_shot"]["images"] and 0 <= metrics["base/zero_shot/top1"] <= 1
        # served over http on 127.0.0.1, as the link artifacts point
        with urllib.request.urlopen(f"http://127.0.0.1:{reports_port}/adhoc/base/benchmarks.md?raw", timeout=HANG_S) as page:
            assert page.read() == (report / "benchmarks.md").read_bytes()
        with urllib.request.urlopen(f"http://127.0.0.1:{reports_port}/adhoc/base/benchmarks.md", timeout=HANG_S) as page:
            assert page.headers["Content-Type"] == "text/html; charset=utf-8" and b'src="benchmarks.png"' in page.read()
        # the report artifact names the MLflow run that logged the same report
        shown = subprocess.run([prefect, "artifact", "inspect", "c2lip-evaluate-base"], env={**client_env, "COLUMNS": "250"}, capture_output=True, text=True)
        import mlflow

        mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
        run = mlflow.search_runs(experiment_names=["c2lip"], filter_string=f"tags.report_dir = '{report.resolve()}'", output_format="list")
        assert len(run) == 1 and run[0].data.metrics["base/zero_shot/top1"] == pytest.approx(metrics["base/zero_shot/top1"], rel=1e-6)
        assert "The same report in MLflow" in shown.stdout and run[0].info.run_id in shown.stdout, shown.stdout + shown.stderr
    finally:
        if serving.poll() is None:
            os.killpg(serving.pid, signal.SIGTERM)
            try:
                serving.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(serving.pid, signal.SIGKILL)
