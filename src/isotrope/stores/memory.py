"""Exact brute-force search in NumPy: the reference every other store is tested against."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from isotrope.lexical import analyze, bm25_scores, query_terms
from isotrope.stores.base import (
    DEFAULT_METRIC,
    Hit,
    StoreFormatError,
    VectorStore,
    as_ids,
    as_vectors,
    check_batch,
    check_k,
    check_metric,
    check_properties,
)
from isotrope.stores.filters import compile_matcher
from isotrope.stores.options import FLAT

FORMAT_VERSION = 1
_MANIFEST = "store.json"
_VECTORS = "vectors.npy"


def exact_scores(queries: np.ndarray, vectors: np.ndarray, metric: str, dtype: type = np.float64) -> np.ndarray:
    """Scores of every (query, vector) pair in ``dtype`` (float64 by default), higher is closer.

    ``ip``: inner product; ``cosine``: cosine similarity (0 for a zero vector);
    ``l2``: minus the squared Euclidean distance.
    """
    q: np.ndarray = queries.astype(dtype, copy=False)
    v: np.ndarray = vectors.astype(dtype, copy=False)
    if metric == "cosine":
        q = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), np.finfo(dtype).tiny)
        v = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), np.finfo(dtype).tiny)
    scores = q @ v.T
    if metric == "l2":
        scores = 2.0 * scores - (q * q).sum(axis=1)[:, None] - (v * v).sum(axis=1)[None, :]
    return scores


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Column indices of the ``k`` best scores of each row, best first; ties keep the lower index first."""
    k = min(k, scores.shape[1])
    if k == 0:
        return np.empty((scores.shape[0], 0), dtype=np.int64)
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    rows = np.arange(scores.shape[0])[:, None]
    order = np.lexsort((part, -scores[rows, part]), axis=1)
    return part[rows, order]


