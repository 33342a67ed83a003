"""The recaption stage: the ShapesWorld oracle and a tiny vision-encoder-decoder behind one interface, outputs next
to the shards (never rewriting them), failures counted by reason, resume after a kill, the train and concepts
stages reading the new field."""

import hashlib
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import tiny_training_data
from pydantic import ValidationError
from tiny_hf import tiny_image_captioner

from components import concepts, recaption
from components.data import shapesworld_grammar as grammar
from components.data.captioners import CaptionInput, Failure, TransformersCaptioner
from components.shared.params import ConceptsParams, RecaptionParams, TrainParams, TransformersCaptionerParams


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Tiny ShapesWorld shards (64 training images in shards of 25) and their manifest."""
    return tiny_training_data(tmp_path_factory.mktemp("recaption_data"), test_images=10)


@pytest.fixture(scope="module")
def captioner_dir(tmp_path_factory):
    return tiny_image_captioner(tmp_path_factory.mktemp("tiny_captioner"))


def params_for(root, out, **overrides) -> RecaptionParams:
    return RecaptionParams.model_validate({"manifest": str(root / "captions" / "manifest.parquet"), "output_dir": str(out / "recaptions"),
                                           "stats_path": str(out / "recaption.json"), "contact_sheet": str(out / "sheet.png"), **overrides})


def digests(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_oracle_writes_each_scenes_dense_description_beside_the_untouched_shards(data, tmp_path):
    before = digests(data / "captions")
    stats = recaption.run(params_for(data, tmp_path))
    assert digests(data / "captions") == before  # the captions stage's shards and manifest are never rewritten
    manifest = pq.read_table(tmp_path / "recaptions" / "manifest.parquet").to_pylist()
    captions = pq.read_table(data / "captions" / "manifest.parquet").to_pylist()
    train = [r for r in captions if r["split"] == "train"]
    assert [r["key"] for r in manifest] == [r["key"] for r in train] and {r["status"] for r in manifest} == {"ok"}
    # every recaption states exactly the scene: parsed back by the world's grammar, each claim holds and every
    # object is named
    for row, source in zip(manifest, train, strict=True):
        parsed = grammar.parse_shapes_caption(row["recaption"])
        assert parsed is not None, row["recaption"]
        assert sorted(parsed.pairs()) == sorted((p.split()[2], p.split()[3]) for p in source["object_phrases"])
    assert stats["samples"] == 64 and stats["failures_total"] == 0
    assert stats["recaption"]["words_per_caption"]["mean"] > stats["source"]["words_per_caption"]["mean"]
    assert stats["recaption"]["vocabulary"] > 0 and json.loads((tmp_path / "recaption.json").read_text()) == stats
    assert (tmp_path / "sheet.png").stat().st_size > 10_000


def test_a_killed_run_resumes_at_the_first_unfinished_shard_and_ends_identical(data, tmp_path):
    straight = tmp_path / "straight"
    recaption.run(params_for(data, straight, contact_sheet=None))
    # what a kill during the last shard leaves: earlier shards finished, the last one's file half-written, no manifest
    killed = tmp_path / "killed"
    params = params_for(data, killed, contact_sheet=None)
    recaption.run(params)
    parts = killed / "recaptions" / "train"
    last = sorted(parts.glob("*.done.json"))[-1]
    last.unlink()
    parquet = last.with_name(last.name.replace(".done.json", ".parquet"))
    parquet.with_name(parquet.name + ".tmp").write_bytes(parquet.read_bytes()[:100])
    parquet.unlink()
    (killed / "recaptions" / "manifest.parquet").unlink()
    kept = {p.name: p.stat().st_mtime_ns for p in parts.glob("*.parquet")}
    calls = []
    original = recaption.recaption_shard
    recaption.recaption_shard = lambda *a: calls.append(a[2]) or original(*a)
    try:
        recaption.run(params)
    finally:
        recaption.recaption_shard = original
    assert calls == ["train/" + parquet.name.replace(".parquet", ".tar")]  # only the unfinished shard is redone
    assert {p.name: p.stat().st_mtime_ns for p in parts.glob("*.parquet") if p.name in kept} == kept
    assert pq.read_table(killed / "recaptions" / "manifest.parquet").equals(pq.read_table(straight / "recaptions" / "manifest.parquet"))
    # byte-identical shards and markers (no timings inside): DVC sees no change in the train stage's input
    assert digests(killed / "recaptions" / "train") == digests(straight / "recaptions" / "train")


def test_a_change_of_captioner_params_starts_afresh(data, tmp_path):
    recaption.run(params_for(data, tmp_path, contact_sheet=None))
    recaption.run(params_for(data, tmp_path, contact_sheet=None, field="dense"))
    table = pq.read_table(tmp_path / "recaptions" / "manifest.parquet")
    assert "dense" in table.column_names and "recaption" not in table.column_names


def _odd_shard(root):
    """A shard of four samples: two with a ShapesWorld scene, one without (web alt-text), one with a broken image."""
    import webdataset as wds

    src = pq.read_table(root / "captions" / "manifest.parquet").to_pylist()[:2]
    good = {}
    for sample in wds.tariterators.tarfile_samples([{"url": str(root / "captions" / src[0]["shard"])}]):
        good[sample["__key__"]] = sample
        if len(good) == 2:
            break
    out = root / "odd"
    (out / "train").mkdir(parents=True, exist_ok=True)
    rows = []
    with wds.TarWriter(str(out / "train" / "shard-000000.tar")) as writer:
        for i, sample in enumerate(good.values()):
            writer.write({"__key__": f"k{i}", "jpg": sample["jpg"], "json": sample["json"]})
            rows.append(f"k{i}")
        writer.write({"__key__": "web", "jpg": sample["jpg"], "json": json.dumps({"captions": {"raw": "a dog"}}).encode()})
        writer.write({"__key__": "broken", "jpg": b"not a jpeg", "json": sample["json"]})
        rows += ["web", "broken"]
    pq.write_table(pa.table({"key": rows, "split": ["train"] * 4, "shard": ["train/shard-000000.tar"] * 4,
                             "raw": ["alt 0", "alt 1", "a dog", "alt 3"]}), out / "manifest.parquet")
    return out


def test_failures_are_counted_by_reason_and_keep_the_source_caption(data, tmp_path):
    odd = _odd_shard(data)
    params = RecaptionParams.model_validate({"manifest": str(odd / "manifest.parquet"), "output_dir": str(tmp_path / "r"),
                                             "stats_path": str(tmp_path / "s.json"), "contact_sheet": None,
                                             "max_failure_rate": 0.5})  # one failure in four samples is meant
    stats = recaption.run(params)
    rows = {r["key"]: r for r in pq.read_table(tmp_path / "r" / "manifest.parquet").to_pylist()}
    assert rows["web"]["status"] == "no_scene_metadata" and rows["web"]["recaption"] == "a dog"
    assert rows["broken"]["status"] == "ok"  # the oracle reads the scene, not the pixels
    assert stats["failures"] == {"no_scene_metadata": 1} and "web" in stats["failure_examples"]["no_scene_metadata"][0]


def test_one_failing_sample_costs_one_caption_not_the_batch():
    class Flaky:
        needs_images = False

        def caption(self, batch):
            if any(item.key == "bad" for item in batch):
                raise RuntimeError("CUDA out of memory (pretend)")
            return [f"caption of {item.key}" for item in batch]

    items = [CaptionInput(k, "alt") for k in ("a", "bad", "c")]
    results = recaption.caption_batch(Flaky(), items)
    assert results[0] == "caption of a" and results[2] == "caption of c"
    assert isinstance(results[1], Failure) and results[1].reason == "error:RuntimeError"


def test_bad_input_names_the_file_and_the_reason(data, tmp_path):
    with pytest.raises(recaption.RecaptionError, match="column 'nope' not found"):
        recaption.run(params_for(data, tmp_path, source_field="nope"))
    with pytest.raises(recaption.RecaptionError, match="does not exist"):
        recaption.run(params_for(tmp_path / "none", tmp_path))
    with pytest.raises(ValidationError, match="needs a transformers: section"):
        RecaptionParams(captioner="transformers")
    with pytest.raises(ValidationError, match="must differ from source_field"):
        RecaptionParams(field="raw")
    with pytest.raises(ValidationError, match="chat: true needs a prompt"):
        TransformersCaptionerParams(model="x", chat=True)
    with pytest.raises(ValidationError, match="only the placeholder"):
        TransformersCaptionerParams(model="x", prompt="describe {image}")


def test_a_tiny_vision_encoder_decoder_captions_in_batches_with_the_same_result_as_one_by_one(data, captioner_dir, tmp_path):
    from PIL import Image

    params = TransformersCaptionerParams(model=str(captioner_dir), max_new_tokens=6, batch_size=3)
    captioner = TransformersCaptioner(params)
    images = [Image.new("RGB", (64, 64), c) for c in ("red", "blue", "white", "black")]
    items = [CaptionInput(f"k{i}", "alt", image=im) for i, im in enumerate(images)]
    together = captioner.caption(items)
    alone = [captioner.caption([item])[0] for item in items]
    assert together == alone and len(together) == 4
    assert all(isinstance(t, str) and t == " ".join(t.split()) or isinstance(t, Failure) and t.reason == "empty_output" for t in together)
    # a fixed prompt is the caption's first words: given to the decoder, cut from the answer
    prompted = TransformersCaptioner(params.model_copy(update={"prompt": "a picture of"}))
    inputs, prompt_ids = prompted.inputs(items[:2])
    start = prompted.model.generation_config.decoder_start_token_id
    assert inputs["decoder_input_ids"][:, 0].tolist() == [start, start] and prompt_ids.shape == (2, 4)
    with pytest.raises(ValueError, match="takes only a fixed prompt"):
        TransformersCaptioner(params.model_copy(update={"prompt": "{alt_text} is"}))


def test_the_stage_runs_the_tiny_model_end_to_end_and_counts_a_broken_image(data, captioner_dir, tmp_path):
    odd = _odd_shard(data)
    params = RecaptionParams.model_validate({
        "manifest": str(odd / "manifest.parquet"), "output_dir": str(tmp_path / "r"), "stats_path": str(tmp_path / "s.json"),
        "contact_sheet": str(tmp_path / "sheet.png"), "captioner": "transformers",
        "max_failure_rate": 1.0,  # a random model may generate no words at all: counted, not a stop, here
        "transformers": {"model": str(captioner_dir), "max_new_tokens": 5, "batch_size": 2}})
    stats = recaption.run(params)
    rows = {r["key"]: r for r in pq.read_table(tmp_path / "r" / "manifest.parquet").to_pylist()}
    assert rows["broken"]["status"] == "unreadable_sample" and rows["broken"]["recaption"] == "alt 3"
    assert all(rows[k]["status"] in ("ok", "empty_output") for k in ("k0", "k1", "web"))
    assert stats["samples"] == 4 and stats["failures"].get("unreadable_sample") == 1 and stats["model"] == str(captioner_dir)
    assert (tmp_path / "sheet.png").is_file()


def test_train_and_concepts_read_the_recaption_field(data, tmp_path):
    from components.data.stream import TrainBatches

    recaption.run(params_for(data, tmp_path, contact_sheet=None))
    new = {r["key"]: r["recaption"] for r in pq.read_table(tmp_path / "recaptions" / "manifest.parquet").to_pylist()}
    shards = sorted(str(p) for p in (data / "captions" / "train").glob("*.tar"))
    seen = {}
    for field in ("raw", "recaption"):
        params = TrainParams.model_validate({"data": {"shards": shards, "caption_field": field, "recaptions_dir": str(tmp_path / "recaptions" / "train"),
                                                      "workers": 0, "shuffle_buffer": 4}, "micro_batch": 4, "global_batch": 4})
        batches = TrainBatches(params, shards, 0, 1, 0, None, None, None, build=None)
        import webdataset as wds

        samples = list(wds.tariterators.tarfile_samples([{"url": shards[0]}]))[:4]
        seen[field] = {key: caption for key, _, caption, _ in batches.decode(samples)}
    assert all(seen["recaption"][k] == new[k] for k in seen["recaption"])
    assert all(seen["raw"][k] != new[k] for k in seen["raw"])  # one param switches raw ↔ recaptioned, same images
    out = ConceptsParams.model_validate({"manifest": str(data / "captions" / "manifest.parquet"), "caption_field": "recaption",
                                         "recaptions": str(tmp_path / "recaptions" / "manifest.parquet"), "output_dir": str(tmp_path / "concepts"),
                                         "stats_path": str(tmp_path / "c.json"), "n_process": 1, "quality_fields": ["recaption"], "quality_samples": 64})
    stats = concepts.run(out)
    assert stats["captions"] == 64 and stats["quality"]["recaption"]["recall"] > 0.9
    missing = out.model_copy(update={"recaptions": tmp_path / "nowhere.parquet", "output_dir": tmp_path / "c2"})
    with pytest.raises(concepts.ConceptsError, match="nowhere.parquet does not exist .*dvc repro recaption"):
        concepts.run(missing)


def test_a_missing_recaption_field_is_named(data, tmp_path):
    from components.data.stream import TrainBatches

    shards = sorted(str(p) for p in (data / "captions" / "train").glob("*.tar"))
    params = TrainParams.model_validate({"data": {"shards": shards, "caption_field": "recaption", "recaptions_dir": str(tmp_path / "none"),
                                                  "workers": 0}, "micro_batch": 4, "global_batch": 4})
    import webdataset as wds

    samples = list(wds.tariterators.tarfile_samples([{"url": shards[0]}]))[:1]
    with pytest.raises(ValueError, match="caption field 'recaption' missing.*recaptions_dir"):
        TrainBatches(params, shards, 0, 1, 0, None, None, None, build=None).decode(samples)


@pytest.mark.slow
def test_two_torchrun_processes_share_the_shards_and_write_what_one_process_writes(data, tmp_path):
    import subprocess
    import sys

    import yaml
    from conftest import HANG_S, REPO

    one = tmp_path / "one"
    recaption.run(params_for(data, one, contact_sheet=None))
    two = tmp_path / "two"
    cfg = params_for(data, two, contact_sheet=None).model_dump(mode="json")
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(cfg))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "components.recaption", "--params", str(tmp_path / "p.yaml")]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert pq.read_table(two / "recaptions" / "manifest.parquet").equals(pq.read_table(one / "recaptions" / "manifest.parquet"))
    assert json.loads((two / "recaption.json").read_text())["samples"] == 64


def test_new_phrases_or_new_recaptions_start_a_new_training_run_not_a_resumed_one(data, tmp_path):
    import shutil

    from components import train as train_stage

    shutil.copytree(data / "concepts", tmp_path / "concepts")
    recaption.run(params_for(data, tmp_path, contact_sheet=None))
    shards = sorted(str(p) for p in (data / "captions" / "train").glob("*.tar"))

    def fp(field):
        params = TrainParams.model_validate({"data": {"shards": shards, "caption_field": field, "concepts_dir": str(tmp_path / "concepts"),
                                                      "recaptions_dir": str(tmp_path / "recaptions" / "train")}})
        return train_stage.run_fingerprint(params, shards)

    long_before, recaption_before = fp("long"), fp("recaption")
    part = sorted((tmp_path / "recaptions" / "train").glob("*.parquet"))[0]
    table = pq.read_table(part)
    pq.write_table(table.set_column(1, "recaption", pa.array(["another captioner"] * table.num_rows)), part)
    assert fp("recaption") != recaption_before  # the captions trained on changed
    assert fp("long") == long_before  # a run on `long` never read them: it may resume
    phrases = tmp_path / "concepts" / "all.parquet"
    pq.write_table(pq.read_table(phrases).slice(0, 10), phrases)
    assert fp("long") != long_before
