"""The store contract (isotrope.stores.base.VectorStore): the same cases on the memory, FAISS and LanceDB
stores, each against an exact reference computed here — dense search against float64 brute force in NumPy
(as faiss's own tests check an index against exact search), filters against Python predicates over the
metadata, lexical search against BM25 recomputed from the shared analyzer, hybrid search against the fusion
of the store's own dense and lexical lists, group-by against the best hit per source."""

from __future__ import annotations

import numpy as np
import pytest

from isotrope.errors import IsotropeError, StoreCapabilityError
from isotrope.fusion import DEFAULT_ALPHA, DEFAULT_CANDIDATES, reciprocal_rank_fusion, search_store
from isotrope.lexical import analyze, bm25_scores, query_terms
from isotrope.stores.base import Hit, ReshapableStore, VectorStore
from isotrope.stores.filters import check_fields, matches, parse_where
from isotrope.stores.memory import MemoryStore
from test_hybrid import QUERIES, assert_lexical_exact, make_texts
from test_stores import assert_same_hits, ids_of, make_metadata, unit_rows

pytest.importorskip("faiss")
pytest.importorskip("lancedb")
import itertools

from isotrope.connectors.faiss_store import FaissStore
from isotrope.connectors.lancedb_store import LanceDBStore

KINDS = ["memory", "faiss", "lance"]
DIM = 16
RAW_DIM = 24
N = 150
K = 10


@pytest.fixture(params=KINDS)
def kind(request):
    return request.param


def open_store(kind, tmp_path, dim=DIM, metric="ip", raw_dim=None):
    """An empty store of ``kind`` searching exactly (a flat FAISS index, a LanceDB table without ANN index)."""
    if kind == "memory":
        return MemoryStore(dim, metric)
    if kind == "faiss":
        return FaissStore(tmp_path / "faiss", dim, index="flat", metric=metric)
    return LanceDBStore(tmp_path / "lance", dim=dim, metric=metric, raw_dim=raw_dim, index="flat")


def open_existing(kind, tmp_path):
    """The store written under ``tmp_path``, opened from its files alone (dim and metric read back)."""
    if kind == "memory":
        return MemoryStore.load(tmp_path / "memory")
    return FaissStore(tmp_path / "faiss") if kind == "faiss" else LanceDBStore(tmp_path / "lance", index="flat")


def reopen(kind, store, tmp_path):
    """Commit, close and open the store again from its files (the memory store: save and load)."""
    store.commit()
    if kind == "memory":
        store.save(tmp_path / "memory")
    store.close()
    return open_existing(kind, tmp_path)


# ----------------------------------------------------------------------------- data and references


