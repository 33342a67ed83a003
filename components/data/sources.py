"""Sample sources of the captions stage: each yields shards of raw samples or skip reasons.

A source plans its shards up front (a shard is a fixed range of its input: sample indices, input
tar files or table rows), so a resumed run rebuilds exactly the shards that are missing, and a shard's
content never depends on how many workers ran or on which shards were already done.
"""

from __future__ import annotations

import glob
import io
import json
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from PIL import Image

from components.data import shapesworld
from components.data.download import Skip, download, make_session  # noqa: F401  (Skip: every source's row outcome)
from components.shared.atomic import atomic_write_bytes
from components.shared.params import CaptionsParams, TableSourceParams, WebDatasetSourceParams
from components.shared.redact import redact
from components.shared.written import Ledger

ROWS_FOLDER = "parts/rows"  # a URL table's rows, a file per unfinished shard (TableSource.prepare)


class SourceError(ValueError):
    """A source that cannot be read at all (as opposed to a bad row, which is skipped and counted)."""


@dataclass
class RawSample:
    """A validated sample: JPEG bytes, caption fields and source metadata."""

    jpg: bytes
    captions: dict[str, str]
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class ShardPlan:
    """One output shard: ``split``/``index`` name it; ``spec`` says which input it covers."""

    split: str
    index: int
    spec: Any

    @property
    def name(self) -> str:
        return f"{self.split}/shard-{self.index:06d}"


def to_jpeg(data: bytes, quality: int = 95, max_side: int | None = None) -> bytes:
    """Decode ``data`` fully (raises on a corrupt or truncated image) and return RGB JPEG bytes, at most
    ``max_side`` pixels on the longer side (aspect kept).

    Bytes that already are a baseline RGB JPEG within the size are kept as they are, so nothing is re-compressed.
    """
    with Image.open(io.BytesIO(data)) as img:
        # a decompression bomb is a bad row, not a crash: checked before the pixels are decoded
        if Image.MAX_IMAGE_PIXELS and img.width * img.height > Image.MAX_IMAGE_PIXELS:
            raise ValueError(f"{img.width}x{img.height} pixels is over PIL's limit of {Image.MAX_IMAGE_PIXELS}")
        too_large = max_side is not None and max(img.size) > max_side
        if too_large and img.format == "JPEG":
            img.draft("RGB", (max_side, max_side))  # JPEG's own downscaled decode: a 2-MP image decodes several times faster
        img.load()
        if img.format == "JPEG" and img.mode == "RGB" and not too_large:
            return data
        out = img.convert("RGB")
        if max_side is not None and max(out.size) > max_side:
            scale = max_side / max(out.size)
            out = out.resize((max(1, round(out.width * scale)), max(1, round(out.height * scale))), Image.Resampling.BICUBIC)
        buf = io.BytesIO()
        out.save(buf, format="JPEG", quality=quality)
        return buf.getvalue()


def validate_image(data: bytes | None, max_side: int | None = None) -> bytes | Skip:
    if not data:
        return Skip("empty_image")
    try:
        return to_jpeg(data, max_side=max_side)
    except Exception as err:  # PIL raises many types for bad bytes; every one is a skip
        return Skip("undecodable_image", f"{type(err).__name__}: {err}")


def clean_captions(raw: dict[str, Any], caption_field: str) -> dict[str, str] | Skip:
    """Caption fields as stripped strings; the training field must be a non-empty string."""
    out: dict[str, str] = {}
    for name, value in raw.items():
        if value is None:
            value = ""
        if not isinstance(value, str):
            return Skip("caption_not_string", f"{name} is {type(value).__name__}")
        out[name] = value.strip()
    if not out.get(caption_field):
        return Skip("missing_caption", f"{caption_field} is empty")
    return out


# --------------------------------------------------------------------------------------------------
# shapesworld
# --------------------------------------------------------------------------------------------------


