"""Split documents into sentence-aware chunks of at most ``chunk_tokens`` tokens.

:class:`TokenChunker` splits the text into sentences, packs whole sentences into chunks
of at most ``chunk_tokens`` tokens (counted with the encoder's own tokenizer, without
special tokens) and starts each chunk with the trailing sentences of the previous one
that fit in ``overlap_tokens``. A sentence over the budget is split at line breaks, and
a line still over it into token windows cut at word boundaries. Every chunk is a
substring ``document.text[start:end]`` and is re-counted after packing, so the budget
holds even where a tokenizer counts a joined text differently from its parts.

Chunk ids are stable: :func:`chunk_id` hashes the document key, the chunk's position and
its text, so re-ingesting an unchanged file gives identical ids and a changed chunk a
new one.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from isotrope.ingest.loaders import Document

_TOKENIZE_BATCH = 1024

# A sentence ends at . ! ? or an ellipsis (plus closing quotes or brackets) followed by
# whitespace and not by a lower-case letter ("e.g. this" does not end one), at CJK
# sentence punctuation, or at a blank line.
_SENTENCE_END = re.compile(
    r"[.!?\u2026]+[\"'\u201d\u2019)\]]*\s+(?![a-z\s])"
    r"|[\u3002\uff01\uff1f]+[\"'\u201d\u2019\u300d\u300f)\]]*\s*"
    r"|\n[^\S\n]*\n\s*"
)


@dataclass(frozen=True)
class Chunk:
    """A piece of a document, ``text == document.text[start:end]``, ready to embed and store.

    ``metadata`` holds the document's metadata plus ``source``, ``document`` (the
    document key), ``position``, ``start`` and ``end``, which override same-named
    document fields.
    """

    id: str
    text: str
    source: str
    position: int
    start: int
    end: int
    metadata: dict[str, Any] = field(default_factory=dict)


class _Unit(NamedTuple):
    start: int
    end: int
    tokens: int


def chunk_id(source: str, position: int, text: str) -> str:
    """Short stable id: sha256 over the document key, the chunk position and the text's sha256."""
    content = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return hashlib.sha256(f"{source}\x00{position}\x00{content}".encode()).hexdigest()[:16]


