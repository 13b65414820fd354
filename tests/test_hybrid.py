"""Lexical and hybrid search beyond the store contract (tests/test_store_contract.py runs lexical and hybrid
search in every store against exact references, with the helpers defined here): the analyzer, BM25 and fusion
recomputed by hand and in NumPy; the lexical index built for stores written before it and committed atomically
with the rows; and the collection, CLI, LlamaIndex and evaluation interfaces."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from benchmarks.scale import TwoPass
from isotrope.fusion import best_per_group, convex_fusion, reciprocal_rank_fusion, search_store
from isotrope.lexical import analyze, bm25_scores, query_terms
from isotrope.stores.base import Hit
from isotrope.stores.filters import check_fields, matches
from isotrope.stores.memory import MemoryStore
from test_stores import assert_same_hits, make_data, run_child

pytest.importorskip("faiss")
pytest.importorskip("lancedb")
from isotrope.connectors.faiss_store import FaissStore
from isotrope.connectors.lancedb_store import LanceDBStore

DIM = 8
K = 7
WORDS = [
    "run",
    "runs",
    "running",
    "runner",
    "jumps",
    "jumping",
    "jumped",
    "quick",
    "fox",
    "foxes",
    "dog",
    "dogs",
    "lazy",
    "café",
    "cafe",
    "naïve",
    "river",
    "rivers",
    "bank",
    "banks",
    "orchid",
    "zygomorphic",
    "the",
    "a",
    "and",
    "of",
    "to",
    "is",
    "not",
    "in",
    "protein",
    "proteins",
    "cell",
    "cells",
    "x42",
    "3d",
]
QUERIES = [
    "quick fox",
    "running dogs",
    "cafe naive",
    '"fox" AND -dog*',
    "protein NEAR(cell)",
    "the and of",
    "zygomorphic orchid banks",
    "x42 3D",
    "RUNNERS jumped!",
    "",
    "fox OR",
    "^rivers: col:bank",
]


def make_texts(n, seed=0):
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, len(WORDS) + 1)
    order = rng.permutation(len(WORDS))
    probabilities = weights[order] / weights.sum()
    texts = []
    for i in range(n):
        words = rng.choice(WORDS, size=int(rng.integers(1, 15)), p=probabilities)
        texts.append(" ".join(words) + (".", "!", " - yes", "")[i % 4])
    texts[3] = None  # a row without text is never a lexical hit
    return texts


def make_metadata(i):
    return {"source": f"doc{i % 5}.txt", "year": 2000 + i % 9}


def open_store(kind, tmp_path):
    if kind == "memory":
        return MemoryStore(DIM, metric="cosine")
    if kind == "faiss":
        return FaissStore(tmp_path / "faiss", dim=DIM, metric="cosine")
    return LanceDBStore(tmp_path / "lance", dim=DIM, metric="cosine")


def assert_lexical_exact(kind, store, contents, where=None, queries=QUERIES):
    """Each query's hits are the reference BM25 top k among matching rows: scores, ids (tie-aware), count."""
    ids = list(contents)
    documents = [analyze(contents[i][0]) for i in ids]
    found = store.lexical_search(queries, K, where=where)
    assert len(found) == len(queries)
    for query, hits in zip(queries, found):
        scores = bm25_scores(documents, query_terms(query))
        allowed = [j for j, i in enumerate(ids) if scores[j] > 0 and matches(contents[i][1], where)]
        expected = sorted((scores[j] for j in allowed), reverse=True)[:K]
        assert len(hits) == len(expected), query
        np.testing.assert_allclose([h.score for h in hits], expected, rtol=1e-5, atol=1e-9, err_msg=query)
        by_id = dict(zip(ids, scores))
        np.testing.assert_allclose([h.score for h in hits], [by_id[h.id] for h in hits], rtol=1e-5, atol=1e-9)
        assert all(h.text == contents[h.id][0] and h.metadata == contents[h.id][1] for h in hits)


def fill(store, n=120, seed=0):
    texts = make_texts(n, seed)
    ids = [f"d{i}" for i in range(n)]
    metadata = [make_metadata(i) for i in range(n)]
    store.add(ids, make_data("random", n, DIM, seed), texts, metadata)
    store.commit()
    return {i: (t, m) for i, t, m in zip(ids, texts, metadata)}


