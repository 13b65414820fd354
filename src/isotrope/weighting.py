"""Token weights and filters (uniform, idf, SIF, uSIF; drop frequent, special, punctuation).

Weights are per token id, fitted once from a frequency source and saved with
the encoder as ``weighting.weights_`` (vocab_size,) float32.
"""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from isotrope.transforms.base import NotFittedError

logger = logging.getLogger(__name__)

SCHEMES = ("uniform", "idf", "sif", "usif")
FREQUENCY_SOURCES = ("corpus", "wordfreq")


class TokenCounts:
    """Mergeable token statistics: total counts, document frequencies, text and token totals."""

    def __init__(self, vocab_size: int) -> None:
        self.counts = np.zeros(vocab_size, dtype=np.int64)
        self.doc_freq = np.zeros(vocab_size, dtype=np.int64)
        self.n_texts = 0

    @classmethod
    def from_token_ids(cls, token_ids: Iterable[list[int]], vocab_size: int) -> TokenCounts:
        stats = cls(vocab_size)
        for ids in token_ids:
            ids_array = np.asarray(ids, dtype=np.int64)
            stats.counts += np.bincount(ids_array, minlength=vocab_size)
            stats.doc_freq[np.unique(ids_array)] += 1
            stats.n_texts += 1
        return stats

    def merge(self, other: TokenCounts) -> TokenCounts:
        merged = TokenCounts(len(self.counts))
        merged.counts = self.counts + other.counts
        merged.doc_freq = self.doc_freq + other.doc_freq
        merged.n_texts = self.n_texts + other.n_texts
        return merged

    @property
    def n_tokens(self) -> int:
        return int(self.counts.sum())


def is_punctuation(token: str) -> bool:
    """True for tokens made only of punctuation or symbols (WordPiece '##' prefix ignored)."""
    token = token.removeprefix("##")
    return bool(token) and all(unicodedata.category(char)[0] in "PS" for char in token)


