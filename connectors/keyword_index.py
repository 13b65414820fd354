"""The FAISS store's keyword index: exact BM25 (:mod:`isotrope.lexical`'s formula) from a term x row
count matrix (``scipy.sparse``) kept in memory, and in ``keyword.npz`` beside the store.

A query reads the postings of its distinct terms only (numpy, vectorised), with the statistics of the
live rows (N, each term's live document frequency, the average length) computed exactly at query time,
so upserts and deletes never leave it approximate. Its top k stops early and stays exact (MaxScore,
:meth:`_Segment.best`): each term's largest contribution is bounded by a ceiling kept per term, so once
the rare terms have set a k-th score above what the frequent terms left can add, those are only looked
up for the rows still in the running instead of scored in full; the same bounds per range of columns
(the frequent terms' ceilings per range, one byte each) stop scoring a range early where the query's
terms are sparse. Small segments and queries with few postings score them all (:data:`PRUNE_ROWS`,
:data:`PRUNE_FROM`). Rows changed since the last merge sit in a small second matrix; the key's column
in the large one is dead meanwhile. ``merge`` folds them in once :data:`MERGE_ROWS` are pending or dead;
the file keeps both as they are (version 2), so a save never holds a merged copy beside the index.

The file records the SQLite generation it reflects (:class:`KeywordIndex.generation`); the store
compares it with the generation committed in SQLite and rebuilds the index from the stored texts when
they differ (a kill -9 between the SQLite commit and the file's rename, or a store written before).
Chosen by measurement (``benchmarks/keyword_engines.py``, docs/SCALING.md): tantivy ranks 35 of 200
queries' top 10 differently at 1M passages (one-byte length norms), Lance's inverted index keeps
deleted rows in its statistics, bm25s cannot update a row.
"""

from __future__ import annotations