def make_vectors(n, seed=0, ties=False):
    """Gaussian vectors of varied norms (ip, cosine and l2 rank differently); ``ties``: the last 20 rows
    repeat the first 20, so exact score ties occur."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, DIM)) * rng.uniform(0.5, 2.0, (n, 1))).astype(np.float32)
    if ties:
        x[-20:] = x[:20]
    return x


class Corpus:
    """What the test wrote, kept in Python: id -> (vector, text, metadata)."""

    def __init__(self, n=N, seed=0, ties=False):
        self.ids = ids_of(n)
        self.vectors = make_vectors(n, seed, ties)
        self.texts = make_texts(n, seed)
        self.metadata = [make_metadata(i) for i in range(n)]

    def write(self, store):
        half = len(self.ids) // 2  # two batches
        for part in (slice(0, half), slice(half, None)):
            store.add(self.ids[part], self.vectors[part], self.texts[part], self.metadata[part])
        store.commit()
        return store

    def contents(self):
        return {i: (t, m) for i, t, m in zip(self.ids, self.texts, self.metadata)}

    def rows(self):
        return {i: (v, t, m) for i, v, t, m in zip(self.ids, self.vectors, self.texts, self.metadata)}


def brute_force(rows, queries, metric, k, keep=lambda metadata: True):
    """Exact top-k hits in float64: ``rows`` is id -> (vector, text, metadata); higher score is closer."""
    ids = [i for i, (_, _, m) in rows.items() if keep(m)]
    x = np.array([rows[i][0] for i in ids], dtype=np.float64).reshape(len(ids), DIM)
    q = np.asarray(queries, dtype=np.float64)
    if metric == "cosine":
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
    scores = -((q[:, None, :] - x[None, :, :]) ** 2).sum(-1) if metric == "l2" else q @ x.T
    out = []
    for row in scores:
        order = np.argsort(-row, kind="stable")[:k]
        out.append([Hit(ids[j], float(row[j]), rows[ids[j]][1], rows[ids[j]][2]) for j in order])
    return out


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


#: every operator of isotrope.stores.filters, each with a Python predicate written independently of it
FILTER_CASES = [
    ({"source": "doc3.txt"}, lambda m: m.get("source") == "doc3.txt"),
    ({"lang": {"$eq": "fr"}}, lambda m: m.get("lang") == "fr"),
    ({"draft": True}, lambda m: m.get("draft") is True),
    ({"year": 2000}, lambda m: is_number(m.get("year")) and m["year"] == 2000),  # not the string "2000"
    ({"score": {"$ne": 1.5}}, lambda m: not (is_number(m.get("score")) and m["score"] == 1.5)),  # missing matches
    ({"year": {"$gt": 2010}}, lambda m: is_number(m.get("year")) and m["year"] > 2010),
    ({"year": {"$gte": 2010}}, lambda m: is_number(m.get("year")) and m["year"] >= 2010),
    ({"score": {"$lt": 2}}, lambda m: is_number(m.get("score")) and m["score"] < 2),
    ({"score": {"$lte": 2.5}}, lambda m: is_number(m.get("score")) and m["score"] <= 2.5),
    ({"year": {"$gt": "2000"}}, lambda m: isinstance(m.get("year"), str) and m["year"] > "2000"),  # strings only
    ({"lang": {"$in": ["en", "fr"]}}, lambda m: m.get("lang") in ("en", "fr")),
    ({"lang": {"$nin": ["en"]}}, lambda m: m.get("lang") != "en"),  # null and missing match
    ({"year": {"$gte": 2000, "$lt": 2010}}, lambda m: is_number(m.get("year")) and 2000 <= m["year"] < 2010),
    ({"lang": {"$in": ["en", "de"]}, "draft": False}, lambda m: m.get("lang") in ("en", "de") and m.get("draft") is False),
    (
        {"$and": [{"source": {"$ne": "doc0.txt"}}, {"draft": False}]},
        lambda m: m.get("source") != "doc0.txt" and m.get("draft") is False,
    ),
    (
        {"$or": [{"source": "doc1.txt"}, {"score": {"$lt": 2}}]},
        lambda m: m.get("source") == "doc1.txt" or (is_number(m.get("score")) and m["score"] < 2),
    ),
    (
        parse_where("year >= 2000 and (lang = 'fr' or draft = true)"),
        lambda m: is_number(m.get("year")) and m["year"] >= 2000 and (m.get("lang") == "fr" or m.get("draft") is True),
    ),
    ({"source": "nope.txt"}, lambda m: False),
]


def lexical_reference(kind, contents, query, k, keep=lambda metadata: True):
    """(id, BM25) of the rows sharing a term with ``query``, best first (ties by id), computed from the shared
    analyzer with the IDF of the store's engine; statistics over all stored rows, as in the engines."""
    ids = list(contents)
    scores = bm25_scores([analyze(contents[i][0]) for i in ids], query_terms(query))
    found = [(i, float(s)) for i, s in zip(ids, scores) if s > 0 and keep(contents[i][1])]
    return sorted(found, key=lambda pair: (-pair[1], pair[0]))[:k]


# ----------------------------------------------------------------------------- dense search


@pytest.mark.parametrize("metric", ["ip", "cosine", "l2"])
@pytest.mark.parametrize("ties", [False, True], ids=["random", "ties"])
def test_dense_search_is_exact_brute_force(kind, metric, ties, tmp_path):
    corpus = Corpus(ties=ties)
    store = open_store(kind, tmp_path, metric=metric)
    assert isinstance(store, VectorStore) and store.metric == metric and store.dim == DIM
    assert store.search(make_vectors(2, seed=9), K) == [[], []]  # an empty store
    corpus.write(store)
    queries = make_vectors(8, seed=1)
    got = store.search(queries, K)
    expected = brute_force(corpus.rows(), queries, metric, K)
    assert_same_hits(expected, got)  # same scores; same ids except the order inside groups of tied scores
    if not ties:
        assert [[h.id for h in row] for row in got] == [[h.id for h in row] for row in expected]
    by_id = corpus.contents()
    assert all((h.text, h.metadata) == by_id[h.id] for row in got for h in row)
    assert all(a.score >= b.score for row in got for a, b in itertools.pairwise(row))
    # k larger than the count: every row, best first
    everything = store.search(queries[:2], N + 25)
    assert [len(row) for row in everything] == [N, N]
    assert_same_hits(brute_force(corpus.rows(), queries[:2], metric, N), everything)
    # a single query row is accepted
    assert_same_hits(expected[:1], store.search(queries[0], K))