# ----------------------------------------------------------------------------- the analyzer and fusion math


def test_analyzer_stems_folds_and_drops_stop_words():
    assert analyze("The Runners were RUNNING to the Café!") == ["runner", "were", "run", "cafe"]
    assert analyze("naïve x42 snake_case " + "y" * 41) == ["naiv", "x42", "snake", "case"]
    assert query_terms("fox foxes FOX the") == ["fox"]


def test_bm25_reference_by_hand():
    documents = [["a", "b"], ["a", "a", "c"], ["d"]]
    average = 2.0
    idf_a = np.log1p((3 - 2 + 0.5) / (2 + 0.5))
    tf_norm = 2 * 2.2 / (2 + 1.2 * (0.25 + 0.75 * 3 / average))
    assert bm25_scores(documents, ["a"])[1] == pytest.approx(idf_a * tf_norm)
    assert bm25_scores(documents, ["zzz"]).tolist() == [0, 0, 0]


def hits_of(ids, scores):
    return [Hit(i, float(s), None, {}) for i, s in zip(ids, scores)]


def test_convex_fusion_matches_numpy():
    rng = np.random.default_rng(0)
    candidates = hits_of([f"x{i}" for i in range(40)], np.zeros(40))
    for alpha in (0.0, 0.3, 0.5, 1.0):
        dense, lexical = rng.normal(size=40), np.where(rng.random(40) < 0.3, 0.0, rng.exponential(size=40))
        fused = convex_fusion(candidates, dense, lexical, k=10, alpha=alpha)
        reference = alpha * (dense - dense.mean()) / dense.std() + (1 - alpha) * (lexical - lexical.mean()) / lexical.std()
        order = np.argsort(-reference, kind="stable")[:10]
        assert [h.id for h in fused] == [f"x{j}" for j in order]
        np.testing.assert_allclose([h.score for h in fused], reference[order])
    flat = convex_fusion(hits_of("ab", [0, 0]), np.array([3.0, 1.0]), np.zeros(2), k=5, alpha=0.5)  # a flat side adds 0
    assert [(h.id, h.score) for h in flat] == [("a", 0.5), ("b", -0.5)]


def test_reciprocal_rank_fusion_formula():
    fused = reciprocal_rank_fusion([hits_of("abc", [0, 0, 0]), hits_of("cd", [0, 0])], k=3, rrf_k=60)
    expected = {"a": 1 / 61, "b": 1 / 62, "c": 1 / 63 + 1 / 61, "d": 1 / 62}
    assert [h.id for h in fused] == ["c", "a", "b"]  # b and d tie: b came first
    assert [h.score for h in fused] == pytest.approx([expected["c"], expected["a"], expected["b"]])


def test_best_per_group_keeps_the_first_hit_of_each_value():
    hits = [Hit(f"h{i}", 1.0 - i / 10, None, {"source": s}) for i, s in enumerate("aabcab")] + [Hit("x", 0, None, {})]
    assert [h.id for h in best_per_group(hits, "source", 10)] == ["h0", "h2", "h3", "x"]
    assert [h.id for h in best_per_group(hits, "source", 2)] == ["h0", "h2"]


def test_unknown_filter_fields_are_named_with_the_known_ones():
    check_fields({"source": "a", "$or": [{"year": 1}, {"source": "b"}]}, {"source", "year"})
    with pytest.raises(ValueError, match=r"^unknown filter field 'yaer'; the stored metadata fields are: source, year$"):
        check_fields({"$or": [{"yaer": 1}, {"source": "b"}]}, {"source", "year"})


# ----------------------------------------------------------------------------- building and committing the lexical index


def test_faiss_store_without_a_current_keyword_index_builds_it_on_first_use(tmp_path, caplog):
    store = open_store("faiss", tmp_path)
    contents = fill(store)
    store.close()
    (tmp_path / "faiss" / "keyword.npz").unlink()  # a store written before, with the FTS5 index of then
    store = FaissStore(tmp_path / "faiss")
    assert not store.has_lexical_index
    assert_lexical_exact("faiss", store, contents)
    assert store.has_lexical_index and "building it from the 120 stored texts" in caplog.text
    store.close()
    assert FaissStore(tmp_path / "faiss").has_lexical_index  # written


