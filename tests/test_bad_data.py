"""Bad data a real user brings: empty documents and queries, UTF-16 files, uneven files, repeated skips."""

from __future__ import annotations

import json
import logging

import pytest

from isotrope.config import EncoderConfig
from isotrope.evaluate.commands import evaluate
from isotrope.evaluate.harness import Evaluator
from isotrope.ingest.loaders import LoadReport, iter_documents


def write_beir(folder, documents: list[str], queries: list[str]) -> None:
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": f"d{i}", "title": "", "text": text}) + "\n" for i, text in enumerate(documents))
    )
    (folder / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": f"q{i}", "text": text}) + "\n" for i, text in enumerate(queries))
    )
    (folder / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(len(queries)))
    )


def test_retrieval_eval_skips_and_counts_empty_documents_and_queries(tiny_glove_path, tmp_path, caplog):
    # as in Cranfield as published: some documents are empty; one query is whitespace only
    documents = ["the cat sat on the mat", "", "the dog runs fast", "   \n", "a house on the river"]
    queries = ["the cat sat on the mat", "the river", "the dog runs fast", "house", " "]
    write_beir(tmp_path / "beir", documents, queries)
    recipe = EncoderConfig(model=tiny_glove_path, shape="center")
    with caplog.at_level(logging.WARNING):
        result = evaluate("retrieval", recipe, Evaluator(), beir=tmp_path / "beir", fit_corpus="corpus", split=None)
    assert "2 empty documents and 1 empty queries" in caplog.text
    assert result["empty_documents"] == 2 and result["empty_queries"] == 1
    assert result["fitted_on"] == "the retrieval corpus (3 texts)"
    # q0 and q2 find their documents first; q1 and q3 are judged against empty documents, which cannot be
    # retrieved; q4 is empty: those three score 0. Mean MRR@10 over the 5 judged queries = 2/5.
    assert result["scores"]["mrr@10"] == pytest.approx(40.0)
    assert result["scores"]["hit@1"] == pytest.approx(40.0)  # the same two of five first


def test_an_empty_query_says_so(tiny_glove_path, tmp_path):
    from isotrope.ingest.pipeline import index_documents
    from isotrope.search import Collection

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("the cat sat on the mat")
    index_documents(
        tmp_path / "docs",
        f"faiss:{tmp_path / 'store'}",
        config=EncoderConfig(model=tiny_glove_path, shape="none"),
        show_progress=False,
    )
    with Collection.open(f"faiss:{tmp_path / 'store'}") as collection:
        for query in ("", "  \n\t"):
            with pytest.raises(ValueError, match=r"^the query is empty$"):
                collection.search(query)
        with pytest.raises(ValueError, match=r"^queries\[1\] is empty$"):
            collection.search(["cat", " "])
        assert collection.search("cat", k=1)[0].metadata["source"] == "a.txt"


def test_index_skips_whitespace_only_documents(tiny_glove_path, tmp_path):
    from isotrope.ingest.loaders import Document
    from isotrope.ingest.pipeline import index_documents

    documents = [Document("a", "the cat sat"), Document("b", "   \n "), Document("c", "")]
    report = index_documents(
        documents, f"faiss:{tmp_path / 'store'}", show_progress=False, config=EncoderConfig(model=tiny_glove_path, shape="center")
    )
    assert report.documents == 1 and report.added == 1 and report.empty == 2


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be"])
def test_utf16_files_with_a_byte_order_mark_are_read(tmp_path, encoding):
    bom = {"utf-16": b"", "utf-16-le": b"\xff\xfe", "utf-16-be": b"\xfe\xff"}[encoding]
    text = "Café, naïve — 東京\nsecond line"
    (tmp_path / "a.txt").write_bytes(bom + text.encode(encoding))
    (tmp_path / "b.jsonl").write_bytes(bom + (json.dumps({"text": text}, ensure_ascii=False) + "\n").encode(encoding))
    (tmp_path / "c.csv").write_bytes(bom + f'text,n\n"{text}",1\n'.encode(encoding))
    report = LoadReport()
    documents = list(iter_documents(tmp_path, on_error=report.add))
    assert report.skipped == []
    assert [(d.source, d.text) for d in documents] == [("a.txt", text), ("b.jsonl", text), ("c.csv", text)]