class ShapesWorldSource:
    """Deterministic synthetic samples; shard i of a split holds indices [i*shard_size, (i+1)*shard_size)."""

    def __init__(self, params: CaptionsParams):
        self.params = params
        self.world = params.shapesworld
        self.held_out = shapesworld.held_out_pairs(self.world, params.seed)

    def plan(self) -> list[ShardPlan]:
        plans = []
        for split, total in (("train", self.world.train_images), ("test", self.world.test_images)):
            size = self.params.shard_size
            for index, start in enumerate(range(0, total, size)):
                plans.append(ShardPlan(split, index, (start, min(start + size, total))))
        return plans

    def samples(self, plan: ShardPlan) -> Iterator[RawSample | Skip]:
        start, stop = plan.spec
        for i in range(start, stop):
            jpg, captions, meta = shapesworld.make_sample(self.world, self.params.seed, plan.split, i, self.held_out)
            yield RawSample(jpg, captions, {"source": "shapesworld", "index": i, **meta})

    def prepare(self, plans: list[ShardPlan]) -> None:
        """Nothing to stage before the shards are built (each reads its own input)."""

    def finish(self) -> None:
        """Nothing to clear once every shard is finished."""

    def summary(self) -> dict[str, Any]:
        return {"held_out_pairs": [list(p) for p in self.held_out]}


# --------------------------------------------------------------------------------------------------
# webdataset
# --------------------------------------------------------------------------------------------------


# what img2dataset records of each download in the sample's json, kept in ours: where the picture came from and how
# it was fetched (its provenance, for a user's audit or a takedown)
DOWNLOADER_FIELDS = ("url", "status", "width", "height", "original_width", "original_height", "sha256", "error_message")


class WebDatasetSource:
    """Existing local tar shards: output shard i is input shard i, re-keyed and validated."""

    def __init__(self, params: CaptionsParams):
        self.params = params
        self.cfg: WebDatasetSourceParams = params.webdataset
        self.paths: list[str] = []
        for pattern in self.cfg.shards:
            matched = sorted(glob.glob(pattern))
            if not matched:
                raise SourceError(f"webdataset.shards: {pattern!r} matches no file")
            self.paths.extend(matched)

    def plan(self) -> list[ShardPlan]:
        return [ShardPlan("train", i, path) for i, path in enumerate(self.paths)]

    def prepare(self, plans: list[ShardPlan]) -> None:
        """Nothing to stage before the shards are built (each reads its own input)."""

    def finish(self) -> None:
        """Nothing to clear once every shard is finished."""

    def summary(self) -> dict[str, Any]:
        return {"input_shards": len(self.paths)}

    def samples(self, plan: ShardPlan) -> Iterator[RawSample | Skip]:
        import webdataset as wds

        try:
            for sample in wds.WebDataset(plan.spec, shardshuffle=False, empty_check=False):
                yield self._convert(sample, plan.spec)
        except Exception as err:  # a truncated or corrupt tar ends this shard; what was read is kept
            yield Skip("unreadable_tar", f"{plan.spec}: {type(err).__name__}: {err}")

    def _convert(self, sample: dict[str, Any], path: str) -> RawSample | Skip:
        key = sample.get("__key__", "?")
        image = next((sample[k] for k in self.cfg.image_keys if k in sample), None)
        if image is None:
            return Skip("missing_image", f"{path}:{key}")
        jpg = validate_image(image)
        if isinstance(jpg, Skip):
            return Skip(jpg.reason, f"{path}:{key}: {jpg.detail}")
        meta_json: dict[str, Any] = {}
        if "json" in sample:
            try:
                meta_json = json.loads(sample["json"])
            except ValueError:
                return Skip("bad_json", f"{path}:{key}")
        raw: dict[str, Any] = {}
        for name in self.cfg.caption_fields:
            if name in sample:
                try:
                    raw[name] = sample[name].decode("utf-8")
                except UnicodeDecodeError:
                    return Skip("caption_not_utf8", f"{path}:{key}:{name}")
            else:
                raw[name] = meta_json.get(name) if isinstance(meta_json, dict) else None
        captions = clean_captions(raw, self.params.caption_field)
        if isinstance(captions, Skip):
            return Skip(captions.reason, f"{path}:{key}: {captions.detail}")
        kept = {k: meta_json[k] for k in DOWNLOADER_FIELDS if isinstance(meta_json, dict) and meta_json.get(k) is not None}
        return RawSample(jpg, captions, {"source": "webdataset", "source_shard": path, "source_key": key, **kept})


