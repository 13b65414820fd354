"""The fenced code blocks of a Markdown page and their run markers, for tests/test_docs.py.

A block a reader runs is marked on the line above it: ``<!-- run -->`` (the test suite runs it) or
``<!-- skip: REASON -->`` (it needs a cluster, a GPU or the network; the reason says which). Blocks
in a language a reader does not run (``text``, ``json``, ``yaml``, ...) need no marker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

#: languages of blocks a reader runs (and the test runs when marked)
RUNNABLE = ("bash", "sh", "shell", "console", "python", "py")
_FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)")
_MARKER = re.compile(r"^<!--\s*(run|skip)\s*(?::\s*(.*?))?\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block: its language, code, marker (``run``, ``skip`` or ``None``) and skip reason."""

    page: Path
    line: int
    language: str
    code: str
    marker: str | None
    reason: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page`` (indented fences included), with the marker on the line above it."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        stripped = lines[index].strip()
        match = _FENCE.match(stripped)
        if not match:
            index += 1
            continue
        fence, language = match.groups()
        end = index + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        indent = len(lines[index]) - len(lines[index].lstrip())
        code = "\n".join(line[indent:] for line in lines[index + 1 : end])
        above = lines[index - 1].strip() if index else ""
        marker = _MARKER.match(above)
        found.append(
            Block(
                page,
                index + 1,
                language.lower(),
                code,
                marker.group(1) if marker else None,
                (marker.group(2) or "") if marker else "",
            )
        )
        index = end + 1
    return found
