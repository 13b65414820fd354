"""Split documents into sentence-aware chunks of at most ``chunk_tokens`` tokens.

:class:`TokenChunker` splits the text into sentences, packs whole sentences into chunks
of at most ``chunk_tokens`` tokens (counted with the encoder's own tokenizer, without
special tokens) and starts each chunk with the trailing sentences of the previous one
that fit in ``overlap_tokens``. A sentence over the budget is split at line breaks, and
a line still over it into token windows cut at word boundaries. Every chunk is a
substring ``document.text[start:end]``; a chunk of several units is re-counted after
packing, so the budget holds even where a tokenizer counts a joined text differently
from its parts.

:meth:`TokenChunker.chunk_many` cuts many documents with a few batched tokenizer calls (the
sentences of every document in one call, then the packed chunks in another): the same chunks
as :meth:`TokenChunker.chunk` one document at a time. Counting goes straight to the
``tokenizers`` object (a private copy, no truncation or padding), so a folded encoder's
tokenizer needs no transformers.

Chunk ids are stable: :func:`chunk_id` hashes the document key, the chunk's position and
its text, so re-ingesting an unchanged file gives identical ids and a changed chunk a
new one.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from isotrope.backbones.word_cache import WordPieceCache, core_tokenizer
from isotrope.ingest.loaders import Document
from isotrope.sentences import split_lines, split_sentences

_TOKENIZE_BATCH = 1024


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
    #: whether ``tokens`` is the count of ``text[start:end]`` on its own (a token window's is its share of a line's)
    counted: bool = True


def chunk_id(source: str, position: int, text: str) -> str:
    """Short stable id: sha256 over the document key, the chunk position and the text's sha256."""
    content = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return hashlib.sha256(f"{source}\x00{position}\x00{content}".encode()).hexdigest()[:16]


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
    """Sentence-aware chunks of at most ``chunk_tokens`` tokens of a fast tokenizer.

    ``tokenizer`` is a transformers fast tokenizer or a ``tokenizers.Tokenizer`` (then
    ``max_length``, the encoder's limit with special tokens, replaces ``model_max_length``).
    ``overlap_tokens`` bounds the trailing sentences repeated at the start of the next
    chunk (a sentence longer than that is not repeated). ``chunk_tokens`` excludes special
    tokens, so it must leave room for them within the tokenizer's maximum length.
    """

    def __init__(self, tokenizer: Any, chunk_tokens: int = 256, overlap_tokens: int = 32, max_length: int | None = None) -> None:
        if chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
        if not 0 <= overlap_tokens < chunk_tokens:
            raise ValueError(f"overlap_tokens must be in [0, chunk_tokens={chunk_tokens}), got {overlap_tokens}")
        core = core_tokenizer(tokenizer)
        max_length = max_length if max_length is not None else getattr(tokenizer, "model_max_length", None)
        processor = core.post_processor
        special = processor.num_special_tokens_to_add(False) if processor is not None else 0
        if isinstance(max_length, int) and chunk_tokens + special > max_length:
            raise ValueError(
                f"chunk_tokens={chunk_tokens} plus {special} special tokens exceeds the tokenizer's model_max_length={max_length}"
            )
        self.tokenizer = tokenizer
        self.chunk_tokens = chunk_tokens
        self.overlap_tokens = overlap_tokens
        self._core = core
        #: BERT-style WordPiece: a text's count is the sum of its words' counts, each word tokenized once
        self._words = WordPieceCache(core, core.to_str(), max_length=sys.maxsize)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Number of tokens of each text, without special tokens (batched)."""
        if self._words.enabled:
            return self._words.counts(texts)
        counts: list[int] = []
        for begin in range(0, len(texts), _TOKENIZE_BATCH):
            encoded = self._core.encode_batch(list(texts[begin : begin + _TOKENIZE_BATCH]), add_special_tokens=False)
            counts.extend(len(encoding.ids) for encoding in encoded)
        return counts

    def chunk(self, document: Document) -> list[Chunk]:
        """Chunks of ``document`` in text order, positions 0, 1, ..."""
        return self.chunk_many([document])[0]

    def chunk_many(self, documents: Sequence[Document]) -> list[list[Chunk]]:
        """The chunks of each document, as :meth:`chunk` gives them, counted in batched tokenizer calls."""
        texts = [document.text for document in documents]
        sentences = [split_sentences(text) for text in texts]
        counts = iter(self.count_tokens([text[s:e] for text, spans in zip(texts, sentences) for s, e in spans]))
        units = [self._units(text, [(s, e, next(counts)) for s, e in spans]) for text, spans in zip(texts, sentences)]
        groups = [_pack([u.tokens for u in doc_units], self.chunk_tokens, self.overlap_tokens) for doc_units in units]
        # a chunk of one unit counted on its own text is within the budget; the others are re-counted
        recount = [
            (d, _spans(units[d], [(i, j)])[0])
            for d in range(len(documents))
            for i, j in groups[d]
            if j - i > 1 or not units[d][i].counted
        ]
        over = {
            d
            for (d, (s, e)), n in zip(recount, self.count_tokens([texts[d][s:e] for d, (s, e) in recount]))
            if n > self.chunk_tokens
        }
        return [
            make_chunks(document, self._refit(document.text, units[d]) if d in over else _spans(units[d], groups[d]))
            for d, document in enumerate(documents)
        ]

    def _refit(self, text: str, units: list[_Unit]) -> list[tuple[int, int]]:
        """Spans for a tokenizer that is not additive (e.g. byte-level BPE marks a word after a space):
        every unit made to fit on its own, then packed checking each chunk's real count."""
        units = self._fitting_units(text, units)

        def fits(first: int, last: int) -> bool:
            start, end = _spans(units, [(first, last)])[0]
            return self.count_tokens([text[start:end]])[0] <= self.chunk_tokens

        return _spans(units, _pack([u.tokens for u in units], self.chunk_tokens, self.overlap_tokens, fits))

    def _units(self, text: str, sentences: Sequence[tuple[int, int, int]]) -> list[_Unit]:
        """Sentences ``(start, end, tokens)`` that fit the budget; longer ones split at line breaks, then
        into token windows."""
        units = []
        for start, end, tokens in sentences:
            if tokens <= self.chunk_tokens:
                units.append(_Unit(start, end, tokens))
                continue
            lines = split_lines(text, start, end)
            for (line_start, line_end), line_tokens in zip(lines, self.count_tokens([text[s:e] for s, e in lines])):
                if line_tokens <= self.chunk_tokens:
                    units.append(_Unit(line_start, line_end, line_tokens))
                else:
                    units.extend(self._windows(text, line_start, line_end, self.chunk_tokens))
        return [unit for unit in units if unit.tokens > 0]  # nothing an encoder would see

    def _windows(self, text: str, start: int, end: int, budget: int) -> list[_Unit]:
        """Token windows of at most ``budget`` tokens over ``text[start:end]``, cut between words when possible."""
        encoded = self._core.encode(text[start:end], add_special_tokens=False)
        offsets = encoded.offsets
        words = encoded.word_ids
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
            left = start + min(o[0] for o in offsets[first:last])
            right = start + max(o[1] for o in offsets[first:last])
            piece = text[left:right]
            if piece.strip():  # byte-level tokens may carry the space before a word: trim it
                left += len(piece) - len(piece.lstrip())
                units.append(_Unit(left, left + len(piece.strip()), last - first, counted=False))
            if last == n:
                break
            following = max(last - min(self.overlap_tokens, (last - first) // 2), first + 1)
            while following < last and not word_start(following):
                following += 1
            first = following
        return units

    def _fitting_units(self, text: str, units: Sequence[_Unit]) -> list[_Unit]:
        """Units re-counted on their own text; a window over the budget is re-split with a tighter one."""
        result = []
        for unit, tokens in zip(units, self.count_tokens([text[u.start : u.end] for u in units])):
            if tokens <= self.chunk_tokens:
                result.append(unit._replace(tokens=tokens, counted=True))
                continue
            tighter = min(unit.tokens, self.chunk_tokens) - (tokens - self.chunk_tokens)
            if tighter < 1:
                raise ValueError(
                    f"cannot fit text[{unit.start}:{unit.end}] into chunk_tokens={self.chunk_tokens}: "
                    "the tokenizer counts its pieces inconsistently"
                )
            result.extend(self._fitting_units(text, self._windows(text, unit.start, unit.end, tighter)))
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
        self._splitter = SentenceSplitter(chunk_size=chunk_tokens, chunk_overlap=overlap_tokens, tokenizer=self._tokenize)

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


def _spans(units: Sequence[_Unit], groups: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    return [(units[i].start, max(unit.end for unit in units[i:j])) for i, j in groups]


def _pack(
    tokens: Sequence[int], budget: int, overlap: int, fits: Callable[[int, int], bool] | None = None
) -> list[tuple[int, int]]:
    """Greedy packing of units into index ranges ``[i, j)`` of at most ``budget`` summed tokens.

    Each range after the first starts with the trailing units of the previous one that
    fit in ``overlap`` tokens and leave room for the next unit (never the previous
    range's first unit). A unit over the budget gets a range of its own. ``fits(i, j)``,
    when given, is the real test: a failing range drops units from its end, then its
    overlap, until it passes or holds a single new unit.
    """
    groups: list[tuple[int, int]] = []
    first = 0
    while first < len(tokens):
        fresh = groups[-1][1] if groups else 0  # first unit not in any range yet
        last, total = fresh, sum(tokens[first:fresh])
        while last < len(tokens) and (last == fresh or total + tokens[last] <= budget):
            total += tokens[last]
            last += 1
        while fits is not None and not fits(first, last):
            if last - 1 > fresh:
                last -= 1
            elif first < fresh:
                first += 1
            else:
                break
        groups.append((first, last))
        if last == len(tokens):
            break
        room, first = min(overlap, budget - tokens[last]), last
        while first - 1 > groups[-1][0] and sum(tokens[first - 1 : last]) <= room:
            first -= 1
    return groups
