"""Loaders for the evaluation sets, returning plain dataclasses.

Every loader takes the path it reads from (``data_dir`` is the root of a folder
laid out like the project's shared data: ``<data_dir>/sts/stsbenchmark/``,
``<data_dir>/sts/sick/``, ``<data_dir>/classification/senteval/`` ...). Parse
errors raise :class:`DataFormatError` naming the file and the 1-based line.
"""

from __future__ import annotations

import gzip
import json
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from isotrope.errors import DataFormatError

logger = logging.getLogger(__name__)

STSB_FILES = {"train": "sts-train.csv", "dev": "sts-dev.csv", "test": "sts-test.csv"}
SICK_FILES = {"train": "SICK_train.txt", "trial": "SICK_trial.txt", "test": "SICK_test_annotated.txt"}
SICK_HEADER = ("pair_ID", "sentence_A", "sentence_B", "relatedness_score", "entailment_judgment")

#: SentEval binary sets read as (file of label 0, file of label 1), CV-evaluated.
SENTEVAL_BINARY = {
    "MR": ("rt-polarity.neg", "rt-polarity.pos", ("negative", "positive")),
    "CR": ("custrev.neg", "custrev.pos", ("negative", "positive")),
    "SUBJ": ("subj.objective", "subj.subjective", ("objective", "subjective")),
    "MPQA": ("mpqa.neg", "mpqa.pos", ("negative", "positive")),
}
TREC_LABELS = ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")
SST_FILES = {
    "SST2": ("stsa.binary", ("negative", "positive")),
    "SST5": ("stsa.fine", ("very negative", "negative", "neutral", "positive", "very positive")),
}


@dataclass(frozen=True)
class STSPairs:
    """Sentence pairs with gold similarity scores."""

    name: str
    sentences1: list[str]
    sentences2: list[str]
    scores: list[float]

    def __len__(self) -> int:
        return len(self.scores)


@dataclass(frozen=True)
class BeirDataset:
    """A BEIR retrieval split: corpus ``id -> {"title", "text"}``, queries, graded qrels."""

    corpus: dict[str, dict[str, str]]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]


@dataclass(frozen=True)
class LabelledTexts:
    """Texts with integer labels; ``label_names[i]`` names label ``i`` (empty if unknown)."""

    name: str
    texts: list[str]
    labels: list[int]
    label_names: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.texts)


