"""Context-averaged token tables: each token's mean contextual state over a corpus."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from isotrope.backbones.base import TokenBatch, TokenizedBackbone

logger = logging.getLogger(__name__)


class ContextSums:
    """Running per-token sums of contextual states (special tokens left out), float64."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.sums: np.ndarray | None = None
        self.counts = np.zeros(vocab_size, dtype=np.float64)
        self.norm_sum = 0.0

    def add(self, batch: TokenBatch, rows: np.ndarray | None = None) -> None:
        """Add the real, non-special tokens of ``batch`` (only its ``rows`` when given)."""
        from scipy import sparse

        keep = batch.attention_mask & ~batch.special_mask
        if rows is not None:
            keep = keep & np.isin(np.arange(len(keep)), rows)[:, None]
        ids, states = batch.input_ids[keep], batch.states[keep].astype(np.float64)
        if self.sums is None:
            self.sums = np.zeros((self.vocab_size, batch.states.shape[2]), dtype=np.float64)
        rows_of, where = np.unique(ids, return_inverse=True)  # only the tokens present: no V x d temporary
        scatter = sparse.csr_matrix((np.ones(len(ids)), (where, np.arange(len(ids)))), shape=(len(rows_of), len(ids)))
        self.sums[rows_of] += scatter @ states
        self.counts += np.bincount(ids, minlength=self.vocab_size)
        self.norm_sum += float(np.linalg.norm(states, axis=1).sum())

    def table(self) -> np.ndarray:
        """Mean state of every token, float32 (V, d); tokens never seen get a zero row."""
        if self.sums is None:
            raise ValueError("context table: no texts to average over")
        seen = self.counts > 0
        table = np.zeros(self.sums.shape, dtype=np.float32)  # divided in float64, stored in float32
        table[seen] = self.sums[seen] / self.counts[seen, None]
        return table

    @property
    def mean_norm(self) -> float:
        """Mean Euclidean norm of the token states added."""
        return self.norm_sum / max(float(self.counts.sum()), 1.0)


def context_average(
    backbone: TokenizedBackbone, texts: Sequence[str], batch_size: int = 64, max_tokens: int | None = 16384
) -> tuple[np.ndarray, float]:
    """Mean state of every vocabulary token over ``texts`` (special tokens left out), float32 (V, d),
    and the mean norm of those token states.

    Tokens never seen in ``texts`` get a zero row.
    """
    sums = ContextSums(backbone.vocab_size)
    for _, batch in backbone.iter_batches(texts, "document", batch_size, max_tokens):
        sums.add(batch)
    table = sums.table()
    logger.info("context table: %d of %d tokens seen in %d texts", int((sums.counts > 0).sum()), backbone.vocab_size, len(texts))
    return table, sums.mean_norm


def unit_mean_norm(table: np.ndarray) -> np.ndarray:
    """Scale a table so its non-zero rows have mean Euclidean norm 1 (balances concatenated parts)."""
    norms = np.linalg.norm(table, axis=1)
    mean = norms[norms > 0].mean() if (norms > 0).any() else 1.0
    return (table / mean).astype(np.float32)
