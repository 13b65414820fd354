"""Read fit corpora and encode inputs: one text a line (.txt) or a field of JSON lines (.jsonl)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from isotrope.errors import DataFormatError


def _open_text(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def iter_texts(path: str | Path, text_field: str = "text") -> Iterator[str]:
    """Stream the non-empty texts of a corpus file (.txt, .jsonl, optionally gzipped).

    Errors name the file and line: an undecodable line, malformed JSON, a record
    without ``text_field`` or whose value is not a string.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file not found: {path}")
    suffixes = [suffix for suffix in path.suffixes if suffix != ".gz"]
    is_jsonl = bool(suffixes) and suffixes[-1] in (".jsonl", ".ndjson")
    with _open_text(path) as handle:
        line_number = 0
        try:
            for line_number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                if not is_jsonl:
                    yield line.rstrip("\n")
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise DataFormatError(f"{path}:{line_number}: malformed JSON ({error.msg})") from None
                value = record.get(text_field) if isinstance(record, dict) else None
                if not isinstance(value, str):
                    raise DataFormatError(f"{path}:{line_number}: no string field {text_field!r}")
                if value.strip():
                    yield value
        except UnicodeDecodeError:
            raise DataFormatError(f"{path}:{line_number + 1}: not valid UTF-8 text") from None
