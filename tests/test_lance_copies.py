"""The per-fragment copies of a LanceDB table's ``vector`` and ``terms`` columns that hybrid search reads
(:mod:`isotrope.connectors.lance_copies`): always what the table holds, whatever was written since; never a
reason for a different result."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import time

import numpy as np
import pyarrow as pa
import pytest

from test_stores import make_data

pytest.importorskip("lancedb")
from isotrope.connectors import lance_copies
from isotrope.connectors.lancedb_store import LanceDBStore
from isotrope.fusion import search_store

DIM = 16
WORDS = ["quick", "fox", "proteins", "cells", "orchid", "banks", "river", "stone", "light", "water"]


def _texts(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 9)))) for _ in range(n)]


def _add(store: LanceDBStore, start: int, n: int, seed: int) -> None:
    ids = [f"d{i}" for i in range(start, start + n)]
    store.add(ids, make_data("random", n, DIM, seed=seed), _texts(n, seed), [{}] * n)


@pytest.fixture
def store(tmp_path):
    """An indexed table of three fragments (one compacted at the index build, two appended), rows deleted in two."""
    store = LanceDBStore(tmp_path / "lance", dim=DIM, metric="ip", index="hnsw_sq", threshold=200)
    _add(store, 0, 300, seed=1)
    store.commit()  # builds the index, then merges the fragments
    _add(store, 300, 150, seed=2)
    store.commit()
    _add(store, 450, 120, seed=3)
    store.delete(["d3", "d310", "d460", "d461"])
    store.commit()
    assert store.vector_index == "IvfHnswSq" and len(store._dataset().get_fragments()) == 3
    return store


def _row_ids(store: LanceDBStore) -> np.ndarray:
    return store._dataset().to_table(columns=[], with_row_id=True).column("_rowid").to_numpy()


def _taken(store: LanceDBStore, rows: list[int]) -> pa.Table:
    return store._dataset()._take_rows(rows, columns=["vector", "terms"])


def _assert_copies_read_the_table(store: LanceDBStore, seed: int = 0) -> None:
    """The copies folder holds the files of the table's fragments and nothing else, and reads as the table."""
    names = {lance_copies.copy_name(fragment) for fragment in store._dataset().get_fragments()}
    assert {path.name for path in store._copies.folder.iterdir()} == {f"{n}{ext}" for n in names for ext in (".arrow", ".npy")}
    rows = np.random.default_rng(seed).permutation(_row_ids(store))[:97].tolist()
    dataset, taken = store._dataset(), _taken(store, rows)
    vectors = store._copies.vectors(dataset, rows)
    assert vectors is not None, "every fragment has its copy after a commit"
    np.testing.assert_array_equal(vectors, np.stack(taken.column("vector").to_numpy(zero_copy_only=False)))
    assert store._copies.terms(dataset, rows).to_pylist() == taken.column("terms").to_pylist()


def test_copies_hold_each_fragments_rows_in_any_order(store):
    """Rows of every fragment, deleted rows beside them, shuffled: the copies give what a take from Lance gives."""
    for seed in range(3):
        _assert_copies_read_the_table(store, seed)
    assert store._copies.terms(store._dataset(), []).to_pylist() == []


def test_copies_written_in_many_batches_read_the_same(store, monkeypatch):
    """Copies of many record batches (the terms in many chunks) read as those of one."""
    monkeypatch.setattr(lance_copies, "_BATCH", 32)
    for path in store._copies.folder.iterdir():
        path.unlink()
    store._copies = lance_copies.FragmentCopies(store._table_uri(), DIM)
    store.commit()
    assert store._copies._copy(lance_copies.copy_name(store._dataset().get_fragments()[0])).terms.num_chunks > 3
    for seed in range(3):
        _assert_copies_read_the_table(store, seed)


def test_rewritten_rows_are_copied_again_and_the_old_copies_go(store):
    """Vectors rewritten (their rows deleted and appended anew) and a compaction: new copies at the next commit,
    none of the fragments gone left; before it, the rewritten rows have no copy and are read from the table."""
    before = {path.name for path in store._copies.folder.iterdir()}
    ids = [f"d{i}" for i in range(0, 450, 7) if i not in (3, 310)]
    store.update_vectors(ids, make_data("random", len(ids), DIM, seed=11))
    assert store._copies.vectors(store._dataset(), _row_ids(store).tolist()) is None
    store.commit()
    _assert_copies_read_the_table(store)
    store.optimize()  # compacts
    _assert_copies_read_the_table(store)
    assert before - {path.name for path in store._copies.folder.iterdir()}


