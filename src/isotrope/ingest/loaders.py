"""Load documents from files: text, Markdown, reStructuredText, HTML, PDF, JSON (lines) and CSV.

:func:`iter_documents` walks a directory (recursively, in sorted order, skipping hidden
files and folders) or reads one file, and yields :class:`Document` objects one at a time,
so a corpus is never held in memory. Text is UTF-8, or UTF-16 when the file starts with
a UTF-16 byte-order mark. Input that cannot be loaded — a binary or empty
file, text that is not UTF-8, a file over ``max_file_bytes``, an unsupported extension,
a malformed JSON line, a row without text — is reported as a :class:`SkippedFile`
(passed to ``on_error``, or logged at WARNING without one) and the other files still load.

Formats and what one :class:`Document` is:

* ``.txt .md .markdown .rst``: the whole file.
* ``.html .htm``: the visible text of the page (scripts, styles and ``<head>`` dropped,
  block elements separated by blank lines); ``metadata["title"]`` from ``<title>``.
* ``.pdf``: one document per page, ``metadata["page"]`` (1-based) and ``["pages"]``.
  Per page rather than per file so that a hit cites its page directly, chunks never
  straddle a page, and a long PDF is streamed page by page.
* ``.jsonl``: one document per JSON object line; ``.json``: an object, an array of
  objects, or JSON lines. The text is ``record[text_field]``; the other scalar fields
  (or only ``metadata_fields``) become metadata, with ``metadata["line"]``.
* ``.csv``: one document per row of a file with a header; the text is the
  ``text_field`` column, the other columns become metadata, with ``metadata["line"]``.
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import json
import logging
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_MAX_FILE_BYTES = 50_000_000
TEXT_SUFFIXES = frozenset({".txt", ".md", ".markdown", ".rst"})
HTML_SUFFIXES = frozenset({".html", ".htm"})
SUPPORTED_SUFFIXES = TEXT_SUFFIXES | HTML_SUFFIXES | {".pdf", ".jsonl", ".json", ".csv"}

_SNIFF_BYTES = 8192
_HTML_DROPPED = ["script", "style", "noscript", "template", "head"]
_HTML_BLOCKS = [
    "address", "article", "aside", "blockquote", "dd", "div", "dl", "dt", "figcaption",
    "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6", "header", "hr", "li",
    "main", "nav", "ol", "p", "pre", "section", "table", "td", "th", "tr", "ul",
]  # fmt: skip


@dataclass(frozen=True)
class Document:
    """One unit of text to chunk and index.

    ``source`` is the file's path relative to the root that was loaded (POSIX
    separators); ``position`` is the record's index in a multi-document file (row of a
    JSON lines / CSV file, page of a PDF) and 0 otherwise; ``id`` is the record's
    ``id_field`` value when one was asked for.
    """

    source: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)
    position: int = 0
    id: str | None = None

    @property
    def key(self) -> str:
        """Stable identity within a corpus: ``source#id``, or ``source#position`` without an id."""
        return f"{self.source}#{self.position if self.id is None else self.id}"


@dataclass(frozen=True)
class SkippedFile:
    """A file (or one record of it, when ``line`` is set) that was not loaded, and why."""

    path: str
    reason: str
    line: int | None = None

    def __str__(self) -> str:
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        return f"{where}: {self.reason}"


@dataclass
class LoadReport:
    """Collects what was skipped; pass ``on_error=report.add``."""

    skipped: list[SkippedFile] = field(default_factory=list)

    def add(self, entry: SkippedFile) -> None:
        self.skipped.append(entry)


OnError = Callable[[SkippedFile], None]


class _Skip(Exception):
    """A whole file cannot be loaded; the message is the reason."""


@dataclass(frozen=True)
class _Fields:
    text: str
    id: str | None
    metadata: tuple[str, ...] | None


