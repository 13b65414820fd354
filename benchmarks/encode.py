"""Topic ``encode``: isotrope's backends and ``--model fast`` against sentence-transformers, same sentences.

Sides, all on the STS-B test sentences, the same threads, batch size 32, max_seq_length 256 (unit
vectors of all-MiniLM-L6-v2 for every side but ``fast``): isotrope ``torch``, ``onnx``, ``onnx-int8``,
``onnx-int8-per-channel`` and a ``fast`` encoder (distilled on STS-B train sentences, cached under
``--workdir``), and sentence-transformers' torch ``encode`` in this process; with a peer Python
(``--st-onnx-python``) sentence-transformers' torch, ``backend="onnx"`` and its int8 model in a peer
process (:mod:`benchmarks.peer_st_onnx`) that alternates with this one round by round. Every side
first encodes all STS-B test pairs once (untimed: the warm-up, the STS-B Spearman and the cosine to
isotrope torch), then the timed rounds run. Speeds are ratios to sentence-transformers' torch in the
same process (the peer process's sides to its own torch run).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import spearmanr

from benchmarks.common import MAX_SEQ_LENGTH, MODEL, model_path, sts_sentences
from benchmarks.harness import REPO_ROOT, alternate, summarize, thread_env

logger = logging.getLogger(__name__)

BATCH_SIZE = 32  # sentence-transformers' default
BACKENDS = ("torch", "onnx", "onnx-int8", "onnx-int8-per-channel")
SIZES = {"quick": {"texts": 512, "rounds": 3, "fast_samples": 3000}, "full": {"texts": None, "rounds": 5, "fast_samples": 10000}}
#: the quality gates: onnx fp32 per-text cosine to torch, int8 per-channel STS-B as a share of torch's
GATES = {"onnx_min_cosine": 0.9999, "int8_per_channel_stsb_share": 0.99}


def stsb_test(data_dir: str | Path, limit: int | None = None) -> tuple[list[str], np.ndarray]:
    """The STS-B test sentences (first sides, then second sides) and the gold scores of the (first ``limit``) pairs."""
    from isotrope.evaluate.data import load_stsb

    pairs = load_stsb(data_dir, "test")
    first, second, scores = pairs.sentences1[:limit], pairs.sentences2[:limit], pairs.scores[:limit]
    return [*first, *second], np.asarray(scores, dtype=np.float64)


def spearman(vectors: np.ndarray, gold: np.ndarray) -> float:
    """STS-B Spearman x100 of the pairs' cosines (rows 0..n-1 against n..2n-1)."""
    a, b = vectors[: len(gold)].astype(np.float64), vectors[len(gold) :].astype(np.float64)
    cosines = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return float(spearmanr(cosines, gold).statistic) * 100


def cosine_to(reference: np.ndarray, vectors: np.ndarray) -> dict[str, float]:
    a, b = reference.astype(np.float64), vectors.astype(np.float64)
    cosines = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return {"mean_cosine_to_torch": float(cosines.mean()), "min_cosine_to_torch": float(cosines.min())}


def fast_encoder(data_dir: str | Path, workdir: Path, samples: int) -> Any:
    """A ``fast`` encoder distilled on STS-B train sentences (never the scored ones), saved once under ``workdir``."""
    from isotrope.encoder import ShapedEncoder
    from isotrope.evaluate.data import load_stsb

    folder = workdir / f"fast-stsb-train-{samples}"
    if not folder.is_dir():
        train = load_stsb(data_dir, "train")
        texts = list(dict.fromkeys([*train.sentences1, *train.sentences2]))
        logger.info("distilling a fast encoder on %d STS-B train sentences (once; saved in %s)", len(texts), folder)
        encoder = ShapedEncoder.create("fast", distill_samples=samples).fit(texts, fitted_on="stsb-train")
        encoder.save(folder)
    return ShapedEncoder.load(folder, device="cpu")


def in_process_sides(data_dir: str | Path, workdir: Path, samples: int) -> dict[str, Callable[[list[str]], np.ndarray]]:
    """Name -> encode(texts) of every side that runs in this process."""
    from sentence_transformers import SentenceTransformer

    from isotrope.encoder import ShapedEncoder

    sides: dict[str, Callable[[list[str]], np.ndarray]] = {}
    for backend in BACKENDS:  # "none" is l2 alone: nothing to fit
        encoder = ShapedEncoder.create(
            MODEL, shape="none", max_length=MAX_SEQ_LENGTH, device="cpu", batch_size=BATCH_SIZE, backend=backend
        )
        sides[f"isotrope_{backend}"] = encoder.encode
    sides["isotrope_fast"] = fast_encoder(data_dir, workdir, samples).encode
    st_model = SentenceTransformer(model_path(), device="cpu")
    st_model.max_seq_length = MAX_SEQ_LENGTH
    sides["st_torch"] = lambda texts: st_model.encode(
        texts, batch_size=BATCH_SIZE, convert_to_numpy=True, show_progress_bar=False
    )
    return sides


