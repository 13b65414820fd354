"""Sentence and line spans of a text: shared by chunking (ingestion) and autoshape's probe queries."""

from __future__ import annotations

import re

# A sentence ends at . ! ? or an ellipsis (plus closing quotes or brackets) followed by
# whitespace and not by a lower-case letter ("e.g. this" does not end one), at CJK
# sentence punctuation, or at a blank line.
_SENTENCE_END = re.compile(
    r"[.!?\u2026]+[\"'\u201d\u2019)\]]*\s+(?![a-z\s])"
    r"|[\u3002\uff01\uff1f]+[\"'\u201d\u2019\u300d\u300f)\]]*\s*"
    r"|\n[^\S\n]*\n\s*"
)
_LINE_BREAK = re.compile(r"\n")


def split_sentences(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` character spans of the sentences of ``text``, whitespace trimmed, in order."""
    return _trimmed_spans(text, _SENTENCE_END, 0, len(text))


def split_lines(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """Spans of the non-blank lines of ``text[start:end]``, whitespace trimmed."""
    return _trimmed_spans(text, _LINE_BREAK, start, end)


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
