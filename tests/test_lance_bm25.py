"""The LanceDB store's BM25 statistics beside its table (connectors/lance_bm25.py): counted as the reference
counts them, kept exact through appends, upserts, deletes and compaction, used only while they describe the
table's rows, and scoring any rows as Lance's own full-text query scores them (and as the float64 reference)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from isotrope.lexical import analyze, bm25_scores, index_text, query_terms
from test_hybrid import QUERIES, make_texts
from test_stores import make_data

pytest.importorskip("lancedb")
from isotrope.connectors import lance_bm25
from isotrope.connectors.lance_bm25 import TermStats
from isotrope.connectors.lance_lexical import TERMS
from isotrope.connectors.lance_rows import fragment_rows
from isotrope.connectors.lancedb_store import LanceDBStore

DIM = 8


def reference_counts(texts):
    """Rows with terms, total terms and each term's document frequency, counted in plain Python."""
    documents = [analyze(t) for t in texts]
    df = Counter(term for d in documents for term in set(d))
    return sum(1 for d in documents if d), sum(len(d) for d in documents), df


def assert_counts(stats, texts):
    num_docs, total, df = reference_counts(texts)
    assert (stats.num_docs, stats.total_tokens) == (num_docs, total)
    assert dict(zip(stats.terms.tolist(), stats.df.tolist())) == dict(df)
    assert list(stats.terms) == sorted(df)


def test_counts_and_scores_match_the_reference():
    texts = make_texts(200, seed=4)
    stats = TermStats.count([pa.array([index_text(t) for t in texts[:90]]), pa.array([index_text(t) for t in texts[90:]])], [])
    assert_counts(stats, texts)
    documents = [analyze(t) for t in texts]
    rows = pa.array([index_text(t) for t in texts])
    for query in [*QUERIES, "orchid orchid unseenword"]:
        terms = query_terms(query)
        np.testing.assert_allclose(stats.scores(terms, rows), bm25_scores(documents, terms), rtol=1e-6, atol=1e-9, err_msg=query)
    added = TermStats.count([pa.array([index_text(t) for t in texts[:50]])], []).plus([rows.slice(50)], [(0, 0)])
    assert_counts(added, texts)
    assert added.fragments == ((0, 0),)
    empty = TermStats.count([], [])
    assert (empty.num_docs, len(empty.terms)) == (0, 0)
    assert not empty.scores(["fox"], rows).any()


def committed_store(tmp_path, n=150, seed=0):
    store = LanceDBStore(tmp_path / "lance", dim=DIM, metric="cosine", index="flat")
    texts = make_texts(n, seed)
    store.add([f"d{i}" for i in range(n)], make_data("random", n, DIM, seed), texts, [{"i": i} for i in range(n)])
    store.commit()
    return store, dict(zip([f"d{i}" for i in range(n)], texts))


def saved(store):
    return lance_bm25.read(store._stats_uri(), None)


def same(a, b):
    """Two statistics hold the same counts of the same rows."""
    return (a.num_docs, a.total_tokens, a.terms.tolist(), a.df.tolist(), a.fragments) == (
        b.num_docs,
        b.total_tokens,
        b.terms.tolist(),
        b.df.tolist(),
        b.fragments,
    )


def assert_scores_are_lances(store, stats):
    """Each query's BM25 of every row from the statistics equals Lance's own full-text query's (float32)."""
    dataset = store._dataset()
    table = dataset.to_table(columns=[TERMS], with_row_id=True)
    rows = table.column("_rowid").to_pylist()
    lance = store._bm25_of_rows(dataset, QUERIES, [rows] * len(QUERIES))
    for query, expected in zip(QUERIES, lance):
        np.testing.assert_allclose(stats.scores(query_terms(query), table.column(TERMS)), expected, rtol=1e-6, atol=1e-7)


