"""End to end on a clone: `dvc repro` of every stage, then the Prefect deployments on a real server.

Both start from one reproduced clone (conftest.reproduced_clone, built once): `make test` distributes
tests by file (pytest-xdist --dist loadfile), so this module's tests share it on one worker."""

import csv
import io
import json
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml
from conftest import HANG_S, REPO, copy_clone, free_port, is_served

from flows import workspace


@pytest.mark.slow
def test_dvc_repro_runs_the_stages_and_then_is_up_to_date(reproduced_clone, tmp_path):
    first_stdout = (reproduced_clone[0].parent / "first_repro.log").read_text()  # the clone's first `dvc repro`
    work, env = copy_clone(reproduced_clone, tmp_path)
    params = yaml.safe_load((work / "params" / "captions.yaml").read_text())

    def dvc(*args):
        return subprocess.run(["dvc", *args], cwd=work, env=env, capture_output=True, text=True, timeout=HANG_S)

    metrics = yaml.safe_load((work / "metrics" / "captions.json").read_text())
    assert metrics["samples_by_split"] == {"train": 40, "test": 10}
    assert (work / "data" / "captions" / "manifest.parquet").is_file()
    assert (work / "docs" / "shapesworld_contact_sheet.png").is_file()
    recaptioned = yaml.safe_load((work / "metrics" / "recaption.json").read_text())  # between captions and concepts
    assert recaptioned["samples"] == 40 and recaptioned["failures_total"] == 0 and recaptioned["captioner"] == "shapesworld"
    assert (work / "data" / "recaptions" / "manifest.parquet").is_file() and (work / "docs" / "recaption_contact_sheet.png").is_file()
    concepts = yaml.safe_load((work / "metrics" / "concepts.json").read_text())
    assert concepts["captions"] == 40 and concepts["quality"]["long"]["recall"] >= 0.98
    assert len(list((work / "data" / "concepts" / "train").glob("shard-*.parquet"))) == 2
    # the frozen base stage is not re-run: train fine-tunes the committed base export
    assert "Running stage 'base'" not in first_stdout and "Running stage 'train'" in first_stdout
    trained = yaml.safe_load((work / "metrics" / "train.json").read_text())
    assert trained["steps"] == 2 and 0 <= trained["zero_shot_top1"] <= 1
    assert (work / "models" / "train" / "export" / "open_clip_model.safetensors").is_file()
    # the export's model card holds the run's own figures and recipe, and the checksums cover it
    from components.shared.checkpoints import check_export
    from components.shared.model_card import card_figures, read_front_matter

    card = work / "models" / "train" / "export" / "README.md"
    front = read_front_matter(card)
    # a local start is not a Hub id: the card names it in its body, not in the Hub's base_model field
    assert front["library_name"] == "open_clip" and "base_model" not in front and "c2lip" in front["tags"]
    assert "| started from | `models/base/export` |" in card.read_text()
    assert card_figures(front)["zero_shot_top1"] == pytest.approx(trained["zero_shot_top1"], abs=1e-5)
    assert "| samples seen | 16 |" in card.read_text()  # 2 steps of 8 (the clone's tiny params)
    check_export(card.parent)

    # the benchmarks stage wrote ShapesWorld's suite from the 10 test images; evaluate read it for both models
    suite = yaml.safe_load((work / "data" / "benchmarks" / "shapesworld" / "stats.json").read_text())
    assert suite["images"] == 10
    report = yaml.safe_load((work / "reports" / "metrics.json").read_text())
    assert report["base/zero_shot/items"] == report["finetuned/zero_shot/items"] == suite["zero_shot"]["images"]
    assert report["base/sugarcrepe/add_att/items"] == suite["sugar_crepe"]["add_att"]
    assert report["finetuned/long_captions/items"] == suite["long_captions"]["images"] == 10
    assert {"base/summary/compositional", "finetuned/summary/compositional"} <= set(report)
    assert "| base | finetuned | Δ finetuned − base |" in (work / "reports" / "benchmarks.md").read_text()
    assert (work / "reports" / "benchmarks.png").is_file() and (work / "reports" / "plots" / "finetuned.json").is_file()
    metrics_show = dvc("metrics", "show", "--json")
    assert "finetuned/summary/zero_shot" in metrics_show.stdout

    second = dvc("repro")
    assert second.returncode == 0
    assert "didn't change, skipping" in second.stdout and "Running stage" not in second.stdout
    # (a train param changed re-runs only train and evaluate: the deployment test below checks it on its run)
    diff = dvc("metrics", "diff", "--json")  # against the clone's commit, which has no report yet
    assert "finetuned/summary/zero_shot" in diff.stdout and "reports/metrics.json" in diff.stdout, diff.stdout

    # a page of yours in the gallery: DVC leaves the stage's outputs in place (persist) and the stage refuses, naming it,
    # before any work; without persist `dvc repro` deleted reports/gallery whole before the stage ran
    (work / "reports" / "gallery" / "mine.html").write_text("<p>mine</p>")
    again = dvc("repro", "--force", "--single-item", "evaluate")
    assert again.returncode != 0 and "mine.html" in again.stdout + again.stderr
    assert (work / "reports" / "gallery" / "mine.html").read_text() == "<p>mine</p>"
    assert (work / "reports" / "gallery" / "index.html").is_file() and (work / "reports" / "benchmarks.md").is_file()
    (work / "reports" / "gallery" / "mine.html").unlink()

    params["seed"] = 3
    (work / "params" / "captions.yaml").write_text(yaml.safe_dump(params))
    status = dvc("status")
    assert "params/captions.yaml" in status.stdout and "seed" in status.stdout