# -- helpers -----------------------------------------------------------------------
def _read_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Stream ``(line_number, line)`` without the line end; gzip if the name ends in .gz.

    Lines are decoded as UTF-8, falling back to latin-1 for a line that is not
    valid UTF-8 (the SentEval raw files hold latin-1 bytes, and SentEval reads
    them as latin-1).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such data file: {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            raw = raw.rstrip(b"\n").removesuffix(b"\r")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                line = raw.decode("latin-1")
            yield number, line.removeprefix("\ufeff") if number == 1 else line


def _fail(path: Path, line: int, message: str) -> DataFormatError:
    return DataFormatError(f"{path}:{line}: {message}")


def _parse_float(value: str, path: Path, line: int, what: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise _fail(path, line, f"{what} is not a number: {value!r}") from None
    if not math.isfinite(number):
        raise _fail(path, line, f"{what} is not finite: {value!r}")
    return number


def _split_file(data_dir: str | Path, folder: str, files: dict[str, str], split: str) -> Path:
    if split not in files:
        raise ValueError(f"unknown split {split!r} for {folder}; expected one of {sorted(files)}")
    return Path(data_dir) / folder / files[split]


# -- STS ---------------------------------------------------------------------------
def load_stsb(data_dir: str | Path, split: str = "test") -> STSPairs:
    """STS Benchmark: tab-separated, score in column 4, sentences in columns 5 and 6 (0-based).

    Columns after the sixth (source notes on some rows) are ignored.
    """
    path = _split_file(data_dir, "sts/stsbenchmark", STSB_FILES, split)
    first, second, scores = [], [], []
    for number, line in _read_lines(path):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 7:
            raise _fail(path, number, f"expected at least 7 tab-separated fields, found {len(fields)}")
        scores.append(_parse_float(fields[4], path, number, "score (column 4)"))
        first.append(fields[5].strip())
        second.append(fields[6].strip())
    return STSPairs(f"STSB-{split}", first, second, scores)


def load_sick(data_dir: str | Path, split: str = "test") -> STSPairs:
    """SICK relatedness (SICK-R): header ``pair_ID sentence_A sentence_B relatedness_score ...``."""
    path = _split_file(data_dir, "sts/sick", SICK_FILES, split)
    lines = _read_lines(path)
    header_line, header = next(lines, (1, ""))
    if tuple(header.split("\t")[:4]) != SICK_HEADER[:4]:
        expected = " ".join(SICK_HEADER[:4])
        raise _fail(path, header_line, f"expected a tab-separated header {expected!r}, found {header!r}")
    first, second, scores = [], [], []
    for number, line in lines:
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 4:
            raise _fail(path, number, f"expected at least 4 tab-separated fields, found {len(fields)}")
        first.append(fields[1].strip())
        second.append(fields[2].strip())
        scores.append(_parse_float(fields[3], path, number, "relatedness_score"))
    return STSPairs(f"SICK-R-{split}", first, second, scores)


def load_pairs(path: str | Path, header: bool = False, name: str | None = None) -> STSPairs:
    """Any ``sentence1<TAB>sentence2<TAB>score`` file (skip the first line if ``header``)."""
    path = Path(path)
    first, second, scores = [], [], []
    for number, line in _read_lines(path):
        if (header and number == 1) or not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 3:
            raise _fail(path, number, f"expected 3 tab-separated fields, found {len(fields)}")
        first.append(fields[0].strip())
        second.append(fields[1].strip())
        scores.append(_parse_float(fields[2], path, number, "score"))
    return STSPairs(name or path.stem, first, second, scores)


# -- BEIR --------------------------------------------------------------------------
def _jsonl_records(path: Path) -> Iterator[tuple[int, dict]]:
    for number, line in _read_lines(path):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise _fail(path, number, f"invalid JSON ({error.msg})") from None
        if not isinstance(record, dict):
            raise _fail(path, number, "expected a JSON object")
        yield number, record


def _jsonl_path(folder: Path, stem: str) -> Path:
    for candidate in (folder / f"{stem}.jsonl", folder / f"{stem}.jsonl.gz"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"no {stem}.jsonl(.gz) in {folder}")


def load_beir(folder: str | Path, split: str = "test") -> BeirDataset:
    """A BEIR folder: ``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``.

    The qrels header (``query-id corpus-id score``) is skipped when present. Only
    queries that appear in the qrels are kept, as BEIR's loader does. A qrels row
    naming an unknown query raises; one naming an unknown document is logged.
    """
    folder = Path(folder)
    qrels_path = folder / "qrels" / f"{split}.tsv"
    if not qrels_path.is_file():
        raise FileNotFoundError(f"no qrels file for split {split!r}: {qrels_path}")
    corpus: dict[str, dict[str, str]] = {}
    path = _jsonl_path(folder, "corpus")
    for number, record in _jsonl_records(path):
        if "_id" not in record or "text" not in record:
            raise _fail(path, number, "corpus record needs '_id' and 'text'")
        corpus[str(record["_id"])] = {"title": record.get("title") or "", "text": record["text"] or ""}

    all_queries: dict[str, str] = {}
    path = _jsonl_path(folder, "queries")
    for number, record in _jsonl_records(path):
        if "_id" not in record or "text" not in record:
            raise _fail(path, number, "query record needs '_id' and 'text'")
        all_queries[str(record["_id"])] = record["text"]

    path = qrels_path
    qrels: dict[str, dict[str, int]] = {}
    missing_docs = 0
    for number, line in _read_lines(path):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 3:
            raise _fail(path, number, f"expected 'query-id corpus-id score', found {len(fields)} field(s)")
        qid, docid, grade = fields[0].strip(), fields[1].strip(), fields[-1].strip()
        try:
            value = int(grade)
        except ValueError:
            if number == 1:  # header row
                continue
            raise _fail(path, number, f"relevance grade is not an integer: {grade!r}") from None
        if qid not in all_queries:
            raise _fail(path, number, f"query id {qid!r} is not in queries.jsonl")
        missing_docs += docid not in corpus
        qrels.setdefault(qid, {})[docid] = value
    if missing_docs:
        logger.warning("%s: %d qrels rows name documents absent from the corpus", path, missing_docs)
    queries = {qid: all_queries[qid] for qid in qrels}
    return BeirDataset(corpus=corpus, queries=queries, qrels=qrels)


# -- clustering --------------------------------------------------------------------
def load_clustering(
    path: str | Path, split: str | None = None, text_field: str = "text", label_field: str = "label"
) -> LabelledTexts:
    """A jsonl(.gz) file of ``{"text", "label"}`` records (keep only ``split`` if given).

    Labels are mapped to integers in sorted order of their values; ``label_names``
    holds the original values as strings.
    """
    path = Path(path)
    texts, raw_labels = [], []
    for number, record in _jsonl_records(path):
        if split is not None and record.get("split") != split:
            continue
        if text_field not in record or label_field not in record:
            raise _fail(path, number, f"record needs {text_field!r} and {label_field!r}")
        texts.append(record[text_field])
        raw_labels.append(record[label_field])
    if not texts:
        raise DataFormatError(f"{path}: no records" + (f" with split {split!r}" if split else ""))
    values = sorted(set(raw_labels))
    index = {value: i for i, value in enumerate(values)}
    name = path.name.split(".")[0] + (f"-{split}" if split else "")
    return LabelledTexts(name, texts, [index[v] for v in raw_labels], tuple(str(v) for v in values))


# -- SentEval classification -------------------------------------------------------
SENTEVAL_TASKS = (*SENTEVAL_BINARY, "TREC", *SST_FILES)


def _sentences(path: Path) -> list[str]:
    """Non-empty lines, stripped (SentEval keeps the few blank CR/MPQA lines; we drop them)."""
    lines = [line.strip() for _, line in _read_lines(path)]
    kept = [line for line in lines if line]
    if len(kept) < len(lines):
        logger.debug("%s: skipped %d blank line(s)", path, len(lines) - len(kept))
    return kept


def load_senteval(data_dir: str | Path, task: str, split: str | None = None) -> LabelledTexts:
    """A SentEval transfer set from ``<data_dir>/classification/senteval``.

    MR, CR, SUBJ and MPQA have no fixed split (evaluate them by cross-validation;
    ``split`` must be None). TREC has ``train``/``test`` (6 coarse labels, SentEval's
    setting); SST2 and SST5 have ``train``/``dev``/``test`` sentence-level files.
    """
    root = Path(data_dir) / "classification" / "senteval"
    if task in SENTEVAL_BINARY:
        if split is not None:
            raise ValueError(f"{task} has no fixed split; pass split=None and cross-validate")
        neg_file, pos_file, names = SENTEVAL_BINARY[task]
        negatives, positives = _sentences(root / "raw" / neg_file), _sentences(root / "raw" / pos_file)
        return LabelledTexts(task, negatives + positives, [0] * len(negatives) + [1] * len(positives), names)
    if task == "TREC":
        trec_split = _check_split(task, split, ("train", "test"))
        return _load_trec(root / "raw" / f"TREC.{trec_split}", trec_split)
    if task in SST_FILES:
        stem, sst_names = SST_FILES[task]
        return _load_sst(
            root / "sst" / f"{stem}.{_check_split(task, split, ('train', 'dev', 'test'))}", f"{task}-{split}", sst_names
        )
    raise ValueError(f"unknown SentEval task {task!r}; expected one of {list(SENTEVAL_TASKS)}")


def _check_split(task: str, split: str | None, allowed: tuple[str, ...]) -> str:
    if split not in allowed:
        raise ValueError(f"{task} needs split in {allowed}; got {split!r}")
    return split


def _load_trec(path: Path, split: str) -> LabelledTexts:
    """TREC question types: ``COARSE:fine question words ...`` per line."""
    texts, labels = [], []
    for number, line in _read_lines(path):
        if not line.strip():
            continue
        tag, _, question = line.strip().partition(" ")
        coarse = tag.split(":", 1)[0]
        if ":" not in tag or coarse not in TREC_LABELS or not question.strip():
            raise _fail(path, number, f"expected 'COARSE:fine question', found {line[:60]!r}")
        texts.append(question.strip())
        labels.append(TREC_LABELS.index(coarse))
    return LabelledTexts(f"TREC-{split}", texts, labels, TREC_LABELS)


def _load_sst(path: Path, name: str, names: tuple[str, ...]) -> LabelledTexts:
    """SST sentence files: ``<label> sentence ...`` per line."""
    texts, labels = [], []
    for number, line in _read_lines(path):
        if not line.strip():
            continue
        label, _, sentence = line.strip().partition(" ")
        if not label.isdigit() or int(label) >= len(names) or not sentence.strip():
            raise _fail(path, number, f"expected '<label 0-{len(names) - 1}> sentence', found {line[:60]!r}")
        texts.append(sentence.strip())
        labels.append(int(label))
    return LabelledTexts(name, texts, labels, names)
