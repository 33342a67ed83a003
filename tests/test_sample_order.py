"""The run's global sample order: every sample once per epoch across ranks and loader workers, the same sequence for
any worker count and any number of ranks, a resume that seeks instead of replaying; the shards' cached tables."""

from __future__ import annotations

import io
import tarfile
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import tiny_training_data

from components.data import shard_index
from components.data.sample_order import SampleOrder
from components.data.stream import TrainBatches, expand_shards
from components.shared.atomic import CorruptFileError
from components.shared.params import TrainParams


def _shards(root: Path, sizes: list[int]) -> list[str]:
    """Tar shards of ``sizes`` samples (a text member and a JSON member each), keys unique across shards."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for s, size in enumerate(sizes):
        path = root / f"shard-{s:02d}.tar"
        with tarfile.open(path, "w") as tar:
            for i in range(size):
                for ext, data in (("txt", f"sample {s}/{i}".encode()), ("json", b"{}")):
                    info = tarfile.TarInfo(f"s{s:02d}-{i:04d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        paths.append(str(path))
    return paths


def _params(shards: list[str], micro_batch: int, global_batch: int, processes: int = 1, **data) -> TrainParams:
    return TrainParams.model_validate({"data": {"shards": shards, "shuffle_buffer": 16, "workers": 0, **data},
                                       "method": {"name": "siglip"}, "micro_batch": micro_batch,
                                       "global_batch": global_batch, "processes": processes})


def _keys(dataset: TrainBatches, indices) -> list[str]:
    return [s["__key__"] for i in indices for s in dataset.samples(i)]


def test_three_ranks_over_nine_unequal_shards_train_every_sample_once_an_epoch(tmp_path):
    sizes = [7, 23, 4, 31, 12, 9, 18, 2, 26]  # 132 samples
    shards = _shards(tmp_path / "data", sizes)
    params = _params(shards, micro_batch=4, global_batch=24, processes=3)  # 2 micro-batches per rank and step
    ranks = [TrainBatches(params, shards, r, 3, 0, None, None, None, None) for r in range(3)]
    length = ranks[0].order.epoch_length
    assert length == 120  # 132 // 24 steps of 24: at most one global batch's worth left out
    per_rank = length // (3 * 4)
    for epoch in range(3):
        trained = [k for r in ranks for k in _keys(r, range(epoch * per_rank, (epoch + 1) * per_rank))]
        counts = Counter(trained)
        assert len(trained) == 120 and max(counts.values()) == 1  # every sample at most once, 120 of 132 trained
        assert {k.split("-")[0] for k in counts} == {f"s{s:02d}" for s in range(9)}
        if epoch == 0:
            first = counts
    assert set(first) != set(counts)  # a different 12 left out in another epoch
    # the shards' own order is not the training order: the blocks are shuffled
    assert _keys(ranks[0], [0]) != sorted(_keys(ranks[0], [0]))


def test_a_step_holds_the_same_samples_for_any_number_of_ranks_so_a_relaunch_continues_the_sequence(tmp_path):
    shards = _shards(tmp_path / "data", [40, 25, 35])
    one = TrainBatches(_params(shards, 4, 8), shards, 0, 1, 0, None, None, None, None)  # 2 micro-batches a step
    two = [TrainBatches(_params(shards, 4, 8, processes=2), shards, r, 2, 0, None, None, None, None) for r in range(2)]
    for step in (0, 5, 12, 13, 40):  # 12 steps an epoch: 13 and 40 are in later epochs
        assert sorted(_keys(one, [2 * step, 2 * step + 1])) == sorted(_keys(two[0], [step]) + _keys(two[1], [step]))


def test_a_resume_reads_only_its_own_samples_and_continues_the_sequence(tmp_path):
    shards = _shards(tmp_path / "data", [60, 50, 40])
    params = _params(shards, 5, 10, processes=2)
    whole = TrainBatches(params, shards, 1, 2, 0, None, None, None, None)
    sequence = _keys(whole, range(40))  # past the first epoch (15 micro-batches of this rank)
    resumed = TrainBatches(params, shards, 1, 2, 37, None, None, None, None)  # epoch 2.47
    assert _keys(resumed, range(37, 40)) == sequence[37 * 5:]
    assert resumed.reader.samples_read == 15  # three micro-batches read, nothing before them
    # loader workers split the batches; each reads only its own
    readers = []
    for worker in range(4):
        dataset = TrainBatches(params, shards, 1, 2, 0, None, None, None, None)
        dataset.make_batch = lambda samples, index: [s["__key__"] for s in samples]
        batches = dataset.batches(worker, 4)
        readers.append(([next(batches) for _ in range(10)], dataset.reader))
    merged = [readers[i % 4][0][i // 4] for i in range(40)]
    assert [k for batch in merged for k in batch] == sequence
    assert [reader.samples_read for _, reader in readers] == [50, 50, 50, 50]


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory) -> Path:
    return tiny_training_data(tmp_path_factory.mktemp("sample-order"), test_images=0)


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")  # 4 workers on 2 cores, on purpose
@pytest.mark.parametrize("workers", [1, 2, 4])
def test_two_ranks_with_loader_workers_decode_the_same_batches_as_one_worker(tiny_data, tmp_path, workers):
    """Through torch's DataLoader (worker processes): the batches of each rank are those of the in-process reading."""
    shards = expand_shards([str(tiny_data / "captions" / "train" / "*.tar")])
    params = _params(shards, 4, 8, processes=2, caption_field="raw")

    def keys(decoded, context):
        return [key for key, *_ in decoded]

    for rank in range(2):
        dataset = TrainBatches(params, shards, rank, 2, 0, None, None, None, keys)
        expected = [dataset.make_batch(dataset.samples(i), i) for i in range(10)]
        loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers)
        batches = iter(loader)
        assert [next(batches) for _ in range(10)] == expected
        del batches


def test_a_shard_is_read_from_its_headers_once_then_from_the_cache_until_it_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("C2LIP_SHARD_INDEX_CACHE", str(tmp_path / "cache"))
    shards = _shards(tmp_path / "data", [3, 5])
    reads = []
    real = shard_index.read_headers
    monkeypatch.setattr(shard_index, "read_headers", lambda path: reads.append(path) or real(path))
    assert shard_index.uncached(shards) == 2
    assert shard_index.sample_counts(shards) == [3, 5] and len(reads) == 2
    assert shard_index.uncached(shards) == 0
    assert shard_index.sample_counts(shards) == [3, 5] and len(reads) == 2  # from the cache
    reader = shard_index.ShardReader(shards)
    assert reader.read(1, 4) == {"__key__": "s01-0004", "__url__": shards[1], "txt": b"sample 1/4", "json": b"{}"}
    assert len(reads) == 2
    # a rewritten shard has another size and time: read again
    Path(shards[1]).write_bytes(Path(_shards(tmp_path / "other", [3, 6])[1]).read_bytes())
    assert shard_index.sample_counts(shards) == [3, 6] and reads[2:] == [shards[1]]
    # a cut-off shard is named, whatever its cached neighbours
    Path(shards[0]).write_bytes(Path(shards[0]).read_bytes()[:1500])
    with pytest.raises(CorruptFileError, match=f"{shards[0]}: not a readable tar shard"):
        shard_index.sample_counts(shards)


def test_fewer_samples_than_a_global_batch_is_named():
    with pytest.raises(ValueError, match="hold 10 samples, fewer than one global batch \\(16\\)"):
        SampleOrder([4, 6], seed=0, block=8, global_batch=16)
