"""The FAISS store's keyword index: exact BM25 (:mod:`isotrope.lexical`'s formula) from a term x row
count matrix (``scipy.sparse``) kept in memory, and in ``keyword.npz`` beside the store.

A query scores the postings of its distinct terms only (numpy, vectorised), with the statistics of the
live rows (N, each term's live document frequency, the average length) computed exactly at query time,
so upserts and deletes never leave it approximate. Rows changed since the last merge sit in a small
second matrix; the key's column in the large one is dead meanwhile. ``merge`` folds them in.

The file records the SQLite generation it reflects (:class:`KeywordIndex.generation`); the store
compares it with the generation committed in SQLite and rebuilds the index from the stored texts when
they differ (a kill -9 between the SQLite commit and the file's rename, or a store written before).
Chosen by measurement (``benchmarks/keyword_engines.py``, docs/SCALING.md): tantivy ranks 35 of 200
queries' top 10 differently at 1M passages (one-byte length norms), Lance's inverted index keeps
deleted rows in its statistics, bm25s cannot update a row.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from scipy.sparse import csr_matrix

from isotrope.lexical import K1, B

from .faiss_index import fsync_dir

logger = logging.getLogger(__name__)

FILE_NAME = "keyword.npz"
#: rows changed since the last merge beyond which a change merges them into the large matrix
MERGE_ROWS = 50_000


class _Segment:
    """Rows as a term x column count matrix over a shared vocabulary, with each column's key and length
    (0: a dead column), columns in key order."""

    def __init__(self, counts: csr_matrix, keys: np.ndarray, lengths: np.ndarray) -> None:
        self.counts, self.keys, self.lengths = counts, keys, lengths.astype(np.float64)
        self.alive = int((self.lengths > 0).sum())  # live columns
        self.length_sum = float(self.lengths.sum())
        self._norm: tuple[float, np.ndarray] | None = None  # (average length, each column's BM25 length norm)
        self._local = threading.local()

    def norm(self, average: float) -> np.ndarray:
        """``k1 * (1 - b + b * dl / avgdl)`` of each column (kept until the average changes)."""
        if self._norm is None or self._norm[0] != average:
            self._norm = (average, K1 * (1 - B + B * self.lengths / average))
        return self._norm[1]

    @classmethod
    def of(cls, rows: Sequence[tuple[int, np.ndarray]], terms: int) -> _Segment:
        """The segment of ``(key, term ids)`` rows with distinct keys, over ``terms`` vocabulary entries."""
        rows = sorted(rows, key=lambda row: row[0])
        lengths = np.fromiter((len(ids) for _, ids in rows), dtype=np.int64, count=len(rows))
        term_ids = np.concatenate([ids for _, ids in rows]) if rows else np.empty(0, np.int32)
        columns = np.repeat(np.arange(len(rows), dtype=np.int32), lengths)
        counts = csr_matrix((np.ones(len(term_ids), np.float32), (term_ids, columns)), shape=(terms, len(rows)))
        counts.sum_duplicates()
        keys = np.fromiter((key for key, _ in rows), dtype=np.int64, count=len(rows))
        return cls(counts, keys, lengths)

    @classmethod
    def joined(cls, segments: Sequence[_Segment], terms: int) -> _Segment:
        """The live columns of ``segments`` (distinct keys) as one segment over ``terms`` vocabulary entries,
        in key order. Each entry is copied once into arrays sized for the result (peak: the segments and
        the result, plus a bounded block of scratch), instead of scipy's stacking, which holds two copies
        more of the entries."""
        live = [segment.lengths > 0 for segment in segments]
        keys = np.concatenate([s.keys[alive] for s, alive in zip(segments, live)])
        lengths = np.concatenate([s.lengths[alive] for s, alive in zip(segments, live)])
        # each column's place in the result (-1: dead)
        places, start = [], 0
        for alive in live:
            place = np.full(len(alive), -1, dtype=np.int64)
            place[alive] = np.arange(start, start + int(alive.sum()))
            start += int(alive.sum())
            places.append(place)
        reordered = bool((np.diff(keys) <= 0).any())  # rows appended in key order (new rows) keep their order
        if reordered:
            order = np.argsort(keys, kind="stable")
            rank = np.empty_like(order)
            rank[order] = np.arange(len(order))
            places = [np.where(place >= 0, rank[np.maximum(place, 0)], -1) for place in places]
            keys, lengths = keys[order], lengths[order]
        per_term = [_live_entries(segment, terms) for segment in segments]
        indptr = np.zeros(terms + 1, dtype=np.int64)
        np.cumsum(np.sum(per_term, axis=0), out=indptr[1:])
        index_type = np.int32 if max(int(indptr[-1]), len(keys)) < np.iinfo(np.int32).max else np.int64
        indices, data = np.empty(indptr[-1], dtype=index_type), np.empty(indptr[-1], dtype=np.float32)
        free = indptr[:-1].copy()  # each term's next free slot
        for segment, place, entries in zip(segments, places, per_term):
            _scatter(segment.counts, place, free, indices, data)
            free += entries
        counts = csr_matrix((data, indices, indptr.astype(index_type)), shape=(terms, len(keys)))
        if reordered:
            counts.has_sorted_indices = False
            counts.sort_indices()
        return cls(counts, keys, lengths)

    def buffer(self) -> np.ndarray:
        """A zeroed float64 array with a slot per column, one per thread, reused by its queries (which zero
        what they touch)."""
        buffer = getattr(self._local, "buffer", None)
        if buffer is None:
            buffer = self._local.buffer = np.zeros(len(self.keys))
        return buffer

    def postings(self, term: int) -> tuple[np.ndarray, np.ndarray]:
        """The live columns holding ``term`` and its counts there."""
        if term >= self.counts.shape[0]:
            return np.empty(0, np.int64), np.empty(0, np.float32)
        start, end = self.counts.indptr[term], self.counts.indptr[term + 1]
        columns, counts = self.counts.indices[start:end], self.counts.data[start:end]
        if self.alive == len(self.keys):
            return columns, counts
        keep = self.lengths[columns] > 0
        return columns[keep], counts[keep]

    def kill(self, keys: np.ndarray) -> None:
        """Mark the columns of ``keys`` dead (keys absent are ignored)."""
        at = np.searchsorted(self.keys, keys)
        found = at < len(self.keys)
        at = at[found]
        at = at[(self.keys[at] == keys[found]) & (self.lengths[at] > 0)]
        self.alive -= len(at)
        self.length_sum -= float(self.lengths[at].sum())
        self.lengths[at] = 0.0
        self._norm = None


class KeywordIndex:
    """Exact BM25 over the rows given to ``upsert`` less those given to ``delete``; rows without terms
    count in no statistic (as in LanceDB's index)."""

    def __init__(self, generation: int = 0) -> None:
        self.generation = generation
        self._vocabulary: dict[str, int] = {}
        self._main = _Segment.of([], 0)
        self._pending: dict[int, np.ndarray] = {}  # key -> term ids of the rows changed since the last merge
        self._recent: _Segment | None = None  # the pending rows as a segment (made on use)

    @classmethod
    def build(cls, rows: Iterable[Sequence[tuple[int, Sequence[str]]]], generation: int) -> KeywordIndex:
        """The index of batches of ``(key, terms)`` rows with distinct keys."""
        index = cls(generation)
        segments = [
            _Segment.of([(key, index._ids(terms)) for key, terms in batch if terms], len(index._vocabulary)) for batch in rows
        ]
        index._main = _Segment.joined(segments or [index._main], len(index._vocabulary))
        return index

    # ------------------------------------------------------------------ writing

    def upsert(self, rows: Iterable[tuple[int, Sequence[str]]]) -> None:
        """Index each ``(key, analyzed terms)``, replacing what the key had."""
        changed = {int(key): self._ids(terms) for key, terms in rows}
        if not changed:
            return
        self._main.kill(np.fromiter(changed, dtype=np.int64, count=len(changed)))
        self._pending.update(changed)
        self._changed()

    def delete(self, keys: Iterable[int]) -> None:
        """Drop the rows of ``keys`` (unknown keys are ignored)."""
        gone = np.fromiter(keys, dtype=np.int64)
        if not len(gone):
            return
        self._main.kill(gone)
        for key in gone.tolist():
            self._pending.pop(key, None)
        self._changed()

    def _ids(self, terms: Sequence[str]) -> np.ndarray:
        """The vocabulary ids of ``terms`` (new terms added): a row pending costs 4 bytes a term, not a string each."""
        vocabulary = self._vocabulary
        return np.fromiter((vocabulary.setdefault(term, len(vocabulary)) for term in terms), dtype=np.int32, count=len(terms))

    def _changed(self) -> None:
        self._recent = None
        if len(self._pending) > MERGE_ROWS:
            self.merge()

    def _pending_segment(self) -> _Segment:
        if self._recent is None:
            self._recent = _Segment.of([(k, t) for k, t in self._pending.items() if len(t)], len(self._vocabulary))
        return self._recent

    def merge(self) -> None:
        """Fold the pending rows into the large matrix, dropping dead columns."""
        if not self._pending and (self._main.lengths > 0).all():
            return
        segments = [self._main, self._pending_segment()]
        self._main = _Segment.joined(segments, len(self._vocabulary))
        self._pending = {}
        self._recent = None

    # ------------------------------------------------------------------ reading

    def __len__(self) -> int:
        return self._main.alive + self._pending_segment().alive

    def scores(self, terms: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(keys, BM25)`` of the live rows sharing a term with the query (its distinct ``terms``); each row
        once, unordered."""
        found, scores, terms_matched, _ = self._matches(terms)
        return _distinct(found, scores, terms_matched)

    def lookup(self, terms: Sequence[str], keys: np.ndarray) -> np.ndarray:
        """The BM25 of each of ``keys`` (0 for a row sharing no term, or not live), in their order."""
        return self._matches(terms, keys)[3]

    def _matches(self, terms: Sequence[str], lookup: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
        """``(keys, BM25, t, looked up)``: each posting of the ``t`` query terms found, with its row's whole
        score (a row appears once per term it holds), and the score of each ``lookup`` key, read from the
        scored columns before they are cleared. Only the postings are touched: O(postings), not O(rows)."""
        looked = np.zeros(0 if lookup is None else len(lookup))
        segments = [s for s in (self._main, self._pending_segment()) if len(s.keys)]
        n_docs = float(sum(s.alive for s in segments))
        wanted = [i for term in dict.fromkeys(terms) if (i := self._vocabulary.get(term)) is not None]
        if n_docs == 0 or not wanted:
            return np.empty(0, np.int64), np.empty(0, np.float64), 0, looked
        average = sum(s.length_sum for s in segments) / n_docs
        postings = [[segment.postings(term) for term in wanted] for segment in segments]  # each read once
        df = np.array([sum(len(parts[t][0]) for parts in postings) for t in range(len(wanted))], dtype=np.float64)
        idf = np.log1p((n_docs - df + 0.5) / (df + 0.5))  # > 0: a matching row scores > 0
        found, scores = [], []
        for segment, parts in zip(segments, postings):
            norm, total = segment.norm(average), segment.buffer()
            columns: list[np.ndarray] = []
            try:
                for term_idf, (cols, counts) in zip(idf, parts):
                    if len(cols) == 0:
                        continue
                    columns.append(cols)
                    total[cols] += (term_idf * (K1 + 1)) * (counts / (counts + norm[cols]))
                if columns:
                    every = np.concatenate(columns)
                    found.append(segment.keys[every])
                    scores.append(total[every])
                    if lookup is not None:  # a dead column was never scored: it reads 0
                        at = np.minimum(np.searchsorted(segment.keys, lookup), len(segment.keys) - 1)
                        held = segment.keys[at] == lookup
                        looked[held] += total[at[held]]
            finally:  # the buffer is all zeros again, whatever was raised: the next query's scores start from 0
                for cols in columns:
                    total[cols] = 0.0
        if not found:
            return np.empty(0, np.int64), np.empty(0, np.float64), 0, looked
        return np.concatenate(found), np.concatenate(scores), len(wanted), looked

    def top(self, terms: Sequence[str], k: int, keys: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` best ``(keys, scores)``, best first, ties by key."""
        return self.top_and_lookup(terms, k, keys)[:2]

    def top_and_lookup(
        self, terms: Sequence[str], k: int, keys: np.ndarray | None = None, lookup: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The ``k`` best ``(keys, scores)`` among ``keys`` (all live rows where None), best first, ties by key,
        and the BM25 of each ``lookup`` key (:meth:`lookup`): one pass over the query terms' postings."""
        found, scores, terms_matched, looked = self._matches(terms, lookup)
        if keys is not None:
            found, scores = _distinct(found, scores, terms_matched)
            keep = np.isin(found, keys)
            found, scores = found[keep], scores[keep]
        else:
            reach = k * max(terms_matched, 1)  # a row appears at most once per term: k distinct rows among these
            if len(found) > reach:
                kth = scores[np.argpartition(-scores, reach - 1)[reach - 1]]
                kept = scores >= kth
                found, scores = found[kept], scores[kept]
            found, scores = _distinct(found, scores, terms_matched)
        if len(found) > k:
            kth = scores[np.argpartition(-scores, k - 1)[k - 1]]
            tied = np.flatnonzero(scores >= kth)  # every row tied with the k-th, so ties go by key
            found, scores = found[tied], scores[tied]
        order = np.lexsort((found, -scores))[:k]
        return found[order], scores[order], looked

    # ------------------------------------------------------------------ the file

    def save(self, directory: Path) -> Path:
        """Merge, then write the index under a temporary name (fsynced); the caller renames it into place
        once SQLite has committed :attr:`generation`."""
        self.merge()
        # a name of its own: threads of one process, or two readers rebuilding a lagging index, may save at once
        tmp = directory / f"{FILE_NAME}.{os.getpid()}-{threading.get_ident()}.tmp"
        main = self._main
        with open(tmp, "wb") as handle:
            np.savez(
                handle,
                generation=np.int64(self.generation),
                vocabulary=np.array(list(self._vocabulary), dtype=object).astype(str),
                indptr=main.counts.indptr,
                indices=main.counts.indices,
                data=main.counts.data,
                keys=main.keys,
                lengths=main.lengths,
            )
            handle.flush()
            os.fsync(handle.fileno())
        return tmp

    @staticmethod
    def install(tmp: Path) -> None:
        """Rename a saved index into place (after the SQLite commit); drop temporary files that processes
        killed while saving left behind."""
        os.replace(tmp, tmp.with_name(FILE_NAME))
        fsync_dir(tmp.parent)
        for left in tmp.parent.glob(f"{FILE_NAME}.*.tmp"):
            pid = left.name[len(FILE_NAME) + 1 :].split("-", 1)[0]
            if pid.isdigit() and not _running(int(pid)):
                left.unlink(missing_ok=True)

    @staticmethod
    def saved_generation(directory: Path) -> int | None:
        """The generation of the index saved in ``directory`` (None: none readable), read alone."""
        try:
            with np.load(directory / FILE_NAME, allow_pickle=False) as saved:
                return int(saved["generation"])
        except (OSError, ValueError, KeyError):
            return None

    @classmethod
    def load(cls, directory: Path) -> KeywordIndex | None:
        """The index saved in ``directory``; None if there is none or it cannot be read."""
        path = directory / FILE_NAME
        if not path.is_file():
            return None
        try:
            with np.load(path, allow_pickle=False) as saved:
                index = cls(int(saved["generation"]))
                index._vocabulary = {term: i for i, term in enumerate(saved["vocabulary"].tolist())}
                counts = csr_matrix(
                    (saved["data"], saved["indices"], saved["indptr"]), shape=(len(index._vocabulary), len(saved["keys"]))
                )
                index._main = _Segment(counts, saved["keys"], saved["lengths"])
        except (OSError, ValueError, KeyError) as error:
            logger.warning("%s cannot be read (%s)", path, error)
            return None
        return index


#: entries copied per step of :func:`_scatter` (its scratch arrays are a few times this many)
_SCATTER_BLOCK = 1 << 20


def _live_entries(segment: _Segment, terms: int) -> np.ndarray:
    """How many live columns hold each of ``terms`` vocabulary entries in ``segment``."""
    indptr = segment.counts.indptr
    entries = np.zeros(terms, dtype=np.int64)
    entries[: len(indptr) - 1] = np.diff(indptr)
    if segment.alive < len(segment.keys):
        dead = np.flatnonzero((segment.lengths == 0)[segment.counts.indices])
        entries -= np.bincount(np.searchsorted(indptr, dead, side="right") - 1, minlength=terms)
    return entries


def _scatter(counts: csr_matrix, place: np.ndarray, free: np.ndarray, indices: np.ndarray, data: np.ndarray) -> None:
    """Copy the entries of ``counts`` whose column has a ``place`` (>= 0) into ``indices`` / ``data``, each
    term's from its ``free`` slot on, a block of terms at a time."""
    indptr, rows = counts.indptr, counts.shape[0]
    first = 0
    while first < rows:
        last = max(first + 1, min(rows, int(np.searchsorted(indptr, indptr[first] + _SCATTER_BLOCK, side="right")) - 1))
        start, end = indptr[first], indptr[last]
        columns = place[counts.indices[start:end]]
        row = np.repeat(np.arange(first, last), np.diff(indptr[first : last + 1]))
        values = counts.data[start:end]
        kept = columns >= 0
        if not kept.all():
            columns, row, values = columns[kept], row[kept], values[kept]
        held = np.bincount(row - first, minlength=last - first)
        row_start = np.cumsum(held) - held  # where each term's entries begin among those kept
        at = free[row] + (np.arange(len(row)) - row_start[row - first])
        indices[at] = columns
        data[at] = values
        first = last


def _distinct(found: np.ndarray, scores: np.ndarray, terms_matched: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row of :meth:`KeywordIndex._matches`'s postings once (a row holding several query terms is
    listed once per term)."""
    if terms_matched <= 1:
        return found, scores
    found, first = np.unique(found, return_index=True)
    return found, scores[first]


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