@pytest.mark.parametrize("uncommitted", [False, True])
@pytest.mark.parametrize(("cores", "faiss_threads"), [(1, 64), (2, 1), (2, 64)])
def test_faiss_hybrid_is_the_same_beside_and_after_the_dense_side(cores, faiss_threads, uncommitted, tmp_path, monkeypatch):
    """Beside the dense side (two cores or more), the keyword side reads its rows' vectors through the reader
    connection in its own thread (inside an open write, which only the writer sees, after the dense side in this
    one); on one core it runs after the dense side."""
    import faiss

    from isotrope.connectors import faiss_index

    monkeypatch.setattr(faiss_index, "usable_cores", lambda: cores)
    store = open_store("faiss", tmp_path)
    contents = fill(store)
    if uncommitted:
        extra = {"u0": ("quick quokkas jump", {}), "u1": ("lazy quokkas sleep over the dog", {})}
        store.add(list(extra), make_data("random", 2, DIM, 9), [t for t, _ in extra.values()], [{}, {}])
        contents.update(extra)
    queries = make_data("random", len(QUERIES), DIM, 5)
    sides = []
    real = store._keyword_candidates
    monkeypatch.setattr(store, "_keyword_candidates", lambda *args, beside: sides.append(beside) or real(*args, beside=beside))
    before = faiss.omp_get_max_threads()
    try:
        faiss.omp_set_num_threads(faiss_threads)
        found = search_store(store, QUERIES, queries, K)
        alone = [search_store(store, [text], queries[i : i + 1], K)[0] for i, text in enumerate(QUERIES)]
        assert faiss.omp_get_max_threads() == faiss_threads
    finally:
        faiss.omp_set_num_threads(before)
    assert sides == [cores > 1] * (1 + len(QUERIES))
    reference = search_store(TwoPass(store), QUERIES, queries, K)  # the generic path, by id
    for ranked in (found, alone):
        assert [[h.id for h in hits] for hits in ranked] == [[h.id for h in hits] for hits in reference]
        for hits, expected in zip(ranked, reference):
            np.testing.assert_allclose([h.score for h in hits], [h.score for h in expected], rtol=1e-9)
        assert all(h.text == contents[h.id][0] for hits in ranked for h in hits)


@pytest.mark.parametrize(("cores", "faiss_threads", "dense_threads"), [(4, 64, 3), (4, 2, 2), (2, 8, 1), (1, 8, 8)])
def test_faiss_hybrid_leaves_the_keyword_side_a_core(cores, faiss_threads, dense_threads, tmp_path, monkeypatch):
    """A hybrid query's dense side searches on at most one faiss thread fewer than the cores (a one-core machine
    keeps its setting), in the calling thread, and faiss's setting is back after the query."""
    import faiss

    from isotrope.connectors import faiss_index

    monkeypatch.setattr(faiss_index, "usable_cores", lambda: cores)
    store = open_store("faiss", tmp_path)
    fill(store)
    queries = make_data("random", 1, DIM, 5)
    seen = []
    real = store._dense_keys

    def dense_keys(*args):
        seen.append((faiss.omp_get_max_threads(), threading.get_ident()))
        return real(*args)

    monkeypatch.setattr(store, "_dense_keys", dense_keys)
    before = faiss.omp_get_max_threads()
    try:
        faiss.omp_set_num_threads(faiss_threads)
        search_store(store, QUERIES[:1], queries, K)
        assert seen == [(dense_threads, threading.get_ident())]
        assert faiss.omp_get_max_threads() == faiss_threads
    finally:
        faiss.omp_set_num_threads(before)


