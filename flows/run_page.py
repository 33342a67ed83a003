"""What a flow run shows: its artifacts on the Prefect UI (the report's summary, links that open from it, the failure
gallery) and, when it fails, its reason in the final state's name (all a terminal watching it with --watch prints).
Every text an artifact or a state carries is redacted: both are stored on the Prefect server."""

from __future__ import annotations

import functools
import inspect
import json
import os
import re
from pathlib import Path

from prefect.artifacts import create_link_artifact
from prefect.artifacts import create_markdown_artifact as _create_markdown_artifact
from prefect.states import Failed

from components.shared.params import ROOT, load_params
from components.shared.redact import one_line, redact


def failure_reason(err: BaseException, limit: int = 300) -> str:
    """One line saying why a flow run failed: a stage's own ``error: …`` line when the error carries a stage's output
    (run_command's tail), else the error's first line; credentials redacted."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    stage_errors = [line[len("error:"):].strip() for line in lines if line.startswith("error:")]
    reason = stage_errors[-1] if stage_errors else lines[0] if lines else type(err).__name__
    return redact(reason if len(reason) <= limit else reason[:limit - 1] + "…")


def reason_in_state(fn):
    """A deployment flow whose failure carries its reason in the final state's name: `prefect deployment run --watch`
    prints only that name ("Flow run finished in state 'Failed'"), so the reason would otherwise reach only the UI's
    log tab. The exception is the state's data: a caller in this process still gets it raised."""
    @functools.wraps(fn)
    def named(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - every failure, named; the exception itself is kept
            from prefect.context import FlowRunContext

            if FlowRunContext.get() is None:  # called as a plain function (flow.fn): the exception as it is
                raise
            reason = failure_reason(err)
            return Failed(data=err, message=reason, name=f"Failed: {reason}")
    # the flow's parameters are typed by names of its own module (string annotations): resolved there, now, so Prefect's
    # parameter schema and validation (inspect.signature) never look for them in this module
    named.__signature__ = inspect.signature(fn, eval_str=True)
    return named


def create_markdown_artifact(markdown: str, **kwargs):
    """Prefect's markdown artifact with every credential redacted: an artifact is stored on the Prefect server and a
    tracking URI in it (where_to_watch, a run's report link) may carry a password."""
    return _create_markdown_artifact(markdown=redact(markdown), **kwargs)


def report_summary(path: Path = ROOT / "reports" / "benchmarks.md") -> str:
    """The report's summary table (the full table stays in the file and in MLflow)."""
    if not path.is_file():
        return "(no report)"
    text = path.read_text()
    start = text.find("## Summary")
    end = text.find("## Every metric")
    return text[start:end].strip() if start >= 0 else text


def artifact_key(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")[:60] or "c2lip"


def final_summary(intervals: Path, galleries: list[str], card: Path) -> list[str]:
    """What the run's last log lines say: each summary group's change (fine-tune − base) with its paired interval, and
    where the report, the failure gallery and the model card are."""
    lines = []
    if intervals.is_file():
        for model, figures in json.loads(intervals.read_text()).items():
            groups = figures.get("groups", {})
            moved = [f"{g} {v['delta']:+.3f} [{v['low']:+.3f}, {v['high']:+.3f}]" for g, v in groups.items() if not g.endswith("_held_out")]
            lines.append(f"{model} against the base: " + "; ".join(moved))
    lines.append(f"report: {page_link(intervals.parent / 'benchmarks.md')}")
    if galleries:
        lines.append(f"failure gallery: {galleries[0]}")
    if card.is_file():
        lines.append(f"model card: {card}")
    return lines


def mlflow_line(report_dir: Path, experiment: str | None = None) -> list[str]:
    """The report artifact's link to the MLflow run that logged the same report, its metrics and gallery (none when
    that run cannot be found: MLflow logging off or another tracking store)."""
    from components.shared.tracking import report_run

    try:
        where = report_run(experiment or load_params("evaluate").mlflow_experiment, report_dir)
    except Exception as err:  # noqa: BLE001 - a tracking store that cannot be read must not fail a finished run
        print(f"(the report's MLflow run could not be looked up: {one_line(err)})")
        return []
    return ["", f"The same report in MLflow, with every metric and the gallery: {where}"] if where else []


def page_link(page: Path) -> str:
    """Where a browser opens a report page from the Prefect UI: the workspace's reports server (``make serve`` starts
    it and sets C2LIP_REPORTS_URL) for a page under reports/; else a file:// address, which a browser opens only when
    pasted (it refuses file:// links from an http page)."""
    served, reports = os.environ.get("C2LIP_REPORTS_URL"), (ROOT / "reports").resolve()
    resolved = page.resolve()
    if served and resolved.is_relative_to(reports):
        return f"{served.rstrip('/')}/{resolved.relative_to(reports).as_posix()}"
    return resolved.as_uri()


def absolute_links(markdown: str, folder: Path) -> str:
    """A report's Markdown with its relative links (``[the failure gallery](gallery/index.html)``) made into addresses a
    browser opens from the Prefect UI (:func:`page_link`): relative ones would resolve against the UI's own host."""
    def absolute(match: re.Match) -> str:
        return f"]({page_link(folder / match.group(1))})"

    return re.sub(r"\]\((?![a-z][a-z0-9+.-]*:|#|/)([^)\s]+)\)", absolute, markdown)


def publish_galleries(folder: Path, key: str) -> list[str]:
    """A link artifact per failure-gallery page in ``folder`` (:func:`page_link`: served when ``make serve`` runs)."""
    links = []
    for page in sorted(folder.glob("*.html")) if folder.is_dir() else []:
        link = page_link(page)
        suffix = "" if page.name == "index.html" else f"-{page.stem}"
        create_link_artifact(link=link, link_text=f"failure gallery ({page.name})", key=artifact_key(f"{key}{suffix}"),
                             description="Items fixed, broken and missed by both models, with images, captions and scores")
        links.append(link)
    return links
