"""Bulk loads build the ANN index once at the end (``deferred_index``), and calibration queries are
made from stored vectors with the source left out of the neighbours."""

from __future__ import annotations

import numpy as np
import pytest

from isotrope.connectors.faiss_store import FaissStore
from isotrope.connectors.lance_index import REFINE, REFINE_SQ
from isotrope.connectors.lancedb_store import LanceDBStore
from isotrope.stores import index_plan
from test_index_plan import DIM, brute_force, draw, fill, recall_of


def test_calibration_set_leaves_the_source_out_and_matches_brute_force():
    data = draw(2000, 21)
    keys = np.array([5, 17, 300, 1999])
    batches = lambda: ((np.arange(s, s + 500), data[s : s + 500]) for s in range(0, 2000, 500))  # noqa: E731
    queries, truth = index_plan.calibration_set(keys, data[keys], batches, "ip", neighbour=1)
    np.testing.assert_allclose(np.linalg.norm(queries, axis=1), 1.0, rtol=1e-5)  # the stored vectors' length
    scores = data.astype(np.float64) @ data[keys].astype(np.float64).T
    scores[keys, np.arange(len(keys))] = -np.inf
    nearest = scores.max(axis=0)  # each source's nearest other stored vector
    # moved orthogonally by the distance d to that neighbour, then scaled back: cosine 1 / sqrt(1 + d^2)
    expected_cosine = 1 / np.sqrt(1 + (2 - 2 * nearest))
    np.testing.assert_allclose((queries.astype(np.float64) * data[keys]).sum(axis=1), expected_cosine, atol=1e-4)
    expected = brute_force(queries, data, k=11)
    for row, source, exact in zip(truth, keys, expected):
        assert source not in row
        assert row.tolist() == [k for k in exact if k != source][:10]
    # the default moves as far as the 10th nearest other vector: further, so farther from the source
    farther, _ = index_plan.calibration_set(keys, data[keys], batches, "ip")
    tenth = np.sort(scores, axis=0)[-10]
    np.testing.assert_allclose((farther.astype(np.float64) * data[keys]).sum(axis=1), 1 / np.sqrt(3 - 2 * tenth), atol=1e-4)


def test_without_sources_drops_the_source_and_pads():
    found = np.array([[3, 1, 2], [4, 5, -1]])
    np.testing.assert_array_equal(index_plan.without_sources(found, np.array([1, 9]), 2), [[3, 2], [4, 5]])
    np.testing.assert_array_equal(index_plan.without_sources([[7]], np.array([7]), 2), [[-1, -1]])


def test_faiss_builds_once_after_a_deferred_load(tmp_path, monkeypatch):
    monkeypatch.setattr(index_plan, "EXACT_BELOW", 1000)
    data, queries = draw(6000, 22), draw(60, 23)
    store = FaissStore(tmp_path / "s", dim=DIM, index="auto", metric="ip")
    builds = []
    original = store._build
    monkeypatch.setattr(store, "_build", lambda factory: (builds.append(factory), original(factory)))
    with store.deferred_index():
        fill(store, data, batch=700)  # crosses the threshold and grows 6x: nothing is built
        assert store.is_exact and store.index_info()["index_built"] == "Flat"
    assert builds == []
    store.commit()
    assert builds == [index_plan.faiss_factory_for(6000)]
    info = store.index_info()
    assert info["index_built"] == index_plan.faiss_factory_for(6000) and not store.is_exact
    assert info["calibrated_recall_at_10"] >= index_plan.TARGET_RECALL
    assert recall_of(store.search(queries, 10), brute_force(queries, data)) >= index_plan.TARGET_RECALL
    store.close()


def test_faiss_trains_a_fixed_factory_after_a_deferred_load(tmp_path):
    data = draw(3000, 24)
    store = FaissStore(tmp_path / "s", dim=DIM, index="IVF16,Flat", metric="ip")
    with store.deferred_index():
        fill(store, data, batch=1000)
        assert store.is_exact  # enough rows to train, but the load is not over
    store.commit()
    assert not store.is_exact and store._index.ntotal == 3000
    store.close()
    assert not FaissStore(tmp_path / "s").is_exact  # the trained index was committed