def file_fingerprint(path: str | Path, *, block_bytes: int = 1 << 20) -> str:
    """SHA-256 hex digest of a file's bytes, read in blocks (unchanged files can be skipped)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(block_bytes):
            digest.update(block)
    return digest.hexdigest()


def iter_files(source: str | Path, *, on_error: OnError | None = None) -> Iterator[tuple[Path, str]]:
    """Yield ``(path, name)`` for each non-hidden file under ``source``, in sorted order.

    ``name`` is the path relative to ``source`` (POSIX separators), or the file name when
    ``source`` is a file. Folders that cannot be read are reported to ``on_error``.
    """
    root = Path(source)
    if root.is_file():
        yield root, root.name
        return
    if not root.is_dir():
        raise FileNotFoundError(f"no such file or directory: {root}")

    def walk_error(exc: OSError) -> None:
        name = Path(exc.filename).relative_to(root).as_posix() if exc.filename else str(root)
        _report(SkippedFile(name, f"cannot read folder: {exc.strerror or exc}"), on_error)

    for dirpath, dirnames, filenames in os.walk(root, onerror=walk_error):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for filename in sorted(filenames):
            if not filename.startswith("."):
                path = Path(dirpath) / filename
                yield path, path.relative_to(root).as_posix()


def iter_documents(
    source: str | Path,
    *,
    text_field: str = "text",
    id_field: str | None = None,
    metadata_fields: Iterable[str] | None = None,
    max_file_bytes: int | None = DEFAULT_MAX_FILE_BYTES,
    on_error: OnError | None = None,
) -> Iterator[Document]:
    """Stream the documents of a folder (recursively) or of one file.

    ``text_field``, ``id_field`` and ``metadata_fields`` apply to JSON and CSV records;
    ``max_file_bytes=None`` lifts the size limit. Whatever cannot be loaded is logged and
    passed to ``on_error`` (for example ``LoadReport().add``); loading goes on.
    """
    for path, name in iter_files(source, on_error=on_error):
        yield from load_file(
            path,
            name=name,
            text_field=text_field,
            id_field=id_field,
            metadata_fields=metadata_fields,
            max_file_bytes=max_file_bytes,
            on_error=on_error,
        )


def load_file(
    path: str | Path,
    *,
    name: str | None = None,
    text_field: str = "text",
    id_field: str | None = None,
    metadata_fields: Iterable[str] | None = None,
    max_file_bytes: int | None = DEFAULT_MAX_FILE_BYTES,
    on_error: OnError | None = None,
) -> Iterator[Document]:
    """Stream the documents of one file; ``name`` (default: the file name) becomes ``Document.source``."""
    if not text_field:
        raise ValueError("text_field must be a non-empty string")
    if isinstance(metadata_fields, str):
        raise TypeError(f"metadata_fields must be a list of field names, not the string {metadata_fields!r}")
    path = Path(path)
    name = path.name if name is None else name
    fields = _Fields(text_field, id_field, None if metadata_fields is None else tuple(metadata_fields))
    problems = 0

    def report(reason: str, line: int | None = None) -> None:
        nonlocal problems
        problems += 1
        _report(SkippedFile(name, reason, line), on_error)

    suffix = path.suffix.lower()
    reader = _READERS.get(suffix)
    if reader is None:
        report(f"unsupported file type {suffix!r}" if suffix else "unsupported file type (no extension)")
        return
    loaded = 0
    try:
        _check_file(path, max_file_bytes)
        for document in reader(path, name, fields, report):
            loaded += 1
            yield document
    except _Skip as exc:
        report(str(exc))
    except OSError as exc:
        report(f"cannot read file: {exc.strerror or exc}")
    else:
        if loaded == 0 and problems == 0:
            report("no text found")


def _report(entry: SkippedFile, on_error: OnError | None) -> None:
    """Pass ``entry`` to ``on_error``, which then reports it; without one, log it as a warning."""
    if on_error is None:
        logger.warning("skipped %s", entry)
    else:
        logger.debug("skipped %s", entry)
        on_error(entry)


def _check_file(path: Path, max_file_bytes: int | None) -> None:
    status = path.stat()
    if not stat.S_ISREG(status.st_mode):
        raise _Skip("not a regular file")
    size = status.st_size
    if size == 0:
        raise _Skip("empty file")
    if max_file_bytes is not None and size > max_file_bytes:
        raise _Skip(f"file is {size} bytes, over max_file_bytes={max_file_bytes}")


def _check_not_binary(data: bytes) -> None:
    offset = data.find(b"\x00")
    if offset >= 0:
        raise _Skip(f"binary file (NUL byte at offset {offset})")


def _decode(data: bytes, line: int | None = None) -> str:
    """UTF-8 (a leading byte-order mark is dropped); anything else is reported, never guessed."""
    bom = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[bom:].decode("utf-8")
    except UnicodeDecodeError as exc:
        offset = bom + exc.start
        where = f"byte {offset}" if line is None else f"byte {offset} of the line"
        raise _Skip(f"not valid UTF-8 (0x{data[offset]:02x} at {where}); convert it to UTF-8") from None


_UTF16_BOMS = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)


def _decode_file(data: bytes) -> str:
    """A whole file's text: UTF-16 when it starts with a UTF-16 byte-order mark, else UTF-8 (not binary)."""
    if data.startswith(_UTF16_BOMS):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError as exc:
            raise _Skip(f"not valid UTF-16 (byte {exc.start}); convert it to UTF-8") from None
    _check_not_binary(data)
    return _decode(data)


