"""The vector stores beyond the store contract (tests/test_store_contract.py runs the cases every store
shares against float64 brute force): approximate indexes against the exact NumPy reference (MemoryStore) —
ANN recall (tie-aware comparisons, as faiss contrib.evaluation), persistence, upserts, deletes and filters —
and each store's own corrupt directories, crashes and index management."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from isotrope.stores.base import StoreFormatError
from isotrope.stores.filters import matches, parse_where
from isotrope.stores.memory import MemoryStore

faiss = pytest.importorskip("faiss")
pytest.importorskip("lancedb")
from isotrope.connectors.faiss_store import FaissStore  # noqa: E402
from isotrope.connectors.lancedb_store import LanceDBStore  # noqa: E402

DIM = 32
K = 10


@pytest.fixture(scope="module", autouse=True)
def one_faiss_thread():
    """faiss's OpenMP threads fight over two busy cores; one thread builds the small indexes faster."""
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(before)


# ----------------------------------------------------------------------------- data


def unit_rows(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def make_data(kind, n, dim=DIM, seed=0):
    """Unit vectors: isotropic ("random") or 20 clusters with 50 exact duplicates ("clustered": real ties)."""
    rng = np.random.default_rng(seed)
    if kind == "random":
        return unit_rows(rng.standard_normal((n, dim)))
    centers = rng.standard_normal((20, dim))
    x = unit_rows(centers[rng.integers(20, size=n)] + 0.35 * rng.standard_normal((n, dim)))
    x[-50:] = x[:50]
    return x


def make_queries(data, n=30, seed=1):
    rng = np.random.default_rng(seed)
    picks = data[rng.choice(len(data), n, replace=False)]
    return unit_rows(picks + 0.2 * rng.standard_normal(picks.shape))


def make_metadata(i):
    meta = {"source": f"doc{i % 7}.txt", "year": 1990 + i % 35, "lang": ("en", "fr", "de")[i % 3], "draft": i % 4 == 0}
    if i % 5 == 0:
        meta["score"] = (i % 11) / 2
    if i % 13 == 0:
        meta["year"] = str(meta["year"])  # the wrong type: never compares with numbers
    if i % 17 == 0:
        meta["lang"] = None
    return meta


def ids_of(n, prefix="d"):
    return [f"{prefix}{i}" for i in range(n)]


FILTERS = [
    {"source": "doc3.txt"},
    {"year": {"$gte": 2010}},
    {"lang": {"$in": ["en", "fr"]}, "draft": False},
    {"$or": [{"source": "doc1.txt"}, {"score": {"$lt": 2}}]},
    {"lang": {"$nin": ["en"]}},
    {"score": {"$ne": 1.5}},
    {"year": {"$gt": "2000"}},
    {"source": "nope.txt"},
    parse_where("year >= 2000 and (lang = 'fr' or draft = true)"),
]


def open_store(kind, tmp_path, dim=DIM, metric="ip", **kw):
    if kind == "memory":
        return MemoryStore(dim, metric)
    if kind.startswith("faiss"):
        index = kw.pop("index", {"faiss": "flat", "faiss-ivf": "IVF32,Flat", "faiss-hnsw": "HNSW32"}[kind])
        return FaissStore(tmp_path / kind, dim, index=index, metric=metric, **kw)
    kw.setdefault("index", "flat")
    return LanceDBStore(tmp_path / "lance", dim=dim, metric=metric, **kw)


def filled(kind, tmp_path, data, metric="ip", texts=None, **kw):
    store = open_store(kind, tmp_path, data.shape[1], metric, **kw)
    n = len(data)
    half = n // 2  # two batches
    meta = [make_metadata(i) for i in range(n)]
    texts = texts or [f"text {i}" for i in range(n)]
    ids = ids_of(n)
    store.add(ids[:half], data[:half], texts[:half], meta[:half])
    store.add(ids[half:], data[half:], texts[half:], meta[half:])
    return store


# ----------------------------------------------------------------------------- comparisons


def assert_same_hits(expected, got, atol=1e-5):
    """Same scores (to atol) and, except inside groups of tied scores, the same ids at each rank.

    As faiss.contrib.evaluation.check_ref_knn_with_draws: tied ids may come in any order, and
    the tie group holding the k-th score may continue past k, so nothing is said about its ids.
    """
    assert len(expected) == len(got)
    for ref, new in zip(expected, got):
        ref_scores = np.array([h.score for h in ref])
        new_scores = np.array([h.score for h in new])
        assert len(ref_scores) == len(new_scores)
        np.testing.assert_allclose(new_scores, ref_scores, rtol=1e-5, atol=atol)
        ref_ids = np.array([h.id for h in ref])
        new_ids = np.array([h.id for h in new])
        if len(ref_ids) == 0 or (ref_ids == new_ids).all():
            continue
        for score in np.unique(ref_scores):
            if abs(score - ref_scores[-1]) <= atol:
                continue
            tied = np.abs(ref_scores - score) <= atol
            assert set(ref_ids[tied]) == set(new_ids[tied])


def recall(expected, got):
    """Mean fraction of the expected ids found (an empty expected list is matched only by an empty one)."""
    return np.mean([len({h.id for h in r} & {h.id for h in g}) / len(r) if r else float(not g) for r, g in zip(expected, got)])


# ----------------------------------------------------------------------------- the reference's own files


def test_memory_store_refuses_a_modified_vectors_file(tmp_path):
    data = make_data("clustered", 400)
    filled("memory", tmp_path, data).save(tmp_path / "mem")
    np.save(tmp_path / "mem" / "vectors.npy", data[:10])
    with pytest.raises(StoreFormatError, match=r"vectors\.npy"):
        MemoryStore.load(tmp_path / "mem")


# ----------------------------------------------------------------------------- approximate indexes


ANN_CASES = {
    "faiss-ivf": {"nprobe": 8},
    "faiss-hnsw": {"ef": 128},
    "lance-ivfpq": {"nprobe": 8, "refine": 10},
    "lance-hnswsq": {"ef": 64, "refine": 4},
}


def build_ann(case, tmp_path, data, metric="cosine"):
    if case.startswith("faiss"):
        return filled(case, tmp_path, data, metric, **ANN_CASES[case])
    store = filled("lance", tmp_path, data, metric, **ANN_CASES[case])
    from lancedb.index import HnswSq, IvfPq

    config = (
        IvfPq(distance_type=metric, num_partitions=16, num_sub_vectors=8)
        if case == "lance-ivfpq"
        else HnswSq(distance_type=metric, num_partitions=1)
    )
    store.create_index(config)
    return store


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c == "lance-hnswsq" else c for c in ANN_CASES])
def test_ann_recall_against_exact(case, tmp_path):
    data = make_data("clustered", 4000)
    queries = make_queries(data, 50)
    reference = filled("memory", tmp_path, data, "cosine")
    store = build_ann(case, tmp_path, data)
    if case.startswith("faiss"):
        assert not store.is_exact
    else:
        assert store.vector_index in ("IvfPq", "IvfHnswSq")
    batch = store.search(queries, K)
    assert recall(reference.search(queries, K), batch) >= 0.95
    for i in range(5):  # one query alone (LanceDB: pylance's scanner) gets its row of the batch, same breadth
        alone = store.search(queries[i : i + 1], K)[0]
        assert [h.id for h in alone] == [h.id for h in batch[i]]
        np.testing.assert_allclose([h.score for h in alone], [h.score for h in batch[i]], rtol=1e-5, atol=1e-6)
    where = {"lang": {"$in": ["en", "fr"]}}
    if case.startswith("faiss"):
        store.exact_filter_limit = 0  # go through the faiss IDSelector, not the exact fallback
    filtered = store.search(queries, K, where=where)
    assert recall(reference.search(queries, K, where=where), filtered) >= 0.95
    assert all(h.metadata["lang"] in ("en", "fr") for row in filtered for h in row)


