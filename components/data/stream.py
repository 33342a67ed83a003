"""The training data: micro-batches of WebDataset samples in the run's global order, decoded by a method's batch
builder; the concepts stage's phrases; sentence sampling.

Which samples a micro-batch holds is a pure function of (seed, its index, rank, world)
(:mod:`components.data.sample_order`), read by offset (:mod:`components.data.shard_index`), and each batch's
random choices are seeded by (seed, rank, batch index): a killed run resumes at the same sample with the same
crops and texts, and a loader worker reads only the samples of its own batches.
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch
from PIL import Image
from torch.utils.data import IterableDataset, get_worker_info

from components.data.sample_order import SampleOrder
from components.data.shard_index import ShardReader, sample_counts
from components.shared.atomic import CorruptFileError, fingerprint, read_parquet, shards_identity, weights_identity
from components.shared.params import ParamsError


def expand_shards(patterns: list[str]) -> list[str]:
    """Sorted shard paths of every pattern (a path or a glob); a pattern that matches nothing is an error."""
    shards: list[str] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern)) if any(c in pattern for c in "*?[") else ([pattern] if Path(pattern).is_file() else [])
        if not matches:
            raise ParamsError(f"data.shards: {pattern!r} matches no file (run the captions stage first?)")
        shards.extend(matches)
    return shards


def phrases_parsed_from(concepts_dir: Path) -> list[str] | None:
    """The caption fields the concepts stage parsed the phrases in ``concepts_dir`` from (the field it read and
    every manifest column with the same text: ``txt`` and ``long`` in the default world), or None for phrases that
    do not say (made by hand, or by an older version of the stage)."""
    files = sorted(Path(concepts_dir).glob("*.parquet"))
    if not files:
        return None
    try:
        names = (pq.read_schema(files[0]).metadata or {}).get(b"c2lip_caption_fields")
    except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
        raise CorruptFileError(f"{files[0]}: not a readable Parquet file ({err})") from None
    if not names:
        return None
    try:
        fields = json.loads(names)
    except ValueError:
        fields = None
    if not isinstance(fields, list) or not fields or not all(isinstance(f, str) for f in fields):
        raise CorruptFileError(f"{files[0]}: its c2lip_caption_fields metadata ({names[:80]!r}) is not the list of caption "
                               "fields the concepts stage writes; run the concepts stage again to rewrite the phrases")
    return fields


def check_phrases_field(data) -> None:
    """Stop a run whose noun phrases were parsed from another caption field than the one it trains on (``data``:
    the train params' DataParams): a dense caption's phrases learned beside a one-sentence caption teach concepts the
    trained text never names. Several caption fields, or phrases that do not say what they were parsed from, pass."""
    field, parsed_from = data.caption_field, phrases_parsed_from(data.concepts_dir)
    if isinstance(field, str) and parsed_from is not None and field not in parsed_from:
        raise ParamsError(f"data.concepts_dir: the phrases in {data.concepts_dir} were parsed from the {' / '.join(parsed_from)} "
                          f"captions, but data.caption_field is {field!r}: run the concepts stage with caption_field: {field} "
                          "and another output_dir, and point data.concepts_dir at it (a comparison does this itself)")


def recaption_files(recaptions_dir: Path | None, fields: list[str]) -> tuple[list[Path], list[str]]:
    """(the recaption stage's files, the wanted fields they hold); ([], []) when they hold none of them."""
    if recaptions_dir is None or not Path(recaptions_dir).is_dir():
        return [], []
    files = sorted(Path(recaptions_dir).glob("*.parquet"))
    columns = [f for f in fields if files and f in read_parquet(files[0]).column_names and f not in ("key", "status")]
    return (files, columns) if columns else ([], [])


def inputs_identity(params, shards: list[str]) -> dict:
    """What a run is made from beyond its params, by content: the start weights, the shards (size and modification
    time), and the text inputs read beside the shards — the noun phrases and, when a caption field is theirs, the
    recaptions — so a rebuilt base, rewritten shards, new phrases (another extractor) or new captions (another
    captioner) make another run, never a stale one resumed or reused (``params``: TrainParams; the train stage's
    resume and the comparison's reuse of a finished run share it)."""
    data = params.data
    texts = sorted(Path(data.concepts_dir).glob("*.parquet")) if data.concepts_dir is not None else []
    texts += recaption_files(data.recaptions_dir, [*data.caption_fields, *filter(None, [data.single_object_caption_field])])[0]
    return {"init": weights_identity(params.model.init), "shards": shards_identity(shards),
            "texts": fingerprint([p.name for p in texts], texts)}


def load_recaptions(recaptions_dir: Path | None, fields: list[str]) -> dict[str, dict[str, str]]:
    """field -> key -> caption, for the wanted fields the recaption stage's files hold (none: empty)."""
    files, columns = recaption_files(recaptions_dir, fields)
    recaptions: dict[str, dict[str, str]] = {f: {} for f in columns}
    for path in files:
        table = read_parquet(path, columns=["key", *columns]).to_pydict()
        for field in columns:
            recaptions[field].update(zip(table["key"], table[field], strict=True))
    return recaptions


def binds_in_alt_text(key: str, share: float) -> bool:
    """Whether this sample is among the ``share`` of crowded scenes whose alt-text binds. A property of the image
    (a hash of its key, never of the run's seed), as real alt-text is: the same scenes bind in every run."""
    if share <= 0:
        return False
    digest = hashlib.blake2b(f"binding-alt-text:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < share


def split_sentences(text: str) -> list[str]:
    """Sentences of a caption: split after '.', '!' or '?' followed by white space."""
    return [t for t in re.split(r"(?<=[.!?])\s+", text.strip()) if t]


def sample_sentences(text: str, min_sentences: int, max_sentences: int | None, generator: torch.Generator | None = None) -> str:
    """A random subset of ``text``'s sentences, in their order: k uniform in [min, max] (clipped to the
    caption's count), then k distinct sentences. Uses torch's RNG, seeded per batch by the caller."""
    sentences = split_sentences(text)
    n = len(sentences)
    if n <= 1:
        return text
    high = min(n, max_sentences or n)
    low = min(min_sentences, high)
    k = int(torch.randint(low, high + 1, (1,), generator=generator))
    keep = sorted(torch.randperm(n, generator=generator)[:k].tolist())
    return " ".join(sentences[i] for i in keep)


@dataclass
class BatchContext:
    """What a builder may use besides the samples. ``params``: the validated TrainParams; ``phrases``: key ->
    noun phrases (None when the run loads none); ``nlp(name)``: a spaCy pipeline, loaded on first use;
    ``index``: the micro-batch's index in the run; ``accumulation``: micro-batches per optimiser step."""

    params: Any
    transform: Callable
    tokenizer: Callable
    phrases: Mapping[str, list[str]] | None
    rng: np.random.Generator
    nlp: Callable[[str], Any]
    index: int
    accumulation: int
    trim_phrases: bool = False  # encode phrases at their own length (method.phrase_context, resolved per model)


class MemoTokenizer:
    """A tokenizer that keeps the token rows of the texts it has seen (up to ``limit``, then starts over): the
    phrases of C2LIP's concept batch recur in every batch and the captions every epoch, and open_clip's tokenizer
    (ftfy, regex BPE) is a third of a batch's loading time (bench/train.py). Rows are the tokenizer's own."""

    def __init__(self, tokenizer: Callable, limit: int = 200_000):
        self.tokenizer, self.limit, self.rows = tokenizer, limit, {}

    def __call__(self, texts: list[str]) -> torch.Tensor:
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts:
            return self.tokenizer(texts)
        missing = list(dict.fromkeys(t for t in texts if t not in self.rows))
        if len(self.rows) + len(missing) > self.limit:
            self.rows.clear()
            missing = list(dict.fromkeys(texts))
        if missing:
            self.rows.update(zip(missing, self.tokenizer(missing).clone(), strict=True))
        return torch.stack([self.rows[t] for t in texts])

    def __getattr__(self, name: str) -> Any:  # context_length and the rest: the tokenizer's own
        if name == "tokenizer":  # not set yet (unpickling in a spawned data worker)
            raise AttributeError(name)
        return getattr(self.tokenizer, name)


class TrainBatches(IterableDataset):
    """Micro-batches for one rank, from batch ``start`` on. With DataLoader workers, worker w reads and decodes
    the batches b ≡ w (mod workers) and nothing else: DataLoader takes batches from its workers in that same
    round-robin order, so the sequence is identical for any number of workers.

    ``phrases``: key -> noun phrases (:class:`~components.data.phrase_table.PhraseTable`, shared by the workers).
    ``build(decoded, context)`` is the method's batch builder (:mod:`components.method.batches`); with
    ``build=None`` a batch is images and captions only (the logit calibration's batches). Torch's RNG and
    the context's numpy generator are seeded by (seed, rank, batch index) before each batch."""

    def __init__(self, params, shards: list[str], rank: int, world: int, start: int, transform, tokenizer,
                 phrases: Mapping[str, list[str]] | None, build: Callable | None, accumulation: int = 1, trim_phrases: bool = False,
                 neighbours=None):
        self.params, self.shards, self.rank, self.world, self.start = params, shards, rank, world, start
        self.transform, self.tokenizer, self.phrases = transform, MemoTokenizer(tokenizer), phrases
        self.build, self.accumulation, self.trim_phrases = build, accumulation, trim_phrases
        self.neighbours = neighbours  # components.data.neighbours.Neighbours: NegCLIP's hard-negative images, or None
        self._nlp: dict[str, Any] = {}
        self.reader = ShardReader(shards)
        self.order = SampleOrder(sample_counts(shards), params.seed, params.data.shuffle_buffer, params.global_batch)
        self.undecodable = 0  # images skipped so far in this process (a data worker has its own count)
        data = params.data
        self.recaptions = load_recaptions(data.recaptions_dir, [*data.caption_fields, *filter(None, [data.single_object_caption_field]),
                                                                 *([data.binding_alt_text_field] if data.binding_alt_text_share else [])])

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        return self.batches(worker, workers)

    def batches(self, worker: int, workers: int):
        """Worker ``worker``'s share of the micro-batches: every ``workers``-th from ``start + worker`` on."""
        index = self.start + worker
        while True:
            yield self.make_batch(self.samples(index), index)
            index += workers

    def samples(self, index: int) -> list[dict]:
        """The raw samples of micro-batch ``index`` (a resume starts here: nothing before it is read)."""
        return [self.reader.read(shard, i) for shard, i in self.order.micro_batch(index, self.rank, self.world, self.params.micro_batch)]

    def nlp(self, name: str):
        """spaCy, loaded on first use in this worker (only real, non-ShapesWorld captions need it)."""
        if name not in self._nlp:
            import spacy

            self._nlp[name] = spacy.load(name, exclude=["ner", "lemmatizer"])
        return self._nlp[name]

    def decode(self, samples: list[dict]) -> list[tuple[str, dict, str, Image.Image]]:
        """(key, scene metadata, caption of the picked field, image) per sample; a broken sample is named."""
        data = self.params.data
        fields = data.caption_fields
        picks = torch.randint(len(fields), (len(samples),)).tolist()
        out = []
        for sample, pick in zip(samples, picks, strict=True):
            key = sample["__key__"]
            field = fields[pick]
            try:
                meta = json.loads(sample["json"]) if "json" in sample else {}
                if data.single_object_caption_field and len(meta.get("objects", ())) == 1:
                    field = data.single_object_caption_field
                elif len(meta.get("objects", ())) > 1 and binds_in_alt_text(key, data.binding_alt_text_share):
                    field = data.binding_alt_text_field
                if field in self.recaptions:
                    caption = self.recaptions[field].get(key)
                    if caption is None:
                        raise KeyError(f"no {field!r} caption in {data.recaptions_dir} (recaptioned from other shards? dvc repro recaption)")
                else:
                    caption = meta.get("captions", {}).get(field)
                if caption is None and field == "txt" and "txt" in sample:
                    caption = sample["txt"].decode()
                if caption is None:
                    raise KeyError(f"caption field {field!r} missing: not in the sample's captions, nor a column of "
                                   f"data.recaptions_dir {data.recaptions_dir}")
            except Exception as err:  # noqa: BLE001 - any broken sample: name it and stop
                raise ValueError(f"{sample.get('__url__', '?')}: sample {key!r}: {err}") from err
            if self.phrases is not None and key not in self.phrases:
                raise KeyError(f"{sample.get('__url__', '?')}: sample {key!r} has no phrases in {data.concepts_dir}")
            out.append((key, meta, caption, self.image(sample)))
        return self.without_undecodable(out, samples)

    def image(self, sample: dict) -> Image.Image | None:
        """The sample's image, or None (counted, named on stderr) when it does not decode: one broken JPEG in a
        shard of thousands costs one sample, not the run — up to ``data.max_undecodable_images``."""
        try:
            return Image.open(io.BytesIO(sample.get("jpg", b""))).convert("RGB")
        except Exception as err:  # noqa: BLE001 - PIL raises several types for a broken image
            self.undecodable += 1
            limit = self.params.data.max_undecodable_images
            where = f"{sample.get('__url__', '?')}: sample {sample['__key__']!r}"
            if self.undecodable > limit:
                raise ValueError(f"{where}: image does not decode ({str(err)[:120]}); that is {self.undecodable} such "
                                 f"images in this data worker, over data.max_undecodable_images ({limit})") from None
            print(f"train: skipped {where}: image does not decode ({str(err)[:120]}); {self.undecodable} so far in this "
                  f"data worker (limit data.max_undecodable_images: {limit})", file=sys.stderr, flush=True)
            return None

    @staticmethod
    def without_undecodable(decoded: list[tuple], samples: list[dict]) -> list[tuple]:
        """Each sample whose image did not decode replaced by the next good one of the batch (cyclically): a batch
        keeps its size (DeepSpeed's micro-batch is fixed) and its place in the stream (resume stays exact)."""
        good = [i for i, item in enumerate(decoded) if item[3] is not None]
        if len(good) == len(decoded):
            return decoded
        if not good:
            raise ValueError(f"{samples[0].get('__url__', '?')}: no image of a batch of {len(samples)} decodes")
        return [item if item[3] is not None else decoded[min(good, key=lambda g: (g - i) % len(decoded))]
                for i, item in enumerate(decoded)]

    def make_batch(self, samples: list[dict], index: int) -> dict[str, torch.Tensor]:
        seed = self.params.seed
        # crops depend on (seed, rank, batch index) only, not on which worker or how many came before
        torch.manual_seed(hash((seed, self.rank, index)) % (2**63))
        rng = np.random.default_rng([seed, self.rank, index])  # hard examples, CLIC's pairing
        if self.neighbours is not None and self.build is not None:  # each sample's look-alike joins the batch after it
            samples = samples + self.neighbours.partners(samples, rng)
        decoded = self.decode(samples)
        if self.build is None:
            return {"images": torch.stack([self.transform(image) for *_, image in decoded]),
                    "texts": self.tokenizer([caption for _, _, caption, _ in decoded])}
        context = BatchContext(self.params, self.transform, self.tokenizer, self.phrases, rng, self.nlp, index, self.accumulation,
                               self.trim_phrases)
        return self.build(decoded, context)
