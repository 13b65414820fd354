"""A small LanceDB table's exact search from vectors held in memory (connectors/lance_exact.py) against
Lance's own exact scan and float64 brute force, for every metric, across writes and past its size limit."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("lance")
from isotrope.connectors.lance_exact import HeldVectors
from isotrope.connectors.lancedb_store import LanceDBStore

DIM = 12


def filled(tmp_path, metric: str, n: int = 300) -> tuple[LanceDBStore, np.ndarray]:
    rng = np.random.default_rng(4)
    vectors = rng.standard_normal((n, DIM)).astype(np.float32)
    vectors[n // 2 :] = vectors[: n - n // 2]  # duplicated rows: exact ties
    store = LanceDBStore(tmp_path / metric, dim=DIM, metric=metric, index="flat")
    store.add([f"r{i}" for i in range(n)], vectors, texts=[f"text {i}" for i in range(n)])
    store.commit()
    return store, vectors


def reference(vectors: np.ndarray, query: np.ndarray, metric: str) -> np.ndarray:
    """Lance's distances in float64: cosine 1 - cos, dot 1 - x.y, l2 squared."""
    v, q = vectors.astype(np.float64), query.astype(np.float64)
    if metric == "l2":
        return ((v - q) ** 2).sum(axis=1)
    if metric == "cosine":
        return 1 - v @ q / (np.linalg.norm(v, axis=1) * np.linalg.norm(q))
    return 1 - v @ q


@pytest.mark.parametrize("metric", ["ip", "cosine", "l2"])
def test_held_vectors_find_lances_exact_neighbours_with_its_distances(tmp_path, metric):
    store, vectors = filled(tmp_path, metric)
    dataset, held = store._dataset(), HeldVectors(metric)
    lance_metric = {"ip": "dot"}.get(metric, metric)
    for query in np.random.default_rng(5).standard_normal((8, DIM)).astype(np.float32):
        rows, distances = held.nearest(dataset, query, 10)
        expected = reference(vectors, query, lance_metric)
        np.testing.assert_allclose(distances, np.sort(expected)[:10], rtol=1e-4, atol=1e-4)
        scan = dataset.scanner(
            columns=["id"], nearest={"column": "vector", "q": query, "k": 10, "metric": lance_metric}, with_row_id=True
        ).to_table()
        np.testing.assert_allclose(distances, np.sort(scan.column("_distance").to_numpy()), rtol=1e-4, atol=1e-4)
        # rows: the k smallest reference distances (exact ties in either order), closest first
        assert np.all(np.diff(distances) >= 0)
        assert np.all(expected[rows] <= np.sort(expected)[9] + 1e-4)
        assert len(set(rows.tolist())) == 10


def test_the_store_searches_held_vectors_and_sees_its_writes(tmp_path):
    store, vectors = filled(tmp_path, "ip")
    query = vectors[7] * 3
    assert store.search(query, 1)[0][0].id in {"r7", f"r{7 + 150}"}
    assert store._held._vectors is not None  # held after the first search
    store.add(["new"], (query * 10)[None, :], texts=["new"])
    store.commit()
    hits = store.search(query, 3)[0]
    assert hits[0].id == "new" and hits[0].text == "new"  # a new table version is read again
    store.delete(["new"])
    store.commit()
    assert store.search(query, 1)[0][0].id in {"r7", f"r{7 + 150}"}
    filtered = store.search(query, 5, where={"missing": 1})  # a filter goes through Lance's scan
    assert filtered == [[]]


def test_a_table_past_the_limit_is_left_to_lances_scan(tmp_path):
    store, _ = filled(tmp_path, "ip", n=40)
    assert HeldVectors("ip", limit=39).nearest(store._dataset(), np.ones(DIM, np.float32), 5) is None
    rows, _ = HeldVectors("ip", limit=40).nearest(store._dataset(), np.ones(DIM, np.float32), 50)
    assert sorted(rows.tolist()) == sorted(store._dataset().to_table(with_row_id=True).column("_rowid").to_pylist())
