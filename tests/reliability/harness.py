"""Helpers of the reliability suite: a corpus, a word-vector table, writer processes killed at random points,
and the comparison of a store with a cleanly built one."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from isotrope.search import Collection

DRIVER = Path(__file__).with_name("driver.py")
WORDS = [
    "the",
    "a",
    "of",
    "to",
    "in",
    "on",
    "and",
    "or",
    "not",
    "it",
    "he",
    "she",
    "they",
    "we",
    "cat",
    "dog",
    "bird",
    "car",
    "house",
    "tree",
    "river",
    "city",
    "sun",
    "moon",
    "rain",
    "snow",
    "food",
    "water",
    "music",
    "red",
    "green",
    "blue",
    "big",
    "small",
    "fast",
    "slow",
    "happy",
    "sad",
    "good",
    "bad",
    "new",
    "old",
    "runs",
    "eats",
    "sees",
    "likes",
    "reads",
    "plays",
    "sleeps",
    "sentence",
    "word",
]


def write_table(path: Path, dim: int = 16) -> str:
    """A GloVe-style text table of seeded random vectors for WORDS."""
    rng = np.random.default_rng(0)
    path.write_text("".join(word + " " + " ".join(f"{v:.5f}" for v in rng.standard_normal(dim)) + "\n" for word in WORDS))
    return str(path)


#: keyword queries a snapshot records (words of the corpus: several rows match each)
KEYWORD_QUERIES = ["the cat runs", "dog house river", "3 7", " ".join(WORDS[:6])]


def write_corpus(folder: Path, n_files: int = 40, per_file: int = 12) -> Path:
    """``n_files`` .jsonl files of ``per_file`` distinct sentences each (one chunk per record)."""
    rng = random.Random(0)
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(n_files):
        lines = [json.dumps({"text": f"{f} {i} " + " ".join(rng.choices(WORDS, k=rng.randint(4, 12)))}) for i in range(per_file)]
        (folder / f"part{f:03d}.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}


def start(*args: str) -> subprocess.Popen:
    """A driver process, returned once it has imported everything (it printed ``ready``)."""
    process = subprocess.Popen(
        [sys.executable, str(DRIVER), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env()
    )
    line = process.stdout.readline()
    if line.strip() != "ready":
        raise RuntimeError(f"driver did not start: {line}{process.stderr.read()}")
    return process


def run(*args: str) -> float:
    """Run a driver to the end; seconds from ``ready`` to exit."""
    process = start(*args)
    began = time.monotonic()
    _, stderr = process.communicate(timeout=600)
    if process.returncode != 0:
        raise RuntimeError(f"driver {args} failed: {stderr[-2000:]}")
    return time.monotonic() - began


def kill_at(seconds: float, *args: str) -> bool:
    """Start a driver and ``kill -9`` it ``seconds`` after it is ready; False when it finished first."""
    process = start(*args)
    try:
        process.wait(timeout=seconds)
        return False
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGKILL)
        process.wait()
        return True
    finally:
        process.stdout.close()
        process.stderr.close()


def snapshot(uri: str) -> dict:
    """Ids (with repeats), vectors by id, fingerprint and keyword top 10 (ids, BM25) of a store, read as a user
    would open it."""
    with Collection.open(uri) as collection:
        ids = collection.store.ids()
        unique = sorted(set(ids))
        vectors = collection.store.vectors(unique) if unique else np.empty((0, 0))
        hits = collection.search("the cat runs", k=3)
        if not hits:
            raise ValueError("search found nothing")
        keyword = [[(h.id, round(h.score, 6)) for h in row] for row in collection.store.lexical_search(KEYWORD_QUERIES, 10)]
        return {
            "ids": ids,
            "vectors": dict(zip(unique, vectors)),
            "fingerprint": collection.encoder.fingerprint,
            "keyword": keyword,
        }


def same_top(found: list[tuple[str, float]], expected: list[tuple[str, float]]) -> bool:
    """The same scores, and the same ids above the last score (rows tied with it may differ)."""
    if [score for _, score in found] != [score for _, score in expected]:
        return False
    last = expected[-1][1] if expected else 0.0
    return {i for i, score in found if score > last} == {i for i, score in expected if score > last}


@dataclass
class Tally:
    """What a series of trials found."""

    trials: int = 0
    killed: int = 0
    lost: int = 0
    duplicated: int = 0
    extra: int = 0
    mismatched_vectors: int = 0
    mismatched_keyword: int = 0  # keyword queries whose top 10 (ids, scores) differ from the clean store's
    unreadable: int = 0
    failures: list[str] = field(default_factory=list)

    def compare(self, uri: str, clean: dict, atol: float = 1e-5, same_fingerprint: bool = True) -> None:
        try:
            got = snapshot(uri)
        except Exception as error:
            self.unreadable += 1
            self.failures.append(f"{uri}: unreadable: {error}")
            return
        ids = set(got["ids"])
        self.lost += len(set(clean["ids"]) - ids)
        self.extra += len(ids - set(clean["ids"]))
        self.duplicated += len(got["ids"]) - len(ids)
        if same_fingerprint and got["fingerprint"] != clean["fingerprint"]:
            self.failures.append(f"{uri}: fingerprint {got['fingerprint'][:12]} != {clean['fingerprint'][:12]}")
        for chunk_id in ids & set(clean["ids"]):
            if not np.allclose(got["vectors"][chunk_id], clean["vectors"][chunk_id], atol=atol):
                self.mismatched_vectors += 1
        self.mismatched_keyword += sum(not same_top(a, b) for a, b in zip(got["keyword"], clean["keyword"]))

    @property
    def clean(self) -> bool:
        return not (
            self.lost
            or self.duplicated
            or self.extra
            or self.mismatched_vectors
            or self.mismatched_keyword
            or self.unreadable
            or self.failures
        )

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "failures"} | {"failures": self.failures[:5]}


def record(name: str, tally: Tally, **extra: object) -> None:
    """Append the figures to ``$ISOTROPE_RELIABILITY_REPORT`` (JSON lines) when it is set."""
    target = os.environ.get("ISOTROPE_RELIABILITY_REPORT")
    if target:
        with open(target, "a") as handle:
            handle.write(json.dumps({"test": name, **tally.as_dict(), **extra}) + "\n")