@pytest.mark.slow
def test_lancedb_builds_once_after_a_deferred_load(tmp_path, monkeypatch):
    monkeypatch.setattr(index_plan, "EXACT_BELOW", 1000)
    data, queries = draw(3000, 25), draw(40, 26)
    store = LanceDBStore(tmp_path / "db", dim=DIM, metric="ip", index="auto")
    with store.deferred_index():
        fill(store, data, batch=1000)
        assert store.vector_index is None
    store.commit()
    info = store.index_info()
    assert info["index_built"] == "IvfHnswSq" and info["num_partitions"] == 1
    assert recall_of(store.search(queries, 10), brute_force(queries, data)) >= index_plan.TARGET_RECALL
    store.close()


def test_lancedb_merges_its_fragments_at_the_commit_after_an_index_build(tmp_path, monkeypatch):
    """A bulk load leaves a fragment per write; the commit building the index merges them once, keeping the
    rows, the ANN index's hits, the full-text index (exact BM25) and the BM25 statistics."""
    from test_hybrid import assert_lexical_exact, make_texts
    from test_lance_bm25 import assert_counts

    monkeypatch.setattr(index_plan, "EXACT_BELOW", 1000)
    data, queries, texts = draw(3000, 27), draw(40, 28), make_texts(3000, seed=2)
    store = LanceDBStore(tmp_path / "db", dim=DIM, metric="ip", index="auto")
    merged = []
    compact = LanceDBStore._compact
    monkeypatch.setattr(
        LanceDBStore, "_compact", lambda self: merged.append(len(self._dataset().get_fragments())) or compact(self)
    )
    with store.deferred_index():
        for start in range(0, 3000, 200):
            store.add([str(i) for i in range(start, start + 200)], data[start : start + 200], texts[start : start + 200])
            store.commit()
    assert not merged
    store.commit()
    assert merged == [15] and len(store._dataset().get_fragments()) == 1
    assert store.index_info()["index_built"] == "IvfHnswSq" and len(store) == 3000
    assert (store.refine, LanceDBStore(tmp_path / "flat", dim=DIM).refine) == (REFINE_SQ, REFINE)  # by the index type
    assert recall_of(store.search(queries, 10), brute_force(queries, data)) >= index_plan.TARGET_RECALL
    assert_lexical_exact("lance", store, {str(i): (t, {}) for i, t in enumerate(texts)})
    assert_counts(store._term_stats(store._dataset()), texts)
    store.commit()
    assert merged == [15]  # once per build


def top_ids(store, queries: np.ndarray) -> list[list[int]]:
    return [[int(hit.id) for hit in row] for row in store.search(queries, 10)]


def exact(queries: np.ndarray, data: np.ndarray, live: np.ndarray) -> list[list[int]]:
    """The brute-force top 10 ids among the ``live`` rows of ``data``."""
    return [[int(live[i]) for i in row] for row in brute_force(queries, data[live])]


def test_faiss_keeps_a_bulk_load_out_of_the_index_until_it_ends_and_stays_exact(tmp_path, caplog):
    """Rows added inside deferred_index() are in SQLite only (no second copy in memory): an open meanwhile
    (as after a kill -9) rebuilds, a search meanwhile catches up, and the commit after the load writes them all."""
    data, queries = draw(1500, 27), draw(20, 28)
    path = tmp_path / "s"
    store = FaissStore(path, dim=DIM, index="Flat", metric="ip")
    with store.deferred_index():
        fill(store, data[:1000], batch=400)
        assert (path / "index.faiss").stat().st_size < data[:1000].nbytes / 10  # the load's vectors are not in it
        with caplog.at_level("WARNING"):
            other = FaissStore(path)
        assert "rebuilding" in caplog.text
        assert top_ids(other, queries) == brute_force(queries, data[:1000]).tolist()
        other.close()
        data[:50] = draw(50, 29)  # upserts of stored rows and deletes inside the load
        store.add([str(i) for i in range(50)], data[:50])
        store.delete([str(i) for i in range(50, 60)])
        assert top_ids(store, queries) == exact(queries, data, np.setdiff1d(np.arange(1000), np.arange(50, 60)))  # caught up
        fill(store, data[1000:], batch=400, first=1000)
    store.commit()
    store.close()
    caplog.clear()
    with caplog.at_level("WARNING"):
        reopened = FaissStore(path)
    assert caplog.text == ""  # the committed file holds every row
    assert top_ids(reopened, queries) == exact(queries, data, np.setdiff1d(np.arange(1500), np.arange(50, 60)))
    reopened.close()


