"""The memory-mapped phrase table: the concepts stage's Parquet files as the mapping a dict filled from them would be."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from components.data.phrase_table import PhraseTable, load_phrases


def _write(path, keys, phrases):
    pq.write_table(pa.table({"key": keys, "phrases": pa.array(phrases, pa.list_(pa.string()))}), path)


def test_the_table_reads_as_the_dict_of_its_files(tmp_path, monkeypatch):
    monkeypatch.setenv("C2LIP_SHARD_INDEX_CACHE", str(tmp_path / "cache"))
    concepts = tmp_path / "concepts"
    concepts.mkdir()
    _write(concepts / "a.parquet", ["k-10", "k-2", "k-é", "k-1"], [["a red circle"], [], ["ünïcode phrase", "x"], ["one"]])
    _write(concepts / "b.parquet", ["k-2", "k-3"], [["replaced"], ["a blue square", "a green cross"]])
    expected = {"k-10": ["a red circle"], "k-2": ["replaced"], "k-é": ["ünïcode phrase", "x"], "k-1": ["one"],
                "k-3": ["a blue square", "a green cross"]}  # b.parquet's k-2 wins, as a dict filled file by file
    table = load_phrases(concepts)
    assert isinstance(table, PhraseTable) and dict(table) == expected and len(table) == 5
    assert "k-1" in table and "k-" not in table and "k-100" not in table and 7 not in table
    with pytest.raises(KeyError):
        table["k-0"]
    again = pickle.loads(pickle.dumps(table))  # a spawned loader worker maps the same files
    assert dict(again) == expected and again.folder == table.folder
    assert load_phrases(concepts).folder == table.folder  # converted once
    # a rerun of the concepts stage rewrites its files: another table
    _write(concepts / "b.parquet", ["k-3"], [["a yellow star"]])
    rerun = load_phrases(concepts)
    assert rerun.folder != table.folder and rerun["k-3"] == ["a yellow star"] and rerun["k-2"] == []
    assert dict(table) == expected  # a process still reading the old one keeps it


def test_an_empty_concepts_folder_is_an_empty_table(tmp_path, monkeypatch):
    monkeypatch.setenv("C2LIP_SHARD_INDEX_CACHE", str(tmp_path / "cache"))
    (tmp_path / "concepts").mkdir()
    table = load_phrases(tmp_path / "concepts")
    assert len(table) == 0 and "x" not in table and list(table) == []


def test_a_cache_that_cannot_be_written_builds_the_table_in_the_temporary_folder(tmp_path, monkeypatch):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setenv("C2LIP_SHARD_INDEX_CACHE", str(blocked / "cache"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR is read again
    concepts = tmp_path / "concepts"
    concepts.mkdir()
    _write(concepts / "a.parquet", ["k"], [["a red circle"]])
    table = load_phrases(concepts)
    assert table["k"] == ["a red circle"] and (tmp_path / "tmp") in table.folder.parents


def test_a_conversion_that_fails_leaves_the_cache_folder_as_it_was(tmp_path, monkeypatch):
    """The table is built in a folder of its own (a fresh temporary name) and renamed into place; when that fails,
    that folder goes and nothing else in the cache does."""
    import os

    from components.data import phrase_table

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "yours.txt").write_text("a file of yours in the cache folder")
    (cache / ".phrases-yours").mkdir()  # a folder named like a build's
    monkeypatch.setenv("C2LIP_SHARD_INDEX_CACHE", str(cache))
    concepts = tmp_path / "concepts"
    concepts.mkdir()
    _write(concepts / "a.parquet", ["k"], [["a red circle"]])

    def no_rename(src, dst):
        raise PermissionError(13, "refused by the test", str(dst))

    monkeypatch.setattr(os, "rename", no_rename)
    monkeypatch.setattr(phrase_table.tempfile, "gettempdir", lambda: str(tmp_path / "unwritable" / "x"))
    with pytest.raises(OSError):
        load_phrases(concepts)
    assert sorted(p.name for p in cache.iterdir()) == [".phrases-yours", "yours.txt"]
