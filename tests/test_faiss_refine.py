"""FaissStore ``refine``: a quantised index's candidates re-ranked by exact scores from the float32 vectors
in SQLite, checked against NumPy brute force in float64."""

from __future__ import annotations

import numpy as np
import pytest

faiss = pytest.importorskip("faiss")
from isotrope.connectors.faiss_store import FaissStore  # noqa: E402

DIM, N, K = 32, 3000, 10


def clustered(n, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((30, DIM))
    x = centers[rng.integers(30, size=n)] + 0.4 * rng.standard_normal((n, DIM))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def exact(data, queries, metric):
    x, q = data.astype(np.float64), queries.astype(np.float64)
    scores = q @ x.T if metric == "ip" else -((q[:, None, :] - x[None]) ** 2).sum(-1)
    return scores, np.argsort(-scores, axis=1, kind="stable")[:, :K]


def build(tmp_path, metric, refine, factory="IVF16,SQ4"):
    data = clustered(N)
    store = FaissStore(tmp_path / f"{metric}-{refine}", DIM, index=factory, metric=metric, refine=refine, nprobe=16)
    store.add([f"r{i}" for i in range(N)], data, None, [{"half": i % 2} for i in range(N)])
    store.commit()
    return store, data


def recall(hits, truth):
    return np.mean([len({int(h.id[1:]) for h in row} & set(t.tolist())) / K for row, t in zip(hits, truth)])


@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_refined_hits_carry_exact_scores_and_beat_the_codes(metric, tmp_path):
    queries = clustered(40, seed=5)
    rough, data = build(tmp_path, metric, 0)
    refined, _ = build(tmp_path, metric, 8)
    scores, truth = exact(data, queries, metric)
    rough_hits, refined_hits = rough.search(queries, K), refined.search(queries, K)
    assert recall(refined_hits, truth) >= 0.99 > recall(rough_hits, truth)
    for row, hits in enumerate(refined_hits):
        got = np.array([h.score for h in hits])
        np.testing.assert_allclose(got, scores[row, [int(h.id[1:]) for h in hits]], rtol=1e-4, atol=1e-4)
        assert np.all(np.diff(got) <= 1e-6)
    # a single query and a batch agree
    assert [h.id for h in refined.search(queries[3], K)[0]] == [h.id for h in refined_hits[3]]


def test_refine_persists_filters_and_switches_off(tmp_path):
    store, data = build(tmp_path, "ip", 4)
    store.close()
    store = FaissStore(tmp_path / "ip-4", exact_filter_limit=100)  # filtered searches go through the index
    assert store.refine == 4 and store.index_info()["refine"] == 4
    queries = clustered(10, seed=6)
    odd = np.arange(1, N, 2)
    scores, truth = exact(data[odd], queries, "ip")
    hits = store.search(queries, K, where={"half": 1})
    assert recall([[type(h)(f"r{(int(h.id[1:]) - 1) // 2}", h.score, None) for h in row] for row in hits], truth) >= 0.95
    for row, found in enumerate(hits):
        assert len(found) == K and all(int(h.id[1:]) % 2 == 1 for h in found)
        np.testing.assert_allclose(
            [h.score for h in found], scores[row, [(int(h.id[1:]) - 1) // 2 for h in found]], rtol=1e-4, atol=1e-4
        )
    assert FaissStore(tmp_path / "ip-4", refine=0).refine == 0  # for that handle only
    store.optimize(refine=0)
    store.close()
    assert FaissStore(tmp_path / "ip-4").refine == 0
    with pytest.raises(ValueError, match="refine must be an integer of at least 0"):
        FaissStore(tmp_path / "other", DIM, refine=-1)


@pytest.mark.parametrize("rows, queries, serial", [(500, 1, True), (500, 3, False), (1000, 1, False)])
def test_one_small_exact_query_searches_on_the_calling_thread_alone(tmp_path, monkeypatch, rows, queries, serial):
    """faiss's other threads are not woken for one query over a small flat index (an encoder's threads still hold
    the cores); a batch, or a scan over SERIAL_SCAN, keeps them. The setting is restored."""
    from isotrope.connectors import faiss_index

    monkeypatch.setattr(faiss_index, "SERIAL_SCAN", 500 * 256)
    faiss.omp_set_num_threads(2)
    store = FaissStore(tmp_path / "s", 256, index="Flat")
    data = np.random.default_rng(1).normal(size=(rows, 256)).astype(np.float32)
    store.add([str(i) for i in range(rows)], data)
    seen, search = [], FaissStore._unfiltered_search

    def recording(self, q, k):
        seen.append(faiss.omp_get_max_threads())
        return search(self, q, k)

    monkeypatch.setattr(FaissStore, "_unfiltered_search", recording)
    hits = store.search(data[:queries], k=3)
    assert seen == [1 if serial else 2] and faiss.omp_get_max_threads() == 2
    assert [row[0].id for row in hits] == [str(i) for i in range(queries)]  # each vector finds itself
    store.close()