def test_filters_agree_with_python_predicates(kind, tmp_path):
    corpus = Corpus()
    store = corpus.write(open_store(kind, tmp_path, metric="cosine"))
    contents = corpus.contents()
    queries = make_vectors(4, seed=2)
    texts = ["quick fox", "proteins in cells", "river banks", "x42 3d"]
    split = 0
    for where, keep in FILTER_CASES:
        expected_ids = {i for i, (_, m) in contents.items() if keep(m)}
        assert expected_ids == {i for i, (_, m) in contents.items() if matches(m, where)}, where  # the reference agrees
        split += 0 < len(expected_ids) < N
        assert set(store.ids(where)) == expected_ids, where
        assert_same_hits(brute_force(corpus.rows(), queries, "cosine", K, keep), store.search(queries, K, where=where))
        for text, hits in zip(texts, store.lexical_search(texts, K, where=where)):
            expected = lexical_reference(kind, contents, text, K, keep)
            np.testing.assert_allclose([h.score for h in hits], [s for _, s in expected], rtol=1e-5, atol=1e-9)
            assert all(h.id in expected_ids for h in hits), where
    assert split == len(FILTER_CASES) - 1  # every filter but the last splits the rows


def test_unknown_filter_field_is_a_one_line_error(kind, tmp_path):
    store = Corpus().write(open_store(kind, tmp_path))
    fields = {key for i in range(N) for key in make_metadata(i)}
    assert store.metadata_fields() == fields
    check_fields({"$or": [{"year": 1}, {"lang": {"$ne": "en"}}]}, store.metadata_fields())
    with pytest.raises(ValueError) as caught:
        check_fields({"$or": [{"yaer": 1}, {"lang": "en"}]}, store.metadata_fields())
    assert str(caught.value) == f"unknown filter field 'yaer'; the stored metadata fields are: {', '.join(sorted(fields))}"


# ----------------------------------------------------------------------------- writing, reading, reopening


def test_upsert_replaces_and_delete_removes_everywhere(kind, tmp_path):
    corpus = Corpus()
    store = corpus.write(open_store(kind, tmp_path))
    rows = corpus.rows()
    replaced, new = ids_of(30)[::3], ["new0", "new1"]
    vectors = make_vectors(len(replaced) + 2, seed=7)
    texts = [f"zygomorphic orchid number{j}" for j in range(len(replaced) + 2)]
    metadata = [{"source": "updated.txt", "year": 2024}] * (len(replaced) + 2)
    store.add(replaced + new, vectors, texts, metadata)
    rows.update({i: (v, t, m) for i, v, t, m in zip(replaced + new, vectors, texts, metadata)})
    store.commit()  # the lexical index is exact at each commit
    assert len(store) == N + 2
    assert [(h.id, h.text, h.metadata) for h in store.get(replaced[:1])] == [(replaced[0], texts[0], metadata[0])]
    np.testing.assert_allclose(store.vectors(replaced), vectors[: len(replaced)], rtol=1e-6)
    queries = np.concatenate([vectors[:3], make_vectors(3, seed=8)])
    assert_same_hits(brute_force(rows, queries, "ip", K), store.search(queries, K))
    assert [h.id for h in store.lexical_search(["number0"], K)[0]] == [replaced[0]]  # the new text is found
    assert_lexical_exact(kind, store, {i: (t, m) for i, (_, t, m) in rows.items()})  # ... and the old one gone

    gone = [*ids_of(60)[40:50], "new1", "never-stored"]
    store.delete(gone)
    for i in gone[:-1]:
        del rows[i]
    store.commit()
    assert len(store) == len(rows) == N + 2 - 11
    assert store.contains(gone) == set() and store.get(gone) == [None] * len(gone)
    assert sorted(store.ids()) == sorted(rows)
    gone_vectors = corpus.vectors[40:50]
    got = store.search(np.concatenate([queries, gone_vectors]), K)
    assert not {h.id for row in got for h in row} & set(gone)
    assert_same_hits(brute_force(rows, np.concatenate([queries, gone_vectors]), "ip", K), got)
    gone_texts = [corpus.texts[j] for j in range(40, 50) if corpus.texts[j]] + ["number1"]
    assert not {h.id for row in store.lexical_search(gone_texts, N) for h in row} & set(gone)
    assert_lexical_exact(kind, store, {i: (t, m) for i, (_, t, m) in rows.items()})