import logging
import math
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
#: them into the large matrix
MERGE_ROWS = 50_000
#: the layout of ``keyword.npz``: 2 keeps dead columns and pending rows (1: merged, read as 2 without them)
VERSION = 2
#: the live rows of a segment and its postings of a query's terms from which its top k stops early: below
#: either, scoring every posting costs less CPU than the bounds and lookups (``python -m
#: benchmarks.keyword_engines --profile``, 200 real queries: scoring every posting cost less at 100,000 rows at
#: every depth, as much for the top 10 and less for the top 50 and 200 at 300,000; at 1,000,000 the early stop
#: cost 0.35 of it for the top 10, from 2**12 postings on)
PRUNE_ROWS = 500_000
PRUNE_FROM = 4096

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
        self._ceilings: tuple[float, np.ndarray] | None = None  # (reference average, each term's ceiling)
        self._ranges: _Ranges | None = None  # the frequent terms' ceilings per range of columns
        self._local = threading.local()

    def norm(self, average: float) -> np.ndarray:
        """``k1 * (1 - b + b * dl / avgdl)`` of each column (kept until the average changes)."""
        if self._norm is None or self._norm[0] != average:
            self._norm = (average, _length_norm(self.lengths, average))
        return self._norm[1]

    def ceilings(self) -> tuple[float, np.ndarray]:
        """``(reference, ceilings)``: each term's largest ``tf / (tf + k1 (1 - b + b dl / reference))`` over its
        postings (dead columns included: still a bound), ``reference`` the live columns' average length
        when first asked; saved with the index."""
        if self._ceilings is None:
            reference = self.length_sum / self.alive if self.alive else 1.0
            self._ceilings = (reference, _ceilings(self.counts, _length_norm(self.lengths, reference)))
        return self._ceilings

    def ranges(self) -> _Ranges:
        """Each frequent term's ceiling in each range of ``2**shift`` columns (at the reference of
        :meth:`ceilings`; saved with the index)."""
        if self._ranges is None:
            reference, ceilings = self.ceilings()
            self._ranges = _range_ceilings(
                self.counts, _length_norm(self.lengths, reference), ceilings, _range_shift(len(self.keys))
            )
        return self._ranges

    def reach(self, query: _Query, parts: list[Postings]) -> tuple[int, np.ndarray]:
        """``(shift, reach)``: ``reach[t, r]``, the most the query's terms ``t...`` add to the score of a row of
        columns ``r * 2**shift ...``: each term's :meth:`bounds` scaled by its ceiling in that range (a term
        of few postings: its bound in the ranges holding it), 0 in ranges without it."""
        bounds = self.bounds(query)
        ranges, (reference, ceilings) = self.ranges(), self.ceilings()
        count = (len(self.keys) - 1 >> ranges.shift) + 1 if len(self.keys) else 1
        per = np.zeros((len(parts) + 1, count))
        scale = max(1.0, query.average / reference)
        for t, (term, (columns, _)) in enumerate(zip(query.terms.tolist(), parts)):
            row = ranges.rows[term] if term < len(ranges.rows) else -1
            if row >= 0:
                per[t] = query.weights[t] * np.minimum(1.0, ceilings[term] * scale * ranges.ceilings[row] / _LEVELS)
            elif len(columns):
                per[t, columns >> ranges.shift] = bounds[t]
        return ranges.shift, np.cumsum(per[::-1], axis=0)[::-1]

    def bounds(self, query: _Query) -> np.ndarray:
        """The most each query term adds to the score of a row of this segment: its weight times its ceiling,
        which holds at the reference average; at a longer average ``avgdl`` a row's ``tf / (tf + k1 (1 - b +
        b dl / avgdl))`` grows by at most ``avgdl / reference`` (and stays below 1)."""
        reference, ceilings = self.ceilings()
        ceiling = np.zeros(len(query.terms))
        known = query.terms < len(ceilings)
        ceiling[known] = ceilings[query.terms[known]]
        return query.weights * np.minimum(1.0, ceiling * max(1.0, query.average / reference))

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

    def buffer(self) -> np.ndarray:
        """A zeroed float64 array with a slot per column, one per thread, reused by its queries (which zero
        what they touch)."""
        buffer = getattr(self._local, "buffer", None)
        if buffer is None:
            buffer = self._local.buffer = np.zeros(len(self.keys))
        return buffer

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

    def best(
        self, query: _Query, parts: list[Postings], k: int, allowed: np.ndarray | None = None, read: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, int, int, np.ndarray | None]:
        """The live (``allowed``) columns that can rank among this segment's ``k`` best for ``query`` (every
        one tied with the k-th among them) with their scores, and how many postings were scored and
        looked up. ``parts``: the query terms' postings here.

        MaxScore (Turtle & Flood 1995): terms are scored rarest first into the buffer, the k best rows seen
        brought up to date before each term of ``_CHECK`` postings or more; once the k-th of them exceeds the most the terms left can add (:meth:`bounds`), a row
        that none of the terms so far holds cannot rank, so the terms left are only looked up (binary
        search in their postings) for the rows seen, which drop out as soon as their score plus what is
        left falls below the k-th. The bounds are also kept per range of columns (:meth:`reach`: block-max,
        as in the live-block filtering of Mallia et al., WSDM 2021): a range whose unseen rows can no longer
        reach the k-th is scored no further; its rows seen get the terms they lack afterwards, in order (binary
        searches, or that term's postings in the stopped ranges where cheaper), and only the rows seen at or above their
        range's floor (the k-th less what the terms left can add there) are finished. Each row's terms are added in
        the same order on every path (the same floats). A segment of fewer than :data:`PRUNE_ROWS` live rows,
        a query with fewer than :data:`PRUNE_FROM` postings here, or one asking for every live row, scores
        every posting, all terms in one vectorised pass: then the BM25 of the columns ``read`` comes back too (the
        floats :func:`_looked_up` gives), else None."""
        norm, total = self.norm(query.average), self.buffer()
        prunes = PRUNE_ROWS <= self.alive > k and sum(len(columns) for columns, _ in parts) >= PRUNE_FROM
        check = _CHECK if prunes else math.inf
        left = np.append(np.cumsum(self.bounds(query)[::-1])[::-1], 0.0)  # left[t]: the most terms t... add
        # reach[t, r]: the same for the rows of range r (columns >> shift); one range when not pruning
        shift, reach = self.reach(query, parts) if prunes else (62, left[:, None])
        ended = len(parts)
        switch = np.full(reach.shape[1], ended)  # per range, the term from which its rows are only looked up
        leaders, kth = np.zeros(0, np.int64), 0.0  # the k best rows seen (all, while fewer) and the k-th score
        touched: list[np.ndarray] = []  # the columns of each term scored
        scored = searched = term = checked = 0
        try:
            if not prunes and parts:  # every posting at once, in term order: each row's terms add up as term by term
                columns = np.concatenate([columns for columns, _ in parts])
                weights = np.repeat(query.weights[: len(parts)], [len(columns) for columns, _ in parts])
                counts = np.concatenate([counts for _, counts in parts])
                np.add.at(total, columns, _contribution(weights, counts, norm[columns]))
                touched.append(columns)
                scored, term = len(columns), len(parts)
            while term < len(parts) and left[term] >= kth * _MARGIN:
                columns, counts = parts[term]
                if kth > 0 and len(switch) > 1:  # ranges whose rows seen by no term so far cannot rank any more
                    switch[(switch == ended) & (reach[term] < kth * _MARGIN)] = term
                    if (switch < ended).all():
                        break
                    if (switch < ended).any():
                        scoring = (switch == ended)[columns >> shift]
                        columns, counts = columns[scoring], counts[scoring]
                total[columns] += _contribution(query.weights[term], counts, norm[columns])
                touched.append(columns)
                scored += len(columns)
                term += 1
                if term < len(parts) and len(parts[term][0]) >= check:  # worth knowing whether to score it
                    leaders, kth = _leaders(total, leaders, touched[checked:], kth, k, allowed)
                    checked = term
            # per range, the least score a row scored so far needs to reach the k-th with what its range's terms left
            # can add (with slack for rounding; at least > 0: a row no term scored is no candidate)
            floor = (kth * _MARGIN - reach[np.minimum(switch, term), np.arange(len(switch))]) * _MARGIN
            floor = np.maximum(floor, np.finfo(np.float64).tiny)
            if scored * 128 < len(self.keys):  # the rows scored (sorted), from their postings or the whole buffer
                candidates = np.unique(np.concatenate(touched)) if touched else np.zeros(0, np.int64)
                candidates = candidates[total[candidates] >= (floor[candidates >> shift] if len(floor) > 1 else floor[0])]
            else:
                candidates = np.flatnonzero(total >= (np.repeat(floor, 1 << shift)[: len(total)] if len(floor) > 1 else floor[0]))
            if allowed is not None:
                candidates = candidates[allowed[candidates]]
            home = candidates >> shift if len(switch) > 1 else np.zeros(len(candidates), np.int64)
            after = np.minimum(switch[home], term)  # each candidate's first term not in its total yet
            for rest in range(int(after.min(initial=term)), len(parts)):
                partial = total[candidates]
                kth = max(kth, _kth(partial, k))
                kept = partial + np.take(reach, after * reach.shape[1] + home) >= kth * _MARGIN
                candidates, home, after = candidates[kept], home[kept], after[kept]
                columns, counts = parts[rest]
                needs = after == rest  # every candidate from ``term`` on
                if int(needs.sum()) * len(columns).bit_length() > len(columns):  # cheaper to score its postings
                    if rest < term:  # only in the ranges that stopped before it (the others have it)
                        scoring = switch[columns >> shift] <= rest
                        columns, counts = columns[scoring], counts[scoring]
                    total[columns] += _contribution(query.weights[rest], counts, norm[columns])
                    touched.append(columns)
                    scored += len(columns)
                else:
                    asking = candidates[needs]
                    hit, scores = _term_scores(parts[rest], query.weights[rest], norm, asking)
                    total[asking[hit]] += scores
                    searched += len(asking)
                after[needs] = rest + 1
            candidates = candidates[total[candidates] >= kth * _MARGIN]
            read_scores = total[read].astype(np.float64) if read is not None and not prunes else None
            return candidates, total[candidates], scored, searched, read_scores
        finally:  # the buffer is all zeros again, whatever was raised: the next query's scores start from 0
            for columns in touched:
                total[columns] = 0.0


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
        if len(self._pending) + len(self._main.keys) - self._main.alive > MERGE_ROWS:
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
        query, segments = self._plan(terms)
        found = [segment.best(query, parts, len(segment.keys))[:2] for segment, parts in segments]
        return _joined_keys(segments, found)

    def lookup(self, terms: Sequence[str], keys: np.ndarray) -> np.ndarray:
        """The BM25 of each of ``keys`` (0 for a row sharing no term, or not live), in their order."""
        query, segments = self._plan(terms)
        return _looked_up(query, segments, keys)

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
        scored = searched = 0
        wanted = np.zeros(0, np.int64) if lookup is None else np.asarray(lookup, dtype=np.int64)
        looked: np.ndarray | None = np.zeros(len(wanted))
        for segment, parts in segments:
            at, held = segment.find(wanted) if len(wanted) else (wanted, np.zeros(0, bool))
            columns, scores, touched, looked_up, read = segment.best(
                query, parts, k, None if keys is None else segment.holding(keys), at[held]
            )
            found.append((columns, scores))
            scored, searched = scored + touched, searched + looked_up
            if read is None and len(wanted):  # a segment that stopped early: the keys are looked up after
                looked = None
            elif looked is not None and read is not None:
                looked[held] += read
        if logger.isEnabledFor(logging.DEBUG):
            every = sum(len(columns) for _, parts in segments for columns, _ in parts)
            logger.debug(
                "keyword top %d of %d terms: %d of %d postings scored, %d looked up", k, len(query.terms), scored, every, searched
            )
        found_keys, scores = _joined_keys(segments, found)
        if len(found_keys) > k:
            kth = scores[np.argpartition(-scores, k - 1)[k - 1]]
            tied = np.flatnonzero(scores >= kth)  # every row tied with the k-th, so ties go by key
            found_keys, scores = found_keys[tied], scores[tied]
        order = np.lexsort((found_keys, -scores))[:k]
        return found_keys[order], scores[order], _looked_up(query, segments, wanted) if looked is None else looked

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
        reference, ceilings = main.ceilings()
        ranges = main.ranges()
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
                reference=np.float64(reference),
                ceilings=ceilings,
                range_shift=np.int64(ranges.shift),
                range_terms=np.flatnonzero(ranges.rows >= 0),
                range_ceilings=ranges.ceilings,
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
                if "ceilings" in saved.files:  # else (a file of an earlier version) computed on first use
                    index._main._ceilings = (float(saved["reference"]), saved["ceilings"])
                if version > 1:
                    rows = np.full(counts.shape[0], -1, dtype=np.int64)
                    rows[saved["range_terms"]] = np.arange(len(saved["range_terms"]))
                    index._main._ranges = _Ranges(int(saved["range_shift"]), rows, saved["range_ceilings"])
                    ends = np.cumsum(saved["pending_lengths"])
                    terms = np.split(saved["pending_terms"], ends[:-1]) if len(ends) else []
                    index._pending = dict(zip(saved["pending_keys"].tolist(), terms))
        except (OSError, ValueError, KeyError) as error:
            logger.warning("%s cannot be read (%s)", path, error)
            return None
        return index