def split_sentences(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` character spans of the sentences of ``text``, whitespace trimmed, in order."""
    return _trimmed_spans(text, _SENTENCE_END, 0, len(text))


def make_chunks(document: Document, spans: Sequence[tuple[int, int]]) -> list[Chunk]:
    """Build the :class:`Chunk` objects of ``document`` from ordered character spans."""
    chunks = []
    for position, (start, end) in enumerate(spans):
        text = document.text[start:end]
        metadata = {
            **document.metadata,
            "source": document.source,
            "document": document.key,
            "position": position,
            "start": start,
            "end": end,
        }
        chunks.append(
            Chunk(
                id=chunk_id(document.key, position, text),
                text=text,
                source=document.source,
                position=position,
                start=start,
                end=end,
                metadata=metadata,
            )
        )
    return chunks


class TokenChunker:
    """Sentence-aware chunks of at most ``chunk_tokens`` tokens of a fast Hugging Face tokenizer.

    ``overlap_tokens`` bounds the trailing sentences repeated at the start of the next
    chunk (a sentence longer than that is not repeated). ``chunk_tokens`` excludes special
    tokens, so it must leave room for them within the tokenizer's ``model_max_length``.
    """

    def __init__(self, tokenizer: Any, chunk_tokens: int = 256, overlap_tokens: int = 32) -> None:
        if chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
        if not 0 <= overlap_tokens < chunk_tokens:
            raise ValueError(f"overlap_tokens must be in [0, chunk_tokens={chunk_tokens}), got {overlap_tokens}")
        if getattr(tokenizer, "is_fast", True) is False:
            raise ValueError(f"TokenChunker needs a fast tokenizer (offset mapping); got {type(tokenizer).__name__}")
        max_length = getattr(tokenizer, "model_max_length", None)
        special = tokenizer.num_special_tokens_to_add() if hasattr(tokenizer, "num_special_tokens_to_add") else 0
        if isinstance(max_length, int) and chunk_tokens + special > max_length:
            raise ValueError(
                f"chunk_tokens={chunk_tokens} plus {special} special tokens exceeds the tokenizer's "
                f"model_max_length={max_length}"
            )
        self.tokenizer = tokenizer
        self.chunk_tokens = chunk_tokens
        self.overlap_tokens = overlap_tokens

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Number of tokens of each text, without special tokens (batched)."""
        counts: list[int] = []
        for begin in range(0, len(texts), _TOKENIZE_BATCH):
            encoded = self.tokenizer(
                list(texts[begin : begin + _TOKENIZE_BATCH]),
                add_special_tokens=False,
                return_attention_mask=False,
                return_token_type_ids=False,
                verbose=False,
            )
            counts.extend(len(ids) for ids in encoded["input_ids"])
        return counts

    def chunk(self, document: Document) -> list[Chunk]:
        """Chunks of ``document`` in text order, positions 0, 1, ..."""
        text = document.text
        spans = split_sentences(text)
        units: list[_Unit] = []
        for (start, end), tokens in zip(spans, self.count_tokens([text[s:e] for s, e in spans])):
            if tokens <= self.chunk_tokens:
                units.append(_Unit(start, end, tokens))
            else:
                units.extend(self._split_long(text, start, end))
        return make_chunks(document, self._pack_checked(text, units, self.chunk_tokens))

    def _split_long(self, text: str, start: int, end: int) -> list[_Unit]:
        """Split an over-budget sentence at line breaks, then lines still over it into token windows."""
        lines = _trimmed_spans(text, re.compile(r"\n"), start, end)
        units = []
        for (line_start, line_end), tokens in zip(lines, self.count_tokens([text[s:e] for s, e in lines])):
            if tokens <= self.chunk_tokens:
                units.append(_Unit(line_start, line_end, tokens))
            else:
                units.extend(self._windows(text, line_start, line_end, self.chunk_tokens))
        return units

    def _windows(self, text: str, start: int, end: int, budget: int) -> list[_Unit]:
        """Token windows of at most ``budget`` tokens over ``text[start:end]``, cut between words when possible."""
        encoded = self.tokenizer(
            text[start:end], add_special_tokens=False, return_offsets_mapping=True, verbose=False
        )
        offsets = encoded["offset_mapping"]
        words = encoded.word_ids()
        n = len(offsets)

        def word_start(k: int) -> bool:
            return words[k] is None or words[k] != words[k - 1]

        units = []
        first = 0
        while first < n:
            last = min(first + budget, n)
            if last < n:
                cut = last
                while cut > first + 1 and not word_start(cut):
                    cut -= 1
                last = cut if word_start(cut) else last
            units.append(
                _Unit(
                    start + min(o[0] for o in offsets[first:last]),
                    start + max(o[1] for o in offsets[first:last]),
                    last - first,
                )
            )
            if last == n:
                break
            following = max(last - min(self.overlap_tokens, (last - first) // 2), first + 1)
            while following < last and not word_start(following):
                following += 1
            first = following
        return units

    def _pack_checked(self, text: str, units: Sequence[_Unit], budget: int) -> list[tuple[int, int]]:
        """Pack units into chunk spans, re-count the chunks and re-split any over ``chunk_tokens``."""
        groups = _pack([unit.tokens for unit in units], budget, self.overlap_tokens)
        spans = [(units[i].start, max(unit.end for unit in units[i:j])) for i, j in groups]
        result: list[tuple[int, int]] = []
        for (i, j), span, tokens in zip(groups, spans, self.count_tokens([text[s:e] for s, e in spans])):
            if tokens == 0:  # nothing the encoder would see (e.g. only characters it drops)
                continue
            if tokens <= self.chunk_tokens:
                result.append(span)
                continue
            tighter = budget - (tokens - self.chunk_tokens)
            if tighter < 1:
                raise ValueError(
                    f"cannot fit text[{span[0]}:{span[1]}] into chunk_tokens={self.chunk_tokens}: "
                    "the tokenizer counts its pieces inconsistently"
                )
            parts = units[i:j] if j - i > 1 else self._windows(text, *span, tighter)
            result.extend(self._pack_checked(text, parts, tighter))
        return result


class LlamaIndexChunker:
    """Chunks from LlamaIndex's ``SentenceSplitter``, counted with the same tokenizer, as :class:`Chunk` objects.

    LlamaIndex sums the token counts of its splits, so a chunk can exceed
    ``chunk_tokens`` where the tokenizer is not additive; :class:`TokenChunker` re-counts.
    """

    def __init__(self, tokenizer: Any, chunk_tokens: int = 256, overlap_tokens: int = 32) -> None:
        from llama_index.core.node_parser import SentenceSplitter

        self.tokenizer = tokenizer
        self.chunk_tokens = chunk_tokens
        self.overlap_tokens = overlap_tokens
        self._splitter = SentenceSplitter(
            chunk_size=chunk_tokens, chunk_overlap=overlap_tokens, tokenizer=self._tokenize
        )

    def _tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False, verbose=False)

    def chunk(self, document: Document) -> list[Chunk]:
        """Chunks of ``document`` in text order, located in its text to give character offsets."""
        spans = []
        cursor = 0
        for piece in self._splitter.split_text(document.text):
            if not piece:
                continue
            start = document.text.find(piece, cursor)
            if start < 0:
                raise ValueError(f"{document.key}: SentenceSplitter returned text not found in the document")
            spans.append((start, start + len(piece)))
            cursor = start + 1
        return make_chunks(document, spans)


def _trimmed_spans(text: str, separator: re.Pattern[str], start: int, end: int) -> list[tuple[int, int]]:
    """Spans of ``text[start:end]`` each ending with a ``separator`` match, whitespace trimmed, empty ones dropped."""
    spans = []
    begin = start
    for stop in [m.end() for m in separator.finditer(text, start, end)] + [end]:
        piece = text[begin:stop]
        stripped = piece.strip()
        if stripped:
            left = begin + len(piece) - len(piece.lstrip())
            spans.append((left, left + len(stripped)))
        begin = stop
    return spans


def _pack(tokens: Sequence[int], budget: int, overlap: int) -> list[tuple[int, int]]:
    """Greedy packing of units into index ranges ``[i, j)`` of at most ``budget`` tokens.

    Each new range starts with the trailing units of the previous one that fit in
    ``overlap`` tokens (and leave room for the next unit). A unit over the budget gets a
    range of its own.
    """
    groups = []
    first, total = 0, 0
    for index, size in enumerate(tokens):
        if index > first and total + size > budget:
            groups.append((first, index))
            first, total = index, 0
            while first - 1 > groups[-1][0] and total + tokens[first - 1] <= min(overlap, budget - size):
                first -= 1
                total += tokens[first]
        total += size
    if tokens:
        groups.append((first, len(tokens)))
    return groups