def test_faiss_searches_exactly_until_trained(tmp_path):
    data = make_data("clustered", 1500)
    queries = make_queries(data)
    store = open_store("faiss-ivf", tmp_path, metric="cosine", threshold=1000)
    reference = MemoryStore(DIM, "cosine")
    for s in (store, reference):
        s.add(ids_of(800), data[:800])
    assert store.is_exact
    assert_same_hits(reference.search(queries, K), store.search(queries, K))
    for s in (store, reference):
        s.add(ids_of(1500)[800:], data[800:])
    assert not store.is_exact  # trained on the stored vectors once there were enough
    assert faiss.try_extract_index_ivf(store._index).ntotal == 1500
    assert recall(reference.search(queries, K), store.search(queries, K)) >= 0.9


def test_faiss_search_breadth_follows_nprobe_and_ef_search_changes(tmp_path):
    """The store's search parameters are cached per index; changing nprobe / ef still takes
    effect, checked against the bare faiss index searched with explicit parameters."""
    data = make_data("random", 3000)
    queries = make_queries(data)
    store = filled("faiss-ivf", tmp_path, data, nprobe=1)
    store.commit()
    bare = faiss.read_index(str(tmp_path / "faiss-ivf" / "index.faiss"))
    for nprobe in (1, 4, 32):
        store.nprobe = nprobe
        _, keys = bare.search(queries, K, params=faiss.SearchParametersIVF(nprobe=nprobe))
        got = [[int(h.id[1:]) + 1 for h in row] for row in store.search(queries, K)]
        assert got == keys.tolist()  # keys are 1-based insertion order, ids "d<i>"
    hnsw = filled("faiss-hnsw", tmp_path, data, ef=16)
    hnsw.commit()
    bare = faiss.read_index(str(tmp_path / "faiss-hnsw" / "index.faiss"))
    for ef in (16, 256):
        hnsw.ef = ef
        _, keys = bare.search(queries, K, params=faiss.SearchParametersHNSW(efSearch=ef))
        assert [[int(h.id[1:]) + 1 for h in row] for row in hnsw.search(queries, K)] == keys.tolist()


