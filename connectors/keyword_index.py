"""The FAISS store's keyword index: exact BM25 (:mod:`isotrope.lexical`'s formula) from a term x row
count matrix (``scipy.sparse``) kept in memory, and in ``keyword.npz`` beside the store.

A query reads the postings of its distinct terms only, with the statistics of the live rows (N, each
term's live document frequency, the average length) computed exactly at query time, so upserts and deletes
never leave it approximate. Its top k is a compiled top-n pass (``sparse_dot_topn``) over each posting's
impact ``tf / (tf + k1 (1 - b + b dl / avgdl))`` kept at a reference average, its rows scored again exactly
and proved to hold every row that can rank (:meth:`_Segment._top_n`); a query of few postings, and every-row
scores, are summed in NumPy. Rows changed since the last merge sit in a small second
matrix; the key's column in the large one is dead meanwhile. ``merge`` folds them in once
:data:`MERGE_ROWS` (or :data:`MERGE_SHARE`) are pending or dead; the file keeps both as they are, so a save never holds a merged copy
beside the index.

The file records the SQLite generation it reflects (:class:`KeywordIndex.generation`); the store
compares it with the generation committed in SQLite and rebuilds the index from the stored texts when
they differ (a kill -9 between the SQLite commit and the file's rename, or a store written before).
Chosen by measurement (``benchmarks/keyword_engines.py``, docs/SCALING.md): tantivy ranks 35 of 200
queries' top 10 differently at 1M passages (one-byte length norms), Lance's inverted index keeps
deleted rows in its statistics, bm25s cannot update a row; NumPy's MaxScore with block-max bounds (the
previous engine) took 17 ms for a hybrid query's top 200 at 1M rows, the top-n pass 4–5 ms.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from isotrope.lexical import K1, B

from .faiss_index import fsync_dir

if TYPE_CHECKING:
    from scipy.sparse import csr_matrix

logger = logging.getLogger(__name__)

FILE_NAME = "keyword.npz"
#: rows changed since the last merge (pending, and dead in the large matrix) beyond which a change merges
#: them into the large matrix: more than ``MERGE_SHARE`` of its live rows, or than ``MERGE_ROWS`` (each query
#: scores both matrices: at 100k rows, a second matrix of 50k cost a second top-n pass and lookups)
MERGE_ROWS = 50_000
MERGE_SHARE = 0.125
#: the layout of ``keyword.npz``: 3 as 2 without the term bounds of the early stop (read and ignored); 2 keeps
#: dead columns and pending rows (1: merged, read as 2 without them)
VERSION = 3
#: a segment's postings of a query's terms from which its top k is the compiled top-n pass
#: (:meth:`_Segment._top_n`) rather than every posting scored in NumPy
TOP_N_FROM = 4096
#: how far (a ratio) the live rows' average length may move from the one the impacts were computed at before
#: they are computed again: the further it moves, the deeper a top-n pass reads to stay exact
DRIFT = 1.01

#: a term's live columns in a segment (ascending) and its counts there
Postings = tuple[np.ndarray, np.ndarray]


class _Query(NamedTuple):
    """A query's distinct terms held by live rows (vocabulary ids, rarest first), each one's ``idf * (k1 +
    1)``, and the live rows' average length."""

    terms: np.ndarray
    weights: np.ndarray
    average: float