def test_faiss_hybrid_beside_the_dense_side_raises_what_the_dense_side_raised(tmp_path, monkeypatch):
    """A dense side that fails while the keyword side runs beside it: its error reaches the caller once the
    keyword side has finished, faiss's thread count is back, and the next search works."""
    import faiss

    from isotrope.connectors import faiss_index

    store = open_store("faiss", tmp_path)
    fill(store)
    queries = make_data("random", 1, DIM, 5)
    monkeypatch.setattr(faiss_index, "usable_cores", lambda: 2)
    real = store._dense_keys
    monkeypatch.setattr(store, "_dense_keys", lambda *args: (_ for _ in ()).throw(RuntimeError("faiss broke")))
    threads = faiss.omp_get_max_threads()
    with pytest.raises(RuntimeError, match="faiss broke"):
        search_store(store, QUERIES[:1], queries, K)
    assert faiss.omp_get_max_threads() == threads
    monkeypatch.setattr(store, "_dense_keys", real)
    assert len(search_store(store, QUERIES[:1], queries, K)[0]) == K


def test_faiss_store_reopens_its_keyword_index_after_commits_that_add_terms(tmp_path, caplog):
    store = open_store("faiss", tmp_path)
    contents = fill(store)
    extra = {"n0": ("quokkas nest beside zyzzyvas", {}), "n1": ("zyzzyvas never nest", {})}  # terms no row had
    store.add(list(extra), make_data("random", 2, DIM, 1), [t for t, _ in extra.values()], [m for _, m in extra.values()])
    store.commit()
    store.close()
    contents.update(extra)
    store = FaissStore(tmp_path / "faiss")
    assert_lexical_exact("faiss", store, contents, queries=[*QUERIES, "nesting zyzzyva"])
    assert "building it" not in caplog.text and "cannot be read" not in caplog.text  # read as saved
    store.close()


def test_lance_table_written_before_the_lexical_index_builds_it_on_first_use(tmp_path, caplog):
    store = open_store("lance", tmp_path)
    contents = fill(store)
    dataset = store._writable()
    for name, _, _ in store._indices():
        dataset.drop_index(name)
    dataset.drop_columns(["terms"])
    store = LanceDBStore(tmp_path / "lance")
    assert not store.has_lexical_index
    assert_lexical_exact("lance", store, contents)
    assert store.has_lexical_index and "has no lexical terms" in caplog.text


FAISS_FTS_CHILD = """
    import os, sys
    import numpy as np
    from isotrope.connectors.faiss_store import FaissStore
    path, mode = sys.argv[1], sys.argv[2]
    store = FaissStore(path, dim=4)
    rng = np.random.default_rng(0)
    store.add(["a", "b"], rng.standard_normal((2, 4)), ["quick fox", "lazy dog"])
    store.commit()
    store.add(["c"], rng.standard_normal((1, 4)), ["zygomorphic orchid"])
    store.delete(["a"])
    if mode == "before-commit":
        os._exit(9)
    os.replace = lambda *args, **kwargs: os._exit(9)  # die after the SQLite commit, before the index rename
    store.commit()
"""


@pytest.mark.parametrize("mode", ["before-commit", "after-sqlite-commit"])
def test_faiss_lexical_index_commits_with_the_rows(mode, tmp_path):
    result = run_child(FAISS_FTS_CHILD, tmp_path / "store", mode)
    assert result.returncode == 9, result.stderr
    store = FaissStore(tmp_path / "store")
    expected = {"a", "b"} if mode == "before-commit" else {"b", "c"}
    assert set(store.ids()) == expected
    assert {h.id for h in store.lexical_search(["quick fox lazy dog zygomorphic orchid"], 10)[0]} == expected


def test_faiss_failed_add_rolls_back_the_lexical_rows(tmp_path, monkeypatch):
    store = FaissStore(tmp_path / "store", dim=4)
    store.add(["a"], np.ones((1, 4)), ["quick fox"])
    store.commit()

    def fail(*args, **kwargs):
        raise RuntimeError("simulated failure inside add")

    monkeypatch.setattr(FaissStore, "_needs_training", property(fail), raising=False)
    with pytest.raises(RuntimeError, match="simulated"):
        store.add(["b"], np.ones((1, 4)), ["lazy fox"])
    monkeypatch.undo()
    store.commit()
    assert store.ids() == ["a"]
    assert [h.id for h in store.lexical_search(["fox"], 5)[0]] == ["a"]