@pytest.mark.parametrize("factory", ["PQ4x4", "IVF8,PQ4x4,RFlat"])
def test_faiss_indexes_without_selectors_filter_by_over_fetching(factory, tmp_path):
    data = make_data("clustered", 1200, dim=16)
    queries = make_queries(data)
    store = filled("faiss", tmp_path, data, "l2", index=factory, threshold=600, exact_filter_limit=0)
    reference = filled("memory", tmp_path, data, "l2")
    where = {"source": {"$in": ["doc1.txt", "doc2.txt"]}}
    got = store.search(queries, K, where=where)
    assert all(h.metadata["source"] in ("doc1.txt", "doc2.txt") for row in got for h in row)
    assert all(len(row) == K for row in got)
    assert recall(reference.search(queries, K, where=where), got) >= 0.5  # PQ4 is coarse


# ----------------------------------------------------------------------------- persistence


@pytest.mark.parametrize("kind", ["faiss-ivf", "faiss-hnsw"])  # exact stores: test_store_contract.py
def test_persist_reopen_identical(kind, tmp_path):
    data = make_data("clustered", 2000)
    queries = make_queries(data)
    store = filled(kind, tmp_path, data, "cosine")
    store.set_properties(fingerprint="abc123", model="tiny")
    store.commit()
    before = store.search(queries, K)
    before_filtered = store.search(queries, K, where=FILTERS[2])
    store.close()
    again = FaissStore(tmp_path / kind)  # dim, index and metric come from the directory
    assert (again.index, again.metric) == (store.index, "cosine")
    assert again.dim == DIM and len(again) == 2000
    assert again.properties == {"fingerprint": "abc123", "model": "tiny"}
    assert_same_hits(before, again.search(queries, K), atol=0)
    assert_same_hits(before_filtered, again.search(queries, K, where=FILTERS[2]), atol=0)
    again.close()


def test_faiss_uncommitted_changes_are_discarded_on_close(tmp_path, caplog):
    data = make_data("random", 300)
    store = open_store("faiss", tmp_path)
    store.add(ids_of(100), data[:100])
    store.set_properties(step="1")
    store.commit()
    store.add(ids_of(300)[100:], data[100:])
    store.set_properties(step="2")
    with caplog.at_level(logging.WARNING):
        store.close()
    assert "uncommitted" in caplog.text
    with FaissStore(tmp_path / "faiss") as again:
        assert len(again) == 100 and again.properties == {"step": "1"}
        again.add(ids_of(300)[100:], data[100:])  # the with block commits on a clean exit
    with FaissStore(tmp_path / "faiss") as again:
        assert len(again) == 300


