"""Context-averaged token tables: each token's mean contextual state over a corpus."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from isotrope.backbones.base import TokenizedBackbone

logger = logging.getLogger(__name__)


def context_average(
    backbone: TokenizedBackbone, texts: Sequence[str], batch_size: int = 64, max_tokens: int | None = 16384
) -> tuple[np.ndarray, float]:
    """Mean state of every vocabulary token over ``texts`` (special tokens left out), float32 (V, d),
    and the mean norm of those token states.

    Tokens never seen in ``texts`` get a zero row.
    """
    import torch
    sums = None
    counts = torch.zeros(backbone.vocab_size, dtype=torch.float64)
    norm_sum = 0.0
    for _, batch in backbone.iter_batches(texts, "document", batch_size, max_tokens):
        keep = batch.attention_mask & ~batch.special_mask
        ids = torch.from_numpy(batch.input_ids[keep])
        if sums is None:
            sums = torch.zeros((backbone.vocab_size, batch.states.shape[2]), dtype=torch.float64)
        sums.index_add_(0, ids, torch.from_numpy(batch.states[keep]).double())
        counts.index_add_(0, ids, torch.ones(len(ids), dtype=torch.float64))
        norm_sum += float(np.linalg.norm(batch.states[keep], axis=1).sum())
    if sums is None:
        raise ValueError("context table: no texts to average over")
    seen = counts > 0
    logger.info("context table: %d of %d tokens seen in %d texts", int(seen.sum()), backbone.vocab_size, len(texts))
    table = torch.zeros_like(sums)
    table[seen] = sums[seen] / counts[seen, None]
    return table.float().numpy(), norm_sum / max(float(counts.sum()), 1.0)


def unit_mean_norm(table: np.ndarray) -> np.ndarray:
    """Scale a table so its non-zero rows have mean Euclidean norm 1 (balances concatenated parts)."""
    norms = np.linalg.norm(table, axis=1)
    mean = norms[norms > 0].mean() if (norms > 0).any() else 1.0
    return (table / mean).astype(np.float32)