def test_statistics_follow_appends_upserts_deletes_and_compaction(tmp_path, monkeypatch):
    store, contents = committed_store(tmp_path)
    stats = store._term_stats(store._dataset())
    assert stats is not None and same(stats, saved(store))
    assert_counts(stats, list(contents.values()))
    assert_scores_are_lances(store, stats)
    counted = []
    monkeypatch.setattr(TermStats, "count", classmethod(lambda cls, *a: counted.append(1) or TermStats._from_parts([], [])))
    more = make_texts(40, seed=9)
    store.add([f"n{i}" for i in range(40)], make_data("random", 40, DIM, 9), more, [{}] * 40, new_ids=True)
    contents.update(zip([f"n{i}" for i in range(40)], more))
    assert store._term_stats(store._dataset()) is None  # written, not committed: the full-text index lags
    store.commit()
    assert not counted  # appended rows: the saved statistics plus the new fragments
    monkeypatch.undo()
    stats = store._term_stats(store._dataset())
    assert stats is not None and stats.fragments == tuple(fragment_rows(store._dataset()))
    assert_counts(stats, list(contents.values()))
    assert_scores_are_lances(store, stats)
    store.add(["d1", "x"], make_data("random", 2, DIM, 3), ["zygomorphic orchid banks", "quick fox"], [{}, {}])  # upsert
    store.delete(["d2", "n5"])
    contents.update({"d1": "zygomorphic orchid banks", "x": "quick fox"})
    del contents["d2"], contents["n5"]
    assert store._term_stats(store._dataset()) is None
    store.commit()
    stats = store._term_stats(store._dataset())
    assert stats is not None
    assert_counts(stats, list(contents.values()))
    assert_scores_are_lances(store, stats)
    store.optimize()  # compaction: new fragments, the same rows
    stats = store._term_stats(store._dataset())
    assert stats is not None and stats.fragments == tuple(fragment_rows(store._dataset()))
    assert_counts(stats, list(contents.values()))
    assert_scores_are_lances(store, stats)


def test_statistics_not_describing_the_rows_are_not_used(tmp_path):
    store, _ = committed_store(tmp_path)
    dataset = store._dataset()
    fresh = LanceDBStore(tmp_path / "lance")
    assert same(fresh._term_stats(fresh._dataset()), store._term_stats(dataset))
    lance_bm25.write(store._stats_uri(), TermStats.count([pa.array(["fox"])], [(99, 0)]), None)  # other rows
    other = LanceDBStore(tmp_path / "lance")
    assert other._term_stats(other._dataset()) is None
    store.restore(dataset.version)  # rows as before, but a new version the next commit must re-describe
    store.commit()
    assert store._term_stats(store._dataset()) is not None
    (tmp_path / "lance" / "chunks.bm25").rename(tmp_path / "gone")  # none at all (a store written before them)
    last = LanceDBStore(tmp_path / "lance")
    assert last._term_stats(last._dataset()) is None


def test_a_commit_killed_before_its_stamp_leaves_hybrid_search_exact(tmp_path, monkeypatch):
    """The statistics are written before the full-text index's stamp: a writer dying between the two leaves
    them unused (search asks Lance) until the next writer's commit stamps both."""
    from benchmarks.scale import TwoPass
    from isotrope.connectors.lance_rows import META_LEXICAL_ROWS
    from isotrope.fusion import search_store
    from test_stores import assert_same_hits

    store, _ = committed_store(tmp_path)
    store.add([f"n{i}" for i in range(30)], make_data("random", 30, DIM, 5), make_texts(30, seed=5), [{}] * 30, new_ids=True)
    set_meta = LanceDBStore._set_meta

    def killed(self, values):
        if META_LEXICAL_ROWS in values:
            raise KeyboardInterrupt("killed")
        set_meta(self, values)

    monkeypatch.setattr(LanceDBStore, "_set_meta", killed)
    with pytest.raises(KeyboardInterrupt):
        store.commit()
    monkeypatch.undo()
    again = LanceDBStore(tmp_path / "lance")
    assert saved(again).fragments == tuple(fragment_rows(again._dataset()))  # the statistics were saved ...
    assert again._term_stats(again._dataset()) is None  # ... but the index is not stamped: not used
    vectors = make_data("random", len(QUERIES), DIM, 11)
    assert_same_hits(search_store(TwoPass(again), QUERIES, vectors, 10), search_store(again, QUERIES, vectors, 10))
    again.commit()
    assert again._term_stats(again._dataset()) is not None
    assert_same_hits(search_store(TwoPass(again), QUERIES, vectors, 10), search_store(again, QUERIES, vectors, 10))


def test_the_first_commit_writes_the_statistics_without_a_lance_warning(tmp_path, capfd):
    """Overwriting a dataset that is not there makes Lance warn on stderr ('No existing dataset at
    ....bm25, it will be created'), which every first `isotrope index` into a LanceDB store printed."""
    store, contents = committed_store(tmp_path, n=30)
    assert "No existing dataset" not in capfd.readouterr().err
    assert_counts(saved(store), list(contents.values()))
    lance_bm25.write(store._stats_uri(), TermStats.count([], []), None, new=True)  # there after all: replaced
    assert saved(store).num_docs == 0