#: entries read per step of :func:`_scatter` and :func:`_ceilings` (their scratch arrays are a few times this many)
_SCATTER_BLOCK = 1 << 20
#: postings of the next term from which the k-th score is brought up to date before it (the check costs
#: about as much as scoring this many)
_CHECK = 1024
#: a bound must fall this far below the k-th score to prune (float sums in another order differ by ulps)
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


def _ceilings(counts: csr_matrix, norm: np.ndarray) -> np.ndarray:
    """Each term's largest ``tf / (tf + norm)`` over its postings (0: none), a block of terms at a time."""
    indptr, ceilings = counts.indptr, np.zeros(counts.shape[0])
    for first, last in _term_blocks(indptr):
        start, end = indptr[first], indptr[last]
        tf = counts.data[start:end]
        ratio = tf / (tf + norm[counts.indices[start:end]])  # the expression of _contribution: the same floats
        held = first + np.flatnonzero(np.diff(indptr[first : last + 1]))
        if len(held):
            ceilings[held] = np.maximum.reduceat(ratio, indptr[held] - start)
    return ceilings


class _Ranges(NamedTuple):
    """The ceilings of a segment's frequent terms per range of ``2**shift`` columns: ``rows[term]`` (-1: not
    kept) is the term's row of ``ceilings``, whose entries are its ceiling in each range as a fraction of its
    ceiling over all columns, in :data:`_LEVELS` steps rounded up (0: no posting in the range)."""

    shift: int
    rows: np.ndarray
    ceilings: np.ndarray


