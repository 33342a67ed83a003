"""The captions stage on ShapesWorld: outputs agree with each other, any worker count gives the same
bytes, a killed run resumes, changed params start afresh."""

import json
import subprocess
import time

import pyarrow.parquet as pq
import webdataset as wds
from conftest import HANG_S, REPO, kill_stage_midway, tiny_captions

from components.captions import part_paths, run
from components.data.sources import make_source


def _tars(params):
    return sorted(params.output_dir.glob("*/shard-*.tar"))


def _read_tar(path):
    return list(wds.WebDataset(str(path), shardshuffle=False, empty_check=False))


def test_shards_manifest_and_stats_agree(tmp_path):
    params = tiny_captions(tmp_path, caption_field="short")
    stats = run(params)
    assert stats["samples_by_split"] == {"train": 60, "test": 20}
    assert stats["skipped_total"] == 0 and stats["shards"] == 4  # train 25+25+10, test 20
    assert json.loads(params.stats_path.read_text())["samples_written"] == 80

    manifest = pq.read_table(params.output_dir / "manifest.parquet").to_pylist()
    assert [list(r) for r in manifest[:1]] == [["key", "split", "shard", "long", "short", "raw", "txt", "object_phrases"]]
    assert len({r["key"] for r in manifest}) == 80
    by_key = {r["key"]: r for r in manifest}
    seen = 0
    for tar in _tars(params):
        for sample in _read_tar(tar):
            row = by_key[sample["__key__"]]
            meta = json.loads(sample["json"])
            assert row["shard"] == str(tar.relative_to(params.output_dir))
            # txt, the training caption the later stages read by default, is caption_field's in the shard and the manifest
            assert sample["txt"].decode() == row["short"] == meta["captions"]["short"] == row["txt"]
            assert meta["captions"]["long"] == row["long"]
            assert row["object_phrases"] == meta["object_phrases"] and len(row["object_phrases"]) >= 1
            assert sample["jpg"][:2] == b"\xff\xd8"
            seen += 1
    assert seen == 80
    held = {tuple(p) for p in stats["held_out_pairs"]}
    for row in manifest:
        if row["split"] == "train":
            assert not any(f"{c} {s}" in row["long"] for c, s in held)
    assert not list(params.output_dir.rglob("*.tmp"))


def test_same_bytes_for_any_worker_count(tmp_path):
    one = tiny_captions(tmp_path / "one", workers=1)
    two = tiny_captions(tmp_path / "two", workers=2)
    run(one)
    run(two)
    tars_one, tars_two = _tars(one), _tars(two)
    assert [t.relative_to(one.output_dir) for t in tars_one] == [t.relative_to(two.output_dir) for t in tars_two]
    for a, b in zip(tars_one, tars_two, strict=False):
        assert a.read_bytes() == b.read_bytes()
    assert pq.read_table(one.output_dir / "manifest.parquet").equals(pq.read_table(two.output_dir / "manifest.parquet"))


def test_rerun_keeps_finished_shards_and_rebuilds_unfinished(tmp_path):
    params = tiny_captions(tmp_path)
    run(params)
    plans = make_source(params).plan()
    tar0, _, _ = part_paths(params.output_dir, plans[0])
    tar1, _, done1 = part_paths(params.output_dir, plans[1])
    reference = tar1.read_bytes()
    before = tar0.stat().st_mtime_ns
    # what a kill leaves behind: a shard without its done-marker and a half-written temporary file
    done1.unlink()
    tar1.write_bytes(reference[:1000])
    (tar1.parent / (tar1.name + ".tmp")).write_bytes(b"partial")
    time.sleep(0.01)
    stats = run(params)
    assert tar0.stat().st_mtime_ns == before
    assert tar1.read_bytes() == reference
    assert stats["samples_written"] == 80


def test_changed_params_start_afresh(tmp_path):
    params = tiny_captions(tmp_path)
    run(params)
    smaller = tiny_captions(tmp_path, seed=5, shapesworld={"train_images": 30, "test_images": 0})
    stats = run(smaller)
    assert stats["samples_by_split"] == {"train": 30}
    assert [p.name for p in _tars(smaller)] == ["shard-000000.tar", "shard-000001.tar"]
    assert pq.read_table(smaller.output_dir / "manifest.parquet").num_rows == 30


def test_killed_run_resumes_to_the_same_result(tmp_path):
    """kill -9 a real stage process mid-run, re-run it, and compare with an uninterrupted run."""
    cfg = {
        "output_dir": str(tmp_path / "killed"),
        "stats_path": str(tmp_path / "killed.json"),
        "contact_sheet": None,
        "shard_size": 100,
        "workers": 1,
        "shapesworld": {"train_images": 3000, "test_images": 0},
    }
    finished, cmd = kill_stage_midway("captions", cfg, tmp_path, "killed/parts/*.done.json", 3)
    assert 3 <= finished < 30, f"kill came too late to test resuming ({finished} shards done)"
    assert not (tmp_path / "killed" / "manifest.parquet").exists()

    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, timeout=HANG_S)
    reference = tiny_captions(tmp_path / "ref", shard_size=100, shapesworld={"train_images": 3000, "test_images": 0})
    run(reference)
    killed = sorted((tmp_path / "killed" / "train").glob("*.tar"))
    assert len(killed) == 30
    for a, b in zip(killed, _tars(reference), strict=False):
        assert a.read_bytes() == b.read_bytes(), a.name
    assert json.loads((tmp_path / "killed.json").read_text())["samples_written"] == 3000


def test_contact_sheet_is_a_png(tmp_path):
    params = tiny_captions(tmp_path, contact_sheet=str(tmp_path / "sheet.png"))
    run(params)
    from PIL import Image

    with Image.open(tmp_path / "sheet.png") as img:
        assert img.format == "PNG" and img.width > 600 and img.height > 600
