"""Distributed indexing on Ray: read and chunk in tasks, fit from reduced statistics, embed on actors.

:func:`run_on_ray` executes the same :class:`~isotrope.ingest.plan.IngestPlan` as the local
engine (:func:`~isotrope.ingest.pipeline.run_local`), on a Ray cluster (or a local Ray runtime),
and writes the same store: the plan opens the store, picks the fit sample, creates the store and
finishes it (``sync``, last commit); this module supplies the distributed map and the write.

1. **read**: one Ray task per group of files (or of documents) loads and chunks them; the
   chunk tables become a Ray Dataset in corpus order, and the driver gets back only the
   chunk ids, the document keys and the skipped files.
2. **sample**: the driver samples the chunk ids with :meth:`IngestPlan.sample` over the same id
   stream as the local engine, so both fit on the same chunks.
3. **token counts** (idf, SIF, uSIF, drop_top): a :class:`~isotrope.weighting.TokenCounts`
   per block, summed on the driver.
4. **raw vectors**: an actor pool (each actor loads the encoder once) embeds every chunk,
   once, and the raw vectors are materialized in the object store (spilled to disk when
   large). Like the single-process path, no chunk goes through the backbone twice.
5. **transforms, in order**: the statistics of step ``i`` are computed per block on the
   sampled rows' raw vectors with the already fitted steps ``0..i-1`` applied, and reduced
   on the driver: one cheap pass of matrix products per step instead of one backbone pass
   per step. :class:`~isotrope.transforms.Moments` (center, zscore, whiten, pca, abtt)
   merge exactly. Other steps (quantile, sif_removal) are fitted on the sampled rows with
   the smallest id hashes (a bottom-k sample, merged across blocks): the whole fit sample,
   in the single-process order, unless it exceeds ``reservoir_size`` rows.
6. **write**: tasks apply the fitted chain; shaped vectors stream back to the driver in
   corpus order and are added by the plan's :class:`~isotrope.ingest.plan.ChunkWriter`, as the
   local engine adds them. A store that exists already, or a fitted encoder, skips 2-5 and the
   actors embed and shape at once.

Two fits are not distributed: ``shape="auto"`` scores candidate shapings, and a
context-averaged table (``model+context:model``) is computed, on the driver from the fit
sample's texts, as in the single-process path; the corpus is still embedded by the actors.

Files are read by the workers: on a multi-node cluster the source must be on a filesystem
that every node mounts at the same path. The store is written by the driver.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import math
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import ray.data

import ray
from isotrope.encoder import ShapedEncoder
from isotrope.ingest.chunking import TokenChunker
from isotrope.ingest.loaders import Document, SkippedFile, iter_files, load_file
from isotrope.ingest.plan import DocumentSource, IngestPlan, IngestReport, Target, chunk_stream
from isotrope.stores.base import check_metadata, dumps_metadata
from isotrope.transforms import Moments, MomentsTransform, Transform, apply_chain
from isotrope.weighting import TokenCounts

logger = logging.getLogger(__name__)

#: a read task gets consecutive files until they hold this many bytes (or this many files) ...
_UNIT_BYTES = 8 << 20
_UNIT_FILES = 256
#: ... or this many documents, for a source given as documents
_UNIT_DOCUMENTS = 1024
#: rows per block after reading: a few blocks per actor, none too large
_MIN_BLOCK_ROWS, _MAX_BLOCK_ROWS, _BLOCKS_PER_ACTOR = 64, 4096, 4
#: rows per store.add on the driver
_WRITE_ROWS = 2048


@dataclass
class FitStatistics:
    """The reduced statistics the shaping was fitted from."""

    #: chunk ids of the fit sample, in the single-process sample order
    sample_ids: list[str]
    #: summed token statistics of the sample (None when the weighting needs none)
    token_counts: TokenCounts | None = None
    #: transform index -> moments of that step's input over the sample
    moments: dict[int, Moments] = field(default_factory=dict)
    #: transform index -> rows of the bounded sample that step was fitted on
    reservoir_rows: dict[int, int] = field(default_factory=dict)


@dataclass
class RayIngestReport(IngestReport):
    """An :class:`IngestReport` plus the statistics a new encoder was fitted from."""

    statistics: FitStatistics | None = None


@dataclass(frozen=True)
class RayOptions:
    """Where and how wide the Ray engine runs.

    ``address``: a Ray cluster (``"auto"``, ``"ray://head:10001"``); None joins the runtime
    already initialised in this process or starts a local one. ``num_actors`` embedding actors
    each load the encoder once and get ``gpus_per_actor`` GPUs (fractions share a GPU). Steps
    that are not fitted from moments (quantile, sif_removal) are fitted on at most
    ``reservoir_size`` rows of the fit sample.
    """

    address: str | None = None
    num_actors: int = 2
    gpus_per_actor: float = 0.0
    reservoir_size: int = 100_000

    def __post_init__(self) -> None:
        if self.num_actors < 1:
            raise ValueError(f"num_actors must be >= 1; got {self.num_actors}")
        if self.gpus_per_actor < 0:
            raise ValueError(f"gpus_per_actor must be >= 0; got {self.gpus_per_actor}")
        if self.reservoir_size < 1:
            raise ValueError(f"reservoir_size must be >= 1; got {self.reservoir_size}")


# -- reading ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Unit:
    """The input of one read task: files under ``root``, or documents given in memory."""

    index: int
    root: str | None = None
    files: tuple[tuple[str, str], ...] = ()
    documents: tuple[Document, ...] = ()


@dataclass
class _UnitSummary:
    """What a read task reports to the driver (the chunk rows stay in the object store)."""

    ids: list[str]
    #: the file (document source) of each id, for the per-file fair fit sample
    sources: list[str]
    documents: list[str]
    skipped: list[SkippedFile]
    chunks: int
    #: whitespace-only documents (left out)
    empty: int


@dataclass
class _Chunks:
    """The chunks of a source as a Ray Dataset, and what the driver knows about them."""

    dataset: ray.data.Dataset | None
    ids: list[str]
    sources: list[str]
    documents: set[str]
    skipped: list[SkippedFile]
    #: documents, chunks and empty documents read, counted as the local engine counts them
    n_documents: int
    n_chunks: int
    n_empty: int
    #: (unit, id) of rows repeating an id already produced by an earlier unit
    repeated: set[tuple[int, str]]


def _plan_units(source: DocumentSource, skipped: list[SkippedFile]) -> list[_Unit]:
    """Split the source into read tasks, in corpus order."""
    if not isinstance(source, (str, Path)):
        documents = list(source() if callable(source) else source)
        return [
            _Unit(index, documents=tuple(documents[start : start + _UNIT_DOCUMENTS]))
            for index, start in enumerate(range(0, len(documents), _UNIT_DOCUMENTS))
        ]
    root = Path(source).expanduser().resolve()  # workers do not share the driver's working directory
    if not root.exists():
        raise FileNotFoundError(f"source not found: {root}")
    units: list[_Unit] = []
    group: list[tuple[str, str]] = []
    size = 0
    for path, name in iter_files(root, on_error=skipped.append):
        group.append((str(path), name))
        with contextlib.suppress(OSError):  # the read task reports the file
            size += path.stat().st_size
        if size >= _UNIT_BYTES or len(group) >= _UNIT_FILES:
            units.append(_Unit(len(units), str(root), tuple(group)))
            group, size = [], 0
    if group:
        units.append(_Unit(len(units), str(root), tuple(group)))
    return units


def _unit_documents(unit: _Unit, loader_options: dict[str, Any], on_error: Any) -> Iterator[Document]:
    if unit.root is not None and not Path(unit.root).exists():
        raise FileNotFoundError(
            f"{unit.root} is not visible from the Ray worker on node {ray.get_runtime_context().get_node_id()}: "
            "put the source on a filesystem that every node mounts at the same path"
        )
    yield from unit.documents
    for path, name in unit.files:
        yield from load_file(path, name=name, on_error=on_error, **loader_options)


def _read_unit(unit: _Unit, chunker: TokenChunker | None, loader_options: dict[str, Any]) -> tuple[pa.Table, _UnitSummary]:
    """Load and chunk one unit; an id repeated within the unit keeps its first chunk, as the single-process loop does."""
    skipped: list[SkippedFile] = []
    documents: list[str] = []
    columns: dict[str, list[str]] = {"id": [], "text": [], "metadata": []}
    sources: list[str] = []
    seen: set[str] = set()
    produced = 0
    counted = IngestReport()
    for document, chunks in chunk_stream(_unit_documents(unit, loader_options, skipped.append), chunker, counted):
        documents.append(document.key)
        for chunk in chunks:
            produced += 1
            if chunk.id in seen:
                continue
            seen.add(chunk.id)
            columns["id"].append(chunk.id)
            sources.append(document.source)
            columns["text"].append(chunk.text)
            columns["metadata"].append(dumps_metadata(check_metadata(chunk.metadata, chunk.id)))
    table = pa.table(
        {
            "id": pa.array(columns["id"], pa.string()),
            "text": pa.array(columns["text"], pa.string()),
            "metadata": pa.array(columns["metadata"], pa.string()),
            "unit": pa.array([unit.index] * len(columns["id"]), pa.int32()),
        }
    )
    return table, _UnitSummary(columns["id"], sources, documents, skipped, produced, counted.empty)


def _read_chunks(plan: IngestPlan, chunker: TokenChunker | None) -> _Chunks:
    """Load and chunk the plan's source in Ray tasks; the rows (id, text, metadata JSON, unit) stay in the object store."""
    skipped: list[SkippedFile] = []
    units = _plan_units(plan.source, skipped)
    read = ray.remote(num_returns=2)(_read_unit)
    chunker_ref = ray.put(chunker)
    refs = [read.remote(unit, chunker_ref, plan.loader_options) for unit in units]
    summaries: list[_UnitSummary] = ray.get([summary for _, summary in refs])
    ids: list[str] = []
    sources: list[str] = []
    produced: set[str] = set()
    repeated: set[tuple[int, str]] = set()
    documents: set[str] = set()
    for unit, summary in zip(units, summaries):
        skipped.extend(summary.skipped)
        documents.update(summary.documents)
        for chunk_id, chunk_source in zip(summary.ids, summary.sources):
            if chunk_id in produced:
                repeated.add((unit.index, chunk_id))
            else:
                produced.add(chunk_id)
                ids.append(chunk_id)
                sources.append(chunk_source)
    dataset = ray.data.from_arrow_refs([table for table, _ in refs]) if refs else None
    n_documents, n_chunks = sum(len(s.documents) for s in summaries), sum(s.chunks for s in summaries)
    n_empty = sum(s.empty for s in summaries)
    return _Chunks(dataset, ids, sources, documents, skipped, n_documents, n_chunks, n_empty, repeated)