class PeerProcess:
    """The sentence-transformers ONNX peer (:mod:`benchmarks.peer_st_onnx`) under another Python."""

    def __init__(self, python: str, timed: list[str], quality: list[str], work: Path, threads: int) -> None:
        (work / "timed.json").write_text(json.dumps(timed))
        (work / "quality.json").write_text(json.dumps(quality))
        command = [python, "-m", "benchmarks.peer_st_onnx", "--timed", str(work / "timed.json")]
        command += ["--quality", str(work / "quality.json"), "--model", model_path(), "--work", str(work)]
        command += ["--threads", str(threads)]
        env = {**os.environ, **thread_env(threads), "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1"}
        self.work = work
        self.process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.ready = self._answer()
        self.runs: dict[str, list[list[float]]] = {name: [] for name in self.ready["ready"]}

    def _answer(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the sentence-transformers ONNX peer exited with code {self.process.wait()}")
        return dict(json.loads(line))

    def round(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("round\n")
        self.process.stdin.flush()
        for name, run in self._answer().items():
            self.runs[name].append(run)

    def vectors(self, name: str) -> np.ndarray:
        return np.load(self.work / f"{name}.npy")

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=60)


def run(
    data_dir: Path,
    *,
    mode: str,
    workdir: Path,
    st_onnx_python: str | None,
    threads: int,
    texts: int | None = None,
    rounds: int | None = None,
    quality_pairs: int | None = None,
) -> dict[str, Any]:
    """Texts/s, CPU s, ratio to sentence-transformers torch, cosine to torch and STS-B Spearman per side.

    ``texts``, ``rounds`` and ``quality_pairs`` override the mode's sizes (all pairs by default)."""
    size = {**SIZES[mode], **({"texts": texts} if texts else {}), **({"rounds": rounds} if rounds else {})}
    quality, gold = stsb_test(data_dir, quality_pairs)
    timed = sts_sentences(data_dir, size["texts"])
    sides = in_process_sides(data_dir, workdir, size["fast_samples"])
    vectors = {name: encode(quality) for name, encode in sides.items()}  # untimed: warm-up and quality
    peer_work = workdir / "peer-st-onnx"  # its export and int8 model are kept for the next run
    peer_work.mkdir(parents=True, exist_ok=True)
    peer = PeerProcess(st_onnx_python, timed, quality, peer_work, threads) if st_onnx_python else None
    timed_sides: dict[str, Callable[[], Any]] = {name: (lambda e=encode: e(timed)) for name, encode in sides.items()}
    if peer:
        timed_sides["peer_process"] = peer.round
    try:
        timings = alternate(timed_sides, size["rounds"], warmups={name: (lambda: None) for name in timed_sides})
    finally:
        if peer:
            peer.close()
    timings.pop("peer_process", None)
    peer_rows: dict[str, dict[str, Any]] = {}
    for name, runs in peer.runs.items() if peer else ():
        peer_rows[name] = summarize([wall for wall, _ in runs], [cpu for _, cpu in runs])
        vectors[f"peer_{name}"] = peer.vectors(name)
    rows = side_rows(timings, len(timed), "st_torch") | side_rows(peer_rows, len(timed), "st_torch", prefix="peer_")
    torch_vectors = vectors["isotrope_torch"]
    for name, row in rows.items():
        row["stsb_spearman"] = spearman(vectors[name], gold)
        row["stsb_share_of_torch"] = row["stsb_spearman"] / spearman(torch_vectors, gold)
        if name != "isotrope_fast":
            row.update(cosine_to(torch_vectors, vectors[name]))
    return {
        "model": MODEL,
        "texts": len(timed),
        "quality_pairs": len(gold),
        "batch_size": BATCH_SIZE,
        "max_seq_length": MAX_SEQ_LENGTH,
        "rounds": size["rounds"],
        "sides": rows,
        "peer": peer.ready if peer else None,
        "gates": gates(rows),
    }


def side_rows(timings: dict[str, dict[str, Any]], texts: int, base: str, prefix: str = "") -> dict[str, dict[str, Any]]:
    """Each side's summary with texts/s and its speed as a multiple of ``base`` (same process)."""
    if not timings:
        return {}
    reference = timings[base]["median_s"]
    return {
        prefix + name: {**summary, "texts_per_s": texts / summary["median_s"], "x_st_torch": reference / summary["median_s"]}
        for name, summary in timings.items()
    }


def gates(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets, checked: quality always, speed against the peer when it ran."""
    checks: dict[str, Any] = {
        "onnx_cosine_ge_0.9999": rows["isotrope_onnx"]["min_cosine_to_torch"] >= GATES["onnx_min_cosine"],
        "int8_per_channel_stsb_ge_99pct": rows["isotrope_onnx-int8-per-channel"]["stsb_share_of_torch"]
        >= GATES["int8_per_channel_stsb_share"],
    }
    if "peer_st_onnx" in rows:
        checks["onnx_ge_st_onnx"] = rows["isotrope_onnx"]["x_st_torch"] >= rows["peer_st_onnx"]["x_st_torch"]
        checks["int8_per_channel_ge_st_int8"] = (
            rows["isotrope_onnx-int8-per-channel"]["x_st_torch"] >= rows["peer_st_onnx_int8"]["x_st_torch"]
        )
    return checks