def test_upsert_delete_and_reopen_keep_the_lexical_index_exact(kind, tmp_path):
    store = open_store(kind, tmp_path)
    corpus = Corpus(n=120)
    corpus.write(store)
    contents = corpus.contents()
    changed = make_texts(30, seed=5)
    ids = [f"d{i}" for i in range(0, 60, 2)]  # upsert 30 stored rows with new texts
    store.add(ids, make_vectors(30, seed=5), changed, [{"source": "new.txt"}] * 30)
    contents.update({i: (t, {"source": "new.txt"}) for i, t in zip(ids, changed)})
    store.add(["n1", "n2"], make_vectors(2, seed=6), ["zygomorphic orchid", "orchid rivers"])
    contents.update({"n1": ("zygomorphic orchid", {}), "n2": ("orchid rivers", {})})
    gone = [f"d{i}" for i in range(1, 40, 3)] + ["n2"]
    store.delete(gone)
    for i in gone:
        del contents[i]
    store.commit()
    assert_lexical_exact(kind, store, contents)
    store = reopen(kind, store, tmp_path)
    assert_lexical_exact(kind, store, contents)
    store.add(["n3"], make_vectors(1, seed=7), ["orchid orchid banks"])  # appended after reopening
    store.commit()
    contents["n3"] = ("orchid orchid banks", {})
    assert_lexical_exact(kind, store, contents)


def test_a_writer_killed_before_its_commit_leaves_the_next_commit_exact(kind, tmp_path):
    if kind == "memory":
        pytest.skip("nothing of a memory store outlives its process")
    store = open_store(kind, tmp_path)
    corpus = Corpus(n=120)
    corpus.write(store)
    contents = corpus.contents()
    store.add(["n1", "n2"], make_vectors(2, seed=6), ["zygomorphic orchid", "quick orchid rivers"])
    store.close()  # as a kill leaves it: no commit (LanceDB keeps the rows, FAISS what it committed)
    again = open_existing(kind, tmp_path)
    if again.contains(["n1", "n2"]):
        contents.update({"n1": ("zygomorphic orchid", {}), "n2": ("quick orchid rivers", {})})
    again.commit()  # the next writer's commit, with nothing of its own to write
    assert_lexical_exact(kind, again, contents, queries=[*QUERIES, "orchid"])
    again.set_properties(note="metadata only")
    again.commit()
    assert_lexical_exact(kind, again, contents, queries=[*QUERIES, "orchid"])


def test_count_and_iteration(kind, tmp_path):
    corpus = Corpus()
    store = open_store(kind, tmp_path)
    assert len(store) == 0 and store.ids() == [] and list(store.iter_vectors()) == []
    corpus.write(store)
    assert len(store) == N
    assert sorted(store.ids()) == sorted(corpus.ids)
    seen = {}
    for ids, vectors in store.iter_vectors(batch_size=32):
        assert len(ids) <= 32 and vectors.shape == (len(ids), DIM) and vectors.dtype == np.float32
        seen.update(zip(ids, vectors))
    assert len(seen) == N
    np.testing.assert_array_equal(np.stack([seen[i] for i in corpus.ids]), corpus.vectors)
    np.testing.assert_array_equal(store.vectors(corpus.ids[::-7]), corpus.vectors[::-7])
    with pytest.raises(KeyError, match="'ghost'"):
        store.vectors(["d1", "ghost"])
    assert store.contains(["d1", "ghost", "d2"]) == {"d1", "d2"}
    hits = store.get(["d5", "ghost"])
    assert hits[1] is None and (hits[0].id, hits[0].text, hits[0].metadata) == ("d5", corpus.texts[5], make_metadata(5))