# ----------------------------------------------------------------------------- upsert and delete


@pytest.mark.parametrize("kind", ["faiss-ivf", "faiss-hnsw"])  # exact stores: test_store_contract.py
def test_upsert_replaces_and_delete_removes(kind, tmp_path):
    data = make_data("clustered", 1600)
    queries = make_queries(data)
    reference = filled("memory", tmp_path, data)
    store = filled(kind, tmp_path, data)
    rng = np.random.default_rng(5)
    new_vectors = unit_rows(rng.standard_normal((60, DIM)))
    upsert_ids = ids_of(50, "d") + ids_of(10, "new")  # 50 replace stored rows, 10 are new
    texts = [f"updated {i}" for i in upsert_ids]
    meta = [{"source": "updated.txt", "year": 2024} for _ in upsert_ids]
    for s in (reference, store):
        s.add(upsert_ids, new_vectors, texts, meta)
    assert len(store) == 1610 == len(reference)
    hits = store.search(new_vectors[:5], 1)
    assert [row[0].id for row in hits] == upsert_ids[:5]
    assert hits[0][0].text == "updated d0" and hits[0][0].metadata == {"source": "updated.txt", "year": 2024}
    assert recall(reference.search(queries, K), store.search(queries, K)) >= 0.95

    gone = [*ids_of(200)[100:140], "new3", "never-stored"]
    for s in (reference, store):
        s.delete(gone)
    assert len(store) == 1610 - 41 == len(reference)
    assert store.contains(gone) == set()
    assert store.get(["d100", "d99"])[0] is None and store.get(["d99"])[0].id == "d99"
    got = store.search(np.concatenate([queries, data[100:140]]), K)
    assert not {h.id for row in got for h in row} & set(gone)
    assert recall(reference.search(queries, K), store.search(queries, K)) >= 0.95
    assert sorted(store.ids()) == sorted(reference.ids())


# ----------------------------------------------------------------------------- filters


@pytest.mark.slow
def test_ivf_filters_agree_with_reference(tmp_path):
    """Filtered search through faiss's IDSelector on an approximate index (exact stores: test_store_contract.py)."""
    data = make_data("clustered", 2000)
    queries = make_queries(data, 10)
    reference = filled("memory", tmp_path, data)
    store = filled("faiss-ivf", tmp_path, data, exact_filter_limit=0)
    for where in FILTERS:
        expected_ids = {f"d{i}" for i in range(2000) if matches(make_metadata(i), where)}
        assert set(reference.ids(where)) == expected_ids
        assert set(store.ids(where)) == expected_ids, where
        expected = reference.search(queries, K, where=where)
        got = store.search(queries, K, where=where)
        assert recall(expected, got) >= 0.95
        assert all(h.id in expected_ids for row in got for h in row)


# ----------------------------------------------------------------------------- corrupt or mismatched directories


def test_faiss_creation_cut_short_is_created_again(tmp_path):
    """A run killed while the store database was being created leaves its temporary file and journal."""
    path = tmp_path / "faiss"
    path.mkdir()
    (path / "store.sqlite.new").write_bytes(b"half a database")
    (path / "store.sqlite.new-journal").write_bytes(b"\xd9\xd5\x05\xf9\x20\xa1\x63\xd7" + b"\0" * 504)
    store = FaissStore(path, dim=DIM)
    store.add(ids_of(10), make_data("random", 10))
    store.commit()
    assert len(FaissStore(path)) == 10 and not any(p.name.startswith("store.sqlite.new") for p in path.iterdir())