class _Segment:
    """Rows as a term x column count matrix over a shared vocabulary, with each column's key and length
    (0: a dead column), columns in key order."""

    def __init__(self, counts: csr_matrix, keys: np.ndarray, lengths: np.ndarray) -> None:
        self.counts, self.keys, self.lengths = counts, keys, lengths.astype(np.float64)
        self.alive = int((self.lengths > 0).sum())  # live columns
        self.length_sum = float(self.lengths.sum())
        self._norm: tuple[float, np.ndarray] | None = None  # (average length, each column's BM25 length norm)
        self._impacts: tuple[float, csr_matrix] | None = None  # (reference average, each posting's impact there)

    def norm(self, average: float) -> np.ndarray:
        """``k1 * (1 - b + b * dl / avgdl)`` of each column (kept until the average changes)."""
        if self._norm is None or self._norm[0] != average:
            self._norm = (average, _length_norm(self.lengths, average))
        return self._norm[1]

    def impacts(self, average: float) -> tuple[float, csr_matrix]:
        """``(reference, impacts)``: each posting's ``tf / (tf + k1 (1 - b + b dl / reference))`` in a matrix of
        the counts' shape and structure (dead columns included), computed at the live average when first
        asked and again once ``average`` has moved beyond :data:`DRIFT` from ``reference``."""
        if self._impacts is None or not 1 / DRIFT <= average / self._impacts[0] <= DRIFT:
            counts, norm = self.counts, self.norm(average)
            data = np.empty(counts.nnz)
            for first, last in _term_blocks(counts.indptr):  # a block at a time: no temporaries of every posting
                start, end = counts.indptr[first], counts.indptr[last]
                data[start:end] = _contribution(1.0, counts.data[start:end], norm[counts.indices[start:end]])
            self._impacts = (average, _csr_matrix((data, counts.indices, counts.indptr), counts.shape))
        return self._impacts

    @classmethod
    def of(cls, rows: Sequence[tuple[int, np.ndarray]], terms: int) -> _Segment:
        """The segment of ``(key, term ids)`` rows with distinct keys, over ``terms`` vocabulary entries."""
        rows = sorted(rows, key=lambda row: row[0])
        lengths = np.fromiter((len(ids) for _, ids in rows), dtype=np.int64, count=len(rows))
        term_ids = np.concatenate([ids for _, ids in rows]) if rows else np.empty(0, np.int32)
        columns = np.repeat(np.arange(len(rows), dtype=np.int32), lengths)
        counts = _csr_matrix((np.ones(len(term_ids), np.float32), (term_ids, columns)), (terms, len(rows)))
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
        counts = _csr_matrix((data, indices, indptr.astype(index_type)), (terms, len(keys)))
        if reordered:
            counts.has_sorted_indices = False
            counts.sort_indices()
        return cls(counts, keys, lengths)

    def postings(self, term: int) -> Postings:
        """The live columns holding ``term`` and its counts there."""
        if term >= self.counts.shape[0]:
            return np.empty(0, np.int64), np.empty(0, np.float32)
        start, end = self.counts.indptr[term], self.counts.indptr[term + 1]
        columns, counts = self.counts.indices[start:end], self.counts.data[start:end]
        if self.alive == len(self.keys):
            return columns, counts
        keep = self.lengths[columns] > 0
        return columns[keep], counts[keep]

    def find(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each of ``keys``' column, and whether it is a live column of this segment (else the column is arbitrary)."""
        if not len(self.keys):
            return np.zeros(len(keys), np.int64), np.zeros(len(keys), bool)
        at = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        return at, (self.keys[at] == keys) & (self.lengths[at] > 0)

    def holding(self, keys: np.ndarray) -> np.ndarray:
        """A mask of the live columns of ``keys``."""
        at, held = self.find(keys)
        mask = np.zeros(len(self.keys), dtype=bool)
        mask[at[held]] = True
        return mask

    def kill(self, keys: np.ndarray) -> None:
        """Mark the columns of ``keys`` dead (keys absent are ignored)."""
        at, held = self.find(keys)
        at = np.unique(at[held])
        self.alive -= len(at)
        self.length_sum -= float(self.lengths[at].sum())
        self.lengths[at] = 0.0
        self._norm = None

    def score(self, query: _Query, parts: list[Postings], columns: np.ndarray) -> np.ndarray:
        """The BM25 of each of the live ``columns`` (0 where it holds no query term), by binary search in
        ``parts``, each row's terms added in the query's order (the floats of every path)."""
        norm, scores = self.norm(query.average), np.zeros(len(columns))
        for weight, postings in zip(query.weights, parts):
            hit, found = _term_scores(postings, weight, norm, columns)
            scores[hit] += found
        return scores

    def best(
        self, query: _Query, parts: list[Postings], k: int, allowed: np.ndarray | None = None, read: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, int, np.ndarray | None]:
        """The live (``allowed``) columns that can rank among this segment's ``k`` best for ``query`` (every
        one tied with the k-th among them) with their scores, how many columns were asked of the top-n pass
        (0: every posting scored), and the BM25 of the columns ``read`` where every posting was scored (the
        floats :meth:`score` gives), else None. ``parts``: the query terms' postings here.

        A query of at least :data:`TOP_N_FROM` postings here asking fewer than the live rows is answered by
        :meth:`_top_n`; the others, and a filter that leaves fewer than ``k`` rows in a quarter of the columns'
        top n, score every posting (vectorised, in term order)."""
        if sum(len(columns) for columns, _ in parts) >= TOP_N_FROM and k < self.alive:
            found = self._top_n(query, parts, k, allowed)
            if found is not None:
                return (*found, None)
        if not parts:
            return np.zeros(0, np.int64), np.zeros(0), 0, None if read is None else np.zeros(len(read))
        columns = np.concatenate([columns for columns, _ in parts])
        weights = np.repeat(query.weights[: len(parts)], [len(columns) for columns, _ in parts])
        counts = np.concatenate([counts for _, counts in parts])
        norm = self.norm(query.average)
        # bincount adds each column's terms in term order, as :meth:`score` does
        total = np.bincount(columns, _contribution(weights, counts, norm[columns]), minlength=len(self.keys))
        candidates = np.flatnonzero(total)
        if allowed is not None:
            candidates = candidates[allowed[candidates]]
        return candidates, total[candidates], 0, None if read is None else total[read]

    def _top_n(
        self, query: _Query, parts: list[Postings], k: int, allowed: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, int] | None:
        """:meth:`best`'s rows from a compiled top ``n`` of the query's weights times the rows of its terms in
        :meth:`impacts` (:func:`_top_n_pass`), or None where ``n`` would pass a quarter of the columns before
        ``k`` live (allowed) ones are found.

        Dead and filtered columns are dropped. At the impacts' own average the pass's sums are the exhaustive
        path's floats (each posting's weight times its impact, added in term order); at another, each column
        found is scored again exactly (:meth:`score`). A column not found has an impact-sum of at most the
        n-th's, and its exact score exceeds its impact-sum by at most ``avgdl / reference`` (a longer average
        shortens every length norm by at most that factor): the k-th exact score above that bound proves that
        every row that can rank was found. Else (ties at the n-th, or a drifted average) a second pass takes
        every column whose impact-sum can reach the k-th."""
        reference, impacts = self.impacts(query.average)
        held = query.terms < impacts.shape[0]
        terms, weights = query.terms[held], query.weights[held]
        grow = max(1.0, query.average / reference) / _MARGIN  # a column's exact score over its impact-sum, at most

        def found(n: int, threshold: float) -> tuple[np.ndarray, np.ndarray, bool, float]:
            """The live (allowed) columns of the top ``n`` above ``threshold``, their scores, whether every
            column above ``threshold`` was found, and the most a column not found can score."""
            columns, sums = _top_n_pass(weights, terms, impacts, n, threshold)
            kept = self.lengths[columns] > 0
            if allowed is not None:
                kept &= allowed[columns]
            columns = columns[kept].astype(np.int64)
            scores = sums[kept] if reference == query.average else self.score(query, parts, columns)
            return columns, scores, len(sums) < n, float(sums.min()) * grow if len(sums) else 0.0

        # enough columns for k live (allowed) ones where the others are spread evenly, and a few for ties
        eligible = self.alive if allowed is None else int(np.count_nonzero(allowed))
        n = int(k * len(self.keys) / max(eligible, 1)) + 16
        while True:
            columns, scores, complete, bound = found(n, 0.0)
            if complete:
                return columns, scores, n
            if len(scores) >= k:
                break
            if 16 * n > len(self.keys):
                return None
            n *= 4
        kth = _kth(scores, k)
        if kth <= bound:  # a column not found may reach the k-th: take every one whose impact-sum can
            columns, scores, _, _ = found(len(self.keys), kth / grow * _MARGIN)
            kth = _kth(scores, k)
            n = len(self.keys)
        keep = scores >= kth
        return columns[keep], scores[keep], n


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
        if len(self._pending) + len(self._main.keys) - self._main.alive > min(MERGE_ROWS, MERGE_SHARE * self._main.alive):
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

    @property
    def pending(self) -> int:
        """Rows changed since the last merge (kept apart from the large matrix until :meth:`merge`)."""
        return len(self._pending)

    def scores(self, terms: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(keys, BM25)`` of the live rows sharing a term with the query (its distinct ``terms``); each row
        once, unordered."""
        query, segments = self._plan(terms)
        found = [segment.best(query, parts, len(segment.keys))[:2] for segment, parts in segments]
        return _joined_keys(segments, found)

    def lookup(self, terms: Sequence[str], keys: np.ndarray) -> np.ndarray:
        """The BM25 of each of ``keys`` (0 for a row sharing no term, or not live), in their order."""
        query, segments = self._plan(terms)
        keys = np.asarray(keys, dtype=np.int64)
        looked = np.zeros(len(keys))
        for segment, parts in segments:
            at, held = segment.find(keys)
            looked[held] += segment.score(query, parts, at[held])
        return looked

    def top(self, terms: Sequence[str], k: int, keys: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` best ``(keys, scores)`` among ``keys`` (all live rows where None), best first, ties by key.
        Each segment gives the rows that can rank among its own ``k`` best (:meth:`_Segment.best`, exact), so
        the ``k`` best of all are among them."""
        found_keys, scores, _ = self.top_and_lookup(terms, k, keys)
        return found_keys, scores

    def top_and_lookup(
        self, terms: Sequence[str], k: int, keys: np.ndarray | None = None, lookup: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`top`, and the BM25 of each of ``lookup`` as :meth:`lookup` gives it: read from the scores of a
        segment that scored every posting (hybrid search's dense candidates at no extra cost), else looked up."""
        query, segments = self._plan(terms)
        found: list[tuple[np.ndarray, np.ndarray]] = []
        asked = []
        wanted = np.zeros(0, np.int64) if lookup is None else np.asarray(lookup, dtype=np.int64)
        looked = np.zeros(len(wanted))
        for segment, parts in segments:
            at, held = segment.find(wanted) if len(wanted) else (wanted, np.zeros(0, bool))
            columns, scores, top_n, read = segment.best(
                query, parts, k, None if keys is None else segment.holding(keys), at[held]
            )
            found.append((columns, scores))
            asked.append(top_n)
            if len(wanted):  # read from a pass that scored every posting, else looked up
                looked[held] += read if read is not None else segment.score(query, parts, at[held])
        if logger.isEnabledFor(logging.DEBUG):
            every = sum(len(columns) for _, parts in segments for columns, _ in parts)
            logger.debug(
                "keyword top %d of %d terms, %d postings: top n asked %s (0: all scored)", k, len(query.terms), every, asked
            )
        found_keys, scores = _joined_keys(segments, found)
        if len(found_keys) > k:
            kth = scores[np.argpartition(-scores, k - 1)[k - 1]]
            tied = np.flatnonzero(scores >= kth)  # every row tied with the k-th, so ties go by key
            found_keys, scores = found_keys[tied], scores[tied]
        order = np.lexsort((found_keys, -scores))[:k]
        return found_keys[order], scores[order], looked

    def _plan(self, terms: Sequence[str]) -> tuple[_Query, list[tuple[_Segment, list[Postings]]]]:
        """The query's distinct ``terms`` held by live rows, rarest first, with their weights, and each
        segment with live rows beside its postings of those terms (each read once)."""
        segments = [s for s in (self._main, self._pending_segment()) if s.alive]
        n_docs = float(sum(s.alive for s in segments))
        ids = [i for term in dict.fromkeys(terms) if (i := self._vocabulary.get(term)) is not None]
        if n_docs == 0 or not ids:
            return _Query(np.zeros(0, np.int64), np.zeros(0), 1.0), []
        postings = [[segment.postings(term) for term in ids] for segment in segments]
        df = np.array([sum(len(parts[t][0]) for parts in postings) for t in range(len(ids))], dtype=np.float64)
        order = [t for t in np.argsort(df, kind="stable").tolist() if df[t] > 0]
        idf = np.log1p((n_docs - df[order] + 0.5) / (df[order] + 0.5))  # > 0: a matching row scores > 0
        average = sum(s.length_sum for s in segments) / n_docs
        query = _Query(np.array(ids, dtype=np.int64)[order], idf * (K1 + 1), average)
        return query, [(segment, [parts[t] for t in order]) for segment, parts in zip(segments, postings)]

    # ------------------------------------------------------------------ the file

    def save(self, directory: Path) -> Path:
        """Write the index under a temporary name (fsynced); the caller renames it into place once SQLite
        has committed :attr:`generation`. The large matrix is written as it is, dead columns included, and
        the rows pending beside it as their term ids: no merged copy is made (at a million rows a merge
        held a second copy of the matrix at the commit that builds the FAISS index)."""
        # a name of its own: threads of one process, or two readers rebuilding a lagging index, may save at once
        tmp = directory / f"{FILE_NAME}.{os.getpid()}-{threading.get_ident()}.tmp"
        main = self._main
        pending = list(self._pending.values())
        with open(tmp, "wb") as handle:
            np.savez(
                handle,
                version=np.int64(VERSION),
                generation=np.int64(self.generation),
                vocabulary=np.array(list(self._vocabulary), dtype=object).astype(str),
                indptr=main.counts.indptr,
                indices=main.counts.indices,
                data=main.counts.data,
                keys=main.keys,
                lengths=main.lengths,
                pending_keys=np.fromiter(self._pending, dtype=np.int64, count=len(pending)),
                pending_lengths=np.fromiter(map(len, pending), dtype=np.int64, count=len(pending)),
                pending_terms=np.concatenate(pending) if pending else np.zeros(0, np.int32),
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
        return cls.read(path) if path.is_file() else None

    @classmethod
    def read(cls, path: Path) -> KeywordIndex | None:
        """The index saved in the file ``path`` (a file of version 1, merged, holds no pending rows); None if
        it cannot be read or is of a later version."""
        try:
            with np.load(path, allow_pickle=False) as saved:
                version = int(saved["version"]) if "version" in saved.files else 1
                if version > VERSION:
                    raise ValueError(f"version {version}; this isotrope reads up to {VERSION}")
                index = cls(int(saved["generation"]))
                index._vocabulary = {term: i for i, term in enumerate(saved["vocabulary"].tolist())}
                # terms first seen in pending rows have no row in the large matrix (:meth:`_Segment.postings`)
                indptr = saved["indptr"]
                counts = _csr_matrix((saved["data"], saved["indices"], indptr), (len(indptr) - 1, len(saved["keys"])))
                index._main = _Segment(counts, saved["keys"], saved["lengths"])
                if version > 1:  # (version 2's term bounds are not read)
                    ends = np.cumsum(saved["pending_lengths"])
                    terms = np.split(saved["pending_terms"], ends[:-1]) if len(ends) else []
                    index._pending = dict(zip(saved["pending_keys"].tolist(), terms))
        except (OSError, ValueError, KeyError) as error:
            logger.warning("%s cannot be read (%s)", path, error)
            return None
        return index


#: entries read per step of :func:`_scatter` and :meth:`_Segment.impacts` (their scratch arrays are a few times this many)
_SCATTER_BLOCK = 1 << 20
#: a bound must fall this far below the k-th score to prove a top k (float sums in another order differ by ulps)
_MARGIN = 1 - 1e-9


def _term_blocks(indptr: np.ndarray) -> Iterator[tuple[int, int]]:
    """Ranges ``[first, last)`` of the terms of a CSR ``indptr`` holding about ``_SCATTER_BLOCK`` entries
    each (at least one term)."""
    rows, first = len(indptr) - 1, 0
    while first < rows:
        last = max(first + 1, min(rows, int(np.searchsorted(indptr, indptr[first] + _SCATTER_BLOCK, side="right")) - 1))
        yield first, last
        first = last


def _live_entries(segment: _Segment, terms: int) -> np.ndarray:
    """How many live columns hold each of ``terms`` vocabulary entries in ``segment``."""
    indptr = segment.counts.indptr
    entries = np.zeros(terms, dtype=np.int64)
    entries[: len(indptr) - 1] = np.diff(indptr)
    if segment.alive < len(segment.keys):
        dead = np.flatnonzero((segment.lengths == 0)[segment.counts.indices])
        entries -= np.bincount(np.searchsorted(indptr, dead, side="right") - 1, minlength=terms)
    return entries


def _csr_matrix(arg: Any, shape: tuple[int, int]) -> csr_matrix:
    """scipy's CSR matrix, imported on first use: a store opened for dense search never loads scipy.sparse
    (about a tenth of a cold ``isotrope search``)."""
    from scipy.sparse import csr_matrix

    return csr_matrix(arg, shape=shape)


def _scatter(counts: csr_matrix, place: np.ndarray, free: np.ndarray, indices: np.ndarray, data: np.ndarray) -> None:
    """Copy the entries of ``counts`` whose column has a ``place`` (>= 0) into ``indices`` / ``data``, each
    term's from its ``free`` slot on, a block of terms at a time."""
    indptr = counts.indptr
    for first, last in _term_blocks(indptr):
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


def _top_n_pass(
    weights: np.ndarray, terms: np.ndarray, impacts: csr_matrix, n: int, threshold: float
) -> tuple[np.ndarray, np.ndarray]:
    """``(columns, sums)``: the ``n`` largest sums above ``threshold`` of ``weights`` times the ``terms`` rows of
    ``impacts``, each column's terms added in their order (sparse_dot_topn's compiled kernel, unordered).
    Its core is called directly: the public ``sp_matmul_topn`` copies the matrix's index arrays on every
    call (440 MB a query at a million rows), and slicing the query's rows first copies them (a query of
    5M postings: 149 ms cold against 30 ms in place)."""
    from sparse_dot_topn import _core

    index_type = impacts.indices.dtype
    sums, columns, _ = _core.sp_matmul_topn(
        top_n=n,
        nrows=1,
        ncols=impacts.shape[1],
        threshold=threshold,
        density=1.0,
        A_data=np.ascontiguousarray(weights, dtype=np.float64),
        A_indptr=np.array([0, len(terms)], dtype=impacts.indptr.dtype),
        A_indices=terms.astype(index_type),
        B_data=impacts.data,
        B_indptr=impacts.indptr,
        B_indices=impacts.indices,
    )
    return columns, sums


def _length_norm(lengths: np.ndarray, average: float) -> np.ndarray:
    """BM25's ``k1 * (1 - b + b * dl / avgdl)`` of rows of ``lengths``."""
    return K1 * (1 - B + B * lengths / average)


def _contribution(weight: float | np.ndarray, counts: np.ndarray, norm: np.ndarray) -> np.ndarray:
    """A term's BM25 in rows where it occurs ``counts`` times, ``weight`` its ``idf * (k1 + 1)`` (or each posting's)."""
    return weight * (counts / (counts + norm))


def _term_scores(postings: Postings, weight: float, norm: np.ndarray, columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which of ``columns`` (live) hold the term of ``postings`` (binary search), and its BM25 there."""
    held, counts = postings
    if not len(held) or not len(columns):
        return np.zeros(0, np.int64), np.zeros(0)
    at = np.minimum(np.searchsorted(held, columns), len(held) - 1)
    hit = np.flatnonzero(held[at] == columns)
    return hit, _contribution(weight, counts[at[hit]], norm[columns[hit]])


def _kth(values: np.ndarray, k: int) -> float:
    """The k-th largest of ``values`` (at least ``k`` of them)."""
    return float(np.partition(values, len(values) - k)[len(values) - k])


def _joined_keys(
    segments: list[tuple[_Segment, list[Postings]]], found: list[tuple[np.ndarray, np.ndarray]]
) -> tuple[np.ndarray, np.ndarray]:
    """The keys and scores of each segment's ``(columns, scores)``, one array each."""
    if not found:
        return np.empty(0, np.int64), np.empty(0, np.float64)
    keys = np.concatenate([segment.keys[columns] for (segment, _), (columns, _) in zip(segments, found)])
    return keys, np.concatenate([scores for _, scores in found])


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
