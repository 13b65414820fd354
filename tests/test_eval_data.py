"""Evaluation-data loaders on tiny fixture files written into tmp_path."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from isotrope.evaluate.data import (
    DataFormatError,
    load_beir,
    load_clustering,
    load_pairs,
    load_senteval,
    load_sick,
    load_stsb,
)


def _write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


STSB_ROWS = (
    "main-captions\tMSRvid\t2012test\t0001\t5.000\tA man is playing a flute.\tA man plays the flute.\n"
    'main-news\theadlines\t2013\t0002\t0.250\tStocks fall.\tIt rains "today".\t2013-xyz\tmore notes\n'
    "main-forums\tanswers\t2015\t0003\t2.400\tWhat is it? \tThat is it.\n"
)


def test_load_stsb_ignores_trailing_columns(tmp_path):
    _write(tmp_path / "sts/stsbenchmark/sts-test.csv", STSB_ROWS)
    pairs = load_stsb(tmp_path)
    assert len(pairs) == 3 and pairs.name == "STSB-test"
    assert pairs.scores == [5.0, 0.25, 2.4]
    assert pairs.sentences1 == ["A man is playing a flute.", "Stocks fall.", "What is it?"]
    assert pairs.sentences2 == ["A man plays the flute.", 'It rains "today".', "That is it."]


def test_load_stsb_names_file_and_line_of_a_malformed_row(tmp_path):
    path = _write(tmp_path / "sts/stsbenchmark/sts-dev.csv", STSB_ROWS + "genre\tfile\tyear\t0004\tonly five\n")
    with pytest.raises(DataFormatError, match=r"sts-dev\.csv:4: expected at least 7"):
        load_stsb(tmp_path, split="dev")
    path.write_text(STSB_ROWS.replace("2.400", "n/a"), encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"sts-dev\.csv:3: score \(column 4\) is not a number: 'n/a'"):
        load_stsb(tmp_path, split="dev")
    with pytest.raises(ValueError, match="unknown split 'valid'"):
        load_stsb(tmp_path, split="valid")
    with pytest.raises(FileNotFoundError, match=r"sts-train\.csv"):
        load_stsb(tmp_path, split="train")


SICK = (
    "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"
    "6\tThere is no boy playing\tA group of kids is playing\t3.3\tNEUTRAL\n"
    "7\tA boy plays\tThe boy is playing\t4.9\tENTAILMENT\r\n"
)


def test_load_sick(tmp_path):
    _write(tmp_path / "sts/sick/SICK_test_annotated.txt", SICK)
    pairs = load_sick(tmp_path)
    assert pairs.sentences1 == ["There is no boy playing", "A boy plays"]
    assert pairs.sentences2 == ["A group of kids is playing", "The boy is playing"]
    assert pairs.scores == [3.3, 4.9]
    _write(tmp_path / "sts/sick/SICK_train.txt", SICK.replace("pair_ID\t", "id\t"))
    with pytest.raises(DataFormatError, match=r"SICK_train\.txt:1: expected a tab-separated header"):
        load_sick(tmp_path, split="train")
    _write(tmp_path / "sts/sick/SICK_trial.txt", SICK + "8\tonly one sentence\n")
    with pytest.raises(DataFormatError, match=r"SICK_trial\.txt:4:"):
        load_sick(tmp_path, split="trial")


def test_load_pairs(tmp_path):
    path = _write(tmp_path / "my.tsv", "s1\ts2\tscore\nhello\thi\t4.5\n\nbye\thello\t0\n")
    pairs = load_pairs(path, header=True)
    assert (pairs.name, pairs.sentences1, pairs.sentences2, pairs.scores) == ("my", ["hello", "bye"], ["hi", "hello"], [4.5, 0.0])
    with pytest.raises(DataFormatError, match=r"my\.tsv:1: score is not a number: 'score'"):
        load_pairs(path)
    _write(path, "a\tb\t1\na\tb\tc\t2\n")
    with pytest.raises(DataFormatError, match=r"my\.tsv:2: expected 3 tab-separated fields, found 4"):
        load_pairs(path)


def _beir_folder(root: Path, qrels: str) -> Path:
    corpus = [
        {"_id": "d1", "title": "Cats", "text": "Cats purr."},
        {"_id": "d2", "title": "", "text": "Dogs bark."},
        {"_id": "d3", "text": "No title field."},
    ]
    queries = [{"_id": "q1", "text": "what purrs"}, {"_id": "q2", "text": "who barks"}, {"_id": "q3", "text": "not judged"}]
    _write(root / "corpus.jsonl", "".join(json.dumps(d) + "\n" for d in corpus))
    _write(root / "queries.jsonl", "".join(json.dumps(q) + "\n" for q in queries))
    _write(root / "qrels/test.tsv", qrels)
    return root


def test_load_beir_with_qrels_header(tmp_path):
    folder = _beir_folder(tmp_path / "toy", "query-id\tcorpus-id\tscore\nq1\td1\t2\nq1\td2\t0\nq2\td2\t1\n")
    data = load_beir(folder)
    assert data.corpus["d1"] == {"title": "Cats", "text": "Cats purr."}
    assert data.corpus["d3"] == {"title": "", "text": "No title field."}
    assert data.queries == {"q1": "what purrs", "q2": "who barks"}  # q3 is not in the qrels
    assert data.qrels == {"q1": {"d1": 2, "d2": 0}, "q2": {"d2": 1}}


def test_load_beir_without_header_and_errors(tmp_path):
    folder = _beir_folder(tmp_path / "toy", "q1\td1\t1\n")
    assert load_beir(folder).qrels == {"q1": {"d1": 1}}
    _write(folder / "qrels/test.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\nq9\td1\t1\n")
    with pytest.raises(DataFormatError, match=r"test\.tsv:3: query id 'q9' is not in queries\.jsonl"):
        load_beir(folder)
    _write(folder / "qrels/test.tsv", "q1\td1\t1\nq1\td2\thigh\n")
    with pytest.raises(DataFormatError, match=r"test\.tsv:2: relevance grade is not an integer: 'high'"):
        load_beir(folder)
    _write(folder / "queries.jsonl", '{"_id": "q1", "text": "ok"}\n{"_id": "q2", "text": \n')
    with pytest.raises(DataFormatError, match=r"queries\.jsonl:2: invalid JSON"):
        load_beir(folder)
    with pytest.raises(FileNotFoundError, match=r"dev\.tsv"):
        load_beir(folder, split="dev")


def test_load_clustering_gzip_with_split(tmp_path):
    records = [
        {"split": "train", "label": 3, "text": "a"},
        {"split": "test", "label": 1, "text": "b"},
        {"split": "test", "label": 3, "text": "c"},
        {"split": "test", "label": 1, "text": "d"},
    ]
    path = tmp_path / "news.jsonl.gz"
    path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in records).encode()))
    test = load_clustering(path, split="test")
    assert (test.name, test.texts, test.labels, test.label_names) == ("news-test", ["b", "c", "d"], [0, 1, 0], ("1", "3"))
    assert len(load_clustering(path)) == 4
    with pytest.raises(DataFormatError, match="no records with split 'dev'"):
        load_clustering(path, split="dev")
    bad = _write(tmp_path / "bad.jsonl", '{"text": "x", "label": 0}\n{"text": "y"}\n')
    with pytest.raises(DataFormatError, match=r"bad\.jsonl:2: record needs 'text' and 'label'"):
        load_clustering(bad)


def test_load_senteval_binary_sets_decode_latin1_and_drop_blank_lines(tmp_path):
    raw = tmp_path / "classification/senteval/raw"
    _write(raw / "rt-polarity.neg", b"dull film .\n\nbad .\n")
    _write(raw / "rt-polarity.pos", "a caf\xe9 delight . \n".encode("latin-1"))  # not valid UTF-8
    mr = load_senteval(tmp_path, "MR")
    assert mr.texts == ["dull film .", "bad .", "a caf\u00e9 delight ."]
    assert mr.labels == [0, 0, 1] and mr.label_names == ("negative", "positive")
    with pytest.raises(ValueError, match="no fixed split"):
        load_senteval(tmp_path, "MR", split="test")
    with pytest.raises(ValueError, match="unknown SentEval task 'MRPC'"):
        load_senteval(tmp_path, "MRPC")


def test_load_senteval_trec_and_sst(tmp_path):
    root = tmp_path / "classification/senteval"
    _write(root / "raw/TREC.test", "DESC:manner How did serfdom develop ?\nNUM:date When was it ?\n")
    trec = load_senteval(tmp_path, "TREC", split="test")
    assert trec.texts == ["How did serfdom develop ?", "When was it ?"]
    assert [trec.label_names[i] for i in trec.labels] == ["DESC", "NUM"]
    _write(root / "raw/TREC.train", "DESC:manner How ?\nWHAT:x Why ?\n")
    with pytest.raises(DataFormatError, match=r"TREC\.train:2: expected 'COARSE:fine question'"):
        load_senteval(tmp_path, "TREC", split="train")
    _write(root / "sst/stsa.fine.dev", "4 a gem .\n0 awful .\n")
    sst5 = load_senteval(tmp_path, "SST5", split="dev")
    assert (sst5.texts, sst5.labels, len(sst5.label_names)) == (["a gem .", "awful ."], [4, 0], 5)
    _write(root / "sst/stsa.binary.test", "1 fine .\n2 too high .\n")
    with pytest.raises(DataFormatError, match=r"stsa\.binary\.test:2: expected '<label 0-1> sentence'"):
        load_senteval(tmp_path, "SST2", split="test")
    with pytest.raises(ValueError, match="SST2 needs split"):
        load_senteval(tmp_path, "SST2")
