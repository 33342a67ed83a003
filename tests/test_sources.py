"""The webdataset and table sources: real files the tests make, and a real HTTP server on 127.0.0.1
serving good, corrupt, oversized, slow, flaky and missing images."""

import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import webdataset as wds
from conftest import HANG_S
from PIL import Image

from components.captions import run
from components.data.sources import SourceError, make_source
from components.shared.params import CaptionsParams


def _image(fmt="JPEG", size=(32, 32), color=(200, 30, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format=fmt)
    return buf.getvalue()


def _noise_jpeg(side=256) -> bytes:
    import numpy as np

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (side, side, 3), dtype="uint8")).save(buf, format="JPEG")
    return buf.getvalue()


def _params(tmp_path, **kw) -> CaptionsParams:
    base = {
        "output_dir": str(tmp_path / "out"),
        "stats_path": str(tmp_path / "stats.json"),
        "contact_sheet": None,
        "workers": 1,
    }
    return CaptionsParams.model_validate({**base, **kw})


def _manifest(params):
    return pq.read_table(params.output_dir / "manifest.parquet").to_pylist()


# --------------------------------------------------------------------------------------------------
# webdataset
# --------------------------------------------------------------------------------------------------


def _write_tar(path, samples):
    with wds.TarWriter(str(path)) as writer:
        for s in samples:
            writer.write(s)


def test_webdataset_source_rekeys_validates_and_counts_skips(tmp_path):
    _write_tar(tmp_path / "a-000.tar", [
        {"__key__": "x1", "jpg": _image(), "txt": "a red square"},
        {"__key__": "x2", "png": _image("PNG"), "txt": "a png image",  # img2dataset's json: its download record beside a caption
         "json": {"long": "long text", "url": "https://example.org/x2.png", "status": "success", "width": 32, "height": 32,
                  "key": "000000002", "exif": "{}"}},
        {"__key__": "x3", "jpg": b"not an image", "txt": "corrupt"},
    ])
    _write_tar(tmp_path / "a-001.tar", [
        {"__key__": "x1", "jpg": _image(), "txt": "same key, other shard"},
        {"__key__": "x4", "jpg": _image(), "txt": "   "},
        {"__key__": "x5", "txt": "no image"},
    ])
    params = _params(tmp_path, source="webdataset", caption_field="txt",
                     webdataset={"shards": [str(tmp_path / "a-*.tar")], "caption_fields": ["txt", "long"]})
    stats = run(params)
    assert stats["samples_written"] == 3
    assert stats["skipped"] == {"missing_caption": 1, "missing_image": 1, "undecodable_image": 1}
    rows = _manifest(params)
    assert [r["key"] for r in rows] == ["train-000000-000000", "train-000000-000001", "train-000001-000000"]
    assert rows[1]["long"] == "long text" and rows[0]["long"] == ""
    assert rows[0]["object_phrases"] is None  # only ShapesWorld knows the true phrases
    samples = list(wds.WebDataset(str(params.output_dir / "train" / "shard-000000.tar"), shardshuffle=False))
    # the png was re-encoded: every output image is a JPEG
    assert all(s["jpg"][:2] == b"\xff\xd8" for s in samples)
    meta = json.loads(samples[1]["json"])
    assert meta["source_key"] == "x2" and meta["source_shard"].endswith("a-000.tar")
    # the downloader's record of where the picture came from stays with it; its own key does not replace ours
    assert (meta["url"], meta["status"], meta["width"]) == ("https://example.org/x2.png", "success", 32)
    assert meta["key"] == "train-000000-000001" and "exif" not in meta
    assert "a-000.tar:x3" in stats["skip_examples"]["undecodable_image"][0]


def test_img2dataset_shards_need_the_caption_said_once(tmp_path):
    """img2dataset stores the caption as txt: params/captions.yaml says so, and the concepts and train stages, which
    read txt by default, follow it without a word in their own params files."""
    from components import concepts
    from components.shared.params import ConceptsParams, TrainDataParams

    _write_tar(tmp_path / "web-000.tar", [
        {"__key__": "000000000", "jpg": _image(), "txt": "a red square next to a blue circle",
         "json": {"url": "https://example.org/0.jpg", "status": "success", "width": 32, "height": 32}},
    ])
    params = _params(tmp_path, source="webdataset", caption_field="txt", webdataset={"shards": [str(tmp_path / "web-*.tar")]})
    run(params)
    assert _manifest(params)[0]["txt"] == "a red square next to a blue circle"
    assert ConceptsParams().caption_field == "txt" and TrainDataParams().caption_fields == ["txt"]
    phrases = ConceptsParams(manifest=params.output_dir / "manifest.parquet", output_dir=tmp_path / "concepts",
                             stats_path=tmp_path / "concepts.json", recaptions=None, n_process=1)
    concepts.run(phrases)
    rows = pq.read_table(tmp_path / "concepts" / "train" / "shard-000000.parquet").to_pylist()
    assert rows[0]["phrases"] == ["a red square", "a blue circle"]