def test_reopen_keeps_everything(kind, tmp_path):
    corpus = Corpus()
    raw = np.random.default_rng(4).standard_normal((N, RAW_DIM)).astype(np.float32)
    store = open_store(kind, tmp_path, metric="cosine", raw_dim=RAW_DIM)
    if store.stores_raw_vectors:
        store.add(corpus.ids, corpus.vectors, corpus.texts, corpus.metadata, raw_vectors=raw)
    else:
        corpus.write(store)
    store.set_properties(fingerprint="abc123", model="tiny")
    queries, texts = make_vectors(5, seed=3), ["quick fox", "zygomorphic orchid banks", "running dogs"]
    where = {"lang": {"$in": ["en", "fr"]}, "draft": False}
    before = (
        store.search(queries, K),
        store.search(queries, K, where=where),
        store.lexical_search(texts, K),
        store.get(corpus.ids),
        store.metadata_fields(),
        sorted(store.ids()),
    )
    again = reopen(kind, store, tmp_path)
    assert (again.dim, again.metric, len(again)) == (DIM, "cosine", N)
    assert again.properties == {"fingerprint": "abc123", "model": "tiny"} and again.encoder_fingerprint == "abc123"
    after = (
        again.search(queries, K),
        again.search(queries, K, where=where),
        again.lexical_search(texts, K),
        again.get(corpus.ids),
        again.metadata_fields(),
        sorted(again.ids()),
    )
    assert_same_hits(before[0], after[0], atol=0)
    assert_same_hits(before[1], after[1], atol=0)
    assert [[(h.id, h.score) for h in row] for row in before[2]] == [[(h.id, h.score) for h in row] for row in after[2]]
    assert [(h.id, h.text, h.metadata) for h in before[3]] == [(h.id, h.text, h.metadata) for h in after[3]]
    assert before[4:] == after[4:]
    assert again.stores_raw_vectors == store.stores_raw_vectors
    if again.stores_raw_vectors:
        np.testing.assert_array_equal(again.raw_vectors(corpus.ids), raw)


def test_raw_vectors_when_kept(kind, tmp_path):
    corpus = Corpus()
    raw = np.random.default_rng(5).standard_normal((N, RAW_DIM)).astype(np.float32)
    store = open_store(kind, tmp_path, raw_dim=RAW_DIM)
    if not store.stores_raw_vectors:  # declared, not probed: the store says it keeps none, and means it
        corpus.write(store)
        with pytest.raises(StoreCapabilityError, match="keeps no raw vectors"):
            store.raw_vectors(corpus.ids[:2])
        with pytest.raises(IsotropeError):
            list(store.iter_raw())
        return
    assert isinstance(store, ReshapableStore)
    half = N // 2
    store.add(corpus.ids[:half], corpus.vectors[:half], raw_vectors=raw[:half])
    store.add(corpus.ids[half:], corpus.vectors[half:], raw_vectors=raw[half:])
    np.testing.assert_array_equal(store.raw_vectors(corpus.ids[::-3]), raw[::-3])
    seen = {}
    for ids, vectors in store.iter_raw(batch_size=40):
        assert len(ids) <= 40 and vectors.shape == (len(ids), RAW_DIM)
        seen.update(zip(ids, vectors))
    np.testing.assert_array_equal(np.stack([seen[i] for i in corpus.ids]), raw)


def test_properties_and_context_manager(kind, tmp_path):
    store = open_store(kind, tmp_path)
    assert store.properties == {} and store.encoder_fingerprint is None
    store.set_properties(a="1")
    store.set_properties(b="2", a="3")
    assert store.properties == {"a": "3", "b": "2"}
    with pytest.raises(ValueError, match="'c'"):
        store.set_properties(c=4)
    with store:  # commits on a clean exit, then closes
        store.add(["x"], make_vectors(1), ["quick fox"])
    if kind != "memory":  # the memory store is not durable
        with open_existing(kind, tmp_path) as again:
            assert again.ids() == ["x"] and again.properties == {"a": "3", "b": "2"}


def test_bad_input_is_rejected_and_nothing_is_lost(kind, tmp_path):
    store = open_store(kind, tmp_path)
    data = unit_rows(make_vectors(20))
    store.add(ids_of(20), data)
    with pytest.raises(ValueError, match=rf"\(n, {DIM}\)"):
        store.add(["x"], np.zeros((1, DIM - 1)))
    with pytest.raises(ValueError, match="row 1"):
        store.add(["x", "y"], np.stack([data[0], np.full(DIM, np.nan)]))
    with pytest.raises(ValueError, match="'x'"):
        store.add(["x", "x"], data[:2])
    with pytest.raises(ValueError, match="'tags' of id 'x'"):
        store.add(["x"], data[:1], metadata=[{"tags": ["a"]}])
    with pytest.raises(ValueError, match="2 ids but 1 texts"):
        store.add(["x", "y"], data[:2], texts=["a"])
    with pytest.raises(TypeError):
        store.delete("d1")
    with pytest.raises(ValueError, match="k must"):
        store.search(data[:1], 0)
    with pytest.raises(TypeError, match="not a single string"):
        store.lexical_search("quick fox", K)
    assert len(store) == 20
    assert [h.id for h in store.search(data[3], 1)[0]] == ["d3"]


