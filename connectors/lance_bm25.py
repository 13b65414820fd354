"""The BM25 statistics of a LanceDB store's keyword index, kept beside the table, and the BM25 of given rows
computed from them as Lance's full-text index computes it.

Hybrid search needs the BM25 of its dense candidates; asking Lance for it is a third query (the full-text
query restricted to those rows). With these statistics (rows that have terms, their total length, each term's
document frequency) it is computed from the rows' ``terms`` instead. They live in a small Lance dataset,
``<table>.bm25`` beside ``<table>.lance`` (one row per term; the totals and the rows described, as fragment ids
and deleted-row counts, in its schema metadata), rewritten atomically at each commit that refreshes the
full-text index: the previous statistics plus the fragments added since, or every row counted again after
deletes and updates. They are used only while they describe the table's current rows; otherwise the third
query answers.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from isotrope.lexical import K1, B

from .lance_rows import signature

logger = logging.getLogger(__name__)

#: the statistics dataset of table T: ``T.bm25`` (not ``*.lance``: LanceDB lists no such table)
SUFFIX = ".bm25"
_META = "isotrope.bm25"
#: Lance scores in float32
_F32 = np.float32


def _combined(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    return array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array


def _term_counts(terms: pa.Array | pa.ChunkedArray) -> tuple[int, int, pa.Table]:
    """Rows holding at least one term, their total term count, and each term's row count (``term``, ``df``)
    among space-joined analyzed texts."""
    tokens = pc.split_pattern(_combined(terms), " ")
    pairs = pa.table({"term": pc.list_flatten(tokens), "row": pc.list_parent_indices(tokens)})
    pairs = pairs.filter(pc.not_equal(pairs.column("term"), ""))  # "" (a text without terms) splits to [""]
    counts = pairs.group_by("term").aggregate([("row", "count_distinct")]).rename_columns(["term", "df"])
    return int(pc.count_distinct(pairs.column("row")).as_py()) if pairs.num_rows else 0, pairs.num_rows, counts


def _summed(tables: Sequence[pa.Table]) -> pa.Table:
    """``(term, df)`` tables added up per term, sorted by term."""
    schema = pa.schema([("term", pa.string()), ("df", pa.int64())])
    table = pa.concat_tables([schema.empty_table(), *(t.cast(schema) for t in tables)])
    table = table.group_by("term").aggregate([("df", "sum")]).rename_columns(["term", "df"])
    return table.sort_by("term")


@dataclass(frozen=True)
class TermStats:
    """The BM25 statistics of some rows: ``num_docs`` rows with at least one term, ``total_tokens`` terms in
    all, and ``df[i]``, the rows holding ``terms[i]`` (sorted); ``fragments``: the rows described."""

    num_docs: int
    total_tokens: int
    terms: np.ndarray
    df: np.ndarray
    fragments: tuple[tuple[int, int], ...]

    @classmethod
    def count(cls, batches: Iterable[pa.Array | pa.ChunkedArray], fragments: Sequence[tuple[int, int]]) -> TermStats:
        """The statistics of the ``terms`` column read in ``batches``."""
        return cls._from_parts([_term_counts(batch) for batch in batches], fragments)

    def plus(self, batches: Iterable[pa.Array | pa.ChunkedArray], fragments: Sequence[tuple[int, int]]) -> TermStats:
        """These statistics with the rows of ``batches`` added (now describing ``fragments``)."""
        own = pa.table({"term": pa.array(self.terms, pa.string()), "df": pa.array(self.df, pa.int64())})
        return self._from_parts([(self.num_docs, self.total_tokens, own), *(_term_counts(b) for b in batches)], fragments)

    @classmethod
    def _from_parts(cls, parts: Sequence[tuple[int, int, pa.Table]], fragments: Sequence[tuple[int, int]]) -> TermStats:
        table = _summed([counts for _, _, counts in parts])
        return cls(
            num_docs=sum(p[0] for p in parts),
            total_tokens=sum(p[1] for p in parts),
            terms=table.column("term").to_numpy(zero_copy_only=False).astype(object),
            df=table.column("df").to_numpy(zero_copy_only=False).astype(np.int64),
            fragments=tuple((int(i), int(d)) for i, d in fragments),
        )

    @property
    def rows(self) -> str:
        """The signature of the rows described (:func:`.lance_rows.signature`)."""
        return signature(self.fragments)

    def idf(self, terms: Sequence[str]) -> np.ndarray:
        """Each term's IDF as Lance's index computes it, ``ln(1 + (N - n_t + 0.5) / (n_t + 0.5))`` in float32
        (the logarithm rounded from float64); 0 for a term no row holds."""
        query = np.array(terms, dtype=object)
        df = np.zeros(len(query), dtype=_F32)
        if len(self.terms) and len(query):
            where = np.minimum(np.searchsorted(self.terms, query), len(self.terms) - 1)
            df = np.where(self.terms[where] == query, self.df[where], 0).astype(_F32)
        ratio = (_F32(self.num_docs) - df + _F32(0.5)) / (df + _F32(0.5)) + _F32(1.0)
        return np.where(df > 0, np.log(ratio.astype(np.float64)).astype(_F32), _F32(0.0))

    def scores(self, terms: Sequence[str], rows: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """BM25 of each row (its analyzed ``terms`` string) for the distinct query ``terms``: Lance's float32
        arithmetic, in its order (0 for a row sharing no term), returned as float64."""
        out = np.zeros(len(rows), dtype=_F32)
        weights = self.idf(terms)
        kept = [t for t, w in zip(terms, weights) if w != 0]
        if not kept or not len(rows) or self.num_docs == 0:
            return out.astype(np.float64)
        tokens = pc.split_pattern(_combined(rows), " ")
        lengths = pc.fill_null(pc.list_value_length(tokens), 0).to_numpy().astype(_F32)
        which = pc.index_in(pc.list_flatten(tokens), value_set=pa.array(kept, pa.string()))
        matched = which.is_valid().to_numpy(zero_copy_only=False)
        tf = np.zeros((len(rows), len(kept)), dtype=_F32)
        parents = pc.list_parent_indices(tokens).to_numpy()[matched]
        np.add.at(tf, (parents, which.to_numpy(zero_copy_only=False)[matched].astype(np.int64)), _F32(1))
        average = _F32(self.total_tokens) / _F32(self.num_docs)
        norm = _F32(K1) * (_F32(1.0 - B) + _F32(B) * lengths / average)
        for column, weight in enumerate(weights[weights != 0]):
            freq = tf[:, column]
            out += weight * (_F32(K1 + 1.0) * freq / (freq + norm))
        return out.astype(np.float64)


def write(uri: str, stats: TermStats, storage_options: dict[str, str] | None, new: bool = False) -> None:
    """Save ``stats`` as the dataset at ``uri``: a new version replacing the last atomically; the one before is
    kept for readers still reading it, older ones removed. ``new``: none were found there, so the dataset is
    created (overwriting a missing dataset makes Lance print a warning on stderr, in every first ``isotrope
    index``), or replaced after all if it is there."""
    import lance

    meta = {"num_docs": stats.num_docs, "total_tokens": stats.total_tokens, "fragments": stats.fragments}
    schema = pa.schema([("term", pa.string()), ("df", pa.int64())], metadata={_META: json.dumps(meta)})
    table = pa.table({"term": pa.array(stats.terms, pa.string()), "df": pa.array(stats.df, pa.int64())}, schema=schema)
    dataset = None
    if new:
        try:
            dataset = lance.write_dataset(table, uri, mode="create", storage_options=storage_options)
        except OSError as error:  # there after all (unreadable, or written meanwhile): replaced below
            logger.debug("BM25 statistics at %s already exist: %s", uri, error)
    if dataset is None:
        dataset = lance.write_dataset(table, uri, mode="overwrite", storage_options=storage_options)
    dataset.cleanup_old_versions(retain_versions=2)


def read(uri: str, storage_options: dict[str, str] | None) -> TermStats | None:
    """The statistics saved at ``uri``; None where there are none (a store written before them) or they cannot
    be read (removed by a writer replacing them while this reader read)."""
    import lance

    try:
        table = lance.dataset(uri, storage_options=storage_options).to_table()
    except (OSError, ValueError) as error:
        logger.debug("no BM25 statistics at %s: %s", uri, error)
        return None
    meta = json.loads((table.schema.metadata or {})[_META.encode()])
    return TermStats(
        num_docs=int(meta["num_docs"]),
        total_tokens=int(meta["total_tokens"]),
        terms=table.column("term").to_numpy(zero_copy_only=False).astype(object),
        df=table.column("df").to_numpy(zero_copy_only=False).astype(np.int64),
        fragments=tuple((int(i), int(d)) for i, d in meta["fragments"]),
    )


def stats_uri(table_uri: str) -> str:
    """Where the statistics of the table at ``table_uri`` (``<database>/<table>.lance``) live."""
    return table_uri.removesuffix(".lance") + SUFFIX
