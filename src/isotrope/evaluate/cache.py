"""A disk cache of token states, so a sweep never runs the backbone twice on the same text.

Entries are keyed by sha256 over the backbone's config (model, layers, prompt, token prepending,
max length, backend and numeric class when not torch) and fitted arrays (a context table, if any), the text kind and the text. One SQLite file holds, per text, its
token ids, special-token mask, token states (float32) and the prompt target
position; batches are rebuilt from it by length, as the backbone would.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from isotrope.backbones.base import TextKind, TokenBatch, TokenizedBackbone, plan_batches

logger = logging.getLogger(__name__)

_SCHEMA = """CREATE TABLE IF NOT EXISTS states (
    key TEXT PRIMARY KEY, length INTEGER NOT NULL, target INTEGER NOT NULL,
    ids BLOB NOT NULL, special BLOB NOT NULL, states BLOB NOT NULL)"""


class CachedBackbone(TokenizedBackbone):
    """Wraps a backbone; ``backbone_texts`` counts the texts the wrapped backbone really ran on."""

    def __init__(self, backbone: TokenizedBackbone, cache_dir: str | Path) -> None:
        self.backbone = backbone
        self.tokenizer = backbone.tokenizer
        self.dim = backbone.dim
        self.backbone_texts = 0
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(Path(cache_dir) / "token_states.sqlite")
        self._db.execute(_SCHEMA)

    # delegated backbone protocol
    @property
    def vocab_size(self) -> int:
        return self.backbone.vocab_size

    def vocabulary(self) -> list[str]:
        return self.backbone.vocabulary()

    def special_ids(self) -> np.ndarray:
        return self.backbone.special_ids()

    def token_ids(self, texts: list[str]) -> list[list[int]]:
        return self.backbone.token_ids(texts)

    def get_config(self) -> dict[str, Any]:
        return self.backbone.get_config()

    def get_state(self) -> dict[str, np.ndarray]:
        return self.backbone.get_state()

    @property
    def needs_fit(self) -> bool:
        return self.backbone.needs_fit

    def fit(self, texts: Sequence[str], show_progress: bool = False) -> CachedBackbone:
        self.backbone.fit(texts, show_progress=show_progress)
        return self

    def _prefix(self) -> str:
        """Identity of the backbone: its config and any fitted arrays (context tables)."""
        from isotrope.fingerprint import fingerprint

        return fingerprint(self.backbone.get_config(), self.backbone.get_state())

    def _fill(self, texts: Sequence[str], keys: list[str], kind: TextKind, batch_size: int, max_tokens: int | None) -> None:
        """Run the backbone on the texts whose keys are not cached yet, and store their states."""
        known: set[str] = set()
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), 900):
            part = unique[start : start + 900]
            rows = self._db.execute(f"SELECT key FROM states WHERE key IN ({','.join('?' * len(part))})", part)
            known.update(key for (key,) in rows)
        missing = list({key: text for key, text in zip(keys, texts) if key not in known}.items())
        if not missing:
            return
        self.backbone_texts += len(missing)
        logger.info("token-state cache: running the backbone on %d of %d texts", len(missing), len(texts))
        for index, batch in self.backbone.iter_batches([text for _, text in missing], kind, batch_size, max_tokens):
            records = []
            for row, i in enumerate(index):
                n = int(batch.attention_mask[row].sum())
                target = -1 if batch.target_index is None else int(batch.target_index[row])
                records.append(
                    (
                        missing[i][0],
                        n,
                        target,
                        batch.input_ids[row, :n].astype(np.int64).tobytes(),
                        batch.special_mask[row, :n].astype(np.bool_).tobytes(),
                        np.ascontiguousarray(batch.states[row, :n], dtype=np.float32).tobytes(),
                    )
                )
            self._db.executemany("INSERT OR REPLACE INTO states VALUES (?, ?, ?, ?, ?, ?)", records)
            self._db.commit()

    def iter_batches(
        self, texts: Sequence[str], kind: TextKind = "document", batch_size: int = 32, max_tokens: int | None = None
    ) -> Iterator[tuple[np.ndarray, TokenBatch]]:
        prefix = self._prefix()
        keys = [hashlib.sha256(f"{prefix}\0{kind}\0{text}".encode()).hexdigest() for text in texts]
        self._fill(texts, keys, kind, batch_size, max_tokens)
        lengths = np.array([self._db.execute("SELECT length FROM states WHERE key = ?", (key,)).fetchone()[0] for key in keys])
        pad_id = self.tokenizer.pad_token_id or 0
        for index in plan_batches(lengths, batch_size, max_tokens):
            width = int(lengths[index].max())
            input_ids = np.full((len(index), width), pad_id, dtype=np.int64)
            attention = np.zeros((len(index), width), dtype=bool)
            special = np.ones((len(index), width), dtype=bool)
            states = np.zeros((len(index), width, self.dim), dtype=np.float32)
            targets = np.zeros(len(index), dtype=np.int64)
            for row, i in enumerate(index):
                n, target, ids, mask, values = self._db.execute(
                    "SELECT length, target, ids, special, states FROM states WHERE key = ?", (keys[i],)
                ).fetchone()
                input_ids[row, :n] = np.frombuffer(ids, dtype=np.int64)
                attention[row, :n] = True
                special[row, :n] = np.frombuffer(mask, dtype=np.bool_)
                states[row, :n] = np.frombuffer(values, dtype=np.float32).reshape(n, self.dim)
                targets[row] = target
            yield index, TokenBatch(states, input_ids, attention, special, None if (targets < 0).any() else targets)

    def close(self) -> None:
        self._db.close()