# -- per-block functions (run in Ray workers) ----------------------------------------


def _select_rows(batch: dict[str, np.ndarray], drop_ids: Any, repeated: Any) -> dict[str, np.ndarray]:
    """Drop rows whose id is in ``drop_ids`` and rows whose (unit, id) is in ``repeated``."""
    drop_ids, repeated = ray.get(drop_ids), ray.get(repeated)
    keep = np.array([not (i in drop_ids or (int(u), i) in repeated) for i, u in zip(batch["id"], batch["unit"])], dtype=bool)
    return {name: column[keep] for name, column in batch.items()}


def _mark_sample(batch: dict[str, np.ndarray], ranks: Any) -> dict[str, np.ndarray]:
    """Add ``rank``: the row's position in the fit sample, -1 outside it."""
    ranks = ray.get(ranks)
    return {**batch, "rank": np.array([ranks.get(i, -1) for i in batch["id"]], dtype=np.int64)}


def _sampled_texts(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sampled = batch["rank"] >= 0
    return {"rank": batch["rank"][sampled], "text": batch["text"][sampled]}


def _count_tokens(batch: dict[str, np.ndarray], backbone: Any) -> dict[str, np.ndarray]:
    """Token statistics of the sampled rows of one block, as one row."""
    texts = [str(text) for text in batch["text"][batch["rank"] >= 0]]
    counts = TokenCounts(backbone.vocab_size)
    if texts:
        counts = TokenCounts.from_token_ids(backbone.token_ids(texts), backbone.vocab_size)
    return {
        "counts": counts.counts[None],
        "doc_freq": counts.doc_freq[None],
        "n_texts": np.array([counts.n_texts], dtype=np.int64),
    }


def _step_input(batch: dict[str, np.ndarray], transforms: list[Transform]) -> np.ndarray:
    """The sampled rows' raw vectors with the fitted ``transforms`` applied (float32)."""
    vectors = batch["raw_vector"][batch["rank"] >= 0].astype(np.float32, copy=False)
    return apply_chain(transforms, vectors) if len(vectors) else vectors


def _block_moments(batch: dict[str, np.ndarray], transforms: list[Transform], dim: int, full: bool) -> dict[str, np.ndarray]:
    """Moments of one block's step input, as one row (no row for a block without sampled rows)."""
    vectors = _step_input(batch, transforms)
    if not len(vectors):
        shape = (dim, dim) if full else (dim,)
        return {"count": np.zeros(0, np.int64), "mean": np.zeros((0, dim)), "scatter": np.zeros((0, *shape))}
    state = Moments.from_array(vectors, full=full).to_state()
    return {name: np.asarray(value)[None] for name, value in state.items()}


def _hash_keys(ids: Iterable[str]) -> np.ndarray:
    """A uniform 64-bit key per id: the bottom-k rows by key are a uniform sample, whatever the blocks."""
    digests = b"".join(hashlib.blake2b(str(i).encode(), digest_size=8).digest() for i in ids)
    return np.frombuffer(digests, dtype="<u8")


def _smallest(keys: np.ndarray, size: int) -> np.ndarray:
    return np.arange(len(keys)) if len(keys) <= size else np.argpartition(keys, size - 1)[:size]


def _block_reservoir(batch: dict[str, np.ndarray], transforms: list[Transform], dim: int, size: int) -> dict[str, np.ndarray]:
    """The ``size`` sampled rows of one block with the smallest id hash, with their step input."""
    vectors = _step_input(batch, transforms).reshape(-1, dim)
    sampled = batch["rank"] >= 0
    keys = _hash_keys(batch["id"][sampled])
    keep = _smallest(keys, size)
    return {"key": keys[keep], "rank": batch["rank"][sampled][keep], "vector": vectors[keep]}


class _Embedder:
    """Ray actor: loads a saved encoder once, then embeds every row of each batch.

    ``shape=False`` adds ``raw_vector`` (the shaping is fitted afterwards); ``shape=True``
    gives the rows to write: ``raw_vector`` and the shaped ``vector``.
    """

    def __init__(self, files: dict[str, bytes], device: str, batch_size: int, max_batch_tokens: int | None, shape: bool) -> None:
        folder = Path(tempfile.mkdtemp(prefix="isotrope-encoder-"))
        try:
            for name, data in files.items():
                (folder / name).write_bytes(data)
            self.encoder = ShapedEncoder.load(folder, device=device)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        self.encoder.batch_size = batch_size
        self.encoder.max_batch_tokens = max_batch_tokens
        self.shape = shape

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raw = self.encoder.embed_raw([str(text) for text in batch["text"]], kind="document")
        if not self.shape:
            return {**batch, "raw_vector": raw}
        return _output(batch, raw, self.encoder.apply_transforms(raw))


def _output(batch: dict[str, np.ndarray], raw: np.ndarray, vectors: np.ndarray) -> dict[str, np.ndarray]:
    return {"id": batch["id"], "text": batch["text"], "metadata": batch["metadata"], "raw_vector": raw, "vector": vectors}


def _shape_cached(batch: dict[str, np.ndarray], transforms: list[Transform]) -> dict[str, np.ndarray]:
    """Apply the fitted chain to the raw vectors computed while fitting."""
    raw = batch["raw_vector"].astype(np.float32, copy=False)
    return _output(batch, raw, apply_chain(transforms, raw))


# -- fitting ------------------------------------------------------------------------


def _encoder_files(encoder: ShapedEncoder) -> dict[str, bytes]:
    """The saved encoder folder as bytes, so actors on any node can load it without a shared filesystem."""
    with tempfile.TemporaryDirectory(prefix="isotrope-encoder-") as folder:
        path = encoder.save(Path(folder) / "encoder")
        return {file.name: file.read_bytes() for file in path.iterdir() if file.is_file()}


def _tokenizer_view(backbone: Any) -> Any:
    """A shallow copy of the backbone without its weights: enough for ``token_ids`` in a worker."""
    view = copy.copy(backbone)
    for name in ("model", "table"):
        if hasattr(view, name):
            setattr(view, name, None)
    return view


@dataclass
class _Actors:
    """The embedding actor pool: sized and placed by the options, fed the plan's batches."""

    options: RayOptions
    batch_size: int

    def map(self, dataset: ray.data.Dataset, encoder: ShapedEncoder, shape: bool) -> ray.data.Dataset:
        kwargs = {
            "files": _encoder_files(encoder),
            "device": "cuda" if self.options.gpus_per_actor > 0 else "cpu",
            "batch_size": encoder.batch_size,
            "max_batch_tokens": encoder.max_batch_tokens,
            "shape": shape,
        }
        return dataset.map_batches(
            _Embedder,
            fn_constructor_kwargs=kwargs,
            compute=ray.data.ActorPoolStrategy(size=self.options.num_actors),
            num_gpus=self.options.gpus_per_actor or None,
            batch_size=self.batch_size,
            batch_format="numpy",
        )


def _collect(dataset: ray.data.Dataset) -> Iterator[dict[str, np.ndarray]]:
    yield from dataset.iter_batches(batch_size=None, batch_format="numpy")


def _reduce_counts(dataset: ray.data.Dataset, backbone: Any) -> TokenCounts:
    view = _tokenizer_view(backbone)
    total = TokenCounts(backbone.vocab_size)
    for batch in _collect(
        dataset.map_batches(_count_tokens, fn_kwargs={"backbone": view}, batch_size=None, batch_format="numpy")
    ):
        for counts, doc_freq, n_texts in zip(batch["counts"], batch["doc_freq"], batch["n_texts"]):
            part = TokenCounts(len(counts))
            part.counts, part.doc_freq, part.n_texts = counts.astype(np.int64), doc_freq.astype(np.int64), int(n_texts)
            total = total.merge(part)
    return total


def _reduce_moments(dataset: ray.data.Dataset, fitted: list[Transform], dim: int, full: bool) -> Moments:
    kwargs = {"transforms": fitted, "dim": dim, "full": full}
    merged: Moments | None = None
    for batch in _collect(dataset.map_batches(_block_moments, fn_kwargs=kwargs, batch_size=None, batch_format="numpy")):
        for count, mean, scatter in zip(batch["count"], batch["mean"], batch["scatter"]):
            part = Moments.from_state({"count": count, "mean": mean, "scatter": scatter})
            merged = part if merged is None else merged.merge(part)
    if merged is None:
        raise ValueError("the fit sample produced no vectors")
    return merged


def _reduce_reservoir(dataset: ray.data.Dataset, fitted: list[Transform], dim: int, size: int) -> np.ndarray:
    """Rows of the step input with the ``size`` smallest id hashes, in fit-sample order."""
    kwargs = {"transforms": fitted, "dim": dim, "size": size}
    keys, ranks, vectors = np.zeros(0, "<u8"), np.zeros(0, np.int64), np.zeros((0, dim), np.float32)
    for batch in _collect(dataset.map_batches(_block_reservoir, fn_kwargs=kwargs, batch_size=None, batch_format="numpy")):
        keys = np.concatenate([keys, batch["key"]])
        ranks = np.concatenate([ranks, batch["rank"]])
        vectors = np.concatenate([vectors, batch["vector"].reshape(-1, dim)])
        if len(keys) > 2 * size:
            keep = _smallest(keys, size)
            keys, ranks, vectors = keys[keep], ranks[keep], vectors[keep]
    keep = _smallest(keys, size)
    order = np.argsort(ranks[keep], kind="stable")
    return vectors[keep][order]


def _fit(
    target: Target, marked: ray.data.Dataset, sample_ids: list[str], actors: _Actors
) -> tuple[ray.data.Dataset | None, FitStatistics | None]:
    """Fit the target's encoder on the sample; returns the materialized raw vectors (or None) and the statistics.

    ``shape="auto"`` (scoring candidate shapings), a context-averaged table and a distilled ``fast``
    table are fitted on the driver.
    """
    if target.auto_config is not None:
        target.fit(_sample_texts(marked))
        return None, None
    encoder = target.encoder
    if encoder.backbone.needs_fit:
        encoder.backbone.fit(_sample_texts(marked))
        encoder.adopt_distilled_shape()
    raw, statistics = _fit_encoder(encoder, marked, sample_ids, actors)
    if encoder.finish_fit(target.fitted_on(len(sample_ids)), len(sample_ids)):
        raw = None  # folded (``--model fast``): the actors embed with the folded table
    return raw, statistics


def _fit_encoder(
    encoder: ShapedEncoder, marked: ray.data.Dataset, sample_ids: list[str], actors: _Actors
) -> tuple[ray.data.Dataset | None, FitStatistics]:
    """Fit the weighting, then each transform in order; returns the materialized raw vectors (or None)."""
    statistics = FitStatistics(sample_ids)
    backbone = encoder.backbone
    if encoder.weighting.needs_corpus:
        statistics.token_counts = _reduce_counts(marked, backbone)
    encoder.weighting.fit(backbone.vocabulary(), backbone.special_ids(), statistics.token_counts)
    if not any(transform.requires_fit for transform in encoder.transforms):
        return None, statistics
    # every chunk is embedded here, once: the write pass only applies the fitted chain
    raw_encoder = ShapedEncoder(
        backbone, encoder.pooling, encoder.weighting, [], encoder.batch_size, max_batch_tokens=encoder.max_batch_tokens
    )
    raw = actors.map(marked, raw_encoder, shape=False).materialize()
    dim = backbone.dim
    for index, transform in enumerate(encoder.transforms):
        fitted = encoder.transforms[:index]
        if isinstance(transform, MomentsTransform):
            moments = _reduce_moments(raw, fitted, dim, transform.full_moments)
            transform.fit_moments(moments)
            statistics.moments[index] = moments
        elif transform.requires_fit:
            sample = _reduce_reservoir(raw, fitted, dim, actors.options.reservoir_size)
            transform.fit(sample)
            statistics.reservoir_rows[index] = len(sample)
        dim = transform.transform(np.zeros((1, dim), dtype=np.float32)).shape[1]
    return raw, statistics


# -- the driver ---------------------------------------------------------------------


@contextmanager
def _ray_runtime(address: str | None, show_progress: bool) -> Iterator[None]:
    """Join the running Ray runtime, or start/connect one for this call; keep row order in every pass."""
    started = not ray.is_initialized()
    if started:
        ray.init(address=address)
    elif address is not None:
        logger.warning("Ray is already initialised in this process: ignoring address %r", address)
    context = ray.data.DataContext.get_current()
    saved = context.execution_options.preserve_order, context.enable_progress_bars
    context.execution_options.preserve_order = True
    context.enable_progress_bars = show_progress
    try:
        yield
    finally:
        context.execution_options.preserve_order, context.enable_progress_bars = saved
        if started:
            ray.shutdown()


def _block_count(rows: int, num_actors: int) -> int:
    per_block = min(max(math.ceil(rows / (_BLOCKS_PER_ACTOR * num_actors)), _MIN_BLOCK_ROWS), _MAX_BLOCK_ROWS)
    return max(1, math.ceil(rows / per_block))


def index_with_ray(source: DocumentSource, store: str | Path, **options: Any) -> RayIngestReport:
    """:func:`~isotrope.ingest.pipeline.index_documents` on Ray: same arguments, same store, same encoder.

    ``options`` are the other fields of :class:`~isotrope.ingest.plan.IngestPlan` and those of
    :class:`RayOptions` (``address``, ``num_actors``, ``gpus_per_actor``, ``reservoir_size``).
    """
    names = {option.name for option in fields(RayOptions)}
    cluster = RayOptions(**{name: value for name, value in options.items() if name in names})
    plan = IngestPlan(source, store, **{name: value for name, value in options.items() if name not in names})
    return run_on_ray(plan, cluster)


def run_on_ray(plan: IngestPlan, options: RayOptions | None = None) -> RayIngestReport:
    """Execute ``plan`` on Ray: read and chunk in tasks, fit from reduced statistics, embed on actors;
    the store is written by the driver."""
    options = options or RayOptions()
    report = RayIngestReport()
    actors = _Actors(options, plan.batch_size)
    # one writer per store, refused before Ray starts or anything is fitted
    with plan.open() as target, _ray_runtime(options.address, plan.show_progress):
        started = time.perf_counter()
        existing = target.resume_from()
        chunks = _read_chunks(plan, plan.chunker(target.encoder))
        pending = [chunk_id for chunk_id in chunks.ids if chunk_id not in existing]
        report.skipped, report.documents, report.chunks = chunks.skipped, chunks.n_documents, chunks.n_chunks
        report.empty, report.unchanged = chunks.n_empty, len(chunks.ids) - len(pending)
        report.seconds["read"] = time.perf_counter() - started

        started = time.perf_counter()
        sample_ids: list[str] = []
        if target.needs_fit:
            pending_sources = (source for source, chunk_id in zip(chunks.sources, chunks.ids) if chunk_id not in existing)
            sample_ids = plan.sample(zip(pending_sources, pending), report.skipped)
        dataset = _rows_to_index(chunks, existing, sample_ids, len(pending), options.num_actors) if pending else None
        raw = None
        if target.needs_fit:
            raw, report.statistics = _fit(target, dataset, sample_ids, actors)
        target.create()
        report.seconds["fit"] = time.perf_counter() - started

        started = time.perf_counter()
        if dataset is not None:
            if raw is not None:  # embedded while fitting: only the fitted chain is left to apply
                shaped = raw.map_batches(
                    _shape_cached, fn_kwargs={"transforms": target.encoder.transforms}, batch_size=None, batch_format="numpy"
                )
            else:
                shaped = actors.map(dataset, target.encoder, shape=True)
            report.added = _write(target, shaped, committed=len(existing))
        target.finish(existing, set(chunks.ids), chunks.documents, report)
        report.seconds["embed_write"] = time.perf_counter() - started
    return report


def _sample_texts(dataset: ray.data.Dataset) -> list[str]:
    """The fit sample's texts, in sample order, gathered on the driver."""
    picked = dataset.map_batches(_sampled_texts, batch_size=None, batch_format="numpy")
    rows = [(int(rank), str(text)) for batch in _collect(picked) for rank, text in zip(batch["rank"], batch["text"])]
    return [text for _, text in sorted(rows)]


def _rows_to_index(chunks: _Chunks, existing: set[str], sample_ids: list[str], rows: int, num_actors: int) -> ray.data.Dataset:
    """The chunk rows to embed, in corpus order, ``rank`` marking the fit sample, in balanced blocks (materialized)."""
    dataset = chunks.dataset
    assert dataset is not None  # called only with rows pending, so some unit was read
    if chunks.repeated or existing:
        drop = {"drop_ids": ray.put(existing), "repeated": ray.put(chunks.repeated)}
        dataset = dataset.map_batches(_select_rows, fn_kwargs=drop, batch_size=None, batch_format="numpy")
    if sample_ids:
        ranks = ray.put({chunk_id: rank for rank, chunk_id in enumerate(sample_ids)})
        dataset = dataset.map_batches(_mark_sample, fn_kwargs={"ranks": ranks}, batch_size=None, batch_format="numpy")
    return dataset.repartition(_block_count(rows, num_actors)).materialize()


def _write(target: Target, shaped: ray.data.Dataset, committed: int) -> int:
    """Add the shaped rows through the plan's writer on the driver, in corpus order; returns the rows added."""
    with target.writer(committed) as writer:
        for batch in shaped.iter_batches(batch_size=_WRITE_ROWS, batch_format="numpy"):
            writer.add(
                [str(i) for i in batch["id"]],
                batch["vector"],
                [str(text) for text in batch["text"]],
                [json.loads(metadata) for metadata in batch["metadata"]],
                batch["raw_vector"],
            )
    return writer.added


__all__ = ["FitStatistics", "RayIngestReport", "RayOptions", "index_with_ray", "run_on_ray"]
