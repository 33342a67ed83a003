"""NegCLIP's hard-negative images: the shard index reads a sample back byte for byte, the nearest images are the
look-alikes, a batch carries each sample's partner after it, and a training run computes its neighbours once."""

import io
import json
import tarfile

import numpy as np
import pytest
import torch
import webdataset as wds
from conftest import tiny_training_data
from PIL import Image
from test_train import mlflow_env, run_stage, tiny_train, write_params  # noqa: F401 - mlflow_env is a fixture

from components.data import neighbours as nb
from components.data import stream
from components.method.methods import method_for
from components.shared.params import TrainParams


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    return tiny_training_data(tmp_path_factory.mktemp("neighbours_data"), test_images=24)


def _solid_shard(path, colours):
    """A tar shard of solid-colour images, one sample per colour (key i), as the captions stage writes samples."""
    with tarfile.open(path, "w") as tar:
        for i, colour in enumerate(colours):
            jpg = io.BytesIO()
            Image.new("RGB", (8, 8), colour).save(jpg, format="JPEG", quality=95)
            for ext, data in (("jpg", jpg.getvalue()), ("json", json.dumps({"colour": colour}).encode())):
                info = tarfile.TarInfo(f"{i:04d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return str(path)


def test_the_index_reads_each_sample_back_as_webdataset_streams_it(tiny_data):
    shards = stream.expand_shards([str(tiny_data / "captions" / "train" / "*.tar")])
    index = nb.KeyIndex(shards)
    streamed = list(wds.tariterators.tarfile_samples({"url": s} for s in shards))
    assert len(index.keys()) == len(streamed) == 64
    for sample in streamed[::7]:
        again = index.sample(sample["__key__"])
        assert again["__key__"] == sample["__key__"] and again["__url__"] == sample["__url__"]
        assert {k: v for k, v in again.items() if not k.startswith("__")} == {k: v for k, v in sample.items() if not k.startswith("__")}
    with pytest.raises(ValueError, match="local or mounted filesystem"):
        nb.KeyIndex(["https://example.org/shard-{000..003}.tar"])


def test_the_nearest_images_are_the_look_alikes(tmp_path):
    shard = _solid_shard(tmp_path / "s.tar", [(250, 0, 0), (0, 0, 250), (200, 20, 20), (20, 20, 200), (0, 250, 0)])
    index = nb.KeyIndex([shard])

    def mean_colour(images):  # a stand-in image tower: the mean colour, centred (cosine then tells hues apart)
        return torch.from_numpy(np.stack([np.asarray(i, dtype=np.float32).mean(axis=(0, 1)) - 85 for i in images]))

    table = nb.nearest_images(index, mean_colour, k=1, batch=2)
    assert table == {"0000": ["0002"], "0001": ["0003"], "0002": ["0000"], "0003": ["0001"], "0004": [table["0004"][0]]}
    assert table["0004"][0] != "0004"  # never itself
    with pytest.raises(ValueError, match="too few"):
        nb.nearest_images(index, mean_colour, k=5)


def _mean_colour(images):  # a stand-in image tower (module level: the ranks below are spawned processes)
    return torch.from_numpy(np.stack([np.asarray(i, dtype=np.float32).mean(axis=(0, 1)) - 85 for i in images]))


def _neighbours_rank(rank, world, port, shard, out):
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    calls = []

    def embed(images):
        calls.append(len(images))
        return _mean_colour(images)

    table = nb.nearest_images(nb.KeyIndex([shard]), embed, k=2, batch=2, rank=rank, world=world)
    json.dump({"table": table, "embedded": sum(calls)}, open(f"{out}/rank{rank}.json", "w"))
    torch.distributed.destroy_process_group()


def test_the_ranks_of_a_run_embed_a_share_each_and_all_get_the_whole_table(tmp_path):
    """Every rank embeds its share of the images (7 images on 3 ranks: 3, 3, 1) instead of waiting for rank 0, and
    every rank's table equals one process's."""
    from conftest import free_port, spawn_ranks

    colours = [(250, 0, 0), (0, 0, 250), (200, 20, 20), (20, 20, 200), (0, 250, 0), (20, 200, 20), (120, 120, 0)]
    shard = _solid_shard(tmp_path / "s.tar", colours)
    alone = nb.nearest_images(nb.KeyIndex([shard]), _mean_colour, k=2, batch=2)
    spawn_ranks(_neighbours_rank, (3, free_port(), shard, str(tmp_path)), 3)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    assert [r["embedded"] for r in ranks] == [3, 3, 1]
    assert all(r["table"] == alone for r in ranks)


def test_a_negclip_batch_carries_each_samples_neighbour_after_it(tiny_data, tmp_path):
    from components.method.models import create_model

    params = TrainParams.model_validate({
        "data": {"shards": [str(tiny_data / "captions" / "train" / "*.tar")], "concepts_dir": str(tiny_data / "concepts"),
                 "shuffle_buffer": 16, "workers": 0},
        "model": {"name": "c2lip-tiny-rn", "init": "scratch"}, "method": {"name": "negclip", "hard_examples": {"neighbour_images": 2}},
        "steps": 4, "global_batch": 8, "micro_batch": 8})
    _, transform, _, tokenizer = create_model(params.model.name, pretrained=None)
    shards = stream.expand_shards(params.data.shards)
    index = nb.KeyIndex(shards)
    keys = index.keys()
    table = {key: [keys[(i + 1) % len(keys)], keys[(i + 2) % len(keys)]] for i, key in enumerate(keys)}
    near = nb.Neighbours(index, table)
    seen = []

    def build(decoded, ctx):
        seen.append([key for key, *_ in decoded])
        return method_for("negclip").make_batch(decoded, ctx)

    data = stream.TrainBatches(params, shards, 0, 1, 0, transform, tokenizer, None, build, neighbours=near)
    batch = next(iter(data))
    assert batch["images"].shape[0] == batch["texts"].shape[0] == 16  # the micro-batch and one partner per sample
    first, partners = seen[0][:8], seen[0][8:]
    assert all(p in table[k] for k, p in zip(first, partners, strict=True))
    assert batch["extra_owner"].max() >= 8  # the partners' captions have hard negatives too
    again = stream.TrainBatches(params, shards, 0, 1, 0, transform, tokenizer, None, build, neighbours=near)
    next(iter(again))
    assert seen[1] == seen[0]  # the partners are a function of (seed, rank, batch index): a resumed run sees the same
    with pytest.raises(ValueError, match="no hard examples"):
        TrainParams.model_validate({"method": {"name": "c2lip", "hard_examples": {"neighbour_images": 2}}})


def test_a_training_run_computes_its_neighbours_once_and_reuses_them(tiny_data, tmp_path, mlflow_env):  # noqa: F811
    out = tmp_path / "run"
    cfg = tiny_train(tiny_data, out, method={"name": "negclip", "hard_examples": {"neighbour_images": 3}}, steps=2)
    params_file = write_params(tmp_path / "train.yaml", cfg)
    done = run_stage(params_file, mlflow_env)
    assert done.returncode == 0, done.stderr[-3000:]
    stored = json.loads((out / nb.NEIGHBOURS_FILE).read_text())
    assert stored["k"] == 3 and len(stored["neighbours"]) == 64
    assert all(len(v) == 3 and key not in v for key, v in stored["neighbours"].items())
    written = (out / nb.NEIGHBOURS_FILE).stat().st_mtime_ns
    cfg["steps"] = 3  # the same start model and shards: the neighbours are reused, not recomputed
    done = run_stage(write_params(params_file, cfg), mlflow_env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / nb.NEIGHBOURS_FILE).stat().st_mtime_ns == written
