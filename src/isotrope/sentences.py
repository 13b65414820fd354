"""Sentence and line spans of a text: shared by chunking (ingestion) and autoshape's probe queries."""

from __future__ import annotations

import re

_CLOSERS = "\"'\u201d\u2019)\\]"
#: the characters every sentence end below starts with: looked ahead for first, so a search passes over the
#: others without trying each alternative (3 times faster on passages of English)
_FIRST = r"(?=[.!?\u2026\u3002\uff01\uff1f\n])"
# A sentence ends at . ! ? or an ellipsis (plus closing quotes or brackets) followed by
# whitespace and not by a lower-case letter ("e.g. this" does not end one), at a terminator
# standing alone between spaces ("laminar . the layer": tokenised text), at CJK sentence
# punctuation, or at a blank line.
_SENTENCE_END = re.compile(
    _FIRST + rf"(?:(?<=\s)[.!?\u2026]+[{_CLOSERS}]*\s+"
    rf"|[.!?\u2026]+[{_CLOSERS}]*\s+(?![a-z\s])"
    r"|[\u3002\uff01\uff1f]+[\"'\u201d\u2019\u300d\u300f)\]]*\s*"
    r"|\n[^\S\n]*\n\s*)"
)
# In a text with no capital letters, a terminator followed by whitespace ends a sentence whatever
# comes next, unless it closes an abbreviation (:data:`ABBREVIATIONS`, one letter, or dotted: "e.g.").
_LOWER_CASE_END = re.compile(_FIRST + rf"(?:[.!?\u2026]+[{_CLOSERS}]*\s+|[\u3002\uff01\uff1f]+\s*|\n[^\S\n]*\n\s*)")
_WORD_BEFORE = re.compile(r"([\w.]*)[.!?\u2026]+[" + _CLOSERS + r"]*\s+$")
_WORD_OR_TERMINATOR = re.compile(r"[\w.!?\u2026]")
#: words a period follows without ending a sentence (lower-case text only)
ABBREVIATIONS = frozenset(
    [
        "al",
        "approx",
        "ca",
        "cf",
        "dept",
        "dr",
        "eq",
        "eqs",
        "etc",
        "fig",
        "figs",
        "inc",
        "jr",
        "ltd",
        "mr",
        "mrs",
        "ms",
        "no",
        "nos",
        "p",
        "pp",
        "prof",
        "sr",
        "st",
        "vol",
        "vs",
    ]
)
_LINE_BREAK = re.compile(r"\n")


def split_sentences(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` character spans of the sentences of ``text``, whitespace trimmed, in order.

    Text written without capitals (lower-cased or tokenised corpora) is split at every terminator
    but those of abbreviations, so a sentence boundary never depends on the next word's case."""
    if any(c.isupper() for c in text):
        stops = [m.end() for m in _SENTENCE_END.finditer(text)]
    else:
        stops = [m.end() for m in _LOWER_CASE_END.finditer(text) if not _abbreviation(text, m.start(), m.end())]
    return _trimmed_spans(text, stops, 0, len(text))


def _abbreviation(text: str, start: int, end: int) -> bool:
    """Whether the sentence end ``text[start:end]`` closes an abbreviation ("fig.", "e.g.", "j."). Only the
    run of word characters and terminators before ``start`` is searched (the word a terminator ends lies in
    it), so a long text without capitals is split in linear time, not in time quadratic in its length."""
    begin = start
    while begin and _WORD_OR_TERMINATOR.match(text, begin - 1):
        begin -= 1
    match = _WORD_BEFORE.search(text, begin, end)
    if match is None or text[match.end(1)] != ".":  # "!", "?" and an ellipsis always end one
        return False
    word = match.group(1)
    return bool(word) and (word in ABBREVIATIONS or "." in word or (len(word) == 1 and word.isalpha()))


def split_lines(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """Spans of the non-blank lines of ``text[start:end]``, whitespace trimmed."""
    return _trimmed_spans(text, [m.end() for m in _LINE_BREAK.finditer(text, start, end)], start, end)


def _trimmed_spans(text: str, stops: list[int], start: int, end: int) -> list[tuple[int, int]]:
    """Spans of ``text[start:end]`` each ending at one of ``stops``, whitespace trimmed, empty ones dropped."""
    spans = []
    begin = start
    for stop in [*stops, end]:
        piece = text[begin:stop]
        stripped = piece.strip()
        if stripped:
            left = begin + len(piece) - len(piece.lstrip())
            spans.append((left, left + len(stripped)))
        begin = stop
    return spans