def read_frequency_file(path: str | Path) -> dict[str, float]:
    """A 'word count' file (one pair a line, e.g. SIF's enwiki_vocab_min200.txt)."""
    counts: dict[str, float] = {}
    with open(path, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 2:
                raise ValueError(f"{path}:{line_number}: expected 'word count', got {line.strip()!r}")
            try:
                counts[parts[0]] = float(parts[1])
            except ValueError:
                raise ValueError(f"{path}:{line_number}: count {parts[1]!r} is not a number") from None
    return counts


def _table_probabilities(vocabulary: list[str], source: str) -> np.ndarray:
    """p(w) per token id from wordfreq or a frequency file (WordPiece '##' stripped)."""
    if source == "wordfreq":
        try:
            from wordfreq import word_frequency
        except ImportError:
            raise ImportError("frequencies='wordfreq' needs the package wordfreq (pip install 'isotrope[models]')") from None
        probs = np.array([word_frequency(token.removeprefix("##"), "en") for token in vocabulary])
    else:
        table = read_frequency_file(source)
        total = sum(table.values())
        probs = np.array([table.get(token.removeprefix("##"), 0.0) / total for token in vocabulary])
    return probs


class TokenWeighting:
    """Per-token weights with filters, fitted on a corpus or a frequency table.

    scheme: ``uniform``, ``idf`` (smoothed, as scikit-learn), ``sif`` a/(a+p(w)),
    ``usif`` a/(a/2+p(w)) with a from vocabulary size and mean text length.
    ``frequencies``: ``corpus`` (count the fit texts), ``wordfreq``, or a path to a
    'word count' file. ``drop_top`` zeroes the N most frequent tokens.
    """

    def __init__(
        self,
        scheme: str = "uniform",
        sif_a: float = 1e-3,
        frequencies: str = "corpus",
        drop_top: int = 0,
        exclude_special: bool = False,
        exclude_punctuation: bool = False,
    ) -> None:
        if scheme not in SCHEMES:
            raise ValueError(f"unknown weighting scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
        if scheme == "idf" and frequencies != "corpus":
            raise ValueError("idf needs document frequencies: use frequencies='corpus'")
        if frequencies not in FREQUENCY_SOURCES and not Path(frequencies).is_file():
            raise ValueError(f"frequencies must be 'corpus', 'wordfreq' or an existing file; got {frequencies!r}")
        self.scheme = scheme
        self.sif_a = float(sif_a)
        self.frequencies = frequencies
        self.drop_top = int(drop_top)
        self.exclude_special = bool(exclude_special)
        self.exclude_punctuation = bool(exclude_punctuation)

    @property
    def needs_corpus(self) -> bool:
        """Whether fitting must count tokens of the fit texts."""
        return self.frequencies == "corpus" and (self.scheme != "uniform" or self.drop_top > 0)

    def get_config(self) -> dict[str, Any]:
        return {
            "scheme": self.scheme,
            "sif_a": self.sif_a,
            "frequencies": self.frequencies,
            "drop_top": self.drop_top,
            "exclude_special": self.exclude_special,
            "exclude_punctuation": self.exclude_punctuation,
        }

    def fit(self, vocabulary: list[str], special_ids: np.ndarray, counts: TokenCounts | None = None) -> TokenWeighting:
        """Compute ``weights_`` for every token id; ``counts`` are required when ``needs_corpus``."""
        size = len(vocabulary)
        if self.needs_corpus and (counts is None or counts.n_texts == 0):
            raise ValueError(f"{self.scheme} weighting with corpus frequencies needs fit texts")
        weights = np.ones(size, dtype=np.float64)
        probs = None
        if self.frequencies == "corpus" and counts is not None and counts.n_tokens:
            probs = counts.counts / counts.n_tokens
        elif self.frequencies != "corpus":
            probs = _table_probabilities(vocabulary, self.frequencies)
        if self.scheme == "idf":
            assert counts is not None  # needs_corpus was checked above
            weights = np.log((1 + counts.n_texts) / (1 + counts.doc_freq)) + 1.0
        elif self.scheme == "sif":
            assert probs is not None  # sif and usif always need frequencies
            weights = self.sif_a / (self.sif_a + probs)
        elif self.scheme == "usif":
            mean_length = counts.n_tokens / counts.n_texts if counts is not None and counts.n_texts else 20.0
            assert probs is not None
            a = usif_a(probs, mean_length)
            weights = a / (0.5 * a + probs)
        if self.drop_top > 0:
            if probs is None:
                raise ValueError("drop_top needs token frequencies")
            weights[np.argsort(-probs, kind="stable")[: self.drop_top]] = 0.0
        if self.exclude_punctuation:
            weights[[is_punctuation(token) for token in vocabulary]] = 0.0
        if self.exclude_special and len(special_ids):
            weights[special_ids] = 0.0
        self.weights_ = weights.astype(np.float32)
        return self

    def get_state(self) -> dict[str, np.ndarray]:
        self._check_fitted()
        return {"weights_": self.weights_}

    @classmethod
    def from_state(cls, config: dict[str, Any], state: dict[str, np.ndarray]) -> TokenWeighting:
        weighting = cls(**config)
        if "weights_" not in state:
            raise ValueError("weighting state is missing the array 'weights_'")
        weighting.weights_ = np.asarray(state["weights_"], dtype=np.float32)
        return weighting

    def _check_fitted(self) -> None:
        if not hasattr(self, "weights_"):
            raise NotFittedError("token weighting is not fitted yet: call fit() first")

    def token_weights(self, input_ids: np.ndarray) -> np.ndarray:
        """Weights (B, T) for a batch of token ids."""
        self._check_fitted()
        return self.weights_[input_ids]


def usif_a(probs: np.ndarray, mean_length: float) -> float:
    """uSIF's a (Ethayarajh 2018) from the vocabulary's word probabilities and mean text length."""
    vocab_size = float(len(probs))
    threshold = 1.0 - (1.0 - 1.0 / vocab_size) ** mean_length
    alpha = float((probs > threshold).sum()) / vocab_size
    if alpha <= 0.0:
        logger.warning("uSIF: no token is above the frequency threshold; using a = 1e-3")
        return 1e-3
    z = 0.5 * vocab_size
    return (1.0 - alpha) / (alpha * z)


__all__ = ["SCHEMES", "TokenCounts", "TokenWeighting", "is_punctuation", "read_frequency_file", "usif_a"]