#: LanceDB's full-text query picks among rows tied at its limit, and orders tied rows, differently from one call
#: to the next (so does its two-pass search): its lists are compared where they hold every matching row
SETTINGS = {
    "faiss": [("convex", None, 200), ("convex", 0.2, K), ("convex", 1.0, 3), ("rrf", None, K)],
    "lance": [("convex", None, 200), ("convex", 0.2, 200), ("convex", 1.0, 200)],
}


@pytest.mark.parametrize("kind", ["faiss", "lance"])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("committed", [False, True])
def test_hybrid_candidates_by_row_key_equal_the_two_pass_search(kind, seed, committed, tmp_path, monkeypatch):
    """The stores' one-pass hybrid (FAISS: keyword top and the dense candidates' BM25 from one scoring of the
    postings; both: rows named by their own keys, text read for the fused top only) returns the generic
    two-pass path's hits with filters, pending (or committed) upserts and deletes, a batch of queries, both
    fusions and shallow lists: FAISS (ties by key) to the bit, LanceDB up to the order of tied rows. LanceDB,
    committed, scores its dense candidates' BM25 from the statistics beside the table: the same hits and
    scores (to 1e-6) as its full-text query restricted to them, which it asks while writes are pending."""
    store = open_store(kind, tmp_path)
    assert hasattr(store, "hybrid_candidates")
    fill(store, n=150, seed=seed)
    store.add(["d5", "new"], make_data("random", 2, DIM, seed + 7), ["zygomorphic orchid banks", "quick fox x42"], [{}, {}])
    store.delete(["d8", "d9"])  # FAISS: pending in its open transaction; LanceDB: committed
    if committed:
        store.commit()
    if kind == "lance":
        assert (store._term_stats(store._dataset()) is not None) == committed
    vectors = make_data("random", len(QUERIES), DIM, seed + 3)
    for where in (None, {"source": {"$in": ["doc1.txt", "doc3.txt"]}}, {"year": {"$gte": 2100}}):
        for fusion, alpha, candidates in SETTINGS[kind]:
            options = {"where": where, "fusion": fusion, "alpha": alpha, "candidates": candidates}
            one_pass = search_store(store, QUERIES, vectors, K, **options)
            two_pass = search_store(TwoPass(store), QUERIES, vectors, K, **options)
            if kind == "faiss":
                assert one_pass == two_pass, (where, fusion, alpha, candidates)
            else:
                assert_same_hits(two_pass, one_pass)
                for row in one_pass:  # each hit with its own row's text and metadata
                    assert [(h.text, h.metadata) for h in row] == [(g.text, g.metadata) for g in store.get([h.id for h in row])]
                with monkeypatch.context() as patch:  # the BM25 of the dense candidates asked of Lance
                    patch.setattr(LanceDBStore, "_term_stats", lambda self, dataset: None)
                    asked = search_store(store, QUERIES, vectors, K, **options)
                assert [[h.id for h in row] for row in one_pass] == [[h.id for h in row] for row in asked]
                np.testing.assert_allclose(
                    [h.score for row in one_pass for h in row], [h.score for row in asked for h in row], atol=1e-6
                )
            assert any(one_pass) == ("year" not in (where or {}))  # the last filter keeps no row
    with pytest.raises(ValueError, match="got 12 query texts but 2 query vectors"):
        search_store(store, QUERIES, vectors[:2], K)