#: the most column ranges a segment is cut into, and their least width (a power of two)
_RANGES = 2048
_RANGE_WIDTH = 128
#: steps of a term's ceiling per range (one byte)
_LEVELS = 255


def _range_shift(columns: int) -> int:
    """The power of two of the range width for a segment of ``columns``."""
    return (max(_RANGE_WIDTH, -(-columns // _RANGES)) - 1).bit_length()


def _range_ceilings(counts: csr_matrix, norm: np.ndarray, ceilings: np.ndarray, shift: int) -> _Ranges:
    """:class:`_Ranges` of the terms holding at least a quarter as many postings as there are ranges (the
    others' bounds come from their postings at query time), a block of terms at a time."""
    indptr = counts.indptr
    count = (counts.shape[1] - 1 >> shift) + 1 if counts.shape[1] else 1
    held = np.diff(indptr)
    kept = np.flatnonzero(held >= max(1, count // 4))
    rows = np.full(counts.shape[0], -1, dtype=np.int64)
    rows[kept] = np.arange(len(kept))
    levels = np.zeros((len(kept), count), dtype=np.uint8)
    for first, last in _term_blocks(indptr):
        start, end = indptr[first], indptr[last]
        term = np.repeat(np.arange(first, last), held[first:last])
        keep = rows[term] >= 0
        if not keep.any():
            continue
        tf, columns, term = counts.data[start:end][keep], counts.indices[start:end][keep], term[keep]
        ratio = tf / (tf + norm[columns])  # the expression of _contribution: the same floats
        level = np.minimum(np.ceil(ratio / ceilings[term] * _LEVELS * (1 + 1e-9)), _LEVELS).astype(np.uint8)
        place = rows[term] * count + (columns >> shift)  # runs of one term and range where columns are sorted
        runs = np.flatnonzero(np.r_[True, place[1:] != place[:-1]])
        np.maximum.at(levels.reshape(-1), place[runs], np.maximum.reduceat(level, runs))
    return _Ranges(shift, rows, levels)


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


def _leaders(
    total: np.ndarray, leaders: np.ndarray, scored: list[np.ndarray], kth: float, k: int, allowed: np.ndarray | None
) -> tuple[np.ndarray, float]:
    """The ``k`` best (``allowed``) rows by ``total`` once the columns of the terms ``scored`` since the
    former ``leaders`` were added, and the k-th score (0 while fewer than k): they are among the former
    leaders and the scored columns now at or above the former k-th; every other row is at or below it."""
    changed = np.concatenate(scored) if len(scored) > 1 else scored[0]
    risen = total[changed] >= kth
    if allowed is not None:
        risen &= allowed[changed]
    pool = np.concatenate([leaders, changed[risen]])  # a row at most once per term and once as a leader
    values = total[pool]
    reach = k * (len(scored) + 1)  # so the best ``reach`` entries hold the k best rows
    if len(pool) > reach:
        best = np.argpartition(-values, reach - 1)[:reach]
        pool, values = pool[best], values[best]
    pool, first = np.unique(pool, return_index=True)
    if len(pool) < k:
        return pool, 0.0
    values = values[first]
    best = np.argpartition(-values, k - 1)[:k]
    return pool[best], float(values[best].min())


def _kth(values: np.ndarray, k: int) -> float:
    """The k-th largest of ``values`` (0 while fewer)."""
    return float(np.partition(values, len(values) - k)[len(values) - k]) if len(values) >= k else 0.0


def _joined_keys(
    segments: list[tuple[_Segment, list[Postings]]], found: list[tuple[np.ndarray, np.ndarray]]
) -> tuple[np.ndarray, np.ndarray]:
    """The keys and scores of each segment's ``(columns, scores)``, one array each."""
    if not found:
        return np.empty(0, np.int64), np.empty(0, np.float64)
    keys = np.concatenate([segment.keys[columns] for (segment, _), (columns, _) in zip(segments, found)])
    return keys, np.concatenate([scores for _, scores in found])


def _looked_up(query: _Query, segments: list[tuple[_Segment, list[Postings]]], keys: np.ndarray) -> np.ndarray:
    """The BM25 of each of ``keys`` (0 for a row sharing no term, or not live), by binary search in the
    postings, each row's terms added in :meth:`_Segment.best`'s order (the same floats)."""
    keys = np.asarray(keys, dtype=np.int64)
    looked = np.zeros(len(keys))
    for segment, parts in segments:
        at, held = segment.find(keys)
        columns, norm = at[held], segment.norm(query.average)
        scores = np.zeros(len(columns))
        for weight, postings in zip(query.weights, parts):
            hit, found = _term_scores(postings, weight, norm, columns)
            scores[hit] += found
        looked[held] += scores
    return looked


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
