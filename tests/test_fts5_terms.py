"""The FAISS store's lexical answers from cached term scores against FTS5 ranking the same query itself."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from isotrope.lexical import fts5_match, query_terms

faiss_store = pytest.importorskip("isotrope.connectors.faiss_store")
from isotrope.connectors.fts5_terms import TermScores  # noqa: E402

WORDS = [f"w{i}" for i in range(60)]
FTS5_TOP = "SELECT rowid, -bm25(items_fts) FROM items_fts WHERE items_fts MATCH ? ORDER BY rank, rowid LIMIT ?"


def zipf_texts(n: int, seed: int) -> list[str]:
    """Texts of 3 to 12 words drawn by a Zipf law: frequent words occur in most texts, rare ones in few,
    and many rows tie (same words, same length)."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, len(WORDS) + 1)
    return [" ".join(rng.choice(WORDS, size=rng.integers(3, 13), p=p / p.sum())) for _ in range(n)]


def build(path, texts: list[str]):
    store = faiss_store.FaissStore(path, dim=4, metric="ip")
    vectors = np.random.default_rng(0).standard_normal((len(texts), 4)).astype(np.float32)
    store.add([f"d{i}" for i in range(len(texts))], vectors, texts)
    store.commit()
    return store


def fts5_top(db: sqlite3.Connection, terms: list[str], k: int) -> tuple[list[int], list[float]]:
    rows = db.execute(FTS5_TOP, [fts5_match(terms), k]).fetchall()
    return [r[0] for r in rows], [r[1] for r in rows]


@pytest.mark.parametrize("budget", [10_000_000, 2_000])  # everything kept; a budget that leaves terms out
def test_top_and_of_are_fts5s_own_ranking_and_scores(tmp_path, budget):
    store = build(tmp_path / "s", zipf_texts(1500, seed=1))
    db = store._db
    cache = TermScores("items_fts", budget_rows=budget, min_rows=50)
    rng = np.random.default_rng(2)
    answered = 0
    for query in [*zipf_texts(40, seed=3), "w59 w0", "w0", "nothing here"]:
        terms = query_terms(query)
        wanted = rng.choice(1500, size=50, replace=False) + 1
        for k in (1, 10, 200, 5000):
            seen = set(cache._seen)
            found = cache.top(db, terms, k)
            if found is None:  # FTS5 ranks: a frequent term asked for the first time, or one over the budget
                assert (cache._seen - seen) & set(terms) or not cache._left_out.isdisjoint(terms)
                continue
            answered += 1
            expected_keys, expected_scores = fts5_top(db, terms, k)
            assert found[0].tolist() == expected_keys  # ties broken by rowid, as ORDER BY rank, rowid
            assert found[1].tolist() == expected_scores  # the same float64 sums, bit for bit
        sql = f"SELECT rowid, -bm25(items_fts) FROM items_fts WHERE items_fts MATCH ? AND +rowid IN ({','.join('?' * 50)})"
        expected = dict(db.execute(sql, [fts5_match(terms), *wanted.tolist()]).fetchall())
        scores = cache.of(db, terms, wanted)
        assert scores is None or scores.tolist() == [expected.get(int(key), 0.0) for key in wanted]
    assert cache._rows <= budget and answered >= (100 if budget > 1_000_000 else 4)
    assert cache._kept and cache._rare and (budget > 1_000_000 or cache._left_out)


def test_a_commit_by_any_connection_empties_the_cache(tmp_path):
    store = build(tmp_path / "s", zipf_texts(800, seed=4))
    store._term_scores.min_rows = 1  # keep every term read
    terms = query_terms("w0 w1 w7")
    store.lexical_search([" ".join(terms)], 20)
    before = store.lexical_search([" ".join(terms)], 20)[0]  # the second time: from the kept terms
    assert set(store._term_scores._kept) == set(terms)
    other = faiss_store.FaissStore(tmp_path / "s")  # another handle: its commit changes N, avgdl and every idf
    other.add([f"n{i}" for i in range(300)], np.ones((300, 4), np.float32), ["w7 w7 w7"] * 300)
    other.commit()
    after = store.lexical_search([" ".join(terms)], 20)[0]
    expected_keys, expected_scores = fts5_top(store._db, terms, 20)
    assert [h.score for h in after] == expected_scores
    assert [h.id for h in after] == [
        store._db.execute("SELECT id FROM items WHERE key = ?", [k]).fetchone()[0] for k in expected_keys
    ]
    assert [h.score for h in after] != [h.score for h in before]


def test_store_reads_use_the_cache_outside_a_write_and_fts5_inside(tmp_path):
    store = build(tmp_path / "s", zipf_texts(3000, seed=5))
    query = "w0 w1 zzz"
    store.lexical_search([query], 10)
    first = store.lexical_search([query], 10)[0]
    assert set(store._term_scores._kept) == {"w0", "w1"} and store._term_scores._rare == {"zzz"}
    store.add(["x"], np.ones((1, 4), np.float32), ["zzz"])  # not committed: FTS5 sees the new row
    inside = store.lexical_search([query], 10)[0]
    assert inside[0].id == "x" and "x" not in {h.id for h in first}
    store.commit()
    assert store.lexical_search([query], 10)[0] == inside
