"""A folded token table: one ``vocab x d`` array looked up through a ``tokenizers`` tokenizer.

Everything a folded encoder does at encode time needs only NumPy and the ``tokenizers``
package: tokenize, gather rows, weighted mean, L2. The table may be stored as float32,
float16, or int8 with one scale per row. The tokenizer is saved beside the encoder's
arrays as ``tokenizer.json``; its sha256 is part of the config, so the encoder's
fingerprint covers it.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from isotrope.backbones.base import TextKind, TokenBatch, TokenizedBackbone
from isotrope.backbones.word_cache import WordPieceCache
from isotrope.pooling import table_mean
from isotrope.token_pairs import TokenPairs, batch_ids

logger = logging.getLogger(__name__)

TOKENIZER_FILE = "tokenizer.json"
PAIRS_STATE = "pairs"
DTYPES = ("float32", "float16", "int8")


def quantize(table: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray | None]:
    """``table`` in ``dtype``; int8 rows come with a float32 scale each (row = int8 * scale)."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown table dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    table = np.asarray(table, dtype=np.float32)
    if dtype == "float32":
        return np.ascontiguousarray(table), None
    if dtype == "float16":
        if np.abs(table).max(initial=0.0) > np.finfo(np.float16).max:
            raise ValueError("the folded table overflows float16: store it as float32 or int8")
        return table.astype(np.float16), None
    peak = np.abs(table).max(axis=1)
    scale = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
    return np.clip(np.rint(table / scale[:, None]), -127, 127).astype(np.int8), scale