@pytest.mark.parametrize("path", ["own", "generic"])
def test_a_failed_dense_side_waits_for_the_keyword_side(path, tmp_path, monkeypatch):
    """Hybrid search runs LanceDB's keyword side in a second thread: when the dense side raises, the error
    reaches the caller only once that thread is done, so no query of the failed search runs beside the
    caller's next call (the store's own candidates, and the generic path over its public methods)."""
    store = LanceDBStore(tmp_path / "lance", dim=DIM, metric="cosine")
    store.add(["a", "b"], make_data("random", 2, DIM, 1), ["quick fox", "lazy dog"], [{}] * 2)
    store.commit()
    done = threading.Event()
    keyword, dense = ("_keyword_top", "_dense_top") if path == "own" else ("lexical_search", "search")
    found = getattr(store, keyword)

    def slow_keyword_side(*args, **kwargs):
        time.sleep(0.3)
        result = found(*args, **kwargs)
        done.set()
        return result

    def failing_dense_side(*args, **kwargs):
        raise RuntimeError("simulated dense failure")

    monkeypatch.setattr(store, keyword, slow_keyword_side)
    monkeypatch.setattr(store, dense, failing_dense_side)
    with pytest.raises(RuntimeError, match="simulated dense failure"):
        search_store(store if path == "own" else TwoPass(store), ["quick fox"], make_data("random", 1, DIM, 2), K)
    assert done.is_set()


@pytest.mark.parametrize(
    ("index", "metric"),
    [("ivf_pq", "cosine"), ("hnsw_sq", "ip"), ("hnsw_sq", "cosine")],
)
def test_lance_hybrid_candidates_over_an_ann_index(index, metric, tmp_path):
    """Over an ANN index, LanceDB's hybrid candidates: the dense list is the index's own top (IVF_HNSW_SQ with
    the ip metric keeps its 8-bit scores, within their quantization of the exact ones; otherwise refined to
    the exact scores), each keyword-only row's vector is its stored one, every dense row's BM25 is the exact
    BM25 (from the keyword list where listed, else from its terms), and the fused top k is the exact fusion's."""
    from lancedb.index import HnswSq, IvfPq

    n, dim, distance = 2000, 32, "dot" if metric == "ip" else metric
    store = LanceDBStore(tmp_path / "lance", dim=dim, metric=metric, index=index, refine=10, nprobe=16, ef=400)
    contents = dict(zip((f"d{i}" for i in range(n)), make_texts(n, seed=5)))
    data = make_data("clustered", n, dim)
    store.add(list(contents), data, list(contents.values()), [{}] * n)
    config = (
        HnswSq(distance_type=distance, num_partitions=1)
        if index == "hnsw_sq"
        else IvfPq(distance_type=distance, num_partitions=8, num_sub_vectors=8)
    )
    store.create_index(config)
    store.commit()
    assert store.vector_index == ("IvfHnswSq" if index == "hnsw_sq" else "IvfPq")
    texts, queries = ["quick fox", "proteins in cells", "zygomorphic orchid banks"], make_data("random", 3, dim, seed=9)
    found = store.hybrid_candidates(texts, queries, 200, 100, None, True)
    dataset = store._dataset()
    row_ids = dict(zip(*(c.to_pylist() for c in dataset.to_table(columns=["id"], with_row_id=True).columns[::-1])))
    documents = {i: analyze(text or "") for i, text in contents.items()}
    exact = queries.astype(np.float64) @ data.astype(np.float64).T
    position = {i: j for j, i in enumerate(contents)}
    assert len(set().union(*(set(listed).difference(dense) for (dense, _), (listed, _) in zip(found.dense, found.lexical))))
    for q, (text, (dense, dense_scores), bm25, (listed, _)) in enumerate(
        zip(texts, found.dense, found.dense_bm25, found.lexical)
    ):
        rows = [position[row_ids[r]] for r in dense]
        np.testing.assert_allclose(bm25, bm25_scores(list(documents.values()), query_terms(text))[rows], rtol=1e-5, atol=1e-9)
        truth = exact[q, rows]
        np.testing.assert_allclose(dense_scores, truth, atol=2e-2 if (index, metric) == ("hnsw_sq", "ip") else 1e-5)
        for r in set(listed).difference(dense):
            np.testing.assert_array_equal(found.vectors.take([r])[0], data[position[row_ids[r]]])
    fused = search_store(store, texts, queries, K, candidates=200)
    exact_store = MemoryStore(dim, metric=metric)
    exact_store.add(list(contents), data, list(contents.values()), [{}] * n)
    expected = search_store(exact_store, texts, queries, K, candidates=200)
    assert np.mean([len({h.id for h in a} & {h.id for h in b}) / K for a, b in zip(fused, expected)]) >= 0.9


# ----------------------------------------------------------------------------- collection, CLI, LlamaIndex, eval