def test_faiss_refuses_corrupt_or_mismatched_directories(tmp_path):
    store = filled("faiss", tmp_path, make_data("random", 100))
    store.commit()
    store.close()
    path = tmp_path / "faiss"
    with pytest.raises(StoreFormatError, match="dim=32; got dim=16"):
        FaissStore(path, dim=16)
    with pytest.raises(StoreFormatError, match="index=Flat; got index=HNSW32"):
        FaissStore(path, index="HNSW32")
    with pytest.raises(StoreFormatError, match="metric=ip; got metric=l2"):
        FaissStore(path, metric="l2")
    with pytest.raises(ValueError, match="needs dim"):
        FaissStore(tmp_path / "new")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("hello")
    with pytest.raises(StoreFormatError, match="not a FaissStore"):
        FaissStore(tmp_path / "junk", dim=4)
    (path / "store.sqlite").write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreFormatError, match=r"store\.sqlite"):
        FaissStore(path)


def test_faiss_rebuilds_an_index_that_disagrees_with_sqlite(tmp_path, caplog):
    data = make_data("clustered", 600)
    queries = make_queries(data)
    store = open_store("faiss-hnsw", tmp_path)
    store.add(ids_of(300), data[:300])
    store.commit()
    stale = (tmp_path / "faiss-hnsw" / "index.faiss").read_bytes()
    store.add(ids_of(600)[300:], data[300:])
    store.commit()
    expected = store.search(queries, K)
    store.close()
    (tmp_path / "faiss-hnsw" / "index.faiss").write_bytes(stale)  # an index from an older checkpoint
    with caplog.at_level(logging.WARNING):
        again = FaissStore(tmp_path / "faiss-hnsw")
    assert "rebuilding" in caplog.text
    assert len(again) == 600 and again._index.ntotal == 600
    reference = MemoryStore(DIM)
    reference.add(ids_of(600), data)
    assert recall(reference.search(queries, K), again.search(queries, K)) >= 0.95
    assert recall(expected, again.search(queries, K)) >= 0.95
    (tmp_path / "faiss-hnsw" / "index.faiss").write_bytes(b"garbage")
    assert len(FaissStore(tmp_path / "faiss-hnsw").search(queries, K)[0]) == K


def test_lance_refuses_corrupt_or_mismatched_directories(tmp_path):
    import lancedb
    import pyarrow as pa

    store = filled("lance", tmp_path, make_data("random", 100))
    store.close()
    with pytest.raises(StoreFormatError, match="dim=32; got dim=16"):
        LanceDBStore(tmp_path / "lance", dim=16)
    with pytest.raises(StoreFormatError, match="metric=ip; got metric=cosine"):
        LanceDBStore(tmp_path / "lance", metric="cosine")
    with pytest.raises(ValueError, match="needs dim"):
        LanceDBStore(tmp_path / "lance", table="other")
    lancedb.connect(tmp_path / "lance").create_table("foreign", data=pa.table({"x": [1, 2]}))
    with pytest.raises(StoreFormatError, match="not written by LanceDBStore"):
        LanceDBStore(tmp_path / "lance", table="foreign")
    faiss_dir = tmp_path / "faiss"
    filled("faiss", tmp_path, make_data("random", 10)).commit()
    with pytest.raises(StoreFormatError, match="not a LanceDB directory"):
        LanceDBStore(faiss_dir, dim=DIM)


# ----------------------------------------------------------------------------- crashes


def run_child(code, *args):
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


FAISS_CHILD = """
    import os, sys
    import numpy as np
    from isotrope.connectors.faiss_store import FaissStore
    path, mode, data = sys.argv[1], sys.argv[2], np.load(sys.argv[3])
    store = FaissStore(path, dim=data.shape[1], index="HNSW32")
    store.add([f"d{i}" for i in range(100)], data[:100])
    store.set_properties(step="1")
    store.commit()
    store.add([f"d{i}" for i in range(100, 200)], data[100:200])
    store.set_properties(step="2")
    if mode == "before-commit":
        os._exit(9)
    os.replace = lambda *args, **kwargs: os._exit(9)  # die between the SQLite commit and the index rename
    store.commit()
"""