def test_a_source_field_named_txt_keeps_one_meaning(tmp_path):
    with pytest.raises(ValueError, match="txt is the training caption"):
        _params(tmp_path, source="webdataset", caption_field="long",
                webdataset={"shards": [str(tmp_path / "a-*.tar")], "caption_fields": ["txt", "long"]})


def test_webdataset_source_without_matching_shards_is_a_clear_error(tmp_path):
    params = _params(tmp_path, source="webdataset", caption_field="txt", webdataset={"shards": [str(tmp_path / "none-*.tar")]})
    with pytest.raises(SourceError, match="none-\\*.tar.*matches no file"):
        make_source(params)


def test_truncated_tar_keeps_what_was_read(tmp_path):
    good = tmp_path / "good.tar"
    _write_tar(good, [{"__key__": f"k{i}", "jpg": _noise_jpeg(64), "txt": f"caption {i}"} for i in range(6)])
    data = good.read_bytes()
    (tmp_path / "cut.tar").write_bytes(data[: len(data) // 2])  # cut inside a member
    params = _params(tmp_path, source="webdataset", caption_field="txt", webdataset={"shards": [str(tmp_path / "cut.tar")]})
    stats = run(params)
    assert 1 <= stats["samples_written"] < 6
    assert stats["skipped"]["unreadable_tar"] == 1
    assert "cut.tar" in stats["skip_examples"]["unreadable_tar"][0]


# --------------------------------------------------------------------------------------------------
# table: local files and URLs from a real server on 127.0.0.1
# --------------------------------------------------------------------------------------------------

GOOD = _image()
BIG = _noise_jpeg(256)  # well over the 4 KiB cap used below
SMALL_NOISE = _noise_jpeg(40)  # under the cap: its truncation must fail decoding, not the size check


class _Handler(BaseHTTPRequestHandler):
    hits: dict = {}
    release = threading.Event()  # set when the test's server shuts down: /slow.jpg answers only then

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _send(self, status, body=b"", length=True):
        self.send_response(status)
        self.send_header("Content-Type", "image/jpeg")
        if length:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        path = self.path.split("?")[0]  # a query string makes distinct URLs of one image
        self.hits[path] = self.hits.get(path, 0) + 1
        if path == "/good.jpg":
            self._send(200, GOOD)
        elif path == "/good.png":
            self._send(200, _image("PNG"))
        elif path == "/corrupt.jpg":
            self._send(200, b"\xff\xd8\xff\xe0 definitely not a jpeg")
        elif path == "/truncated.jpg":
            self._send(200, SMALL_NOISE[: len(SMALL_NOISE) // 2])
        elif path == "/big.jpg":
            self._send(200, BIG)
        elif path == "/big-unannounced.jpg":
            self.close_connection = True
            self._send(200, BIG, length=False)
        elif path == "/slow.jpg":
            self.release.wait(HANG_S)  # hangs until the test ends: past any timeout_s, however slow the machine
            self._send(200, GOOD)
        elif path == "/flaky.jpg":
            self._send(503) if self.hits[path] == 1 else self._send(200, GOOD)
        elif path == "/down.jpg":
            self._send(503)
        else:
            self._send(404, b"not found")


@pytest.fixture
def server():
    _Handler.hits, _Handler.release = {}, threading.Event()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", _Handler.hits
    _Handler.release.set()
    httpd.shutdown()
    httpd.server_close()


DREAMLIP_HEADER = ["Image Path", "raw_caption", "shortIB_captions", "longIB_captions", "shortLLA_captions", "longLLA_captions"]


def _rows(base):
    # (image, raw, short, long) -> expected outcome
    return [
        (f"{base}/good.jpg", "raw 1", "short 1", "long 1"),                # ok
        (f"{base}/good.png", "raw 2", "short 2", "long 2"),                # ok, re-encoded
        (f"{base}/corrupt.jpg", "r", "s", "l"),                            # undecodable_image
        (f"{base}/truncated.jpg", "r", "s", "l"),                          # undecodable_image
        (f"{base}/big.jpg", "r", "s", "l"),                                # too_large (Content-Length)
        (f"{base}/big-unannounced.jpg", "r", "s", "l"),                    # too_large (streamed)
        (f"{base}/slow.jpg", "r", "s", "l"),                               # timeout
        (f"{base}/missing.jpg", "r", "s", "l"),                            # http_404
        (f"{base}/flaky.jpg", "raw 9", "short 9", "long 9"),               # ok after one retry
        (f"{base}/down.jpg", "r", "s", "l"),                               # http_503 after retries
        ("local.jpg", "raw 11", "short, with comma", "long 11\nsecond line"),  # ok, relative local path
        ("absent.jpg", "r", "s", "l"),                                     # missing_file
        ("", "r", "s", "l"),                                               # missing_image_path
        (f"{base}/good.jpg", "r", "s", ""),                                # missing_caption
    ]


EXPECTED_SKIPS = {
    "undecodable_image": 2, "too_large": 2, "timeout": 1, "http_404": 1, "http_503": 1,
    "missing_file": 1, "missing_image_path": 1, "missing_caption": 1,
}


def _table_params(tmp_path, path):
    return _params(
        tmp_path, source="table", caption_field="long", shard_size=4,
        table={
            "path": str(path), "chunk_rows": 3,
            # 20 s per read: a loaded machine's loopback answers come well within it; only /slow.jpg, which hangs, does
            # not (it is read three times: 60 s of the test)
            "download": {"concurrency": 4, "timeout_s": 20, "retries": 2, "backoff_s": 0.01, "max_bytes": 4096,
                         "allow_hosts": ["127.0.0.1"]},  # the test server: loopback is refused by default
        },
    )


def test_table_csv_with_dreamlip_columns_over_http(tmp_path, server):
    base, hits = server
    (tmp_path / "local.jpg").write_bytes(GOOD)
    import csv

    with open(tmp_path / "cc3m.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(DREAMLIP_HEADER)
        for image, raw, short, long in _rows(base):
            writer.writerow([image, raw, "ib", "ib long", short, long])
    params = _table_params(tmp_path, tmp_path / "cc3m.csv")
    stats = run(params)
    assert stats["skipped"] == EXPECTED_SKIPS
    assert stats["samples_written"] == 4 and stats["shards"] == 4
    rows = _manifest(params)
    assert [r["long"] for r in rows] == ["long 1", "long 2", "long 9", "long 11\nsecond line"]
    assert rows[3]["short"] == "short, with comma"
    # keys keep the row's position, so skipped rows leave gaps rather than shifting later keys
    assert [r["key"] for r in rows] == ["train-000000-000000", "train-000000-000001", "train-000002-000000", "train-000002-000002"]
    assert hits["/flaky.jpg"] == 2 and hits["/down.jpg"] == 3  # one retry, then two retries exhausted
    assert any("/slow.jpg" in e for e in stats["skip_examples"]["timeout"])


def test_table_parquet_and_a_non_string_caption(tmp_path, server):
    base, _ = server
    (tmp_path / "local.jpg").write_bytes(GOOD)
    table = pa.table({
        "Image Path": [f"{base}/good.jpg", f"{base}/good.jpg", "local.jpg"],
        "raw_caption": ["a", "b", "c"],
        "shortLLA_captions": ["s", "s", "s"],
        "longLLA_captions": pa.array(["one", None, "three"]),
    })
    pq.write_table(table, tmp_path / "t.parquet")
    ints = table.set_column(1, "raw_caption", pa.array([1, 2, 3]))
    pq.write_table(ints, tmp_path / "ints.parquet")

    params = _table_params(tmp_path, tmp_path / "t.parquet")
    stats = run(params)
    assert stats["samples_written"] == 2 and stats["skipped"] == {"missing_caption": 1}

    params = _table_params(tmp_path / "b", tmp_path / "ints.parquet")
    stats = run(params)
    assert stats["samples_written"] == 0 and stats["skipped"] == {"caption_not_string": 3}


def test_table_missing_column_is_a_clear_error(tmp_path):
    (tmp_path / "t.csv").write_text("url,caption\nhttp://127.0.0.1:9/x.jpg,hello\n")
    params = _table_params(tmp_path, tmp_path / "t.csv")
    with pytest.raises(SourceError, match=r"t.csv: column\(s\) \['Image Path'"):
        make_source(params)


def _url_table(path, urls: list[str]) -> None:
    """A DreamLIP-columned CSV of ``urls``, row i's long caption 'long i'."""
    import csv

    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(DREAMLIP_HEADER)
        writer.writerows([url, "r", "ib", "ib", "s", f"long {i}"] for i, url in enumerate(urls))


def test_table_resume_skips_finished_shards_without_downloading(tmp_path, server):
    base, hits = server
    _url_table(tmp_path / "t.csv", [f"{base}/good.jpg?{i}" for i in range(10)])
    params = _table_params(tmp_path, tmp_path / "t.csv")
    run(params)
    assert sum(hits.values()) == 10
    (params.output_dir / "parts" / "train-000001.done.json").unlink()
    stats = run(params)
    assert sum(hits.values()) == 14  # only the 4 rows of the unfinished shard were fetched again
    assert [r["long"] for r in _manifest(params)] == [f"long {i}" for i in range(10)]
    assert stats["samples_written"] == 10


def test_a_url_table_builds_its_shards_in_parallel_processes_as_one_process_does(tmp_path, server):
    """Each shard's rows go to a file of their own, so worker processes build shards from them; the shards, manifest
    and counts equal one process's, the row files are gone afterwards, and the stats count the downloads' time."""
    base, hits = server
    _url_table(tmp_path / "t.csv", [f"{base}/{'missing' if i == 5 else 'good'}.jpg?{i}" for i in range(14)])
    written = {}
    for workers in (1, 3):
        params = _table_params(tmp_path / f"w{workers}", tmp_path / "t.csv").model_copy(update={"workers": workers})
        stats = run(params)
        assert stats["samples_written"] == 13 and stats["skipped"] == {"http_404": 1} and stats["shards"] == 4
        assert stats["run_samples"] == 13 and stats["run_samples_per_second"] > 0
        assert 0 < stats["source_seconds"] <= stats["build_seconds"]  # the shards' time includes their downloads
        assert not (params.output_dir / "parts" / "rows").exists()  # the rows files, removed by the record once all are built
        written[workers] = {p.relative_to(params.output_dir): p.read_bytes() for p in params.output_dir.rglob("*.tar")}
        written[workers]["manifest"] = (params.output_dir / "manifest.parquet").read_bytes()
    assert written[1] == written[3]


def test_the_rows_files_go_by_the_stages_record_and_nothing_else_does(tmp_path, server):
    """A URL table's rows files are removed by the captions stage's record of its outputs: a copy elsewhere, and one
    whose content changed since it was written, stay."""
    from components import captions
    from components.data.sources import ROWS_FOLDER

    base, _ = server
    _url_table(tmp_path / "t.csv", [f"{base}/good.jpg?{i}" for i in range(10)])
    params = _table_params(tmp_path, tmp_path / "t.csv")
    source, plans, todo = captions.plan(params)  # what a run does before its first shard: the rows, a file a shard
    rows = sorted((params.output_dir / ROWS_FOLDER).iterdir())
    assert len(rows) == len(todo) == 3
    keep = tmp_path / "keep"  # a copy of yours, beside the workspace's outputs
    keep.mkdir()
    (keep / rows[0].name).write_bytes(rows[0].read_bytes())
    rows[1].write_bytes(b"edited since the stage wrote it")
    source.finish()
    assert [p.name for p in (params.output_dir / ROWS_FOLDER).iterdir()] == [rows[1].name]
    assert rows[1].read_bytes() == b"edited since the stage wrote it" and (keep / rows[0].name).is_file()


def test_images_over_max_side_are_resized_at_ingestion_and_others_kept_as_they_are():
    from components.data import sources

    large = _noise_jpeg(300)
    resized = sources.validate_image(large, max_side=128)
    assert Image.open(io.BytesIO(resized)).size == (128, 128) and len(resized) < len(large)
    wide = io.BytesIO()
    Image.new("RGB", (400, 100), (10, 200, 30)).save(wide, format="PNG")
    assert Image.open(io.BytesIO(sources.validate_image(wide.getvalue(), max_side=200))).size == (200, 50)
    assert sources.validate_image(large, max_side=300) == large  # within the size: the original bytes
    assert sources.validate_image(large, max_side=None) == large


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_decompression_bomb_is_a_counted_skip(monkeypatch):
    from components.data import sources

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 32 * 32 - 1)
    skip = sources.validate_image(_image(size=(32, 32)))
    assert isinstance(skip, sources.Skip) and skip.reason == "undecodable_image" and "over PIL's limit" in skip.detail
    assert isinstance(sources.validate_image(_image(size=(16, 16))), bytes)
