"""What every backbone gives the pooling step: token states with their masks."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

TextKind = Literal["document", "query"]


@dataclass
class TokenBatch:
    """Token-level output of a backbone for one batch of texts.

    ``states`` is already the chosen layer (or the mean of the chosen layers).
    """

    states: np.ndarray  # (B, T, d) float32
    input_ids: np.ndarray  # (B, T) int64
    attention_mask: np.ndarray  # (B, T) bool: real tokens
    special_mask: np.ndarray  # (B, T) bool: special tokens ([CLS], [SEP], ...)
    target_index: np.ndarray | None = None  # (B,) position pooled by the "mask" mode


class Backbone(Protocol):
    """A tokenizer plus a map from token ids to token states."""

    @property
    def dim(self) -> int: ...

    @property
    def tokenizer(self) -> Any: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def needs_fit(self) -> bool:
        """True while the backbone has statistics to compute from the fit corpus (context tables)."""

    def fit(self, texts: Sequence[str], *, show_progress: bool = False) -> Any:
        """Compute the corpus statistics the backbone needs (a no-op for most backbones)."""

    def vocabulary(self) -> list[str]:
        """Token string of every id, index = id."""

    def special_ids(self) -> np.ndarray:
        """Ids of the tokenizer's special tokens."""

    def token_ids(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, special tokens excluded (for frequency statistics)."""

    def embed(self, texts: list[str], kind: TextKind = "document") -> TokenBatch:
        """Token states of one batch of texts."""

    def iter_batches(
        self, texts: Sequence[str], kind: TextKind = "document", batch_size: int = 32, max_tokens: int | None = None
    ) -> Iterator[tuple[np.ndarray, TokenBatch]]:
        """Length-sorted batches ``(indices into texts, TokenBatch)`` covering all texts."""

    def get_config(self) -> dict[str, Any]:
        """JSON-serialisable description that rebuilds this backbone with ``make_backbone``."""

    def get_state(self) -> dict[str, np.ndarray]:
        """Arrays that must be saved with the encoder (empty when the config suffices)."""


#: padded tokens per batch (short texts go in big batches, long ones in small)
BATCH_TOKENS = 16384
#: the same on the CPU, for torch and ONNX Runtime alike: smaller batches of long texts run faster there (their
#: attention fits the caches) and hold less (indexing 1,526 chunks of <= 256 tokens with all-MiniLM-L6-v2, 2 cores,
#: alternating runs: torch 8,192 -> 2,048 tokens a batch 59.4-61.3 -> 54.3-54.9 s and peak RSS 1,007 -> 912 MB;
#: onnx 4,096 -> 2,048 31.6-32.4 -> 30.1-31.0 s and 823 -> 725 MB; 1,024 held less again, 805 MB, and ran slower,
#: 56.3 s; ``--model fast``'s ONNX teacher pass over them 29.2-30.6 -> 26.5-28.9 s)
CPU_BATCH_TOKENS = 2048


def batch_tokens(backbone: Any) -> int:
    """Padded tokens per batch for ``backbone``: :data:`CPU_BATCH_TOKENS` for a transformer on the CPU (torch or
    ONNX Runtime), else :data:`BATCH_TOKENS`."""
    device = getattr(backbone, "device", None)
    return CPU_BATCH_TOKENS if getattr(device, "type", None) == "cpu" else BATCH_TOKENS


def plan_batches(lengths: np.ndarray, batch_size: int, max_tokens: int | None = None) -> list[np.ndarray]:
    """Index batches, longest texts first; each batch holds at most ``batch_size`` texts and,
    when ``max_tokens`` is set, at most ``max_tokens`` padded tokens (less padding, steady memory)."""
    order = np.argsort(-np.asarray(lengths), kind="stable")
    batches, start = [], 0
    while start < len(order):
        longest = max(int(lengths[order[start]]), 1)
        size = batch_size if max_tokens is None else max(1, min(batch_size, max_tokens // longest))
        batches.append(order[start : start + size])
        start += size
    return batches


class TokenizedBackbone:
    """Shared batching for backbones driven by a Hugging Face tokenizer.

    Subclasses implement ``tokenize`` (ids and special-token masks, unpadded) and
    ``forward`` (padded arrays -> TokenBatch). Texts are tokenized once, sorted by
    token count and padded per batch.
    """

    tokenizer: Any
    dim: int

    @property
    def needs_fit(self) -> bool:
        """True while the backbone has statistics to compute from the fit corpus (context tables)."""
        return False

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    def vocabulary(self) -> list[str]:
        raise NotImplementedError

    def special_ids(self) -> np.ndarray:
        raise NotImplementedError

    def token_ids(self, texts: list[str]) -> list[list[int]]:
        raise NotImplementedError

    def get_config(self) -> dict[str, Any]:
        raise NotImplementedError

    def get_state(self) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def fit(self, texts: Sequence[str], show_progress: bool = False) -> TokenizedBackbone:
        """Compute corpus statistics the backbone needs; nothing by default."""
        return self

    def tokenize(self, texts: Sequence[str], kind: TextKind) -> tuple[list[list[int]], list[list[int]]]:
        raise NotImplementedError

    def pad_id(self) -> int:
        """The id padded batches are filled with (masked out, so any valid id does)."""
        return self.tokenizer.pad_token_id or 0

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray, special_mask: np.ndarray) -> TokenBatch:
        raise NotImplementedError

    def iter_batches(
        self, texts: Sequence[str], kind: TextKind = "document", batch_size: int = 32, max_tokens: int | None = None
    ) -> Iterator[tuple[np.ndarray, TokenBatch]]:
        """``(indices into texts, TokenBatch)`` for length-sorted batches covering all texts."""
        ids, special = self.tokenize(texts, kind)
        lengths = np.fromiter((len(row) for row in ids), dtype=np.int64, count=len(ids))
        pad_id = self.pad_id()
        for index in plan_batches(lengths, batch_size, max_tokens):
            width = int(lengths[index].max())
            input_ids = np.full((len(index), width), pad_id, dtype=np.int64)
            attention = np.zeros((len(index), width), dtype=bool)
            special_mask = np.ones((len(index), width), dtype=bool)
            for row, i in enumerate(index):
                n = lengths[i]
                input_ids[row, :n] = ids[i]
                attention[row, :n] = True
                special_mask[row, :n] = np.asarray(special[i], dtype=bool)
            yield index, self.forward(input_ids, attention, special_mask)

    def embed(self, texts: Sequence[str], kind: TextKind = "document") -> TokenBatch:
        """Token states of all ``texts`` as one padded batch, in the given order."""
        index, batch = next(self.iter_batches(texts, kind, batch_size=len(texts)))
        order = np.argsort(index)
        return TokenBatch(
            states=batch.states[order],
            input_ids=batch.input_ids[order],
            attention_mask=batch.attention_mask[order],
            special_mask=batch.special_mask[order],
            target_index=None if batch.target_index is None else batch.target_index[order],
        )