@pytest.fixture
def collection_uri(tmp_path, tiny_bert_path):
    from isotrope.encoder import ShapedEncoder
    from isotrope.search import Collection

    encoder = ShapedEncoder.create(tiny_bert_path, shape="center", device="cpu")
    texts = [t or "empty" for t in make_texts(60, seed=2)]
    encoder.fit(texts)
    uri = f"faiss:{tmp_path / 'coll'}"
    with Collection.create(uri, encoder) as collection:
        vectors = encoder.encode(texts)
        collection.store.add([f"c{i}" for i in range(60)], vectors, texts, [{"source": f"s{i % 6}"} for i in range(60)])
        collection.store.commit()
    return uri


def test_collection_modes_group_by_and_unknown_fields(collection_uri):
    from isotrope.search import Collection

    with Collection.open(collection_uri) as collection:
        lexical = collection.search("quick foxes", k=5, mode="lexical")
        assert lexical == collection.store.lexical_search(["quick foxes"], 5)[0]
        hybrid = collection.search(["quick foxes"], k=5, mode="hybrid", alpha=0.3, where="source != 's1'")[0]
        assert hybrid and all(h.metadata["source"] != "s1" for h in hybrid)
        for mode in ("dense", "lexical", "hybrid"):
            grouped = collection.search("quick foxes running", k=4, mode=mode, group_by="source")
            ungrouped = collection.search("quick foxes running", k=60, mode=mode)
            assert [h.id for h in grouped] == [h.id for h in best_per_group(ungrouped, "source", 4)]
            assert len({h.metadata["source"] for h in grouped}) == len(grouped) == 4
            with pytest.raises(ValueError, match="unknown filter field 'sorce'; the stored metadata fields are: source"):
                collection.search("fox", mode=mode, where={"sorce": {"$ne": "x"}})
            with pytest.raises(ValueError, match=r"^unknown group_by field 'sorce'; the stored metadata fields are: source$"):
                collection.search("fox", mode=mode, group_by="sorce")  # a typo would otherwise group nothing
        with pytest.raises(ValueError, match="mode 'dense' takes none"):
            collection.search("fox", mode="dense", alpha=0.5)
        assert collection.search("fox", alpha=0.5) == collection.search("fox", mode="hybrid", alpha=0.5)  # a weight: hybrid


def test_cli_search_modes(collection_uri, monkeypatch, capsys):
    from test_cli import run_cli

    code, out, err = run_cli(
        monkeypatch, capsys, "search", collection_uri, 'quick "fox" AND -dog*', "--mode", "lexical", "--json", "-k", 3
    )
    assert code == 0, err
    assert len(json.loads(out)) == 3
    code, out, err = run_cli(
        monkeypatch,
        capsys,
        "search",
        collection_uri,
        "quick fox",
        "--mode",
        "hybrid",
        "--alpha",
        0.7,
        "--group-by",
        "source",
        "--json",
    )
    assert code == 0, err
    sources = [hit["metadata"]["source"] for hit in json.loads(out)]
    assert len(sources) == len(set(sources)) == 6
    code, out, err = run_cli(monkeypatch, capsys, "search", collection_uri, "fox", "--mode", "lexical", "--where", "lang = 'en'")
    assert code == 1 and err.splitlines() == ["error: unknown filter field 'lang'; the stored metadata fields are: source"]
    code, out, err = run_cli(monkeypatch, capsys, "search", collection_uri, "fox", "--group-by", "sourc")
    assert code == 1 and err.splitlines() == ["error: unknown group_by field 'sourc'; the stored metadata fields are: source"]


