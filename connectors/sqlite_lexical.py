"""The keyword index of a store kept in SQLite: an FTS5 table of each row's text analyzed by
:mod:`isotrope.lexical`, written in the rows' transaction and scored by FTS5's BM25; frequent terms'
scores kept in memory (:mod:`.fts5_terms`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from isotrope.lexical import fts5_match, index_text, query_terms
from isotrope.stores.base import Hit, check_k
from isotrope.stores.filters import to_sqlite
from isotrope.stores.rows import chunks

from .fts5_terms import TermScores
from .sqlite_rows import CHUNK, FTS_SCHEMA, READ_BATCH, SqliteRows

logger = logging.getLogger(__name__)


class SqliteLexicalIndex(SqliteRows):
    """Lexical search over the rows' FTS5 table ``items_fts`` (rowid = the row's key)."""

    _term_scores: TermScores

    def _delete_terms(self, keys: Sequence[int]) -> None:
        for part in chunks(keys, CHUNK):
            self._conn.execute(f"DELETE FROM items_fts WHERE rowid IN ({','.join('?' * len(part))})", part)

    @property
    def has_lexical_index(self) -> bool:
        """Whether the FTS5 table of lexical search exists (a store written before it had none: ``build_lexical_index``)."""
        return self._db.execute("SELECT 1 FROM sqlite_master WHERE name = 'items_fts'").fetchone() is not None

    def _ensure_lexical_index(self) -> None:
        """Build the FTS5 table of a store written before it existed (inside the open transaction)."""
        if self.has_lexical_index:
            return
        logger.warning("%s has no lexical index: building it from the %d stored texts", self.path, len(self))
        self._conn.execute(FTS_SCHEMA)
        cursor = self._conn.execute("SELECT key, text FROM items ORDER BY key")
        while rows := cursor.fetchmany(READ_BATCH):
            self._conn.executemany(
                "INSERT INTO items_fts (rowid, terms) VALUES (?, ?)",
                [(key, terms) for key, text in rows if (terms := index_text(text))],
            )

    def build_lexical_index(self) -> None:
        """Build the lexical index if the store has none: committed now, or with the pending writes."""
        if self.has_lexical_index:
            return
        if self._conn.in_transaction:
            self._ensure_lexical_index()
            return
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            self._ensure_lexical_index()
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def lexical_search(
        self, texts: Sequence[str], k: int, where: Mapping[str, Any] | None = None, with_text: bool = True
    ) -> list[list[Hit]]:
        """The ``k`` best rows of each query text by FTS5's ``bm25()`` (negated: higher is better),
        among rows matching ``where``. A store without the lexical index gets it built first. Outside a write
        transaction an unfiltered query whose terms repeat is answered from their scores kept in memory
        (:mod:`.fts5_terms`): the same rows and scores, without FTS5 scoring every match again."""
        k = check_k(k)
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of query strings, not a single string")
        if not self.has_lexical_index:
            self.build_lexical_index()
        condition, params = "", []  # type: str, list[Any]
        if where:
            sql, params = to_sqlite(where)
            condition = f" AND rowid IN (SELECT key FROM items WHERE {sql})"
        query = f"SELECT rowid, -bm25(items_fts) FROM items_fts WHERE items_fts MATCH ?{condition} ORDER BY rank, rowid LIMIT ?"
        out = []
        db = self._db
        for text in texts:
            terms = query_terms(text)
            cached = self._term_scores.top(db, terms, k) if terms and not where and db is self._reader else None
            if cached is not None:
                keys, scores = cached
            else:
                found = db.execute(query, [fts5_match(terms), *params, k]).fetchall() if terms else []
                keys = np.array([key for key, _ in found], dtype=np.int64)
                scores = np.array([score for _, score in found], dtype=np.float64)
            out.append(self._hits(keys.reshape(1, -1), scores.reshape(1, -1), with_text)[0])
        return out

    def lexical_scores(self, texts: Sequence[str], ids: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """Each query text's ``-bm25()`` of each of its ids (0 for a row sharing no term): the FTS5 query
        restricted to those rows, with the whole index's statistics (or, as in ``lexical_search``, the sum
        of the terms' scores kept in memory)."""
        if not self.has_lexical_index:
            self.build_lexical_index()
        out = []
        db = self._db
        for text, wanted in zip(texts, ids):
            keys = self._keys(list(wanted))
            scores = dict.fromkeys(wanted, 0.0)
            terms = query_terms(text)
            cached = (
                self._term_scores.of(db, terms, np.array(list(keys.values()))) if terms and keys and db is self._reader else None
            )
            if cached is not None:
                scores.update(zip(keys, cached.tolist()))
            elif terms and keys:
                id_of = {key: id_ for id_, key in keys.items()}
                for part in chunks(list(id_of), CHUNK):
                    # ``+rowid``: one full-text query filtered by SQLite, not one per rowid (4x slower at 200 rows)
                    sql = f"SELECT rowid, -bm25(items_fts) FROM items_fts WHERE items_fts MATCH ? AND +rowid IN ({','.join('?' * len(part))})"
                    for key, score in self._db.execute(sql, [fts5_match(terms), *part]):
                        scores[id_of[key]] = score
            out.append(np.array([scores[i] for i in wanted], dtype=np.float64))
        return out