def test_empty_metadata_comes_back_as_distinct_dicts(kind, tmp_path):
    data = make_vectors(20)
    store = open_store(kind, tmp_path)
    store.add(ids_of(20), data, [f"t{i}" for i in range(20)], [None] * 10 + [{"a": i} for i in range(10)])
    hits = store.search(data[:2], 20)
    by_id = {h.id: h for h in hits[0]}
    assert by_id["d3"].metadata == {} and by_id["d13"].metadata == {"a": 3}
    assert by_id["d3"].text == "t3"
    by_id["d3"].metadata["x"] = 1  # each hit owns its dict
    assert {h.id: h.metadata for h in hits[1]}["d3"] == {}
    assert store.get(["d3"])[0].metadata == {}


# ----------------------------------------------------------------------------- lexical and hybrid search

#: a tiny corpus whose BM25 rankings have no near ties, under either engine's IDF
TINY = {
    "t0": "Orchids: the orchid house grows orchids",
    "t1": "An orchid in a river valley",
    "t2": "River banks flood; river crossings close",
    "t3": "The bank raised interest rates",
    "t4": "Zygomorphic flowers, such as the orchid's, have one plane of symmetry",
    "t5": "Café culture and naïve art in Paris",
    "t6": "Protein folding in the cell",
    "t7": "Cells divide; each cell copies its proteins",
    "t8": "Interest in river ecology and river fish",
    "t9": None,
}
TINY_QUERIES = [
    "orchid",
    "river bank",
    "ORCHIDS in rivers",
    "cafe naive",
    "protein cells",
    "interest",
    "zygomorphic",
    "the of and",
    "",
    "unknownword",
    '"cell" AND -protein*',
]


def test_lexical_search_on_a_tiny_corpus_is_exact(kind, tmp_path):
    store = open_store(kind, tmp_path)
    ids = list(TINY)
    store.add(ids, make_vectors(len(ids), seed=3), list(TINY.values()), [{"i": j} for j in range(len(ids))])
    store.commit()
    contents = {i: (text, {"i": j}) for j, (i, text) in enumerate(TINY.items())}
    results = store.lexical_search(TINY_QUERIES, 20)  # k larger than any match count
    for query, hits in zip(TINY_QUERIES, results):
        terms = set(query_terms(query))
        sharing = {i for i, text in TINY.items() if terms & set(analyze(text))}
        assert {h.id for h in hits} == sharing, query  # exactly the rows sharing an analyzed term
        expected = lexical_reference(kind, contents, query, 20)
        gaps = np.diff([s for _, s in expected])
        assert (gaps < -1e-4).all(), (query, expected)  # no near ties
        assert [h.id for h in hits] == [i for i, _ in expected], query
        np.testing.assert_allclose([h.score for h in hits], [s for _, s in expected], rtol=1e-5, atol=1e-9)
        assert all((h.text, h.metadata) == contents[h.id] for h in hits)
    by_query = dict(zip(TINY_QUERIES, results))
    assert by_query["orchid"][0].id == "t0"  # three mentions of the stem in a short text
    assert by_query["the of and"] == [] and by_query[""] == [] and by_query["unknownword"] == []
    assert [h.id for h in store.lexical_search(["orchid"], 1)[0]] == ["t0"]


def test_lexical_search_is_exact_bm25_on_random_texts(kind, tmp_path):
    store = open_store(kind, tmp_path)
    corpus = Corpus(n=120)
    corpus.write(store)
    contents = corpus.contents()
    assert_lexical_exact(kind, store, contents)
    assert_lexical_exact(kind, store, contents, where={"source": {"$in": ["doc1.txt", "doc3.txt"]}})
    assert_lexical_exact(kind, store, contents, where={"year": {"$gte": 2005}, "source": {"$ne": "doc0.txt"}})
    assert len(QUERIES) == len(store.lexical_search(QUERIES, 3))