def _read_text(path: Path) -> str:
    return _decode_file(path.read_bytes())


def _text_documents(path: Path, name: str, fields: _Fields, report: Callable[..., None]) -> Iterator[Document]:
    text = _read_text(path)
    if text.strip():
        yield Document(source=name, text=text)


def _html_documents(path: Path, name: str, fields: _Fields, report: Callable[..., None]) -> Iterator[Document]:
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(_read_text(path), "html.parser")
    title = " ".join(soup.title.get_text(" ").split()) if soup.title else ""
    for tag in soup.find_all(_HTML_DROPPED):
        tag.decompose()
    for tag in soup.find_all("br"):
        tag.replace_with("\n")
    for tag in soup.find_all(_HTML_BLOCKS):
        tag.insert_before("\n\n")
        tag.insert_after("\n\n")
    lines = (" ".join(line.split()) for line in soup.get_text().splitlines())
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    if text:
        yield Document(source=name, text=text, metadata={"title": title} if title else {})


def _pdf_documents(path: Path, name: str, fields: _Fields, report: Callable[..., None]) -> Iterator[Document]:
    from pypdf import PasswordType, PdfReader

    # pypdf raises many exception types on damaged files; any of them means "cannot read this PDF".
    try:
        reader = PdfReader(path)
        if reader.is_encrypted and reader.decrypt("") == PasswordType.NOT_DECRYPTED:
            raise _Skip("encrypted PDF (needs a password)")
        pages = len(reader.pages)
        title = (reader.metadata.title if reader.metadata else None) or ""
    except _Skip:
        raise
    except Exception as exc:
        raise _Skip(f"not a readable PDF ({type(exc).__name__}: {exc})") from None
    for index in range(pages):
        try:
            text = reader.pages[index].extract_text().strip()
        except Exception as exc:
            report(f"page {index + 1}: text extraction failed ({type(exc).__name__}: {exc})")
            continue
        if text:
            metadata: dict[str, Any] = {"page": index + 1, "pages": pages}
            if title.strip():
                metadata["title"] = title.strip()
            yield Document(source=name, text=text, metadata=metadata, position=index)


def _jsonl_documents(path: Path, name: str, fields: _Fields, report: Callable[..., None]) -> Iterator[Document]:
    with open(path, "rb") as handle:
        head = handle.read(_SNIFF_BYTES)
        if head.startswith(_UTF16_BOMS):  # decoded whole, then read as UTF-8 lines
            lines = (line.encode("utf-8") for line in _read_text(path).split("\n"))
            yield from _records_to_documents(_json_lines(lines, report), name, fields, report)
            return
        _check_not_binary(head)
        handle.seek(0)
        yield from _records_to_documents(_json_lines(handle, report), name, fields, report)