def _tokenizer_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class FoldedBackbone(TokenizedBackbone):
    """A static table with every linear step of an encoder already applied to its rows.

    ``tokenizer`` is a ``tokenizers.Tokenizer`` (special tokens added as the source
    tokenizer adds them; truncation at ``max_length`` tokens); ``table`` is (vocab, d) in
    float32/float16/int8, ``row_scale`` the per-row scale of an int8 table.
    ``ordered_by_variance`` records that column i is the i-th principal direction (the
    chain's last linear step was whiten or pca), so leading columns may be kept alone.
    ``pairs``: token-pair rows (:mod:`isotrope.token_pairs`), the table's last rows.
    """

    needs_fit = False

    def __init__(
        self,
        tokenizer: Any,
        table: np.ndarray,
        row_scale: np.ndarray | None = None,
        *,
        special_ids: Sequence[int] = (),
        max_length: int = 8192,
        ordered_by_variance: bool = False,
        folded_from: str = "",
        tokenizer_json: str | None = None,
        pairs: np.ndarray | None = None,
    ) -> None:
        dtype = str(table.dtype)
        if dtype not in DTYPES:
            raise ValueError(f"folded table must be one of {', '.join(DTYPES)}; got {dtype}")
        if table.ndim != 2:
            raise ValueError(f"folded table must be 2-D (vocab, dim); got shape {table.shape}")
        if (dtype == "int8") != (row_scale is not None):
            raise ValueError("an int8 table needs row_scale (and only an int8 table has one)")
        if row_scale is not None and row_scale.shape != (table.shape[0],):
            raise ValueError(f"row_scale has shape {row_scale.shape}; the table has {table.shape[0]} rows")
        vocab = tokenizer.get_vocab_size(with_added_tokens=True)
        pair_count = 0 if pairs is None else len(pairs)
        if vocab > table.shape[0] - pair_count:
            raise ValueError(
                f"the tokenizer has {vocab} tokens and {pair_count} token pairs but the folded table only {table.shape[0]} rows"
            )
        #: the token pairs whose rows end the table (their ids start after the tokens' rows)
        self.pairs = None if pairs is None else TokenPairs(pairs, table.shape[0] - pair_count)
        self._tokenizer = tokenizer
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        #: the tokenizer as saved (no padding, no truncation); parsed once, its digest goes in the config
        self._tokenizer_json = tokenizer_json if tokenizer_json is not None else tokenizer.to_str()
        self._tokenizer_sha256 = _tokenizer_digest(self._tokenizer_json)
        self.set_max_length(max_length)
        self.stored = np.ascontiguousarray(table)
        self.row_scale = None if row_scale is None else np.asarray(row_scale, dtype=np.float32)
        self._special_ids = np.asarray(sorted({int(i) for i in special_ids}), dtype=np.int64)
        self.ordered_by_variance = bool(ordered_by_variance)
        self.folded_from = folded_from
        self.dim = int(table.shape[1])
        self._hf_tokenizer: Any = None

    def set_max_length(self, max_length: int) -> None:
        """Truncate texts at ``max_length`` tokens, special tokens included."""
        self.max_length = int(max_length)
        self._tokenizer.enable_truncation(self.max_length)
        self._word_cache = WordPieceCache(self._tokenizer, self._tokenizer_json, self.max_length)

    # -- persistence -----------------------------------------------------------
    @classmethod
    def from_saved(cls, config: dict[str, Any], state: dict[str, np.ndarray], folder: str | Path | None) -> FoldedBackbone:
        """Rebuild from ``get_config()``, ``get_state()`` and the folder holding ``tokenizer.json``."""
        from tokenizers import Tokenizer

        if folder is None:
            raise ValueError("a folded backbone is loaded from its encoder folder (tokenizer.json)")
        path = Path(folder) / TOKENIZER_FILE
        if not path.is_file():
            raise ValueError(f"{path} not found: the folded encoder's tokenizer is missing")
        text = path.read_text(encoding="utf-8")
        if _tokenizer_digest(text) != config.get("tokenizer_sha256"):
            raise ValueError(f"{path} does not match the tokenizer the encoder was saved with (sha256 differs)")
        if "table" not in state:
            raise ValueError("folded backbone state is missing the array 'table'")
        return cls(
            Tokenizer.from_str(text),
            state["table"],
            state.get("row_scale"),
            special_ids=config.get("special_ids", ()),
            max_length=config.get("max_length", 8192),
            ordered_by_variance=config.get("ordered_by_variance", False),
            folded_from=config.get("folded_from", ""),
            tokenizer_json=text,
            pairs=state.get(PAIRS_STATE),
        )

    def tokenizer_json(self) -> str:
        """The tokenizer as saved: no padding, no truncation (set again at load from ``max_length``)."""
        return self._tokenizer_json

    def save_files(self, folder: Path) -> None:
        """Write ``tokenizer.json`` into the encoder folder being saved."""
        (Path(folder) / TOKENIZER_FILE).write_text(self.tokenizer_json(), encoding="utf-8")

    def get_config(self) -> dict[str, Any]:
        return {
            "type": "folded",
            "source": f"folded:{self.folded_from}",
            "folded_from": self.folded_from,
            "dtype": str(self.stored.dtype),
            "max_length": self.max_length,
            "special_ids": self._special_ids.tolist(),
            "ordered_by_variance": self.ordered_by_variance,
            "tokenizer_sha256": self._tokenizer_sha256,
        }

    def get_state(self) -> dict[str, np.ndarray]:
        state = {"table": self.stored}
        if self.row_scale is not None:
            state["row_scale"] = self.row_scale
        if self.pairs is not None:
            state[PAIRS_STATE] = self.pairs.codes
        return state

    # -- the table -------------------------------------------------------------
    def rows(self, ids: np.ndarray) -> np.ndarray:
        """float32 rows of the table for ``ids`` (any shape), dequantised."""
        rows = self.stored[ids].astype(np.float32, copy=False)
        if self.row_scale is not None:
            rows = rows * self.row_scale[ids][..., None]
        return rows

    @property
    def table(self) -> np.ndarray:
        """The whole table as float32 (a copy for float16/int8 storage)."""
        return self.rows(np.arange(self.stored.shape[0]))

    # -- Backbone protocol -----------------------------------------------------
    @property
    def core_tokenizer(self) -> Any:
        """The ``tokenizers.Tokenizer`` that encoding uses (truncation at ``max_length``)."""
        return self._tokenizer

    @property
    def tokenizer(self) -> Any:
        """A transformers fast tokenizer over the same ``tokenizer.json``, for chunking (needs transformers);
        encoding itself uses the ``tokenizers`` object directly."""
        if self._hf_tokenizer is None:
            from tokenizers import Tokenizer

            from isotrope.backbones.resolve import require_transformers

            transformers = require_transformers("chunking documents with a folded encoder's tokenizer")
            # its own copy: transformers resets truncation on the tokenizer it wraps at every call
            self._hf_tokenizer = transformers.PreTrainedTokenizerFast(
                tokenizer_object=Tokenizer.from_str(self._tokenizer_json), model_max_length=self.max_length
            )
        return self._hf_tokenizer

    @property
    def vocab_size(self) -> int:
        return int(self.stored.shape[0])

    def vocabulary(self) -> list[str]:
        rows = self.vocab_size if self.pairs is None else self.pairs.vocab
        tokens = [self._tokenizer.id_to_token(i) or "" for i in range(rows)]
        return tokens + (self.pairs.names(tokens) if self.pairs is not None else [])

    def special_ids(self) -> np.ndarray:
        return self._special_ids

    def pad_id(self) -> int:
        return 0

    def token_ids(self, texts: list[str]) -> list[list[int]]:
        ids = [encoding.ids for encoding in self._tokenizer.encode_batch(list(texts), add_special_tokens=False)]
        return ids if self.pairs is None else self.pairs.extend(ids)

    def tokenize(self, texts: Sequence[str], kind: TextKind = "document") -> tuple[list[list[int]], list[list[int]]]:
        encodings = self._tokenizer.encode_batch(list(texts))
        ids, special = [e.ids for e in encodings], [e.special_tokens_mask for e in encodings]
        return (ids, special) if self.pairs is None else self.pairs.extend_with_mask(ids, special)

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray, special_mask: np.ndarray) -> TokenBatch:
        return TokenBatch(
            states=self.rows(input_ids), input_ids=input_ids, attention_mask=attention_mask, special_mask=special_mask
        )

    def pool_mean(self, texts: Sequence[str], weights: np.ndarray) -> np.ndarray:
        """Weighted mean of each text's rows, float32 (n, d) (:func:`isotrope.pooling.table_mean`): ids
        through the word cache (the tokenizer's ids; see :mod:`isotrope.backbones.word_cache`)."""
        return table_mean(
            texts, lambda batch: batch_ids(self._word_cache.ids(batch), self.pairs), self.stored, weights, self.row_scale
        )
