"""What every backbone gives the pooling step: token states with their masks."""

from __future__ import annotations

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

    dim: int
    tokenizer: Any

    @property
    def vocab_size(self) -> int: ...

    def vocabulary(self) -> list[str]:
        """Token string of every id, index = id."""

    def special_ids(self) -> np.ndarray:
        """Ids of the tokenizer's special tokens."""

    def token_ids(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, special tokens excluded (for frequency statistics)."""

    def embed(self, texts: list[str], kind: TextKind = "document") -> TokenBatch:
        """Token states of one batch of texts."""

    def get_config(self) -> dict[str, Any]:
        """JSON-serialisable description that rebuilds this backbone with ``make_backbone``."""

    def get_state(self) -> dict[str, np.ndarray]:
        """Arrays that must be saved with the encoder (empty when the config suffices)."""
