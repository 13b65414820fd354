"""``--model fast --teacher-queries``: documents through the distilled table, queries also through its teacher.

A ``fast`` table is fitted so that its mean-pooled vector of a text approaches the teacher's; it does so best
for long texts (chunks), least for short ones (queries). With teacher queries the encoder keeps the table for
everything it encodes as a document (ingestion stays as fast) and encodes a query twice: through the table,
and through the teacher transformer followed by the same fitted shaping chain (a copy of the chain as fitted
on the table's vectors, kept here because a folded encoder has none of its own). The query vector is

    L2(w * L2(chain(teacher(q))) + (1 - w) * L2(table(q)))

with ``w`` = :data:`WEIGHT`. The teacher is the same model and runtime the table was distilled with, on ONNX
Runtime from the export the distillation wrote (no torch). It is loaded once per process, on the first query or
earlier in a background thread (:func:`start_loading`: a store opened for search starts it before it reads its
index and encoder). Measured in docs/results/fast-small-corpora.md ("Teacher queries"); the cost is the
teacher's: a forward pass per query and its session in a cold process.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from isotrope.backbones import make_backbone
from isotrope.backbones.base import batch_tokens
from isotrope.pooling import pool
from isotrope.transforms import apply_chain, chain_from_state, chain_state

logger = logging.getLogger(__name__)

#: weight of the teacher's query vector in the mix: of 0, 0.25, 0.5, 0.75 and 1, the best dense nDCG@10 on SciFact's
#: *train* queries (hybrid: 0.12 below the best), then reported on test sets that did not choose it
WEIGHT = 0.5
#: queries the teacher encodes at once
BATCH_SIZE = 64

#: a loaded teacher: texts -> their mean-pooled vectors
Teacher = Callable[[Sequence[str]], np.ndarray]


def _load_teacher(model: str, backend: str) -> Teacher:
    """The teacher's mean pooling: on an ONNX backend through its cached export alone (a cold process imports no
    torch), else through the transformer backbone."""
    if backend.startswith("onnx"):
        from isotrope.backbones.onnx import OnnxMeanPooler

        return OnnxMeanPooler(model, backend, BATCH_SIZE)
    backbone = make_backbone({"type": "hf", "model": model, "backend": backend})

    def mean_pooled(texts: Sequence[str]) -> np.ndarray:
        vectors = np.empty((len(texts), backbone.dim), dtype=np.float32)
        for index, batch in backbone.iter_batches(texts, "query", BATCH_SIZE, batch_tokens(backbone)):
            vectors[index] = pool(batch.states, batch.attention_mask, "mean", None, batch.target_index)
        return vectors

    return mean_pooled


#: teachers loaded or loading in this process, by (model, backend): every encoder with that teacher shares it
_TEACHERS: dict[tuple[str, str], Future[Teacher]] = {}
_TEACHERS_LOCK = threading.Lock()


def start_loading(model: str, backend: str) -> Future[Teacher]:
    """The teacher ``model`` on ``backend``, loading in a background thread unless this process has (or is
    loading) it already; a load that fails is forgotten, so the next call tries again."""
    key = (model, backend)
    with _TEACHERS_LOCK:
        if key in _TEACHERS:
            return _TEACHERS[key]
        future: Future[Teacher] = Future()
        _TEACHERS[key] = future

    def load() -> None:
        try:
            future.set_result(_load_teacher(model, backend))
        except BaseException as error:  # handed to whoever waits on the future
            with _TEACHERS_LOCK:
                _TEACHERS.pop(key, None)
            future.set_exception(error)

    logger.info("loading the teacher %s (%s) for teacher queries", model, backend)
    threading.Thread(target=load, name=f"isotrope-teacher-{model}").start()
    return future


def _unit_rows(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.where(norms > 0, norms, 1.0)


class TeacherQueries:
    """The teacher half of a ``fast`` encoder's query vectors: the teacher's name and runtime, the mix weight,
    and the shaping chain fitted on the table (applied to the teacher's mean-pooled vectors)."""

    def __init__(self, model: str, backend: str, transforms: Sequence[Any], weight: float = WEIGHT) -> None:
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"the teacher queries' weight must be in (0, 1]; got {weight!r}")
        self.model, self.backend, self.weight = model, backend, float(weight)
        self.transforms = list(transforms)

    @classmethod
    def of_chain(cls, model: str, backend: str, transforms: Sequence[Any], weight: float | None = None) -> TeacherQueries:
        """Teacher queries through a copy of the fitted ``transforms`` (the encoder may fold its own away), mixed
        at ``weight`` (default :data:`WEIGHT`)."""
        return cls(model, backend, copy.deepcopy(list(transforms)), WEIGHT if weight is None else weight)

    def get_config(self) -> dict[str, Any]:
        """The part of the encoder's spec (and fingerprint) that says how queries are encoded."""
        return {
            "model": self.model,
            "backend": self.backend,
            "weight": self.weight,
            "transforms": [{"kind": t.kind, "config": t.get_config()} for t in self.transforms],
        }

    def get_state(self) -> dict[str, np.ndarray]:
        """The copied chain's fitted arrays, keyed ``<index>.<name>``."""
        return chain_state(self.transforms)

    @classmethod
    def from_state(cls, config: dict[str, Any], state: dict[str, np.ndarray]) -> TeacherQueries:
        """Rebuilt from :meth:`get_config` and :meth:`get_state`; a KeyError or ValueError names what is wrong."""
        transforms = chain_from_state(config["transforms"], state, "query_teacher.transforms")
        return cls(str(config["model"]), str(config["backend"]), transforms, float(config["weight"]))

    def teacher_vectors(self, texts: Sequence[str]) -> np.ndarray:
        """The teacher's mean of each text's token states (special tokens included: the vectors the table was
        fitted to), float32; the teacher is loaded on the first call unless :func:`start_loading` began it."""
        try:
            teacher = start_loading(self.model, self.backend).result()
        except (OSError, ImportError) as error:
            raise type(error)(
                f"this encoder encodes queries also through its teacher {self.model} ({self.backend}, "
                f"--teacher-queries), which cannot be loaded here: {error}"
            ) from None
        return teacher(texts)

    def mix(self, texts: Sequence[str], table_vectors: np.ndarray) -> np.ndarray:
        """The query vectors of ``texts``, given their table vectors (the encoder's own, shaped), float32."""
        teacher = apply_chain(self.transforms, self.teacher_vectors(texts))
        mixed = self.weight * _unit_rows(np.asarray(teacher, dtype=np.float64))
        mixed += (1.0 - self.weight) * _unit_rows(np.asarray(table_vectors, dtype=np.float64))
        return _unit_rows(mixed).astype(np.float32)
