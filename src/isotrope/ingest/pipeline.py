"""The streaming ingestion loop: load, chunk, fit the shaping on a sample, embed in batches, write.

Re-running is cheap and safe: chunk ids are stable (source + position + content),
so unchanged chunks are skipped, changed documents are upserted, and an
interrupted run resumes from the last commit without duplicates.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from isotrope.encoder import DEFAULT_MODEL, ShapedEncoder, default_shape, fair_sample
from isotrope.ingest.chunking import Chunk, TokenChunker, make_chunks
from isotrope.ingest.loaders import Document, SkippedFile, iter_documents
from isotrope.search import Collection, parse_store_uri
from isotrope.shapes import format_shape, parse_shape
from isotrope.stores.lock import writer_lock

logger = logging.getLogger(__name__)

#: a path, documents, or a function starting a fresh pass over documents (streamed, never held in memory)
DocumentSource = str | Path | Iterable[Document] | Callable[[], Iterable[Document]]


@dataclass
class IngestReport:
    """What one ingestion run did."""

    documents: int = 0
    chunks: int = 0
    added: int = 0
    unchanged: int = 0
    deleted: int = 0
    #: documents with no text but whitespace (not indexed)
    empty: int = 0
    skipped: list[SkippedFile] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def summary(self) -> str:
        timing = ", ".join(f"{step} {value:.1f}s" for step, value in self.seconds.items())
        return (
            f"{self.documents} documents, {self.chunks} chunks: {self.added} added, {self.unchanged} unchanged, "
            f"{self.deleted} deleted, {len(self.skipped)} files skipped"
            + (f", {self.empty} empty documents skipped" if self.empty else "") + f" ({timing})"
        )


def _document_stream(source: DocumentSource, report: IngestReport, loader_options: dict[str, Any]) -> Callable[[], Iterator[Document]]:
    """A function that starts a fresh pass over the documents (files are re-read, lists reused)."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.exists():
            raise FileNotFoundError(f"source not found: {path}")
        def skipped(entry: SkippedFile) -> None:  # every pass reads the files again: report each once
            if entry not in report.skipped:
                logger.info("skipped %s", entry)
                report.skipped.append(entry)

        def from_files() -> Iterator[Document]:
            yield from iter_documents(path, on_error=skipped, **loader_options)

        return from_files
    if callable(source):
        return lambda: iter(source())
    documents = list(source)
    return lambda: iter(documents)


def make_chunker(tokenizer: Any, chunk_tokens: int, overlap_tokens: int) -> TokenChunker | None:
    """A token chunker, or None for ``chunk_tokens <= 0``: each document is one chunk (the encoder truncates)."""
    return TokenChunker(tokenizer, chunk_tokens, overlap_tokens) if chunk_tokens > 0 else None


def chunk_document(document: Document, chunker: TokenChunker | None) -> list[Chunk]:
    return chunker.chunk(document) if chunker else make_chunks(document, [(0, len(document.text))])


def _chunk_stream(
    documents: Iterable[Document], chunker: TokenChunker | None, report: IngestReport | None = None
) -> Iterator[tuple[Document, list[Chunk]]]:
    """Each document with its chunks; empty (whitespace-only) documents are left out and counted in ``report``."""
    for document in documents:
        if document.text.strip():
            yield document, chunk_document(document, chunker)
        elif report is not None:
            report.empty += 1


def warn_if_encoder_differs(collection: Collection, encoder_options: dict[str, Any]) -> None:
    """An existing store keeps its encoder: say so when another model or shape was asked for."""
    recorded = collection.store.properties
    model, shape = encoder_options.get("model"), encoder_options.get("shape")
    if (model and model != recorded.get("model")) or (
        shape and shape != "auto" and format_shape(parse_shape(shape)) != collection.encoder.shape
    ):
        logger.warning("%s exists: keeping its encoder (model %s, shape %s); the model/shape asked for are ignored "
                       "(use `isotrope reshape` or a new store)", collection.path, recorded.get("model"), recorded.get("shape"))


def drop_duplicates(store: Any, path: Path) -> set[str]:
    """The stored ids; rows sharing an id (left by writers that ran at once, before the writer lock)
    are deleted, so this run writes each of them again once."""
    ids = store.ids()
    existing = set(ids)
    if len(ids) != len(existing):
        duplicated = sorted(chunk_id for chunk_id, count in Counter(ids).items() if count > 1)
        logger.warning("%s: %d chunk ids were stored more than once; rewriting them once", path, len(duplicated))
        store.delete(duplicated)
        store.commit()
        existing.difference_update(duplicated)
    return existing


def delete_stale(store: Any, existing: set[str], produced: set[str], documents: set[str], sync: bool) -> int:
    """Delete stored chunks no longer produced: all of them with ``sync``, else those of re-read documents."""
    stale = existing - produced
    if stale and not sync:
        hits = store.get(sorted(stale))
        stale = {hit.id for hit in hits if hit is not None and hit.metadata.get("document") in documents}
    if stale:
        store.delete(sorted(stale))
    return len(stale)