def _bulk_load(store, data: np.ndarray) -> None:
    """``data`` added inside ``deferred_index()`` with a text per row, committing every 700 rows but the
    last ones (as ingestion leaves them to the commit that builds the index)."""
    texts = [f"row{i} word{i % 7} word{i % 11} common" for i in range(len(data))]
    with store.deferred_index():
        for start in range(0, len(data), 700):
            part = slice(start, start + 700)
            if start:
                store.commit()
            store.add([str(i) for i in range(start, start + len(data[part]))], data[part], texts[part])


def test_the_keyword_index_leaves_memory_while_a_bulk_load_builds_the_index(tmp_path, monkeypatch):
    """The commit after a bulk load saves the keyword index first and drops it while the ANN index is
    built from SQLite (the load's memory peak); keyword search then reads it back from its file, exact."""
    monkeypatch.setattr(index_plan, "EXACT_BELOW", 1000)
    store = FaissStore(tmp_path / "s", dim=DIM, index="auto", metric="ip")
    held = []
    original = store._build
    monkeypatch.setattr(store, "_build", lambda factory: (held.append(store._keyword), original(factory)))
    _bulk_load(store, draw(3000, 24))
    queries = ["word3 row5", "common word10", "row2999 word1"]
    expected = [[(h.id, h.score) for h in row] for row in store.lexical_search(queries, 5)]  # the index in memory
    store.commit()
    assert held == [None] and store._keyword is None
    assert [[(h.id, h.score) for h in row] for row in store.lexical_search(queries, 5)] == expected
    assert store._keyword is not None and store._keyword.generation == store._committed_generation()


def test_a_failed_bulk_commit_keeps_keyword_search_exact(tmp_path, monkeypatch):
    """If building the index fails once the keyword index has left memory, keyword search inside the open
    transaction still sees its rows (the index rebuilt from them), and the next commit keeps them."""
    monkeypatch.setattr(index_plan, "EXACT_BELOW", 1000)
    store = FaissStore(tmp_path / "s", dim=DIM, index="auto", metric="ip")
    original = store._build
    _bulk_load(store, draw(3000, 25))
    expected = [[(h.id, h.score) for h in row] for row in store.lexical_search(["word3 row5", "row2999"], 5)]

    def fails(factory: str) -> None:
        raise MemoryError("no room")

    monkeypatch.setattr(store, "_build", fails)
    with pytest.raises(MemoryError):
        store.commit()
    assert store._keyword is None
    assert [[(h.id, h.score) for h in row] for row in store.lexical_search(["word3 row5", "row2999"], 5)] == expected
    monkeypatch.setattr(store, "_build", original)
    store.commit()
    store.close()
    reopened = FaissStore(tmp_path / "s")
    assert [[(h.id, h.score) for h in row] for row in reopened.lexical_search(["word3 row5", "row2999"], 5)] == expected
    assert reopened.has_lexical_index


def test_a_bulk_load_ends_with_the_keyword_index_in_one_matrix(tmp_path):
    """The rows a bulk load added since the keyword index last merged them in (a second matrix every query
    scores apart) are merged by the commit that ends the load, and saved merged; keyword search is unchanged."""
    from isotrope.connectors.keyword_index import KeywordIndex

    store = FaissStore(tmp_path / "s", dim=DIM, metric="ip")
    _bulk_load(store, draw(3100, 26))  # the last 300 rows: fewer than MERGE_SHARE of the 2,800 before
    queries = ["word3 row5", "common word10", "row3099 word1", "row2805"]
    assert store._keyword is not None and store._keyword.pending == 300
    expected = [[(h.id, h.score) for h in row] for row in store.lexical_search(queries, 5)]
    store.commit()
    saved = KeywordIndex.load(store.path)
    assert saved is not None and saved.pending == 0 and len(saved) == 3100
    assert saved.generation == store._committed_generation()
    assert [[(h.id, h.score) for h in row] for row in store.lexical_search(queries, 5)] == expected
    store.add(["new"], draw(1, 27), ["row5 fresh"])  # outside a bulk load, a change stays pending
    store.commit()
    assert KeywordIndex.load(store.path).pending == 1
