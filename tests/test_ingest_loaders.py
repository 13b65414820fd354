"""Loading documents: every format, streaming, and bad input reported by name while the rest loads."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import pytest

from isotrope.ingest.loaders import (
    Document,
    LoadReport,
    SkippedFile,
    file_fingerprint,
    iter_documents,
    iter_files,
    load_file,
)


def minimal_pdf(pages: list[str], title: str | None = None) -> bytes:
    """A valid PDF written by hand: one Helvetica text line per page, xref offsets computed."""
    page_ids = [4 + 2 * i for i in range(len(pages))]
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{' '.join(f'{p} 0 R' for p in page_ids)}] /Count {len(pages)} >>".encode(),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    for page_id, text in zip(page_ids, pages):
        stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode() if text else b""
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            f"/Resources << /Font << /F1 3 0 R >> >> /Contents {page_id + 1} 0 R >>".encode()
        )
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    trailer = b"/Root 1 0 R"
    if title is not None:
        objects.append(f"<< /Title ({title}) >>".encode())
        trailer += b" /Info %d 0 R" % len(objects)
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d %s >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, trailer, xref)
    return bytes(out)


HTML = """<!DOCTYPE html>
<html><head><title>The  Page Title</title><style>p { color: red; }</style>
<script>var hidden = "script text";</script></head>
<body><h1>Heading</h1><p>First <b>bold</b> paragraph.</p><!-- a comment -->
<ul><li>item one</li><li>item two</li></ul><noscript>no script</noscript>
<div>Line one<br>Line two</div></body></html>
"""


def write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        path.write_text(data, encoding="utf-8")
    else:
        path.write_bytes(data)
    return path


def load(source: Path, **kwargs) -> tuple[list[Document], LoadReport]:
    report = LoadReport()
    return list(iter_documents(source, on_error=report.add, **kwargs)), report


def reasons(report: LoadReport) -> dict[tuple[str, int | None], str]:
    return {(entry.path, entry.line): entry.reason for entry in report.skipped}


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    write(root / "a.txt", "Plain text file.\nSecond line.\n")
    write(root / "notes.md", b"\xef\xbb\xbf# Notes\n\nMarkdown with a BOM.\n")
    write(root / "guide.rst", "Guide\n=====\n\nSome reStructuredText.\n")
    write(root / "page.html", HTML)
    write(root / "book.pdf", minimal_pdf(["First page text.", "", "Third page text."], title="A Book"))
    write(root / "rows.jsonl", '{"text": "row zero", "lang": "en"}\n\n{"text": "row one", "n": 1}\n')
    write(root / "table.csv", "id,text,tag\n1,first row,x\n2,second row,y\n")
    write(root / "sub" / "deeper" / "nested.txt", "Nested file.")
    write(root / ".hidden" / "secret.txt", "hidden folder")
    write(root / ".dotfile.txt", "hidden file")
    write(root / "binary.txt", b"abc\x00\x01\x02def")
    write(root / "empty.md", b"")
    write(root / "blank.txt", "  \n\t\n")
    write(root / "latin1.txt", "caf\u00e9 cr\u00e8me".encode("latin-1"))
    write(root / "big.txt", "x" * 5000)
    write(root / "image.png", b"\x89PNG\r\n\x1a\n")
    write(root / "README", "no extension")
    write(root / "broken.pdf", b"%PDF-1.4\nthis is not really a pdf\n")
    return root


def test_directory_loads_every_format_and_reports_bad_files(corpus: Path) -> None:
    documents, report = load(corpus, max_file_bytes=3000)

    assert [(d.source, d.position) for d in documents] == [
        ("a.txt", 0),
        ("book.pdf", 0),
        ("book.pdf", 2),
        ("guide.rst", 0),
        ("notes.md", 0),
        ("page.html", 0),
        ("rows.jsonl", 0),
        ("rows.jsonl", 1),
        ("table.csv", 0),
        ("table.csv", 1),
        ("sub/deeper/nested.txt", 0),
    ]
    by_key = {d.key: d for d in documents}
    assert by_key["a.txt#0"].text == "Plain text file.\nSecond line.\n"
    assert by_key["notes.md#0"].text == "# Notes\n\nMarkdown with a BOM.\n"  # BOM dropped
    assert by_key["book.pdf#0"].text == "First page text."
    assert by_key["book.pdf#0"].metadata == {"page": 1, "pages": 3, "title": "A Book"}
    assert by_key["book.pdf#2"].metadata["page"] == 3
    assert by_key["rows.jsonl#1"].metadata == {"n": 1, "line": 3}
    assert by_key["table.csv#1"].text == "second row"
    assert by_key["table.csv#1"].metadata == {"id": "2", "tag": "y", "line": 3}

    found = reasons(report)
    assert found.pop(("broken.pdf", None)).startswith("not a readable PDF")
    assert found == {
        ("big.txt", None): "file is 5000 bytes, over max_file_bytes=3000",
        ("binary.txt", None): "binary file (NUL byte at offset 3)",
        ("blank.txt", None): "no text found",
        ("empty.md", None): "empty file",
        ("image.png", None): "unsupported file type '.png'",
        ("latin1.txt", None): "not valid UTF-8 (0xe9 at byte 3); convert it to UTF-8",
        ("README", None): "unsupported file type (no extension)",
    }
    assert all(isinstance(entry, SkippedFile) for entry in report.skipped)


def test_size_limit_can_be_lifted(corpus: Path) -> None:
    documents, report = load(corpus, max_file_bytes=None)
    assert "big.txt" in {d.source for d in documents}
    assert "big.txt" not in {entry.path for entry in report.skipped}


def test_skipped_files_are_logged_at_warning(corpus: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="isotrope.ingest.loaders"):
        documents = list(iter_documents(corpus))  # no on_error: logging alone
    assert documents
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "skipped binary.txt: binary file (NUL byte at offset 3)" in logged
    assert any(message.startswith("skipped latin1.txt: not valid UTF-8") for message in logged)


def test_iteration_is_lazy(corpus: Path) -> None:
    report = LoadReport()
    documents = iter_documents(corpus, on_error=report.add)
    assert next(documents).source == "a.txt"
    (corpus / "page.html").unlink()  # listed but not read yet, so its loss is reported
    rest = list(documents)
    assert "page.html" not in {d.source for d in rest}
    assert reasons(report)[("page.html", None)] == "cannot read file: No such file or directory"


def test_single_file_source_and_missing_source(tmp_path: Path) -> None:
    path = write(tmp_path / "dir" / "one.md", "Just one.")
    assert [(d.source, d.text) for d in iter_documents(path)] == [("one.md", "Just one.")]
    assert list(iter_files(tmp_path)) == [(path, "dir/one.md")]
    with pytest.raises(FileNotFoundError, match="nope"):
        list(iter_documents(tmp_path / "nope"))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
def test_special_files_are_reported_not_read(tmp_path: Path) -> None:
    write(tmp_path / "ok.txt", "fine")
    os.mkfifo(tmp_path / "pipe.txt")  # reading it would block forever
    documents, report = load(tmp_path)
    assert [d.source for d in documents] == ["ok.txt"]
    assert report.skipped == [SkippedFile("pipe.txt", "not a regular file")]


def test_html_visible_text_and_title(tmp_path: Path) -> None:
    (document,) = iter_documents(write(tmp_path / "page.htm", HTML))
    assert document.metadata == {"title": "The Page Title"}
    assert document.text == "Heading\n\nFirst bold paragraph.\n\nitem one\n\nitem two\n\nLine one\nLine two"


def test_jsonl_bad_lines_are_reported_with_line_numbers(tmp_path: Path) -> None:
    lines = [
        {"_id": "d1", "text": "good one", "title": "T1", "tags": ["a", "b"], "score": 0.5},
        "{not json",
        {"_id": "d3", "body": "no text field"},
        {"_id": "d4", "text": 42},
        {"_id": "d5", "text": "   "},
        ["not", "an", "object"],
        {"_id": "d1", "text": "duplicate id"},
        {"text": "missing id"},
        {"_id": 9, "text": "good two", "flag": True, "none": None},
    ]
    body = "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n"
    path = write(tmp_path / "corpus.jsonl", body.encode() + b'{"_id": "d10", "text": "caf\xe9"}\n')

    report = LoadReport()
    documents = list(load_file(path, id_field="_id", on_error=report.add))

    assert [(d.id, d.text, d.position, d.key) for d in documents] == [
        ("d1", "good one", 0, "corpus.jsonl#d1"),
        ("9", "good two", 8, "corpus.jsonl#9"),
    ]
    assert documents[0].metadata == {"_id": "d1", "title": "T1", "score": 0.5, "line": 1}  # list dropped
    assert documents[1].metadata == {"_id": 9, "flag": True, "none": None, "line": 9}
    found = reasons(report)
    assert set(found) == {("corpus.jsonl", line) for line in range(2, 9)} | {("corpus.jsonl", 10)}
    assert found[("corpus.jsonl", 2)].startswith("malformed JSON")
    assert found[("corpus.jsonl", 3)] == "missing text field 'text'"
    assert found[("corpus.jsonl", 4)] == "text field 'text' is int, expected a string"
    assert found[("corpus.jsonl", 5)] == "empty text in field 'text'"
    assert found[("corpus.jsonl", 6)] == "expected a JSON object, got list"
    assert found[("corpus.jsonl", 7)] == "duplicate id 'd1' (first at record 0)"
    assert found[("corpus.jsonl", 8)] == "missing or invalid id field '_id' (got None)"
    assert found[("corpus.jsonl", 10)].startswith("not valid UTF-8")
    assert str(report.skipped[0]) == f"corpus.jsonl:2: {found[('corpus.jsonl', 2)]}"


def test_metadata_fields_select_and_text_field_renames(tmp_path: Path) -> None:
    path = write(tmp_path / "r.jsonl", json.dumps({"body": "hello", "a": 1, "b": 2, "c": [3]}) + "\n")
    (document,) = load_file(path, text_field="body", metadata_fields=["b"])
    assert (document.text, document.metadata) == ("hello", {"b": 2, "line": 1})
    report = LoadReport()
    assert list(load_file(path, text_field="body", metadata_fields=["c"], on_error=report.add)) == []
    assert report.skipped == [SkippedFile("r.jsonl", "metadata field 'c' is list, expected a scalar", 1)]
    with pytest.raises(TypeError, match="metadata_fields"):
        list(load_file(path, metadata_fields="title"))


def test_json_array_object_and_json_lines(tmp_path: Path) -> None:
    array = write(tmp_path / "array.json", json.dumps([{"text": "one"}, {"x": 1}, {"text": "three"}]))
    report = LoadReport()
    assert [(d.text, d.position) for d in load_file(array, on_error=report.add)] == [("one", 0), ("three", 2)]
    assert report.skipped == [SkippedFile("array.json", "item 1: missing text field 'text'")]

    single = write(tmp_path / "single.json", json.dumps({"text": "alone", "k": "v"}, indent=2))
    assert [(d.text, d.metadata) for d in load_file(single)] == [("alone", {"k": "v"})]

    lines = write(tmp_path / "lines.json", '{"text": "l1"}\n{"text": "l2"}\n')
    assert [(d.text, d.metadata["line"]) for d in load_file(lines)] == [("l1", 1), ("l2", 2)]

    report = LoadReport()
    assert list(load_file(write(tmp_path / "bad.json", '{"text": '), on_error=report.add)) == []
    assert report.skipped[0].reason.startswith("malformed JSON")
    assert list(load_file(write(tmp_path / "num.json", "3"), on_error=report.add)) == []
    assert report.skipped[1].reason == "expected a JSON object or an array of objects, got int"


def test_csv_rows_and_errors(tmp_path: Path) -> None:
    path = write(
        tmp_path / "t.csv",
        'title,text\nA,"multi\nline text"\nB\nC,plain,extra\nD,\nE,last\n',
    )
    report = LoadReport()
    documents = list(load_file(path, on_error=report.add))
    assert [(d.text, d.position, d.metadata) for d in documents] == [
        ("multi\nline text", 0, {"title": "A", "line": 3}),
        ("last", 4, {"title": "E", "line": 7}),
    ]
    assert reasons(report) == {
        ("t.csv", 4): "row has 1 fields, the header has 2",
        ("t.csv", 5): "row has 3 fields, the header has 2",
        ("t.csv", 6): "empty text in field 'text'",
    }

    report = LoadReport()
    assert list(load_file(write(tmp_path / "n.csv", "a,b\n1,2\n"), on_error=report.add)) == []
    assert report.skipped == [SkippedFile("n.csv", "no column 'text' (columns: a, b)")]


def test_pdf_pages_keep_positions(tmp_path: Path) -> None:
    path = write(tmp_path / "p.pdf", minimal_pdf(["Alpha page.", "Beta page."]))
    documents = list(load_file(path))
    assert [(d.text, d.position, d.metadata) for d in documents] == [
        ("Alpha page.", 0, {"page": 1, "pages": 2}),
        ("Beta page.", 1, {"page": 2, "pages": 2}),
    ]
    assert [d.key for d in documents] == ["p.pdf#0", "p.pdf#1"]


def test_file_fingerprint_streams_sha256(tmp_path: Path) -> None:
    data = bytes(range(256)) * 50
    path = write(tmp_path / "f.bin", data)
    assert file_fingerprint(path, block_bytes=1000) == hashlib.sha256(data).hexdigest()
    assert file_fingerprint(path) == file_fingerprint(path, block_bytes=7)
    write(path, data + b"!")
    assert file_fingerprint(path) == hashlib.sha256(data + b"!").hexdigest()