def index_documents(
    source: DocumentSource,
    store: str | Path,
    *,
    encoder: ShapedEncoder | None = None,
    encoder_options: dict[str, Any] | None = None,
    store_options: dict[str, Any] | None = None,
    loader_options: dict[str, Any] | None = None,
    chunk_tokens: int = 256,
    overlap_tokens: int = 32,
    fit_samples: int = 20_000,
    batch_size: int = 256,
    commit_every: int = 4096,
    sync: bool = False,
    show_progress: bool = True,
) -> IngestReport:
    """Index a folder, a file or an iterable of :class:`Document` into ``store`` (``faiss:DIR`` / ``lancedb:DIR``).

    A new store gets ``encoder`` (or one built from ``encoder_options`` and fitted on up to
    ``fit_samples`` chunks of the corpus); an existing store keeps the encoder that wrote it.
    ``sync`` also deletes chunks of documents that are no longer in ``source``.
    """
    with writer_lock(parse_store_uri(store)[1], "indexed"):  # refused here, before any fitting
        report = IngestReport()
        raw_cache: dict[str, np.ndarray] = {}
        documents = _document_stream(source, report, loader_options or {})
        started = time.perf_counter()
        if Collection.exists(store):
            collection = Collection.open(store, encoder, backend=(encoder_options or {}).get("backend"))
            warn_if_encoder_differs(collection, encoder_options or {})
            logger.info("appending to %s (encoder %s)", store, collection.encoder.fingerprint[:12])
        else:
            Collection.check_creatable(store)
            options = dict(encoder_options or {})
            options["shape"] = options.get("shape") or default_shape(options.get("model", DEFAULT_MODEL))
            auto = options["shape"] == "auto"
            built = encoder is None
            encoder = encoder or ShapedEncoder.create(**{**options, "shape": "none" if auto else options["shape"]})
            if auto or encoder.needs_corpus and (built or not encoder.is_fitted()):
                chunker = make_chunker(encoder.tokenizer, chunk_tokens, overlap_tokens)
                chunks = ((document.source, chunk) for document, chunks in _chunk_stream(documents(), chunker) for chunk in chunks)
                sample = fair_sample(chunks, fit_samples)  # per file: one huge file does not crowd out the rest
                if not sample:
                    raise ValueError(f"{source}: no text to index")
                texts, fitted_on = [chunk.text for chunk in sample], f"{len(sample)} sampled chunks of {source}"
                if auto:
                    from isotrope.autoshape import choose_shape

                    encoder = choose_shape(texts, options, fitted_on=fitted_on)
                else:
                    raw = encoder.fit_sample(texts, show_progress=show_progress, fitted_on=fitted_on)
                    if raw is not None:  # reused when writing: the sample is not embedded twice
                        raw_cache = {chunk.id: vector for chunk, vector in zip(sample, raw)}
            collection = Collection.create(store, encoder, **(store_options or {}))
        report.seconds["fit"] = time.perf_counter() - started
        try:
            _write(collection, documents, raw_cache, report, chunk_tokens, overlap_tokens, batch_size, commit_every, sync, show_progress)
        finally:
            collection.close()
        return report


def _write(
    collection: Collection,
    documents: Callable[[], Iterator[Document]],
    raw_cache: dict[str, np.ndarray],
    report: IngestReport,
    chunk_tokens: int,
    overlap_tokens: int,
    batch_size: int,
    commit_every: int,
    sync: bool,
    show_progress: bool,
) -> None:
    store, encoder = collection.store, collection.encoder
    chunker = make_chunker(encoder.tokenizer, chunk_tokens, overlap_tokens)
    existing = drop_duplicates(store, collection.path)
    produced: set[str] = set()
    seen_documents: set[str] = set()
    pending: list[Chunk] = []
    since_commit = 0
    committed = len(existing)
    timer = {"embed": 0.0, "write": 0.0}
    accepts_raw = store.stores_raw_vectors

    def flush() -> None:
        nonlocal since_commit, committed
        if not pending:
            return
        texts = [chunk.text for chunk in pending]
        tick = time.perf_counter()
        raw = np.empty((len(pending), encoder.backbone.dim), dtype=np.float32)
        missing = [i for i, chunk in enumerate(pending) if chunk.id not in raw_cache]
        for i, chunk in enumerate(pending):
            if chunk.id in raw_cache:
                raw[i] = raw_cache.pop(chunk.id)
        if missing:
            raw[missing] = encoder.embed_raw([texts[i] for i in missing], kind="document")
        vectors = encoder.apply_transforms(raw)
        timer["embed"] += time.perf_counter() - tick
        tick = time.perf_counter()
        extra = {"raw_vectors": raw} if accepts_raw else {}
        if getattr(store, "appends_new_ids", False):
            extra["new_ids"] = True  # pending chunks are neither stored (``existing``) nor repeated (``produced``)
        store.add([c.id for c in pending], vectors, texts, [c.metadata for c in pending], **extra)
        since_commit += len(pending)
        # commits grow with the store (a FAISS commit rewrites the whole index): O(n) work in all
        if since_commit >= max(commit_every, committed // 4):
            store.commit()
            committed += since_commit
            since_commit = 0
        timer["write"] += time.perf_counter() - tick
        progress.update(len(pending))
        report.added += len(pending)
        pending.clear()

    with tqdm(desc="indexing", unit="chunk", disable=not show_progress) as progress:
        for document, chunks in _chunk_stream(documents(), chunker, report):
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
                if len(pending) >= batch_size:
                    flush()
        flush()
    report.deleted = delete_stale(store, existing, produced, seen_documents, sync)
    tick = time.perf_counter()
    store.commit()
    timer["write"] += time.perf_counter() - tick
    report.seconds.update(timer)
