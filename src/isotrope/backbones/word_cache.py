"""Token ids for BERT-style WordPiece tokenizers, through a cache of space-separated words.

``tokenizers`` spends most of a folded encoder's time on long texts: normalizing, splitting and
tracking offsets that a bag of tokens never reads. With a ``BertNormalizer`` and a
``BertPreTokenizer`` every normalization step is local to a character and every whitespace
character ends a pre-token, so a text's ids are the ids of its space-separated words, one after
the other, between the post-processor's ``[CLS]`` and ``[SEP]``. Each word's ids are computed by
the tokenizer itself the first time it is seen and then read from a dict, so a corpus is
tokenized by ``str.split`` and dict look-ups. Other tokenizers (byte-level BPE, SentencePiece:
a space belongs to the next token) go through the tokenizer. ``tests/test_word_cache.py``
checks the ids against the tokenizer's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import chain
from typing import Any

#: cached words before the cache is emptied and refilled (bounds memory on an endless stream: about
#: 150 bytes a word); a million passages of English hold about 300,000 distinct space-separated words
MAX_CACHED = 500_000


def _words(text: str) -> list[str]:
    """``text`` split at spaces, tabs, newlines and carriage returns (whitespace to BertPreTokenizer; three
    ``str.replace`` scans take a hundredth of one ``str.translate``)."""
    return text.replace("\t", " ").replace("\n", " ").replace("\r", " ").split(" ")


def core_tokenizer(tokenizer: Any, max_length: int | None = None) -> Any:
    """A private ``tokenizers.Tokenizer`` copy of ``tokenizer`` (a transformers fast tokenizer or a
    ``tokenizers.Tokenizer``) without padding, truncating at ``max_length`` (None: not at all): the ids,
    counts and offsets transformers gives, without its conversion of each encoding to Python lists."""
    from tokenizers import Tokenizer

    backend = tokenizer if isinstance(tokenizer, Tokenizer) else getattr(tokenizer, "backend_tokenizer", None)
    if getattr(tokenizer, "is_fast", True) is False or not isinstance(backend, Tokenizer):
        raise ValueError(f"isotrope needs a fast tokenizer (offsets, batched encoding); got {type(tokenizer).__name__}")
    core = Tokenizer.from_str(backend.to_str())
    core.no_padding()
    if max_length is None:
        core.no_truncation()
    else:
        core.enable_truncation(max_length)
    return core


def _is_bert_style(config: dict[str, Any]) -> bool:
    normalizer, pre = config.get("normalizer") or {}, config.get("pre_tokenizer") or {}
    added = config.get("added_tokens") or []
    return (
        normalizer.get("type") == "BertNormalizer"
        and pre.get("type") == "BertPreTokenizer"
        and (config.get("model") or {}).get("type") == "WordPiece"
        and not any(
            token.get("lstrip")
            or token.get("rstrip")
            or token.get("single_word")
            or any(c.isspace() for c in token.get("content", ""))
            for token in added
        )
    )


class WordPieceCache:
    """Ids of texts as ``tokenizer.encode_batch`` gives them (specials added, truncated at ``max_length``)."""

    def __init__(self, tokenizer: Any, tokenizer_json: str, max_length: int) -> None:
        self._tokenizer = tokenizer
        self.max_length = max_length
        self._words: dict[str, list[int]] = {}
        self._lengths: dict[str, int] = {"": 0}  # a word's number of ids, for counts()
        self._first, self._last = 0, 0
        self.enabled = _is_bert_style(json.loads(tokenizer_json))
        if self.enabled:
            empty, probe = tokenizer.encode("").ids, tokenizer.encode("a").ids
            self.enabled = len(empty) == 2 and len(probe) == 3 and [probe[0], probe[-1]] == empty
            self._first, self._last = (empty[0], empty[1]) if self.enabled else (0, 0)

    def _word_ids(self, word: str) -> list[int]:
        word_ids = self._words.get(word)
        if word_ids is None:
            if len(self._words) >= MAX_CACHED:
                self._words.clear()
            word_ids = self._words[word] = self._tokenizer.encode(word, add_special_tokens=False).ids
        return word_ids

    def _text_ids(self, text: str) -> list[int]:
        words = _words(text)
        if len(words) < self.max_length:  # every word looked up at once, truncated after
            try:
                pieces = list(map(self._words.__getitem__, words))
            except KeyError:
                pieces = [self._word_ids(word) for word in words]
        else:  # a longer text stops at max_length ids
            pieces, count = [], 0
            for word in words:
                pieces.append(self._word_ids(word))
                count += len(pieces[-1])
                if count >= self.max_length:
                    break
        ids = [self._first, *chain.from_iterable(pieces)]
        del ids[self.max_length - 1 :]
        ids.append(self._last)
        return ids

    def ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's ids, as ``encode_batch`` gives them (specials added, truncated at ``max_length``)."""
        if not self.enabled:
            return [encoding.ids for encoding in self._tokenizer.encode_batch(list(texts))]
        return [self._text_ids(text) for text in texts]

    def counts(self, texts: Sequence[str]) -> list[int]:
        """Each text's number of tokens without special tokens and without truncation (when ``enabled``)."""
        lengths = self._lengths
        counts = []
        for text in texts:
            words = _words(text)
            try:
                counts.append(sum(map(lengths.__getitem__, words)))
            except KeyError:  # a word not seen yet
                if len(lengths) >= MAX_CACHED:
                    lengths.clear()
                    lengths[""] = 0
                for word in words:
                    if word not in lengths:
                        lengths[word] = len(self._tokenizer.encode(word, add_special_tokens=False).ids)
                counts.append(sum(map(lengths.__getitem__, words)))
        return counts
