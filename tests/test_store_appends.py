"""Appending batches whose ids are known to be new (``add(new_ids=True)``, as ingestion does) gives the same
store as upserting them; upserts of stored ids keep replacing rows (LanceDB: merge_insert on id)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("faiss")
pytest.importorskip("lancedb")
from lance import LanceDataset

from isotrope.connectors.faiss_store import FaissStore
from isotrope.connectors.lancedb_store import LanceDBStore

DIM = 8


def open_store(kind, path):
    if kind == "faiss":
        return FaissStore(path / kind, DIM)
    return LanceDBStore(path / kind, dim=DIM, metric="ip", index="flat")


def batch(start, n, seed, word="alpha"):
    ids = [f"r{i}" for i in range(start, start + n)]
    vectors = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return ids, vectors, [f"{word} text {i}" for i in ids], [{"n": i, "word": word} for i in range(start, start + n)]


def snapshot(store):
    rows = store.get(sorted(store.ids()))
    return [(h.id, h.text, h.metadata) for h in rows], store.vectors(sorted(store.ids()))


@pytest.mark.parametrize("kind", ["faiss", "lancedb"])
def test_appending_new_ids_equals_upserting_them(kind, tmp_path):
    appended, upserted = open_store(kind, tmp_path / "a"), open_store(kind, tmp_path / "u")
    for start, seed in ((0, 1), (50, 2), (100, 3)):
        appended.add(*batch(start, 50, seed), new_ids=True)
        upserted.add(*batch(start, 50, seed))
    for store in (appended, upserted):
        store.commit()
    (rows_a, vectors_a), (rows_u, vectors_u) = snapshot(appended), snapshot(upserted)
    assert rows_a == rows_u and len(rows_a) == 150
    np.testing.assert_array_equal(vectors_a, vectors_u)
    queries = np.random.default_rng(9).standard_normal((5, DIM))
    assert [[h.id for h in row] for row in appended.search(queries, 7)] == [
        [h.id for h in row] for row in upserted.search(queries, 7)
    ]
    assert [h.id for h in appended.lexical_search(["alpha r7"], 3)[0]] == [
        h.id for h in upserted.lexical_search(["alpha r7"], 3)[0]
    ]
    assert appended.metadata_fields() == {"n", "word"}


def test_lance_appends_unless_an_upsert_is_possible(tmp_path, monkeypatch):
    store = open_store("lancedb", tmp_path)
    merges = []
    merge_insert = LanceDataset.merge_insert

    def spy(self, on):
        merges.append(on)
        return merge_insert(self, on)

    monkeypatch.setattr(LanceDataset, "merge_insert", spy)
    store.add(*batch(0, 40, 1))  # an empty table: appended
    store.add(*batch(40, 40, 2), new_ids=True)  # the caller knows the ids are new
    assert merges == [] and len(store) == 80
    # a plain add to a non-empty table merges on id: stored rows are replaced, none duplicated
    ids, vectors, texts, meta = batch(30, 20, 3, word="beta")
    store.add(ids, vectors, texts, meta)
    store.commit()
    assert merges == ["id"] and len(store) == 80 and len(set(store.ids())) == 80
    assert store.get(["r35"])[0].text == "beta text r35" and store.get(["r35"])[0].metadata == {"n": 35, "word": "beta"}
    np.testing.assert_array_equal(store.vectors(ids), vectors)
    assert {h.id for h in store.lexical_search(["beta"], 50)[0]} == set(ids)


def test_faiss_new_ids_with_a_stored_id_fails_and_changes_nothing(tmp_path):
    store = open_store("faiss", tmp_path)
    store.add(*batch(0, 20, 1))
    store.commit()
    before = snapshot(store)
    with pytest.raises(Exception, match="UNIQUE"):
        store.add(*batch(15, 10, 2, word="beta"), new_ids=True)
    store.commit()
    after = snapshot(store)
    assert after[0] == before[0] and len(store) == 20
    np.testing.assert_array_equal(after[1], before[1])
    assert len(store.search(np.ones((1, DIM)), 30)[0]) == 20


def test_lance_adds_appended_rows_to_the_full_text_index_after_metadata_writes(tmp_path, monkeypatch):
    """Metadata-only writes (properties, a calibration) keep the full-text index exact: the next writer
    adds its rows to the index rather than rebuilding it (a rebuild costs minutes at a million rows)."""
    store = open_store("lancedb", tmp_path)
    store.add(*batch(0, 40, 1))
    store.commit()
    store.set_properties(note="calibrated")
    store.commit()
    store.close()
    rebuilds = []
    refresh = LanceDBStore._refresh_lexical_index

    def spy(self):
        rebuilds.append(self._lexical_state)
        return refresh(self)

    monkeypatch.setattr(LanceDBStore, "_refresh_lexical_index", spy)
    again = LanceDBStore(tmp_path / "lancedb", index="flat")
    again.commit()  # nothing written, the index exact: nothing to do
    again.add(*batch(40, 10, 2, word="gamma"), new_ids=True)
    again.commit()
    assert rebuilds == ["appended"]
    assert {h.id for h in again.lexical_search(["gamma"], 50)[0]} == {f"r{i}" for i in range(40, 50)}


def test_lance_compaction_keeps_the_full_text_index_exact_and_appendable(tmp_path, monkeypatch):
    from test_hybrid import assert_lexical_exact

    store = open_store("lancedb", tmp_path)
    contents = {}
    for start in range(0, 60, 12):  # five fragments
        ids, vectors, texts, meta = batch(start, 12, start, word=f"w{start % 24}")
        store.add(ids, vectors, texts, meta, new_ids=True)
        store.commit()
        contents.update({i: (t, m) for i, t, m in zip(ids, texts, meta)})
    gone = [f"r{i}" for i in range(0, 60, 4)]
    store.delete(gone)
    store.commit()
    for i in gone:
        del contents[i]
    queries = ["w0 text", "w12 r13", "text", "w0 w12 r50"]
    fragments = len(store._dataset().get_fragments())
    store.optimize()
    assert len(store._dataset().get_fragments()) < fragments  # compacted
    assert_lexical_exact("lancedb", store, contents, queries=queries)
    store.close()
    store = LanceDBStore(tmp_path / "lancedb", index="flat")  # the next writer
    rebuilds = []
    refresh = LanceDBStore._refresh_lexical_index
    monkeypatch.setattr(
        LanceDBStore, "_refresh_lexical_index", lambda self: rebuilds.append(self._lexical_state) or refresh(self)
    )
    ids, vectors, texts, meta = batch(60, 6, 9, word="w0")
    store.add(ids, vectors, texts, meta, new_ids=True)
    store.commit()
    contents.update({i: (t, m) for i, t, m in zip(ids, texts, meta)})
    assert rebuilds == ["appended"]
    assert_lexical_exact("lancedb", store, contents, queries=queries)