@pytest.mark.parametrize("mode", ["before-commit", "between-writes"])
def test_faiss_survives_a_kill_during_commit(mode, tmp_path):
    data = make_data("clustered", 200)
    np.save(tmp_path / "data.npy", data)
    result = run_child(FAISS_CHILD, tmp_path / "store", mode, tmp_path / "data.npy")
    assert result.returncode == 9, result.stderr
    store = FaissStore(tmp_path / "store")
    n = 100 if mode == "before-commit" else 200
    assert len(store) == n == store._index.ntotal
    assert store.properties == {"step": "1" if n == 100 else "2"}
    reference = MemoryStore(DIM)
    reference.add(ids_of(n), data[:n])
    queries = make_queries(data[:n], 20)
    assert recall(reference.search(queries, K), store.search(queries, K)) >= 0.95


LANCE_CHILD = """
    import sys
    import numpy as np
    from isotrope.connectors.lancedb_store import LanceDBStore
    store = LanceDBStore(sys.argv[1], dim=16, index="flat")
    rng = np.random.default_rng(0)
    for batch in range(10_000):
        store.add([f"{batch}-{i}" for i in range(500)], rng.standard_normal((500, 16)))
        print(batch, flush=True)
"""


@pytest.mark.slow
def test_lance_survives_a_kill_mid_add(tmp_path):
    path = tmp_path / "lance"
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(LANCE_CHILD), str(path)], stdout=subprocess.PIPE, text=True)
    try:
        for line in child.stdout:
            if int(line) >= 2:
                break
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=60)
    store = LanceDBStore(path)
    n = len(store)
    assert n >= 1500 and n % 500 == 0
    assert set(store.ids()) == {f"{b}-{i}" for b in range(n // 500) for i in range(500)}
    assert len(store.search(np.ones((1, 16)), 5)[0]) == 5


# ----------------------------------------------------------------------------- LanceDB extras


def test_lance_raw_vectors_roundtrip_and_update_vectors(tmp_path):
    rng = np.random.default_rng(4)
    raw = rng.standard_normal((300, 12)).astype(np.float32)
    shaped = unit_rows(rng.standard_normal((300, 8)))
    store = LanceDBStore(tmp_path / "lance", dim=8, raw_dim=12, index="flat")
    assert store.stores_raw_vectors and not LanceDBStore(tmp_path / "plain", dim=8).stores_raw_vectors
    store.add(ids_of(150), shaped[:150], raw_vectors=raw[:150])
    store.add(ids_of(300)[150:], shaped[150:], raw_vectors=raw[150:])
    seen = {}
    for ids, vectors in store.iter_raw(batch_size=64):
        assert len(ids) <= 64 and vectors.dtype == np.float32 and vectors.shape == (len(ids), 12)
        seen.update(zip(ids, vectors))
    assert len(seen) == 300
    np.testing.assert_array_equal(np.stack([seen[i] for i in ids_of(300)]), raw)

    refit = unit_rows(rng.standard_normal((300, 8)))
    store.update_vectors(ids_of(300), refit)
    np.testing.assert_array_equal(store.vectors(ids_of(300)), refit)
    hits = store.search(refit[:3], 1)
    assert [row[0].id for row in hits] == ids_of(3)
    np.testing.assert_allclose([row[0].score for row in hits], 1.0, atol=1e-5)
    np.testing.assert_array_equal(np.concatenate([v for _, v in store.iter_raw()]), raw)  # raw untouched
    with pytest.raises(KeyError, match="'ghost'"):
        store.update_vectors(["ghost"], refit[:1])
    store.add(["bare"], refit[:1])
    with pytest.raises(ValueError, match="'bare' has no stored raw_vector"):
        list(store.iter_raw())


def test_lance_builds_the_ann_index_at_the_threshold(tmp_path):
    data = make_data("clustered", 1200)
    store = LanceDBStore(tmp_path / "lance", dim=DIM, threshold=1000, index="ivf_pq")
    store.add(ids_of(900), data[:900])
    assert store.vector_index is None
    store.add(ids_of(1200)[900:], data[900:])
    assert store.vector_index == "IvfPq"
    with pytest.raises(ValueError, match="does not match the store metric"):
        from lancedb.index import IvfPq

        store.create_index(IvfPq(distance_type="l2"))


def test_lance_rows_written_after_the_ann_index_is_built_are_added_to_it(tmp_path):
    data = make_data("clustered", 1500)
    store = LanceDBStore(tmp_path / "lance", dim=DIM, threshold=1000, index="ivf_pq")
    store.add(ids_of(1200), data[:1200])
    store.add(ids_of(1500)[1200:], data[1200:])
    store.commit()
    name = next(name for name, _, columns in store._indices() if "vector" in columns)
    stats = store.index_stats(name)
    assert (stats["num_indexed_rows"], stats["num_unindexed_rows"]) == (1500, 0)
    assert store.vector_index == "IvfPq" and len(store) == 1500
    more = make_data("clustered", 600, seed=9)
    for start in range(0, 600, 100):  # one delta segment per commit, merged into one from the fourth on
        store.add(ids_of(2100)[1500 + start : 1600 + start], more[start : start + 100])
        store.commit()
        stats = store.index_stats(name)
        assert stats["num_unindexed_rows"] == 0 and stats["num_indices"] <= 4
    reference = filled("memory", tmp_path, np.vstack([data, more]), "cosine")
    assert recall(reference.search(more[:20], K), store.search(more[:20], K)) >= 0.9


def test_lance_vector_index_follows_index_changes_and_empty_tables_search(tmp_path):
    data = make_data("clustered", 1200)
    store = LanceDBStore(tmp_path / "lance", dim=DIM, index="flat")
    assert store.search(data[:2], K) == [[], []]  # an empty table
    store.add(ids_of(1200), data)
    unindexed = store.version
    assert store.vector_index is None
    store.create_index()
    assert store.vector_index == "IvfPq"
    assert LanceDBStore(tmp_path / "lance").vector_index == "IvfPq"  # what a fresh handle reads
    store.restore(unindexed)
    assert store.vector_index == LanceDBStore(tmp_path / "lance").vector_index


LANCE_WRITER = """
    import sys
    import numpy as np
    from isotrope.connectors.lancedb_store import LanceDBStore
    rng = np.random.default_rng(0)
    data = rng.standard_normal((400, 16)).astype(np.float32)
    store = LanceDBStore(sys.argv[1], dim=16, metric="cosine", index="ivf_pq", threshold=300, raw_dim=4)
    store.add([f"d{i}" for i in range(400)], data, [f"text {i}" for i in range(400)], [{"n": i} for i in range(400)])
    store.add(["d3"], data[:1], ["replaced"])  # an upsert: a merge on id
    store.update_vectors(["d5"], data[6:7])
    store.delete(["d4"])
    store.set_properties(step="1")
    store.commit()
    reopened = LanceDBStore(sys.argv[1])
    assert len(reopened) == 399 and reopened.vector_index == "IvfPq" and reopened.has_lexical_index
    assert reopened.search(data[:2], 3)[0] and reopened.lexical_search(["replaced"], 1)[0][0].id == "d3"
    print(sorted(name for name in sys.modules if name.split(".")[0] == "lancedb"))
"""


def test_lance_store_writes_indexes_and_searches_without_lancedb(tmp_path):
    """Every write, index build and search goes through pylance alone: ``import lancedb`` (its own copy of the
    Lance engine, beside pylance's) never happens."""
    result = run_child(LANCE_WRITER, tmp_path / "lance")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_lancedb_reads_a_table_the_store_wrote(tmp_path):
    """The table stays a LanceDB table: LanceDB lists and opens it, and reads the rows and indexes the store wrote."""
    import lancedb

    data = make_data("clustered", 300)
    store = filled("lance", tmp_path, data, metric="cosine", index="flat")
    store.delete([ids_of(300)[0]])
    store.commit()
    table = lancedb.connect(tmp_path / "lance").open_table("chunks")
    assert table.count_rows() == 299
    assert {i.index_type for i in table.list_indices()} == {"FTS"}
    hits = table.search(data[1], vector_column_name="vector").distance_type("cosine").limit(K).to_arrow()
    assert hits.column("id").to_pylist() == [h.id for h in store.search(data[1:2], K)[0]]


@pytest.mark.parametrize("descending", [True, False], ids=["score", "distance"])
def test_lance_top_rows_ties_by_row_id_whatever_lance_picks_at_its_limit(descending):
    """A stand-in for a Lance top-``limit`` query that returns its rows shuffled and, among those tied at its
    limit, a random pick (what Lance does on several compute threads): the top k is the full sort's, ties by
    row id; a query asked again only while the last row returned ties the k-th."""
    import pyarrow as pa

    from isotrope.connectors.lance_rows import TIE_MARGIN, top_rows

    rng = np.random.default_rng(3)
    n, column = 300, "_score" if descending else "_distance"
    values = rng.integers(0, 12, n).astype(np.float32)  # about 25 rows per value: every cut is tied
    row_ids = rng.permutation(10_000)[:n]
    key = -values if descending else values
    asked: list[int] = []

    def search(limit: int) -> pa.Table:
        asked.append(limit)
        ranked = sorted(range(n), key=lambda r: key[r])
        picked = ranked
        if limit < n:
            boundary = key[ranked[limit - 1]]
            better = [r for r in ranked if key[r] < boundary]
            tied = [r for r in ranked if key[r] == boundary]
            picked = better + list(rng.choice(tied, limit - len(better), replace=False))
        picked = rng.permutation(picked)
        return pa.table({column: values[picked], "_rowid": pa.array(row_ids[picked], pa.uint64())})

    full = sorted(range(n), key=lambda r: (key[r], row_ids[r]))
    for k in (1, 10, 37, 120, n, n + 50):
        asked.clear()
        got = top_rows(search, k, column, descending)
        assert got.column("_rowid").to_pylist() == [int(row_ids[r]) for r in full[:k]], k
        expected = [k + TIE_MARGIN + k // 10]
        while expected[-1] < n and key[full[k - 1]] == key[full[expected[-1] - 1]]:
            expected.append(2 * expected[-1])
        assert asked == expected
    values = rng.permutation(n).astype(np.float32)  # no ties: one query
    key = -values if descending else values
    asked.clear()
    got = top_rows(search, 10, column, descending)
    assert got.column(column).to_pylist() == sorted(values.tolist(), reverse=descending)[:10] and len(asked) == 1


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs and affinity"
)
@pytest.mark.parametrize(("cores", "given", "expected"), [(2, None, "2"), (1, None, None), (2, "1", "1")])
def test_lance_computes_on_two_threads_where_it_would_on_one(cores, given, expected):
    """On two or three cores Lance keeps one compute thread; the store asks two unless the user set it."""
    code = textwrap.dedent(f"""
        import os
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:{cores}])
        import isotrope.connectors.lance_rows
        print(os.environ.get("LANCE_CPU_THREADS"))
    """)
    env = {k: v for k, v in os.environ.items() if k != "LANCE_CPU_THREADS"} | ({"LANCE_CPU_THREADS": given} if given else {})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.split()
    assert out[-1] == str(expected)


def test_lance_tied_rows_rank_in_the_order_they_were_written(tmp_path):
    """Rows tied on BM25 or on distance rank in write order (Lance row id; ids shuffled, so not by id), in
    keyword search and in a filtered vector search read through Lance's scanner, call after call."""
    rng = np.random.default_rng(5)
    kinds = rng.permutation([0, 1] * 30)
    vectors = make_data("clustered", 2)[kinds]
    ids = [f"r{i:03d}" for i in rng.permutation(60)]
    texts = ["apple pie recipe" if kind == 0 else "banana bread recipe" for kind in kinds]
    store = LanceDBStore(tmp_path / "lance", dim=DIM, metric="cosine")
    store.add(ids, vectors, texts, [{"n": i} for i in range(60)])
    store.commit()
    apples = [i for i, kind in zip(ids, kinds) if kind == 0]
    for _ in range(5):
        assert [h.id for h in store.lexical_search(["apple"], 7)[0]] == apples[:7]
        assert [h.id for h in store.lexical_search(["recipe"], 7)[0]] == ids[:7]  # every row tied
        assert [h.id for h in store.search(vectors[kinds == 0][:1], 7, where={"n": {"$gte": 0}})[0]] == apples[:7]
