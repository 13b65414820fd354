"""Context-averaged token tables: each token's mean contextual state over a corpus."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from isotrope.backbones.base import TokenBatch, TokenizedBackbone

logger = logging.getLogger(__name__)


#: rows of a block of :class:`ContextSums` (3 MB at 384 float64 dimensions)
BLOCK_ROWS = 1024


class ContextSums:
    """Running per-token sums of contextual states (special tokens left out), float64.

    Only the tokens seen have a row, in blocks of :data:`BLOCK_ROWS` added as new tokens come: a whole
    V x d float64 array (94 MB for 30,522 x 384) is resident after a few batches, however few tokens a
    corpus holds, since NumPy backs large arrays with huge pages and any batch's tokens spread over the
    vocabulary.
    """

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.counts = np.zeros(vocab_size, dtype=np.float64)
        self.norm_sum = 0.0
        self.dim: int | None = None
        self._slot = np.full(vocab_size, -1, dtype=np.int64)  # each token's row, -1 until it is seen
        self._blocks: list[np.ndarray] = []
        self._rows = 0

    def add(self, batch: TokenBatch, rows: np.ndarray | None = None) -> None:
        """Add the real, non-special tokens of ``batch`` (only its ``rows`` when given)."""
        from scipy import sparse

        keep = batch.attention_mask & ~batch.special_mask
        if rows is not None:
            keep = keep & np.isin(np.arange(len(keep)), rows)[:, None]
        ids, states = batch.input_ids[keep], batch.states[keep].astype(np.float64)
        self.dim = batch.states.shape[2]
        tokens, where = np.unique(ids, return_inverse=True)  # only the tokens present: no V x d temporary
        scatter = sparse.csr_matrix((np.ones(len(ids)), (where, np.arange(len(ids)))), shape=(len(tokens), len(ids)))
        self._add_rows(self._place(tokens), scatter @ states)
        self.counts += np.bincount(ids, minlength=self.vocab_size)
        self.norm_sum += float(np.linalg.norm(states, axis=1).sum())

    def subtract(self, part: ContextSums) -> None:
        """Take out what ``part`` (sums over some of the same texts) added: these sums become those of the
        other texts."""
        tokens = np.flatnonzero(part._slot >= 0)
        if (self._slot[tokens] < 0).any():
            raise ValueError("context sums: the part holds tokens these sums never saw")
        self._add_rows(self._slot[tokens], -part._gather(part._slot[tokens]))
        self.counts -= part.counts
        self.norm_sum -= part.norm_sum

    def table(self) -> np.ndarray:
        """Mean state of every token, float32 (V, d); tokens never seen get a zero row."""
        if self.dim is None:
            raise ValueError("context table: no texts to average over")
        seen = np.flatnonzero(self.counts > 0)
        table = np.zeros((self.vocab_size, self.dim), dtype=np.float32)  # divided in float64, stored in float32
        table[seen] = self._gather(self._slot[seen]) / self.counts[seen, None]
        return table

    @property
    def mean_norm(self) -> float:
        """Mean Euclidean norm of the token states added."""
        return self.norm_sum / max(float(self.counts.sum()), 1.0)

    def _place(self, tokens: np.ndarray) -> np.ndarray:
        """The rows of ``tokens`` (distinct), giving the new ones the next free rows."""
        new = tokens[self._slot[tokens] < 0]
        self._slot[new] = np.arange(self._rows, self._rows + len(new))
        self._rows += len(new)
        while len(self._blocks) * BLOCK_ROWS < self._rows:
            self._blocks.append(np.zeros((BLOCK_ROWS, self.dim or 0), dtype=np.float64))
        return self._slot[tokens]

    def _add_rows(self, slots: np.ndarray, values: np.ndarray) -> None:
        """Add ``values`` to the rows ``slots`` (distinct)."""
        blocks, offsets = np.divmod(slots, BLOCK_ROWS)
        for block in np.unique(blocks):
            mine = blocks == block
            self._blocks[block][offsets[mine]] += values[mine]

    def _gather(self, slots: np.ndarray) -> np.ndarray:
        """The rows ``slots``, float64 (len(slots), d)."""
        out = np.empty((len(slots), self.dim or 0), dtype=np.float64)
        blocks, offsets = np.divmod(slots, BLOCK_ROWS)
        for block in np.unique(blocks):
            mine = blocks == block
            out[mine] = self._blocks[block][offsets[mine]]
        return out


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