class MemoryStore(VectorStore):
    """All vectors in one NumPy array; search is an exact matrix product.

    ``save(path)`` / ``MemoryStore.load(path)`` write and read a directory holding
    ``vectors.npy`` and ``store.json`` (ids, texts, metadata, properties); no pickle.
    ``commit()`` does nothing: the store has no durable state of its own.
    """

    stores_raw_vectors = False
    #: queries run one at a time (hybrid search runs its dense and lexical queries in turn)
    concurrent_queries = False

    def __init__(self, dim: int, metric: str = DEFAULT_METRIC, *, index: str = FLAT) -> None:
        """``metric`` and ``index`` are the shared store options (:mod:`isotrope.stores.options`); the
        memory store searches exactly, so ``index`` is "flat" or "auto" (exact at every size)."""
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
            raise ValueError(f"dim must be a positive integer; got {dim!r}")
        self.check_index(index)
        self.dim = int(dim)
        self.metric = check_metric(metric)
        self._vectors = np.empty((0, self.dim), dtype=np.float32)
        self._ids: list[str] = []
        self._texts: list[str | None] = []
        self._metadata: list[dict[str, Any]] = []
        self._terms: list[list[str]] = []
        self._row: dict[str, int] = {}
        self._properties: dict[str, str] = {}

    def index_info(self) -> dict[str, Any]:
        """Exact search over one array: no index to describe."""
        return {}

    def __len__(self) -> int:
        return len(self._ids)

    def add(
        self,
        ids: Sequence[str],
        vectors: Any,
        texts: Sequence[str | None] | None = None,
        metadata: Sequence[Mapping[str, Any] | None] | None = None,
    ) -> None:
        """Insert a batch; rows whose id is already stored are replaced in place."""
        batch = check_batch(ids, vectors, texts, metadata, self.dim)
        new = [j for j, i in enumerate(batch.ids) if i not in self._row]
        for j, i in enumerate(batch.ids):
            if i in self._row:
                row = self._row[i]
                self._vectors[row] = batch.vectors[j]
                self._texts[row] = batch.texts[j]
                self._metadata[row] = batch.metadata[j]
                self._terms[row] = analyze(batch.texts[j])
        for j in new:
            self._row[batch.ids[j]] = len(self._ids)
            self._ids.append(batch.ids[j])
            self._texts.append(batch.texts[j])
            self._metadata.append(batch.metadata[j])
            self._terms.append(analyze(batch.texts[j]))
        self._vectors = np.concatenate([self._vectors, batch.vectors[new]])

    def delete(self, ids: Iterable[str]) -> None:
        """Remove the given ids; unknown ids are ignored."""
        rows = {self._row[i] for i in as_ids(ids) if i in self._row}
        if not rows:
            return
        keep = [r for r in range(len(self._ids)) if r not in rows]
        self._vectors = self._vectors[keep]
        self._ids = [self._ids[r] for r in keep]
        self._texts = [self._texts[r] for r in keep]
        self._metadata = [self._metadata[r] for r in keep]
        self._terms = [self._terms[r] for r in keep]
        self._row = {i: r for r, i in enumerate(self._ids)}

    def _rows(self, where: Mapping[str, Any] | None) -> np.ndarray:
        if not where:
            return np.arange(len(self._ids))
        match = compile_matcher(where)
        return np.array([r for r, m in enumerate(self._metadata) if match(m)], dtype=np.int64)

    def search(self, queries: Any, k: int, where: Mapping[str, Any] | None = None, with_text: bool = True) -> list[list[Hit]]:
        """Exact top-``k`` of each query among the rows matching ``where``."""
        q = as_vectors(queries, self.dim, "queries")
        k = check_k(k)
        rows = self._rows(where)
        scores = exact_scores(q, self._vectors[rows], self.metric)
        best = top_k(scores, k)
        return [[self._hit(int(rows[c]), float(scores[qi, c]), with_text) for c in best[qi]] for qi in range(q.shape[0])]

    def lexical_search(
        self, texts: Sequence[str], k: int, where: Mapping[str, Any] | None = None, with_text: bool = True
    ) -> list[list[Hit]]:
        """Exact BM25 (Lucene IDF, as LanceDB) of each query text over the rows matching ``where``.

        Statistics (N, document frequencies, average length) are those of the whole store, as in
        the engines' indexes; rows sharing no term with the query are not hits.
        """
        k = check_k(k)
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of query strings, not a single string")
        allowed = set(self._rows(where).tolist())
        out = []
        for text in texts:
            scores = bm25_scores(self._terms, query_terms(text))
            rows = [r for r in np.flatnonzero(scores > 0) if r in allowed]
            rows.sort(key=lambda r: (-scores[r], r))
            out.append([self._hit(int(r), float(scores[r]), with_text) for r in rows[:k]])
        return out

    def lexical_scores(self, texts: Sequence[str], ids: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """Each query text's BM25 score of each of its ids (0 for a row sharing no term)."""
        return [bm25_scores(self._terms, query_terms(text))[[self._row[i] for i in wanted]] for text, wanted in zip(texts, ids)]

    def metadata_fields(self) -> set[str]:
        return {key for metadata in self._metadata for key in metadata}

    def _hit(self, row: int, score: float, with_text: bool = True) -> Hit:
        if not with_text:
            return Hit(self._ids[row], score, "", {})
        return Hit(self._ids[row], score, self._texts[row], dict(self._metadata[row]))

    def get(self, ids: Sequence[str]) -> list[Hit | None]:
        """The stored row of each id (score ``nan``), or ``None`` where it is not stored."""
        return [self._hit(self._row[i], float("nan")) if i in self._row else None for i in as_ids(ids)]

    def contains(self, ids: Iterable[str]) -> set[str]:
        return {i for i in as_ids(ids) if i in self._row}

    def ids(self, where: Mapping[str, Any] | None = None) -> list[str]:
        return [self._ids[r] for r in self._rows(where)]

    def vectors(self, ids: Sequence[str]) -> np.ndarray:
        """The stored vectors of ``ids`` (KeyError naming the first unknown id)."""
        wanted = as_ids(ids)
        missing = [i for i in wanted if i not in self._row]
        if missing:
            raise KeyError(f"id {missing[0]!r} is not stored")
        return self._vectors[[self._row[i] for i in wanted]].copy()

    @property
    def properties(self) -> dict[str, str]:
        return dict(self._properties)

    def set_properties(self, **kv: str) -> None:
        self._properties.update(check_properties(kv))

    def commit(self) -> None:
        """Nothing to do: an in-memory store is not durable (use ``save``)."""

    def close(self) -> None:
        """Nothing to release."""

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write ``vectors.npy`` and ``store.json`` into the directory ``path``.

        Each file is written to a temporary name and renamed; the manifest, written last,
        records the vectors' sha256 so a torn pair is detected by ``load``.
        """
        directory = Path(path)
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, suffix=".npy.tmp", delete=False) as handle:
            np.save(handle, self._vectors, allow_pickle=False)
        digest = hashlib.sha256(Path(handle.name).read_bytes()).hexdigest()
        os.replace(handle.name, directory / _VECTORS)
        manifest = {
            "format_version": FORMAT_VERSION,
            "kind": "memory",
            "dim": self.dim,
            "metric": self.metric,
            "vectors_sha256": digest,
            "ids": self._ids,
            "texts": self._texts,
            "metadata": self._metadata,
            "properties": self._properties,
        }
        with tempfile.NamedTemporaryFile("w", dir=directory, suffix=".json.tmp", delete=False, encoding="utf-8") as out:
            json.dump(manifest, out, ensure_ascii=False, allow_nan=False)
        os.replace(out.name, directory / _MANIFEST)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> MemoryStore:
        """Read a directory written by :meth:`save`."""
        directory = Path(path)
        manifest_path = directory / _MANIFEST
        if not manifest_path.is_file():
            raise StoreFormatError(f"{directory} is not a saved MemoryStore: {_MANIFEST} is missing")
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise StoreFormatError(f"{manifest_path} is not valid JSON: {error}") from error
        if manifest.get("kind") != "memory" or manifest.get("format_version") != FORMAT_VERSION:
            raise StoreFormatError(
                f"{manifest_path}: expected kind 'memory' format_version {FORMAT_VERSION}; "
                f"got kind {manifest.get('kind')!r} format_version {manifest.get('format_version')!r}"
            )
        raw = (directory / _VECTORS).read_bytes() if (directory / _VECTORS).is_file() else b""
        if hashlib.sha256(raw).hexdigest() != manifest["vectors_sha256"]:
            raise StoreFormatError(f"{directory / _VECTORS} does not match {manifest_path} (missing or modified)")
        store = cls(manifest["dim"], manifest["metric"])
        vectors = np.load(directory / _VECTORS, allow_pickle=False)
        n = len(manifest["ids"])
        if vectors.shape != (n, store.dim) or len(manifest["texts"]) != n or len(manifest["metadata"]) != n:
            raise StoreFormatError(f"{directory}: {n} ids but vectors of shape {vectors.shape}")
        if n:
            store.add(manifest["ids"], vectors, manifest["texts"], manifest["metadata"])
        store.set_properties(**manifest["properties"])
        return store