def documented_deployment_runs(page, budget: bool = True) -> list[tuple[str, list[str]]]:
    """The `prefect deployment run` examples of a page, in order: (deployment, its --param values); with ``budget`` the
    full run's ``overrides`` become the test's own (3 training steps)."""
    import shlex

    runs = []
    for line in page.read_text().splitlines():
        if line.startswith(".venv/bin/prefect deployment run "):
            args = shlex.split(line, comments=True)
            params = [args[k + 1] for k, arg in enumerate(args) if arg == "--param"]
            if budget:
                params = ['overrides={"train": {"steps": 3}}' if p.startswith("overrides=") else p for p in params]
            runs.append((args[3], params))
    return runs


@pytest.mark.slow
def test_deployments_on_a_real_prefect_server(reproduced_clone, tmp_path):
    """A Prefect server on 127.0.0.1 (temporary PREFECT_HOME), the deployments served from a clone (whose
    data stages DVC already ran), then `prefect deployment run`: a run refused while another holds the
    workspace, a full run with an override (waited to COMPLETED; params files untouched; a DVC
    experiment; a registered challenger), and a promotion."""
    work, env = copy_clone(reproduced_clone, tmp_path)
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_API_URL=api, PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_UI_ENABLED="false", PREFECT_RUNNER_POLL_FREQUENCY="1")  # the runner picks a run up within 1 s, not 10
    prefect = str(REPO / ".venv" / "bin" / "prefect") if (REPO / ".venv" / "bin" / "prefect").exists() else "prefect"
    server = subprocess.Popen([prefect, "server", "start", "--host", "127.0.0.1", "--port", str(port)], env=env,
                              stdout=open(tmp_path / "server.log", "w"), stderr=subprocess.STDOUT)
    served = None
    try:
        deadline = time.time() + HANG_S
        while True:
            try:
                urllib.request.urlopen(f"{api}/health", timeout=2)
                break
            except OSError:
                assert time.time() < deadline and server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
                time.sleep(1)
        served = subprocess.Popen([sys.executable, "-m", "flows.serve"], cwd=work, env=env,
                                  stdout=open(tmp_path / "serve.log", "w"), stderr=subprocess.STDOUT)

        def deployment_run(name: str, *params: str) -> subprocess.CompletedProcess:
            deadline = time.time() + HANG_S
            while not is_served(api, name):  # the served deployments appear once flows.serve has registered them
                assert time.time() < deadline and served.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
                time.sleep(1)
            args = [prefect, "deployment", "run", name, "--watch", "--watch-timeout", str(HANG_S)]
            for p in params:
                args += ["--param", p]
            return subprocess.run(args, env=env, capture_output=True, text=True, timeout=HANG_S + 60)

        params_before = {p.name: p.read_bytes() for p in (work / "params").glob("*.yaml")}
        with workspace.workspace_lock(work, "the test, pretending to be a running full flow"):
            refused = deployment_run("c2lip/full")
        assert refused.returncode != 0
        assert "another c2lip run holds the workspace" in (tmp_path / "serve.log").read_text()

        # the README's examples, in the order written (getting started lists the same): the full run's training budget
        # is the test's own (3 steps instead of 600), every other parameter as written
        examples = documented_deployment_runs(REPO / "README.md")
        for page in (REPO / "README.md", REPO / "docs" / "getting-started.md"):  # promote before the champion is evaluated
            assert [name for name, _ in documented_deployment_runs(page)] == ["c2lip/full", "c2lip/promote", "c2lip/evaluate"], page
        champion = examples[2][1]
        # evaluated before any promotion (the old order): the run fails, and the terminal that watched it says why
        early = deployment_run("c2lip/evaluate", *champion)
        assert early.returncode != 0 and "promote it first" in early.stdout, early.stdout + early.stderr
        done = deployment_run(examples[0][0], *examples[0][1])
        log = (tmp_path / "serve.log").read_text()
        assert done.returncode == 0 and "Completed" in done.stdout, done.stdout + done.stderr + log[-4000:]
        assert {p.name: p.read_bytes() for p in (work / "params").glob("*.yaml")} == params_before
        assert yaml.safe_load((work / "metrics" / "train.json").read_text())["steps"] == 3  # the override took effect
        # a train param changed: DVC re-ran train and evaluate only (the clone's data stages were done)
        ran = list(dict.fromkeys(line.split("Running stage '")[1].split("'")[0] for line in log.splitlines() if "Running stage '" in line))
        assert ran == ["train", "evaluate"], log[-4000:]
        experiments = subprocess.run(["dvc", "exp", "list", "--name-only"], cwd=work, env=env, capture_output=True, text=True)
        assert len(experiments.stdout.split()) == 1, experiments.stdout + experiments.stderr  # the run, as a DVC experiment
        shown = subprocess.run(["dvc", "exp", "show", "--csv"], cwd=work, env=env, capture_output=True, text=True)
        table = list(csv.DictReader(io.StringIO(shown.stdout)))
        row = next(r for r in table if r.get("Experiment") == experiments.stdout.split()[0])
        assert row["params/train.yaml:steps"] == "3", row  # its params: the override
        # and its metrics: a run's reports are not in git, so DVC keeps them in its cache for the experiment
        column = next(c for c in row if c.endswith("finetuned/summary/zero_shot"))
        measured = json.loads((work / "reports" / "metrics.json").read_text())["finetuned/summary/zero_shot"]
        assert row[column] not in ("", "!", "-") and float(row[column]) == pytest.approx(measured, rel=1e-4), row
        assert (work / "reports" / "benchmarks.md").is_file() and any((work / ".dvc-remote").rglob("*"))  # pushed

        import mlflow

        mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
        client = mlflow.MlflowClient()
        version = client.get_model_version_by_alias("c2lip", "challenger")
        assert str(version.version) == "1" and json.loads(version.tags["overrides"]) == {"train": {"steps": 3}}
        assert float(version.tags["summary.zero_shot"]) >= 0 and version.tags["method"] == "c2lip"

        promoted = deployment_run(examples[1][0], *examples[1][1])
        assert promoted.returncode == 0, promoted.stdout + promoted.stderr
        assert str(client.get_model_version_by_alias("c2lip", "champion").version) == "1"

        train_runs = mlflow.search_runs(experiment_names=["c2lip"], filter_string="params.steps = '3'", output_format="list")
        assert len(train_runs) == 1  # the override is in MLflow too
        evaluated = deployment_run(examples[2][0], *champion)
        assert evaluated.returncode == 0, evaluated.stdout + evaluated.stderr
        adhoc = json.loads((work / "reports" / "adhoc" / "champion" / "metrics.json").read_text())
        assert adhoc["champion/zero_shot/top1"] == json.loads((work / "reports" / "metrics.json").read_text())["finetuned/zero_shot/top1"]

        artifacts = subprocess.run([prefect, "artifact", "ls"], env={**env, "COLUMNS": "250"}, capture_output=True, text=True)
        assert all(key in artifacts.stdout for key in ("c2lip-full", "c2lip-full-gallery", "c2lip-promotion", "c2lip-evaluate-champion")), artifacts.stdout
        assert (work / "reports" / "gallery" / "index.html").is_file()  # the link artifact's target
    finally:
        for proc in (served, server):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
