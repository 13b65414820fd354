"""Pooling: pure functions from token states, masks and weights to one vector per text."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain, pairwise

import numpy as np

from isotrope.resources import usable_cores

POOLING_MODES = ("cls", "mean", "max", "mean_sqrt_len", "weighted_mean", "last_token", "mask")
#: texts tokenized and pooled together by :func:`table_mean` (bounds the token ids held at once)
TABLE_MEAN_BATCH = 512


def last_real_position(attention_mask: np.ndarray) -> np.ndarray:
    """Index of the last attended token of each row (right or left padding)."""
    width = attention_mask.shape[1]
    return width - 1 - np.argmax(attention_mask[:, ::-1], axis=1)


def pool(
    states: np.ndarray,
    attention_mask: np.ndarray,
    mode: str = "mean",
    weights: np.ndarray | None = None,
    target_index: np.ndarray | None = None,
) -> np.ndarray:
    """Pool ``states`` (B, T, d) into (B, d) float32.

    ``weights`` (B, T) are token weights (0 drops a token); padding is always
    masked. When every token of a row has weight 0 the row falls back to
    uniform weights over its real tokens, so no text pools to a zero vector.
    """
    if mode not in POOLING_MODES:
        raise ValueError(f"unknown pooling mode {mode!r}; choose one of {', '.join(POOLING_MODES)}")
    rows = np.arange(states.shape[0])
    if mode == "cls":  # the first real token (left padding puts pads first)
        return np.ascontiguousarray(states[rows, np.argmax(attention_mask, axis=1)], dtype=np.float32)
    if mode == "last_token":
        return np.ascontiguousarray(states[rows, last_real_position(attention_mask)], dtype=np.float32)
    if mode == "mask":
        if target_index is None:
            raise ValueError("pooling 'mask' needs a prompt template with a [MASK] (or last) token")
        return np.ascontiguousarray(states[rows, target_index], dtype=np.float32)

    mask = attention_mask.astype(np.float64)
    w = mask if weights is None else mask * weights.astype(np.float64)
    empty = w.sum(axis=1) <= 0
    if empty.any():
        w[empty] = mask[empty]
    if mode == "max":
        masked = np.where(w[:, :, None] > 0, states, -np.inf)
        return masked.max(axis=1).astype(np.float32)
    if mode == "weighted_mean":  # SGPT: weight = position among the row's real tokens, 1..n
        w = w * np.cumsum(mask, axis=1)
    summed = np.einsum("bt,btd->bd", w, states.astype(np.float64))
    total = w.sum(axis=1, keepdims=True)
    if mode == "mean_sqrt_len":
        return (summed / np.sqrt(total)).astype(np.float32)
    return (summed / total).astype(np.float32)


@dataclass(frozen=True)
class IdBatch:
    """A batch of texts' table row ids in two flat arrays: ``ids[i]`` is a row of text ``texts[i]`` (of
    ``count`` texts; a text's ids need not be adjacent)."""

    ids: np.ndarray
    texts: np.ndarray
    count: int

    @classmethod
    def of(cls, id_lists: Sequence[Sequence[int]]) -> IdBatch:
        lengths = np.fromiter(map(len, id_lists), dtype=np.intp, count=len(id_lists))
        ids = np.fromiter(chain.from_iterable(id_lists), dtype=np.intp, count=int(lengths.sum()))
        return cls(ids, np.repeat(np.arange(len(id_lists)), lengths), len(id_lists))


def table_mean(
    texts: Sequence[str],
    token_ids: Callable[[Sequence[str]], IdBatch],
    table: np.ndarray,
    weights: np.ndarray,
    row_scale: np.ndarray | None = None,
) -> np.ndarray:
    """Weighted mean of each text's rows of a static ``table``, float32 (n, d): ``pool(..., "mean")`` over the
    rows of the ids ``token_ids`` gives (a text whose weights are all 0 falls back to the plain mean of its
    rows; a text without ids is 0), without padding. A batch of texts is one sparse (texts x rows) matrix of
    weights times the table, which reads each distinct row of a text once and copies none (on SciFact
    abstracts 1.7x faster than a gather and a BLAS vector-matrix product per text, docs/results/fast.md); one
    text (a query) is one gather and one product, without importing scipy. ``weights``: one per row id;
    ``row_scale``: an int8 table's scale per row."""
    output = np.zeros((len(texts), table.shape[1]), dtype=np.float32)
    weights = np.asarray(weights, dtype=np.float32)
    for begin in range(0, len(texts), TABLE_MEAN_BATCH):
        batch = token_ids(texts[begin : begin + TABLE_MEAN_BATCH])
        row_weights = weights[batch.ids]
        totals = np.bincount(batch.texts, row_weights, minlength=batch.count)
        unweighted = totals <= 0
        if unweighted.any():
            row_weights = np.where(unweighted[batch.texts], np.float32(1), row_weights)
            totals = np.bincount(batch.texts, row_weights, minlength=batch.count)
        if row_scale is not None:
            row_weights = row_weights * row_scale[batch.ids]
        summed = _weighted_sums(batch, row_weights, table)
        np.divide(summed, totals[:, None], out=output[begin : begin + batch.count], where=totals[:, None] > 0)
    return output


def _weighted_sums(batch: IdBatch, row_weights: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Each text's sum of its rows of ``table`` times their weights, float32 (count, d)."""
    if batch.count == 1:
        return (row_weights @ table[batch.ids].astype(np.float32, copy=False))[None]
    from scipy import sparse

    from isotrope.sparse_rows import RowRanges, shared_workers

    order = np.argsort(batch.texts, kind="stable")  # each text's ids together (a repeated id stays repeated)
    indptr = np.zeros(batch.count + 1, dtype=np.intp)
    np.cumsum(np.bincount(batch.texts, minlength=batch.count), out=indptr[1:])
    bags = sparse.csr_matrix((row_weights[order], batch.ids[order], indptr), shape=(batch.count, table.shape[0]))
    if table.dtype == np.float32:
        return RowRanges(bags, usable_cores(), shared_workers()) @ table
    # scipy would convert the whole table to float32: an int8 or float16 table converts each text's rows only
    spans = pairwise(bags.indptr)
    return np.stack([bags.data[a:b] @ table[bags.indices[a:b]].astype(np.float32) for a, b in spans])
