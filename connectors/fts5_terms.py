"""The FAISS store's lexical answers from its frequent terms' FTS5 scores, kept in memory.

FTS5's ``bm25()`` of an OR query is a sum over the query's phrases, in query order, of each phrase's
``idf * tf (k1 + 1) / (tf + k1 (1 - b + b |d| / avgdl))``, each idf computed over the whole table
whatever else the query holds. A query's scores are therefore the sums of its terms' single-term
scores, and ``numpy.bincount`` adds them in the same order to the same float64 values: the top k and
the scores of given rows come out as FTS5 gives them, ties broken by rowid as ``ORDER BY rank, rowid``.
FTS5 scores every matching row before it sorts (a 5 to 10 word query matched 20 to 38 % of 100,000
synthetic chunks); with its terms' rows in memory, a query costs a scatter-add instead.

Which terms: a term new to the cache has its rows counted up to ``MIN_ROWS``; with fewer it is rare
and is re-read on each query (a cheap read). A frequent term is read the second time a query asks for
it (the first time, FTS5 ranks that query itself: a one-off search pays only the count) and kept if its
row count fits in what is left of ``BUDGET_ROWS`` (nothing is evicted, so a broad workload cannot thrash
it), else left to FTS5. A query is answered here when every term is kept or rare. Every answer reads one snapshot of the
database (a read transaction), and the cache holds one committed state (``PRAGMA data_version``): a
commit by any connection empties it.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence

import numpy as np

from isotrope.lexical import fts5_match

#: terms with fewer rows are re-read from FTS5 on each query (a cheap read) instead of kept
MIN_ROWS = 1_000
#: rows kept over all terms (16 bytes each: 128 MB at most)
BUDGET_ROWS = 8_000_000

_Postings = tuple[np.ndarray, np.ndarray]


class TermScores:
    """Single-term ``-bm25()`` of every row each frequent query term occurs in, for one FTS5 table."""

    def __init__(self, table: str, budget_rows: int = BUDGET_ROWS, min_rows: int = MIN_ROWS) -> None:
        self._sql = f"SELECT rowid, -bm25({table}) FROM {table} WHERE {table} MATCH ?"
        self._count_sql = f"SELECT count(*) FROM {table} WHERE {table} MATCH ?"
        # no bm25(): its idf reads the term's whole row list, whatever the limit
        self._probe_sql = f"SELECT count(*) FROM (SELECT rowid FROM {table} WHERE {table} MATCH ? LIMIT ?)"
        self.budget_rows = budget_rows
        self.min_rows = min_rows
        self._lock = threading.Lock()
        self._state: tuple[sqlite3.Connection, int] | None = None  # the connection and data_version held
        self._reset()

    def _reset(self) -> None:
        self._kept: dict[str, _Postings] = {}
        self._rows = 0
        self._rare: set[str] = set()  # re-read on each query
        self._seen: set[str] = set()  # frequent, asked for once: kept (or left out) when asked again
        self._left_out: set[str] = set()  # frequent, over the budget left: FTS5 ranks their queries

    def _fetch(self, db: sqlite3.Connection, term: str) -> _Postings:
        """The rows ``term`` occurs in, ascending, and its single-term scores there."""
        pairs = np.array(db.execute(self._sql, [fts5_match([term])]).fetchall(), dtype=np.float64)
        pairs = pairs.reshape(-1, 2)  # float64 holds every rowid below 2**53 exactly
        return pairs[:, 0].astype(np.int64), pairs[:, 1]

    def _classify(self, db: sqlite3.Connection, term: str) -> None:
        """Rare after a count up to ``min_rows``; a frequent term is seen the first time, kept (or left out,
        over the budget, counted before it is read) the second."""
        if term in self._kept or term in self._rare or term in self._left_out:
            return
        if term not in self._seen:
            rare = db.execute(self._probe_sql, [fts5_match([term]), self.min_rows]).fetchone()[0] < self.min_rows
            (self._rare if rare else self._seen).add(term)
            return
        self._seen.discard(term)
        rows = db.execute(self._count_sql, [fts5_match([term])]).fetchone()[0]
        if self._rows + rows > self.budget_rows:
            self._left_out.add(term)
            return
        self._kept[term] = self._fetch(db, term)
        self._rows += rows

    def _read(self, db: sqlite3.Connection, terms: Sequence[str]) -> list[_Postings] | None:
        """Each term's postings from one snapshot that the cache matches; None where FTS5 should rank."""
        with self._lock:
            db.execute("BEGIN")
            try:
                state = (db, db.execute("PRAGMA data_version").fetchone()[0])
                if state != self._state:
                    self._reset()
                    self._state = state
                for term in terms:
                    self._classify(db, term)
                if not all(term in self._kept or term in self._rare for term in terms):
                    return None
                return [self._kept[term] if term in self._kept else self._fetch(db, term) for term in terms]
            finally:
                db.execute("COMMIT")

    def top(self, db: sqlite3.Connection, terms: Sequence[str], k: int) -> _Postings | None:
        """The ``k`` best rows of the OR of ``terms`` and their scores, best first (ties: lower rowid
        first); None where FTS5 should rank the query."""
        postings = self._read(db, terms)
        if postings is None:
            return None
        keys, position = np.unique(np.concatenate([p[0] for p in postings]), return_inverse=True)
        scores = np.bincount(position, weights=np.concatenate([p[1] for p in postings]), minlength=len(keys))
        chosen = np.arange(len(keys))
        if len(keys) > k:  # every row tied with the k-th best, then ordered as FTS5 orders them
            chosen = np.flatnonzero(scores >= np.partition(scores, len(keys) - k)[len(keys) - k])
        order = chosen[np.lexsort((keys[chosen], -scores[chosen]))][:k]
        return keys[order], scores[order]

    def of(self, db: sqlite3.Connection, terms: Sequence[str], keys: np.ndarray) -> np.ndarray | None:
        """The OR of ``terms``'s score of each row of ``keys`` (0 where it holds none of them); None where
        FTS5 should score them."""
        postings = self._read(db, terms)
        if postings is None:
            return None
        total = np.zeros(len(keys), dtype=np.float64)
        for rows, scores in postings:
            if len(rows):  # in query order, as FTS5 adds them (adding 0.0 changes no sum)
                at = np.minimum(np.searchsorted(rows, keys), len(rows) - 1)
                total += np.where(rows[at] == keys, scores[at], 0.0)
        return total
