"""Token pairs: a corpus's frequent pairs of consecutive tokens as extra rows of a static table.

A static table averages its tokens' rows, so "vitamin d" is the mean of "vitamin" and "d" wherever it
stands. A table distilled on a corpus (:mod:`isotrope.distill`) can also hold a row for each pair of
consecutive tokens found in at least a few of its sampled chunks: pair ``i`` is the id ``vocab + i``, and a
text's ids are its tokens' followed by its known pairs', so the mean over them is the same one gather and
weighted sum as before (:func:`isotrope.pooling.table_mean`). On SciFact such rows lifted ``fast`` dense
retrieval from 64.82 to 67.88 nDCG@10 (docs/results/fast-probe.md, "Bigram rows").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

Texts = TypeVar("Texts", bound=Sequence[str])

#: a pair becomes a row when it is found in at least this many sampled chunks
MIN_CHUNKS = 3


class TokenPairs:
    """Known pairs of consecutive token ids, coded ``first * vocab + second`` (sorted); the pair at position
    ``i`` of :attr:`codes` is the id ``vocab + i``."""

    def __init__(self, codes: np.ndarray, vocab: int) -> None:
        codes = np.asarray(codes, dtype=np.int64)
        if codes.ndim != 1 or (codes.size and (np.any(np.diff(codes) <= 0) or codes[0] < 0 or codes[-1] >= vocab * vocab)):
            raise ValueError(f"token pairs must be distinct sorted codes below {vocab}^2")
        self.codes, self.vocab = codes, int(vocab)

    @classmethod
    def found_in(
        cls, id_lists: Sequence[Sequence[int]], vocab: int, special: np.ndarray, min_chunks: int = MIN_CHUNKS
    ) -> TokenPairs:
        """The pairs of consecutive tokens, neither of them special, found in at least ``min_chunks`` of
        ``id_lists``."""
        per_text = [np.unique(_codes(np.asarray(ids, dtype=np.int64), vocab)) for ids in id_lists]
        codes, found = np.unique(np.concatenate([np.zeros(0, np.int64), *per_text]), return_counts=True)
        codes = codes[found >= min_chunks]
        first, second = divmod(codes, vocab)
        return cls(codes[~np.isin(first, special) & ~np.isin(second, special)], vocab)

    def __len__(self) -> int:
        return len(self.codes)

    def names(self, vocabulary: Sequence[str]) -> list[str]:
        """Each pair's two tokens joined by a space (its entry in the table's vocabulary)."""
        return [f"{vocabulary[first]} {vocabulary[second]}" for first, second in zip(*divmod(self.codes, self.vocab))]

    def prior(self, table: np.ndarray) -> np.ndarray:
        """``table`` (vocab rows) followed by a row per pair: the mean of its two tokens' rows."""
        first, second = divmod(self.codes, self.vocab)
        return np.vstack([table, 0.5 * (table[first] + table[second])]).astype(table.dtype, copy=False)

    def extend(self, id_lists: Sequence[Sequence[int]]) -> list[list[int]]:
        """Each text's ids followed by the ids of its known pairs (no pair holds a special token)."""
        extended = []
        for ids in id_lists:
            array = np.asarray(ids, dtype=np.int64)
            codes = _codes(array, self.vocab)
            at = np.searchsorted(self.codes, codes)
            hit = at < len(self.codes)
            hit[hit] = self.codes[at[hit]] == codes[hit]
            extended.append([*ids, *(self.vocab + at[hit]).tolist()])
        return extended

    def extend_with_mask(
        self, id_lists: Sequence[Sequence[int]], special_masks: Sequence[Sequence[int]]
    ) -> tuple[list[list[int]], list[list[int]]]:
        """:meth:`extend`, and each text's special-token mask extended with a 0 per pair."""
        extended = self.extend(id_lists)
        return extended, [[*mask, *[0] * (len(ids) - len(mask))] for ids, mask in zip(extended, special_masks)]

    def extending(self, token_ids: Callable[[Texts], list[list[int]]]) -> Callable[[Texts], list[list[int]]]:
        """``token_ids`` with each text's pairs appended (:meth:`extend`)."""
        return lambda texts: self.extend(token_ids(texts))


def _codes(ids: np.ndarray, vocab: int) -> np.ndarray:
    return ids[:-1] * vocab + ids[1:] if len(ids) > 1 else np.zeros(0, np.int64)
