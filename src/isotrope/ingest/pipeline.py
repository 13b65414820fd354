"""The local engine: executes an :class:`~isotrope.ingest.plan.IngestPlan` in this process, streaming.

Documents are read twice at most (once for the fit sample of a new store, once to write); chunks
go to the encoder ``batch_size`` at a time and the raw vectors of the fit sample are reused.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from isotrope.encoder import ShapedEncoder
from isotrope.ingest.chunking import Chunk
from isotrope.ingest.loaders import Document
from isotrope.ingest.plan import ChunkWriter, DocumentSource, IngestPlan, IngestReport, Target, chunk_stream

T = TypeVar("T")


def index_documents(source: DocumentSource, store: str | Path, **options: Any) -> IngestReport:
    """Index a folder, a file or an iterable of :class:`Document` into ``store`` (``faiss:DIR`` / ``lancedb:DIR``).

    ``options`` are the other fields of :class:`~isotrope.ingest.plan.IngestPlan` (``encoder``,
    ``config``, ``chunk_tokens``, ``sync``, ...).
    """
    return run_local(IngestPlan(source, store, **options))


def run_local(plan: IngestPlan) -> IngestReport:
    """Execute ``plan`` in this process."""
    report = IngestReport()
    documents = plan.documents(report)
    with plan.open() as target:
        started = time.perf_counter()
        raw_cache: dict[str, np.ndarray] = {}
        if target.needs_fit:
            chunker = plan.chunker(target.encoder)
            sample = plan.sample(_distinct_chunks(chunk_stream(documents(), chunker)), report.skipped)
            raw = target.fit([chunk.text for chunk in sample])
            if raw is not None:  # reused when writing: the sample is not embedded twice
                raw_cache = {chunk.id: vector for chunk, vector in zip(sample, raw)}
        target.create()
        report.seconds["fit"] = time.perf_counter() - started
        _write(target, documents, raw_cache, report)
    return report


def _distinct_chunks(stream: Iterable[tuple[Document, list[Chunk]]]) -> Iterator[tuple[str, Chunk]]:
    """``(file, chunk)`` for each chunk id's first occurrence: the chunks written, which the sample is drawn from."""
    seen: set[str] = set()
    for document, chunks in stream:
        for chunk in chunks:
            if chunk.id not in seen:
                seen.add(chunk.id)
                yield document.source, chunk


def _write(
    target: Target, documents: Callable[[], Iterator[Document]], raw_cache: dict[str, np.ndarray], report: IngestReport
) -> None:
    """Embed and add every chunk not stored yet, in batches, then finish the store."""
    plan, encoder = target.plan, target.encoder
    existing = target.resume_from()
    produced: set[str] = set()
    seen_documents: set[str] = set()
    pending: list[Chunk] = []
    embed_seconds = 0.0

    def flush(writer: ChunkWriter) -> None:
        nonlocal embed_seconds
        if not pending:
            return
        tick = time.perf_counter()
        raw = _embed(encoder, pending, raw_cache)
        vectors = encoder.apply_transforms(raw)
        embed_seconds += time.perf_counter() - tick
        writer.add([c.id for c in pending], vectors, [c.text for c in pending], [c.metadata for c in pending], raw)
        pending.clear()

    read_seconds = 0.0

    def timed(stream: Iterator[T]) -> Iterator[T]:
        nonlocal read_seconds
        while True:
            tick = time.perf_counter()
            item = next(stream, None)
            read_seconds += time.perf_counter() - tick
            if item is None:
                return
            yield item

    with target.writer(committed=len(existing)) as writer:
        for document, chunks in timed(chunk_stream(documents(), plan.chunker(encoder), report)):
            report.documents += 1
            seen_documents.add(document.key)
            for chunk in chunks:
                report.chunks += 1
                if chunk.id in produced:
                    continue
                produced.add(chunk.id)
                if chunk.id in existing:
                    report.unchanged += 1
                    continue
                pending.append(chunk)
                if len(pending) >= plan.batch_size:
                    flush(writer)
        flush(writer)
    report.added = writer.added
    tick = time.perf_counter()
    target.finish(existing, produced, seen_documents, report)
    finish_seconds = time.perf_counter() - tick - report.seconds.get("default_search", 0.0)
    # read+chunk: reading and chunking documents; write includes finish (deletes, the last commit and
    # the ANN index it builds) but not the default search's calibration (its own entry)
    report.seconds.update(
        read_chunk=read_seconds, embed=embed_seconds, write=writer.seconds + finish_seconds, finish=finish_seconds
    )


def _embed(encoder: ShapedEncoder, chunks: list[Chunk], raw_cache: dict[str, np.ndarray]) -> np.ndarray:
    """Raw vectors of ``chunks``: those of the fit sample from ``raw_cache`` (taken out), the rest embedded."""
    raw = np.empty((len(chunks), encoder.backbone.dim), dtype=np.float32)
    missing = []
    for i, chunk in enumerate(chunks):
        if chunk.id in raw_cache:
            raw[i] = raw_cache.pop(chunk.id)
        else:
            missing.append(i)
    if missing:
        raw[missing] = encoder.embed_raw([chunks[i].text for i in missing], kind="document")
    return raw