def _json_documents(path: Path, name: str, fields: _Fields, report: Callable[..., None]) -> Iterator[Document]:
    text = _read_text(path)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg != "Extra data":
            raise _Skip(f"malformed JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
        lines = (line.encode("utf-8") for line in text.split("\n"))
        yield from _records_to_documents(_json_lines(lines, report), name, fields, report)
        return
    if isinstance(value, dict):
        records: Iterable[tuple[int, int | None, Any]] = [(0, None, value)]
    elif isinstance(value, list):
        records = ((index, None, item) for index, item in enumerate(value))
    else:
        raise _Skip(f"expected a JSON object or an array of objects, got {type(value).__name__}")
    yield from _records_to_documents(records, name, fields, report)


def _json_lines(lines: Iterable[bytes], report: Callable[..., None]) -> Iterator[tuple[int, int, Any]]:
    """Yield ``(record index, line number, parsed value)``; bad lines are reported and skipped."""
    index = 0
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            yield index, number, json.loads(_decode(raw, line=number))
        except _Skip as exc:
            report(str(exc), number)
        except json.JSONDecodeError as exc:
            report(f"malformed JSON: {exc.msg} (column {exc.colno})", number)
        index += 1


def _csv_documents(path: Path, name: str, fields: _Fields, report: Callable[..., None]) -> Iterator[Document]:
    with open(path, "rb") as handle:
        head = handle.read(_SNIFF_BYTES)
    utf16 = head.startswith(_UTF16_BOMS)
    if not utf16:
        _check_not_binary(head)
    with open(path, encoding="utf-16" if utf16 else "utf-8-sig", newline="") as handle:
        reader = csv.DictReader(handle)
        try:
            header = reader.fieldnames
            if not header:
                raise _Skip("no header row")
            if fields.text not in header:
                raise _Skip(f"no column {fields.text!r} (columns: {', '.join(header)})")
            yield from _records_to_documents(_csv_rows(reader, len(header), report), name, fields, report)
        except UnicodeDecodeError as exc:
            raise _Skip(f"not valid {'UTF-16' if utf16 else 'UTF-8'} after line {reader.line_num} ({exc.reason})") from None
        except csv.Error as exc:
            raise _Skip(f"malformed CSV at line {reader.line_num}: {exc}") from None


def _csv_rows(reader: csv.DictReader, width: int, report: Callable[..., None]) -> Iterator[tuple[int, int, Any]]:
    for index, row in enumerate(reader):
        cells = width + len(row.get(None, ())) - sum(value is None for value in row.values())
        if cells != width:
            report(f"row has {cells} fields, the header has {width}", reader.line_num)
        else:
            yield index, reader.line_num, row


def _records_to_documents(
    records: Iterable[tuple[int, int | None, Any]], name: str, fields: _Fields, report: Callable[..., None]
) -> Iterator[Document]:
    seen: dict[str, int] = {}
    for index, line, record in records:
        where = f"item {index}: " if line is None else ""
        try:
            document = _record_to_document(record, name, index, line, fields)
        except ValueError as exc:
            report(f"{where}{exc}", line)
            continue
        if document.id is not None:
            if document.id in seen:
                report(f"{where}duplicate id {document.id!r} (first at record {seen[document.id]})", line)
                continue
            seen[document.id] = index
        yield document


def _record_to_document(record: Any, name: str, index: int, line: int | None, fields: _Fields) -> Document:
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    if fields.text not in record:
        raise ValueError(f"missing text field {fields.text!r}")
    text = record[fields.text]
    if not isinstance(text, str):
        raise ValueError(f"text field {fields.text!r} is {type(text).__name__}, expected a string")
    if not text.strip():
        raise ValueError(f"empty text in field {fields.text!r}")
    record_id = None
    if fields.id is not None:
        value = record.get(fields.id)
        if not isinstance(value, (str, int)) or isinstance(value, bool) or value == "":
            raise ValueError(f"missing or invalid id field {fields.id!r} (got {value!r})")
        record_id = str(value)
    metadata: dict[str, Any] = {}
    for key in record if fields.metadata is None else fields.metadata:
        value = record.get(key)
        if key == fields.text and fields.metadata is None:
            continue
        if _is_scalar(value):
            metadata[key] = value
        elif fields.metadata is not None:
            raise ValueError(f"metadata field {key!r} is {type(value).__name__}, expected a scalar")
    for key, value in [(fields.text, text), (fields.id, record_id), *metadata.items()]:
        _check_unicode(key, value)
    if line is not None:
        metadata["line"] = line
    return Document(source=name, text=text, metadata=metadata, position=index, id=record_id)


def _check_unicode(key: Any, value: Any) -> None:
    """JSON's ``\\ud800`` escapes decode to lone surrogates: no tokenizer, hash or store takes them."""
    for part in (key, value):
        if isinstance(part, str):
            try:
                part.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ValueError(
                    f"field {key!r} holds a lone surrogate ({part[exc.start]!r} at character {exc.start}): not valid Unicode"
                ) from None


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


_READERS: dict[str, Callable[[Path, str, _Fields, Callable[..., None]], Iterator[Document]]] = {
    **dict.fromkeys(TEXT_SUFFIXES, _text_documents),
    **dict.fromkeys(HTML_SUFFIXES, _html_documents),
    ".pdf": _pdf_documents,
    ".jsonl": _jsonl_documents,
    ".json": _json_documents,
    ".csv": _csv_documents,
}