def test_utf16_without_a_byte_order_mark_is_still_binary(tmp_path):
    (tmp_path / "a.txt").write_bytes("plain".encode("utf-16-le"))
    report = LoadReport()
    assert list(iter_documents(tmp_path, on_error=report.add)) == []
    assert "binary file" in report.skipped[0].reason


def brute_force_level(counts: list[int], size: int) -> int:
    """The largest cap L with sum(min(c, L)) <= size, by trying every L."""
    return max(level for level in range(0, max(counts) + size + 2) if sum(min(c, level) for c in counts) <= size)


@pytest.mark.parametrize("counts,size", [([1000, 5, 5, 5], 100), ([3, 3, 3], 100), ([50, 40, 7], 60), ([10] * 7, 20)])
def test_fair_level_matches_brute_force(counts, size):
    from isotrope.sampling import fair_level

    expected = brute_force_level(counts, size)
    assert min(fair_level(counts, size), max(counts)) == min(expected, max(counts))


def test_one_huge_file_does_not_crowd_out_the_fit_sample():
    from isotrope.sampling import fair_sample, reservoir_sample

    stream = [("huge.txt", f"h{i}") for i in range(5000)] + [(f"small{j}.txt", f"s{j}.{i}") for j in range(9) for i in range(6)]
    sample = fair_sample(stream, 100)
    assert len(sample) == 100 and len(set(sample)) == 100
    by_file = {
        name: sum(item.startswith(prefix) for item in sample)
        for name, prefix in [("huge", "h")] + [(f"s{j}", f"s{j}.") for j in range(9)]
    }
    assert all(by_file[f"s{j}"] == 6 for j in range(9))  # each small file gives all its 6 chunks
    assert by_file["huge"] == 100 - 54
    # a plain reservoir would have taken ~1 chunk per small file
    plain = reservoir_sample([item for _, item in stream], 100)
    assert sum(item.startswith("s") for item in plain) < 54 / 2
    # within the huge file the sample is spread over the whole file, not its head
    positions = sorted(int(item[1:]) for item in sample if item.startswith("h"))
    assert positions[-1] > 4000 and positions[0] < 1000


def test_fair_sample_with_equal_groups_and_fewer_items_than_size():
    from isotrope.sampling import fair_sample

    stream = [(f"f{j}", (j, i)) for j in range(4) for i in range(300)]
    sample = fair_sample(stream, 200, seed=1)
    assert sorted(sum(1 for group, _ in sample if group == j) for j in range(4)) == [50, 50, 50, 50]
    assert fair_sample(stream[:30], 200) == [item for _, item in stream[:30]]


def test_a_skipped_file_is_reported_once(tiny_glove_path, tmp_path, caplog):
    from typer.testing import CliRunner

    from isotrope.cli import app

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("the cat sat on the mat")
    (tmp_path / "docs" / "b.txt").write_bytes(b"\x00\x01binary")
    with caplog.at_level(logging.WARNING):  # what the CLI's log handler would print, at its default level
        result = CliRunner().invoke(
            app,
            [
                "index",
                str(tmp_path / "docs"),
                "--store",
                f"faiss:{tmp_path / 's'}",
                "--model",
                tiny_glove_path,
                "--shape",
                "center",
            ],
        )
    assert result.exit_code == 0, result.output
    logged = sum("b.txt" in record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING)
    printed = result.output.count("b.txt")  # stdout and stderr, mixed by the runner
    assert (logged, printed) == (0, 1), (caplog.text, result.output)