@pytest.mark.parametrize("kind", ["faiss", "lancedb"])
def test_llama_index_query_modes(kind, tmp_path, tiny_bert_path):
    pytest.importorskip("llama_index.core")
    from llama_index.core.schema import MetadataMode, TextNode
    from llama_index.core.vector_stores.types import VectorStoreQuery, VectorStoreQueryMode

    from isotrope.connectors.llama_index import IsotropeEmbedding, IsotropeVectorStore
    from isotrope.encoder import ShapedEncoder

    texts = [t or "empty" for t in make_texts(40, seed=4)]
    encoder = ShapedEncoder.create(tiny_bert_path, shape="center", device="cpu").fit(texts)
    embedding = IsotropeEmbedding.from_encoder(encoder, tmp_path / "encoder")
    store = IsotropeVectorStore(f"{kind}:{tmp_path / 'store'}", embed_model=embedding)
    nodes = [TextNode(text=text, metadata={"source": f"s{i % 4}"}) for i, text in enumerate(texts)]
    embedded = [node.get_content(metadata_mode=MetadataMode.EMBED) for node in nodes]
    for node, vector in zip(nodes, embedding.get_text_embedding_batch(embedded)):
        node.embedding = vector
    store.add(nodes)
    collection = store.collection
    text = store.query(VectorStoreQuery(query_str="quick fox", similarity_top_k=4, mode=VectorStoreQueryMode.TEXT_SEARCH))
    assert text.ids == [h.id for h in collection.search("quick fox", k=4, mode="lexical")]
    hybrid = store.query(
        VectorStoreQuery(query_str="quick fox", similarity_top_k=4, mode=VectorStoreQueryMode.HYBRID, alpha=0.25)
    )
    assert hybrid.ids == [h.id for h in collection.search("quick fox", k=4, mode="hybrid", alpha=0.25)]
    dense = store.query(VectorStoreQuery(query_str="quick fox", similarity_top_k=4))
    assert dense.ids == [h.id for h in collection.search("quick fox", k=4, mode="dense")]  # never calibrated
    # DEFAULT follows the store's calibrated default search; an embedding alone stays dense
    collection.store.set_properties(default_search=json.dumps({"mode": "hybrid", "alpha": 0.6}))
    default = store.query(VectorStoreQuery(query_str="quick fox", similarity_top_k=4))
    assert default.ids == [h.id for h in collection.search("quick fox", k=4, mode="hybrid", alpha=0.6)]
    vector = collection.encoder.encode(["quick fox"], kind="query")[0].tolist()
    only_vector = store.query(VectorStoreQuery(query_embedding=vector, similarity_top_k=4))
    assert only_vector.ids == [h.id for h in collection.search("quick fox", k=4, mode="dense")]
    with pytest.raises(ValueError, match="needs query_str"):
        store.query(VectorStoreQuery(query_embedding=[0.0] * collection.store.dim, mode=VectorStoreQueryMode.HYBRID))
    with pytest.raises(ValueError, match="supports the query modes"):
        store.query(VectorStoreQuery(query_str="a", mode=VectorStoreQueryMode.MMR))


def test_eval_retrieval_through_the_stores(tiny_glove_path, tmp_path):
    from isotrope.config import EncoderConfig
    from isotrope.evaluate.commands import evaluate
    from isotrope.evaluate.harness import Evaluator

    documents = ["the cat sat on the mat", "the dog runs fast", "a house on the river", "mat , river , fast"]
    queries = ["cats sitting", "running dog", "houses", "zzz unknown"]
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": f"d{i}", "title": "", "text": text}) + "\n" for i, text in enumerate(documents))
    )
    (beir / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": f"q{i}", "text": text}) + "\n" for i, text in enumerate(queries))
    )
    (beir / "qrels" / "test.tsv").write_text("".join(f"q{i}\td{i}\t1\n" for i in range(4)))
    result = evaluate(
        "retrieval",
        EncoderConfig(model=tiny_glove_path, shape="center"),
        Evaluator(),
        beir=beir,
        fit_corpus="corpus",
        modes=["dense", "lexical", "hybrid"],
        stores=["faiss", "lancedb"],
    )
    for kind in ("faiss", "lancedb"):
        # q0..q2 find their document by a shared stem, first; q3 shares no term: reciprocal rank 0
        assert result["scores"][kind]["lexical"]["mrr@10"] == 75.0
        assert result["scores"][kind]["lexical"]["hit@1"] == 75.0  # three of four first
        assert set(result["scores"][kind]) == {"dense", "lexical", "hybrid"}
    assert result["scores"]["faiss"]["dense"] == result["scores"]["lancedb"]["dense"]
