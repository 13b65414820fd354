"""The keyword search of a store kept in SQLite: exact BM25 from a :class:`~.keyword_index.KeywordIndex`
that follows the rows.

SQLite stays the source of truth. Its ``meta`` row ``keyword_generation`` counts the commits that
changed rows; ``keyword.npz`` records the generation it reflects. A store whose file is missing or lags
(a kill -9 between the SQLite commit and the file's rename, another process's commit, a store written
with the FTS5 index of before) rebuilds the index from the stored texts on first use, and logs it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from isotrope.fusion import Candidates, KeyedVectors, run_beside
from isotrope.lexical import analyze, query_terms
from isotrope.stores.base import Hit, check_k

from .keyword_index import KeywordIndex
from .sqlite_rows import READ_BATCH, SqliteRows

logger = logging.getLogger(__name__)

_NO_KEYS = np.empty(0, np.int64)
_GENERATION = "SELECT value FROM meta WHERE key = 'keyword_generation'"


class SqliteLexicalIndex(SqliteRows):
    """Keyword search over the rows' texts; ``_keyword`` is loaded on first use and kept current by
    ``_keyword_upsert`` / ``_keyword_delete`` (called inside the write transaction)."""

    _keyword: KeywordIndex | None = None
    _keyword_changed: bool = False
    _keyword_merge_due: bool = False  # after a bulk load: the next commit merges the rows pending in the index

    def _committed_generation(self) -> int:
        row = self._db.execute(_GENERATION).fetchone()
        return int(row[0]) if row else 0

    @property
    def has_lexical_index(self) -> bool:
        """Whether the keyword index file reflects the last commit (else the first keyword search builds it)."""
        if self._keyword_changed:
            return True  # written at the commit
        return KeywordIndex.saved_generation(self.path) == self._committed_generation()

    def _keyword_index(self) -> KeywordIndex:
        """The index of the rows as this handle sees them: reloaded or rebuilt when another commit moved on."""
        index = self._keyword
        if index is not None and (self._keyword_changed or index.generation == self._committed_generation()):
            return index
        generation = self._committed_generation()
        index = KeywordIndex.load(self.path)
        if index is None or index.generation != generation:
            (logger.warning if generation or len(self) else logger.debug)(
                "%s: the keyword index does not reflect commit %d; building it from the %d stored texts",
                self.path,
                generation,
                len(self),
            )
            index = KeywordIndex.build(self._analyzed_rows(), generation)
            if not self._conn.in_transaction:  # it reflects the commit: kept for the next open
                KeywordIndex.install(index.save(self.path))
        self._keyword = index
        return index

    def _analyzed_rows(self) -> Iterator[list[tuple[int, list[str]]]]:
        cursor = self._db.execute("SELECT key, text FROM items ORDER BY key")
        while rows := cursor.fetchmany(READ_BATCH):
            yield [(key, analyze(text)) for key, text in rows]

    def build_lexical_index(self) -> None:
        """Build the keyword index now and write it (a store whose file is missing or lags)."""
        if not self.has_lexical_index:
            self._keyword_index()

    def _keyword_upsert(self, rows: Sequence[tuple[int, str | None]]) -> None:
        self._keyword_index().upsert((key, analyze(text)) for key, text in rows)
        self._keyword_changed = True

    def _keyword_delete(self, keys: Sequence[int]) -> None:
        self._keyword_index().delete(keys)
        self._keyword_changed = True

    def _keyword_discard(self) -> None:
        """After a rolled-back write: the index rebuilt from the rows the open transaction holds."""
        if self._keyword_changed:
            self._keyword = KeywordIndex.build(self._analyzed_rows(), self._committed_generation())

    def _stage_keyword(self) -> Path | None:
        """Inside the open transaction at commit: the next generation recorded and the index saved under a
        temporary name, to rename with :meth:`_install_keyword` once SQLite has committed."""
        if self._keyword_merge_due and self._keyword is not None and self._keyword.pending:
            # one matrix after a bulk load: a query scores each matrix apart (100k chunks, 9% pending: a
            # hybrid query 0.36 ms less)
            self._keyword.merge()
            self._keyword_changed = True
            self._begin()  # the generation below is committed with the rest
        self._keyword_merge_due = False
        if not self._keyword_changed or self._keyword is None:
            return None
        generation = self._committed_generation() + 1
        self._conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('keyword_generation', ?)", (str(generation),))
        self._conn.execute("DROP TABLE IF EXISTS items_fts")  # the FTS5 index of stores written before
        self._keyword.generation = generation
        return self._keyword.save(self.path)

    def _install_keyword(self, tmp: Path | None) -> None:
        if tmp is not None:
            KeywordIndex.install(tmp)
            self._keyword_changed = False

    def _allowed_keys(self, where: Mapping[str, Any] | None) -> np.ndarray | None:
        if not where:
            return None
        from isotrope.stores.filters import to_sqlite

        sql, params = to_sqlite(where)
        return np.array([key for (key,) in self._db.execute(f"SELECT key FROM items WHERE {sql}", params)], dtype=np.int64)

    def lexical_search(
        self, texts: Sequence[str], k: int, where: Mapping[str, Any] | None = None, with_text: bool = True
    ) -> list[list[Hit]]:
        """The ``k`` best rows of each query text by BM25 (:mod:`isotrope.lexical`), among rows matching
        ``where``; ties by insertion order."""
        k = check_k(k)
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of query strings, not a single string")
        index = self._keyword_index()
        allowed = self._allowed_keys(where)
        out = []
        for text in texts:
            keys, scores = index.top(query_terms(text), k, allowed)
            out.append(self._hits(keys.reshape(1, -1), scores.reshape(1, -1), with_text)[0])
        return out

    def lexical_scores(self, texts: Sequence[str], ids: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """Each query text's BM25 of each of its ids (0 for a row sharing no term), with the statistics
        of all stored rows."""
        index = self._keyword_index()
        out = []
        for text, wanted in zip(texts, ids):
            keys = self._keys(list(wanted))
            lookup = np.fromiter((keys.get(i, -1) for i in wanted), dtype=np.int64, count=len(wanted))
            out.append(index.lookup(query_terms(text), lookup))
        return out

    def _keyword_candidates(
        self,
        texts: Sequence[str],
        k: int,
        where: Mapping[str, Any] | None,
        dense: Callable[[], list[tuple[np.ndarray, np.ndarray]]],
        complete: bool,
        beside: bool,
    ) -> Candidates:
        """Hybrid search's candidates by row key: each query's keyword top ``k`` among rows matching ``where``
        and its dense ``(keys, scores)`` from ``dense()``, then (``complete``) the BM25 of its dense keys and
        the stored vectors of the keyword candidates. ``beside``: the keyword side runs in a second thread while
        ``dense()`` runs in this one, and reads its rows' vectors there before the dense side is done (through
        the reader connection; 100k chunks: 0.6 ms less). Else, after the dense side, the dense keys' BM25 is
        read from the scores of the keyword pass where it scored every posting (100k chunks: 0.4 ms less)."""
        index, allowed = self._keyword_index(), self._allowed_keys(where)
        terms = [query_terms(text) for text in texts]
        read: tuple[np.ndarray, np.ndarray] | None = None
        if beside:
            reader = self._db if complete and not self._conn.in_transaction else None

            def keyword_side() -> tuple[list[tuple[np.ndarray, np.ndarray]], tuple[np.ndarray, np.ndarray] | None]:
                tops = [index.top(query, k, allowed) for query in terms]
                if reader is None:
                    return tops, None
                return tops, self._key_vectors(
                    np.unique(np.concatenate([_NO_KEYS, *(keys for keys, _ in tops)])).tolist(), reader
                )

            found, (lexical, read) = run_beside(keyword_side, dense)
            bm25 = [index.lookup(query, keys) for query, (keys, _) in zip(terms, found)] if complete else []
        else:
            found = dense()
            passes = [
                index.top_and_lookup(query, k, allowed, keys if complete else None) for query, (keys, _) in zip(terms, found)
            ]
            lexical = [(keys, scores) for keys, scores, _ in passes]
            bm25 = [looked for _, _, looked in passes] if complete else []
        if read is None:
            missing = set[int]()
            if complete:
                for (keys, _), (dense_keys, _) in zip(lexical, found):
                    missing.update(np.setdiff1d(keys, dense_keys).tolist())
            read = self._key_vectors(sorted(missing))
        found_keys, vectors = read
        return Candidates(
            [(keys.tolist(), scores) for keys, scores in found],
            [(keys.tolist(), scores) for keys, scores in lexical],
            bm25,
            KeyedVectors.of(found_keys.tolist(), vectors),
            self._ranked_hits,
        )