def reference_hybrid(store, texts, vectors, k, alpha=DEFAULT_ALPHA, candidates=DEFAULT_CANDIDATES, keywords=None, where=None):
    """The convex fusion recomputed in NumPy from the store's *full* rankings (every row's dense score, every
    row's BM25, 0 for no shared term): the union of the dense top ``max(k, candidates)`` and the keyword top
    ``max(k, keywords)`` (None: half of ``candidates``), each side z-scored over it."""
    depth = max(k, candidates)
    keyword_depth = max(k, candidates // 2 if keywords is None else keywords)
    out = []
    for d, t in zip(store.search(vectors, len(store), where=where), store.lexical_search(texts, len(store), where=where)):
        dense, lexical = {h.id: h.score for h in d}, {h.id: h.score for h in t}
        union = list(dict.fromkeys([h.id for h in d[:depth]] + [h.id for h in t[:keyword_depth]]))
        if not union:
            out.append([])
            continue
        sides = [np.array([scores.get(i, 0.0) for i in union], dtype=np.float64) for scores in (dense, lexical)]
        z = [(s - s.mean()) / s.std() if s.std() > 0 else np.zeros_like(s) for s in sides]
        fused = alpha * z[0] + (1 - alpha) * z[1]
        order = np.argsort(-fused, kind="stable")[:k]
        out.append([(union[j], fused[j]) for j in order])
    return out


@pytest.mark.parametrize("where", [None, {"draft": False}], ids=["all", "filtered"])
def test_hybrid_search_is_the_fusion_of_the_stores_exact_scores(kind, where, tmp_path):
    store = Corpus().write(open_store(kind, tmp_path, metric="cosine"))
    texts = ["quick fox", "proteins in cells", "the and", "zygomorphic orchid banks"]
    vectors = make_vectors(len(texts), seed=9)
    assert store.lexical_search(texts, K, where=where)[2] == []  # stop words only: all lexical scores 0
    depths = ((K, None), (DEFAULT_CANDIDATES, None), (2 * K, 3), (3, 2 * K))  # keywords below K are raised to K
    for alpha, (candidates, keywords) in itertools.product((None, 0.0, 0.3, 1.0), depths):
        # K candidates a side: most of the union misses one side's list, so its score there is completed
        options = {"alpha": alpha, "candidates": candidates, "keyword_candidates": keywords}
        fused = search_store(store, texts, vectors, K, where=where, mode="hybrid", **options)
        weight = DEFAULT_ALPHA if alpha is None else alpha
        expected = reference_hybrid(store, texts, vectors, K, weight, candidates, keywords, where)
        assert_same_hits([[Hit(i, s, None) for i, s in row] for row in expected], fused)  # tie-aware
        assert all(matches(h.metadata, where) and h.text is not None for row in fused for h in row)
    dense = store.search(vectors, DEFAULT_CANDIDATES, where=where)
    lexical = store.lexical_search(texts, DEFAULT_CANDIDATES // 2, where=where)
    rrf = search_store(store, texts, vectors, K, where=where, mode="hybrid", fusion="rrf")
    assert [[h.id for h in row] for row in rrf] == [
        [h.id for h in reciprocal_rank_fusion([d, t], K)] for d, t in zip(dense, lexical)
    ]
    assert search_store(store, texts, vectors, K, where=where, mode="dense") == store.search(vectors, K, where=where)
    assert search_store(store, texts, None, K, where=where, mode="lexical") == store.lexical_search(texts, K, where=where)
    with pytest.raises(ValueError, match="alpha must be a number in"):
        search_store(store, texts, vectors, K, mode="hybrid", alpha=1.5)
    with pytest.raises(ValueError, match="unknown search mode 'sparse'"):
        search_store(store, texts, vectors, K, mode="sparse")


def test_hybrid_search_sees_rows_added_since_the_last_commit(kind, tmp_path):
    """(FAISS reads through a second, read-only connection when nothing is pending: not before a commit.)"""
    store = Corpus().write(open_store(kind, tmp_path, metric="cosine"))
    vector, query = make_vectors(1, seed=21), make_vectors(1, seed=22)
    store.add(["fresh"], vector, ["zygomorphic orchid banks"], [{"source": "new.txt"}])
    assert "fresh" not in {h.id for h in store.search(query, K)[0]}  # only the full-text side finds it
    hits = search_store(store, ["zygomorphic orchid"], query, K, mode="hybrid", candidates=K)[0]
    found = {h.id: (h.text, h.metadata) for h in hits}
    assert found["fresh"] == ("zygomorphic orchid banks", {"source": "new.txt"})
    store.commit()
    assert "fresh" in {h.id for h in search_store(store, ["zygomorphic orchid"], query, K, mode="hybrid", candidates=K)[0]}


def test_lexical_scores_are_the_lexical_search_scores_of_any_rows(kind, tmp_path):
    store = Corpus().write(open_store(kind, tmp_path))
    texts = ["quick fox", "proteins in cells", "the and"]
    rows = [store.ids()[::3], store.ids()[1:40], store.ids()[:5]]
    for text, wanted, scores in zip(texts, rows, store.lexical_scores(texts, rows)):
        full = {h.id: h.score for h in store.lexical_search([text], len(store))[0]}
        np.testing.assert_allclose(scores, [full.get(i, 0.0) for i in wanted], rtol=1e-6, atol=1e-9)


def test_hits_without_text_and_lookups_of_the_hits_a_search_returned(kind, tmp_path):
    """``with_text=False`` gives the same ids and scores with ``""`` and ``{}``; ``get``, ``vectors`` and
    ``lexical_scores`` of the ids a search returned (LanceDB: taken by the row ids that search read) agree
    with the written rows and with the same lookups in a freshly opened store; a write makes them read again."""
    corpus = Corpus()
    store = corpus.write(open_store(kind, tmp_path))
    queries, texts = make_vectors(3, seed=5), ["quick fox", "proteins in cells", "river banks"]
    for search, asked in ((store.search, queries), (store.lexical_search, texts)):
        full, bare = search(asked, K), search(asked, K, with_text=False)
        assert [[(h.id, h.score) for h in row] for row in bare] == [[(h.id, h.score) for h in row] for row in full]
        assert all(h.text == "" and h.metadata == {} for row in bare for h in row)
    ids = list(dict.fromkeys(h.id for row in store.search(queries, 40, with_text=False) for h in row))
    if kind == "lance":
        assert store._remembered(ids) is not None  # the lookups below take rows by row id
    rows = corpus.rows()
    got = store.get([*ids, "missing", ids[0]])
    assert [(h.id, h.text, h.metadata) for h in got[:-2]] == [(i, rows[i][1], rows[i][2]) for i in ids]
    assert got[-2] is None and got[-1].id == ids[0]
    np.testing.assert_array_equal(store.vectors(ids), np.stack([rows[i][0] for i in ids]))
    remembered = store.lexical_scores(texts, [ids] * 3)
    fresh = reopen(kind, store, tmp_path)
    for a, b in zip(remembered, fresh.lexical_scores(texts, [ids] * 3)):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    fresh.search(queries, 40, with_text=False)
    fresh.add([ids[0]], corpus.vectors[:1] * 2, ["an upserted text"], [{"source": "new"}])
    fresh.commit()
    assert (fresh.get([ids[0]])[0].text, fresh.get([ids[0]])[0].metadata) == ("an upserted text", {"source": "new"})
    np.testing.assert_array_equal(fresh.vectors([ids[0]]), corpus.vectors[:1] * 2)


@pytest.mark.parametrize("mode", ["dense", "lexical", "hybrid"])
def test_group_by_source_keeps_the_best_hit_of_each_source(kind, mode, tmp_path):
    corpus = Corpus()
    store = corpus.write(open_store(kind, tmp_path))
    texts, vectors = ["quick fox running dogs", "river banks"], make_vectors(2, seed=11)
    if mode == "dense":
        ranked = store.search(vectors, N)
    elif mode == "lexical":
        ranked = store.lexical_search(texts, N)
    else:  # the hybrid ranking over the default candidate lists
        ranked = [
            [Hit(i, s, None, store.get([i])[0].metadata) for i, s in row] for row in reference_hybrid(store, texts, vectors, N)
        ]
    grouped = search_store(store, texts, vectors, 4, mode=mode, group_by="source")
    for row, full in zip(grouped, ranked):
        best: dict[str, float] = {}
        for hit in full:  # the best score of each source, in the store's own full ranking
            best.setdefault(hit.metadata["source"], hit.score)
        expected = sorted(best.values(), reverse=True)[:4]
        sources = [h.metadata["source"] for h in row]
        assert len(sources) == len(set(sources)) == len(expected)
        np.testing.assert_allclose([h.score for h in row], expected, rtol=1e-9)
        assert [h.score for h in row] == pytest.approx([best[source] for source in sources], rel=1e-9)