# --------------------------------------------------------------------------------------------------
# table (CSV / Parquet, local paths or URLs)
# --------------------------------------------------------------------------------------------------


class TableSource:
    """Rows of a CSV/Parquet table, read ``chunk_rows`` at a time; shard i holds rows
    [i*shard_size, (i+1)*shard_size). Images are local paths or URLs fetched in parallel threads.

    Shards are built in parallel processes (the stage's pool, or Dask workers): :meth:`prepare` reads the table
    once and writes each unfinished shard's rows to a small file of its own under ``parts/rows/``, recorded in the
    stage's record of its outputs, so a shard task needs only its file, never the whole table; :meth:`finish` removes
    them through that record once every shard is finished (one that changed since is kept)."""

    def __init__(self, params: CaptionsParams):
        self.params = params
        self.cfg: TableSourceParams = params.table
        self.columns = [self.cfg.image_column, *self.cfg.caption_columns.values()]
        self.root = self.cfg.image_root or self.cfg.path.parent
        self.malformed: list[str] = []  # rows with more or fewer fields than the header, met in the current pass: skipped
        self.malformed_rows: list[str] = []  # those of plan()'s pass over the whole table: the counted ones
        self._check_columns()

    def _check_columns(self) -> None:
        names = self.header = self._schema_names()
        missing = [c for c in self.columns if c not in names]
        if missing:
            raise SourceError(f"{self.cfg.path}: column(s) {missing} not found; the table has {names}")

    def _schema_names(self) -> list[str]:
        try:
            if self.cfg.path.suffix.lower() == ".parquet":
                return pq.ParquetFile(self.cfg.path).schema_arrow.names
            with self._open_csv(select=False) as reader:
                return reader.schema.names
        except UnicodeDecodeError as err:
            raise SourceError(f"{self.cfg.path}: the header row is not UTF-8 text (byte {err.object[err.start:err.end]!r} "
                              f"at {err.start}); save the table as UTF-8") from None
        except (pa.ArrowInvalid, OSError) as err:
            raise SourceError(f"{self.cfg.path}: not a readable table ({str(err).splitlines()[0][:200]})") from None

    def _malformed_row(self, row) -> str:
        """pyarrow's invalid_row_handler: a row with the wrong number of fields is skipped and counted (plan())."""
        self.malformed.append(f"row {row.number or '?'}: {row.actual_columns} fields, the header has "
                              f"{row.expected_columns}: {redact(str(row.text))[:120]}")
        return "skip"

    def _open_csv(self, select: bool = True) -> pacsv.CSVStreamingReader:
        delimiter = self.cfg.delimiter or ("\t" if self.cfg.path.suffix.lower() == ".tsv" else ",")
        # every column we read is text: a caption of digits must not become an int. Read as bytes and
        # decoded per value (rows()): one caption in another encoding is a counted skip, not a failed stage
        convert = pacsv.ConvertOptions(column_types={c: pa.binary() for c in self.columns})
        if select:
            convert.include_columns = self.columns
        return pacsv.open_csv(
            self.cfg.path,
            read_options=pacsv.ReadOptions(block_size=1 << 22),
            parse_options=pacsv.ParseOptions(delimiter=delimiter, newlines_in_values=True, invalid_row_handler=self._malformed_row),
            convert_options=convert,
        )

    def _batches(self) -> Iterator[pa.RecordBatch]:
        if self.cfg.path.suffix.lower() == ".parquet":
            yield from pq.ParquetFile(self.cfg.path).iter_batches(batch_size=self.cfg.chunk_rows, columns=self.columns)
        else:
            with self._open_csv() as reader:
                yield from reader

    def rows(self) -> Iterator[dict[str, Any]]:
        """Every row as a dict of the columns we read, streamed chunk by chunk; text that is not UTF-8
        becomes :data:`UNDECODABLE` (the row is skipped and counted, :meth:`_convert`)."""
        for batch in self._batches():
            for start in range(0, batch.num_rows, self.cfg.chunk_rows):
                for row in batch.slice(start, self.cfg.chunk_rows).to_pylist():
                    yield {k: _text(v) for k, v in row.items()}

    def plan(self) -> list[ShardPlan]:
        # Counting rows streams the table once (cheap next to downloading); Parquet knows its count. The CSV pass
        # also counts malformed rows and finds an unterminated quote, before any output is touched.
        if self.cfg.path.suffix.lower() == ".parquet":
            total = pq.ParquetFile(self.cfg.path).metadata.num_rows
        else:
            self.malformed.clear()
            total, last = 0, None
            for batch in self._batches():
                total += batch.num_rows
                last = batch.slice(batch.num_rows - 1).to_pylist()[0] if batch.num_rows else last
            self._check_last_row(last, total)
            self.malformed_rows = list(self.malformed)
            if self.malformed:
                print(f"captions: {self.cfg.path}: skipped {len(self.malformed)} malformed row(s); first: {self.malformed[0]}",
                      file=sys.stderr)
        size = self.params.shard_size
        return [ShardPlan("train", i, (start, min(start + size, total))) for i, start in enumerate(range(0, total, size))]

    def _check_last_row(self, last: dict[str, Any] | None, total: int) -> None:
        """A quote that is opened and never closed makes the rest of the file one value of the last row: refuse the
        table (naming the row) rather than train on one giant caption with every later row lost. Seen as a last-row
        value with a line break after which a line has as many fields as the header."""
        if not last:
            return
        delimiter = self.cfg.delimiter or ("\t" if self.cfg.path.suffix.lower() == ".tsv" else ",")
        fields = len(self.header)
        for column, value in last.items():
            text = _text(value)
            if not isinstance(text, str) or "\n" not in text:
                continue
            rows_inside = [line for line in text.split("\n")[1:] if len(line.split(delimiter)) >= fields]
            if rows_inside:
                raise SourceError(f"{self.cfg.path}: data row {total}, column {column!r}: a quote opened there is never closed, so "
                                  f"the rest of the file ({text.count(chr(10))} lines, e.g. {redact(rows_inside[0])[:60]!r}) would "
                                  "be one caption; close the quote (nothing was written)")

    def summary(self) -> dict[str, Any]:
        return {"table": str(self.cfg.path), "malformed_rows": len(self.malformed_rows), "malformed_row_examples": self.malformed_rows[:3]}

    def rows_path(self, plan: ShardPlan) -> Path:
        return self.params.output_dir / ROWS_FOLDER / f"{plan.split}-{plan.index:06d}.arrow"

    def prepare(self, plans: list[ShardPlan]) -> None:
        """Each of ``plans``' rows into its own file (an Arrow IPC file of the columns read, as the table holds
        them), reading the table once; a shard whose file exists already keeps it (a resumed run)."""
        ours = Ledger(self.params.output_dir, "captions").files()
        wanted = [p for p in sorted(plans, key=lambda p: p.spec[0]) if self._relative(p) not in ours or not self.rows_path(p).is_file()]
        if not wanted:
            return
        self.rows_path(wanted[0]).parent.mkdir(parents=True, exist_ok=True)
        offset, pieces, queue = 0, [], iter(wanted)
        current = next(queue)
        for batch in self._batches():
            while current is not None:
                start, stop = current.spec
                low, high = max(start, offset), min(stop, offset + batch.num_rows)
                if low < high:
                    pieces.append(batch.slice(low - offset, high - low))
                if stop > offset + batch.num_rows:
                    break  # the shard goes on in the next batch
                self._write_rows(current, pieces, batch.schema)
                pieces, current = [], next(queue, None)
            offset += batch.num_rows
            if current is None:
                break
        # on the stage's record: finish() removes them by it, and a rerun after a kill knows them as its own
        Ledger(self.params.output_dir, "captions").record([self._relative(p) for p in wanted])

    def _relative(self, plan: ShardPlan) -> str:
        return self.rows_path(plan).relative_to(self.params.output_dir).as_posix()

    def _write_rows(self, plan: ShardPlan, pieces: list, schema: pa.Schema) -> None:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, schema) as writer:
            for piece in pieces:
                writer.write_batch(piece)
        atomic_write_bytes(self.rows_path(plan), sink.getvalue().to_pybytes())

    def samples(self, plan: ShardPlan) -> Iterator[RawSample | Skip]:
        """The shard's samples in row order, downloaded with bounded concurrency while the shard is written (the
        stage's shard timings include the downloads)."""
        with pa.memory_map(str(self.rows_path(plan))) as source:
            table = pa.ipc.open_file(source).read_all()
        rows = [{k: _text(v) for k, v in row.items()} for row in table.to_pylist()]
        session = make_session(self.cfg.download)
        try:
            with ThreadPoolExecutor(max_workers=self.cfg.download.concurrency) as pool:
                yield from pool.map(lambda row: self._convert(session, row), rows)
        finally:
            session.close()

    def finish(self) -> None:
        """Every shard is finished: the rows files go, those the stage's record lists with unchanged content only."""
        Ledger(self.params.output_dir, "captions").remove_files(under=ROWS_FOLDER)

    def _convert(self, session, row: dict[str, Any]) -> RawSample | Skip:
        undecodable = [col for col in self.columns if row.get(col) is UNDECODABLE]
        if undecodable:
            return Skip("undecodable_text", f"column(s) {undecodable} are not UTF-8 text")
        location = row.get(self.cfg.image_column)
        raw = {name: row.get(col) for name, col in self.cfg.caption_columns.items()}
        captions = clean_captions(raw, self.params.caption_field)
        if isinstance(captions, Skip):
            return Skip(captions.reason, f"{location}: {captions.detail}")
        if not location or not str(location).strip():
            return Skip("missing_image_path")
        location = str(location).strip()
        if location.startswith(("http://", "https://")):
            data = download(session, location, self.cfg.download)
        else:
            data = self._read_local(location)
        if isinstance(data, Skip):
            return data
        jpg = validate_image(data, self.cfg.max_side)
        if isinstance(jpg, Skip):
            return Skip(jpg.reason, f"{location}: {jpg.detail}")
        return RawSample(jpg, captions, {"source": "table", "image": redact(location)})

    def _read_local(self, location: str) -> bytes | Skip:
        """A path relative to ``image_root`` (or the table's folder); one that leads outside it (absolute,
        ``../``, a symlink out) is refused: a table must not make the stage read the machine's files."""
        root = self.root.resolve()
        path = (root / location).resolve()
        if not path.is_relative_to(root):
            return Skip("outside_image_root", f"{location}: outside {root}")
        if not path.is_file():
            return Skip("missing_file", str(path))
        if path.stat().st_size > self.cfg.download.max_bytes:
            return Skip("too_large", str(path))
        return path.read_bytes()


class _Undecodable:
    def __repr__(self) -> str:
        return "<not UTF-8>"


UNDECODABLE = _Undecodable()


def _text(value: Any) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return UNDECODABLE
    return value


def make_source(params: CaptionsParams) -> ShapesWorldSource | WebDatasetSource | TableSource:
    return {"shapesworld": ShapesWorldSource, "webdataset": WebDatasetSource, "table": TableSource}[params.source](params)