def test_hybrid_search_reads_the_copies_and_finds_what_the_takes_find(store, monkeypatch):
    """Both columns come from the copies, and the candidates (BM25 of the dense rows, vectors of the keyword
    rows) and the fused hits, ids and scores, are those of Lance's takes."""
    texts, queries = ["quick fox", "orchid banks in the river", "stone"], make_data("random", 3, DIM, seed=9)
    read: set[str] = set()
    for column in ("vectors", "terms"):
        method = getattr(lance_copies.FragmentCopies, column)
        monkeypatch.setattr(
            lance_copies.FragmentCopies, column, lambda self, *a, _m=method, _c=column: read.add(_c) or _m(self, *a)
        )
    copied = store.hybrid_candidates(texts, queries, 50, 25, None, True)
    copied_hits = search_store(store, texts, queries, 5, candidates=50)
    assert read == {"vectors", "terms"}
    store._copies = None
    taken = store.hybrid_candidates(texts, queries, 50, 25, None, True)
    for a, b in zip(copied.dense_bm25, taken.dense_bm25):
        np.testing.assert_array_equal(a, b)
    keys = sorted({row for rows, _ in taken.lexical for row in rows} - {row for rows, _ in taken.dense for row in rows})
    assert keys, "some keyword rows are not dense candidates"
    np.testing.assert_array_equal(copied.vectors.take(keys), taken.vectors.take(keys))
    as_pairs = lambda found: [[(hit.id, hit.score) for hit in hits] for hits in found]  # noqa: E731
    assert as_pairs(copied_hits) == as_pairs(search_store(store, texts, queries, 5, candidates=50))


def test_a_damaged_or_interrupted_copy_is_read_from_the_table_and_written_again(store, monkeypatch, caplog):
    """A truncated file: a warning, the table's rows, and a new copy at the next commit; a copy interrupted
    before its last rename (a killed writer): no copy until the next commit writes it, its leftovers removed."""
    vectors = next(store._copies.folder.glob("*.npy"))
    vectors.write_bytes(vectors.read_bytes()[:200])
    store._copies = lance_copies.FragmentCopies(store._table_uri(), DIM)  # a process opening the store now
    rows = _row_ids(store).tolist()
    with caplog.at_level(logging.WARNING):
        assert store._copies.vectors(store._dataset(), rows) is None
    assert "unreadable" in caplog.text
    store.commit()
    _assert_copies_read_the_table(store)

    real_replace = lance_copies.os.replace

    def killed_at_the_vectors(source, target):
        if str(target).endswith(".npy"):
            raise KeyboardInterrupt
        real_replace(source, target)

    _add(store, 600, 40, seed=4)
    monkeypatch.setattr(lance_copies.os, "replace", killed_at_the_vectors)
    with pytest.raises(KeyboardInterrupt):
        store.commit()
    monkeypatch.setattr(lance_copies.os, "replace", real_replace)
    store._copies = lance_copies.FragmentCopies(store._table_uri(), DIM)
    assert store._copies.vectors(store._dataset(), _row_ids(store).tolist()) is None
    assert any(path.name.endswith(".tmp") for path in store._copies.folder.iterdir())
    store.commit()
    _assert_copies_read_the_table(store)
    assert not any(path.name.endswith(".tmp") for path in store._copies.folder.iterdir())


#: a process writing the copies again and again (small batches: many writes per copy) until it is killed
KILLED_WRITER = """
    import shutil, sys
    from isotrope.connectors import lance_copies
    from isotrope.connectors.lancedb_store import LanceDBStore
    lance_copies._BATCH = 16
    store = LanceDBStore(sys.argv[1])
    print("ready", flush=True)
    while True:
        shutil.rmtree(store._copies.folder, ignore_errors=True)
        store._copies = lance_copies.FragmentCopies(store._table_uri(), store.dim)
        store.commit()
"""


def test_copies_killed_at_any_point_are_never_read_wrong(store):
    """kill -9 at random points of writing the copies: a reader then gets the table's rows or nothing (and reads
    from Lance), never other rows; the next commit completes them."""
    rows = _row_ids(store).tolist()
    taken = _taken(store, rows)
    vectors, terms = np.stack(taken.column("vector").to_numpy(zero_copy_only=False)), taken.column("terms").to_pylist()
    for delay in np.random.default_rng(0).uniform(0.0, 0.4, 6):
        child = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(KILLED_WRITER), str(store.path)], stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        time.sleep(delay)
        child.kill()
        child.wait()
        reader = lance_copies.FragmentCopies(store._table_uri(), DIM)
        read = reader.vectors(store._dataset(), rows)
        if read is not None:
            np.testing.assert_array_equal(read, vectors)
            assert reader.terms(store._dataset(), rows).to_pylist() == terms
    store.commit()
    _assert_copies_read_the_table(store)


def test_a_table_without_an_ann_index_keeps_no_copies(tmp_path):
    """Below the index threshold a table is searched exactly from vectors held in memory: no copies written."""
    store = LanceDBStore(tmp_path / "lance", dim=DIM, metric="ip", index="hnsw_sq", threshold=10_000)
    _add(store, 0, 100, seed=1)
    store.commit()
    assert store.vector_index is None and not store._copies.folder.exists()
