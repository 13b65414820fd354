"""One ingestion plan: what to index, into which store, with which encoder, and the stages every engine runs.

An engine (the local loop, :func:`isotrope.ingest.pipeline.run_local`, or Ray,
:func:`isotrope.connectors.ray.run_on_ray`) executes an :class:`IngestPlan` in this order:

1. :meth:`IngestPlan.open`: the writer lock, then the existing store (which keeps its encoder)
   or the new store's encoder, built from the plan (refused before anything is fitted);
2. chunks: :meth:`IngestPlan.documents` and :meth:`IngestPlan.chunker`, cut by :func:`chunk_stream`;
3. fit, for a new store whose encoder learns from the corpus: :meth:`IngestPlan.sample` picks the fit
   sample (fair per file), the engine fits on it (:meth:`Target.fit` on this process);
4. :meth:`Target.create`: the store, with the fitted encoder saved beside it;
5. write: :meth:`Target.resume_from` gives the stored ids (chunks already there are skipped, so an
   interrupted run resumes), a :class:`ChunkWriter` adds the rest in batches and commits;
6. :meth:`Target.finish`: ``sync`` deletes, the last commit; a store without a default search (a new
   one, or one whose first run was interrupted) gets it chosen from its own chunks
   (:meth:`~isotrope.search.Collection.fit_default_search`).

Chunk ids are stable (source + position + content): re-running skips unchanged chunks, upserts
changed documents and, after an interruption, writes no duplicates.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from tqdm.auto import tqdm

from isotrope.autofusion import stored_default
from isotrope.config import EncoderConfig
from isotrope.encoder import ShapedEncoder, default_shape, shape_value
from isotrope.ingest.chunking import Chunk, TokenChunker, make_chunks
from isotrope.ingest.loaders import Document, SkippedFile, iter_documents
from isotrope.resources import return_freed_memory
from isotrope.sampling import fair_sample
from isotrope.search import Collection, parse_store_uri
from isotrope.shapes import format_shape, parse_shape
from isotrope.stores.lock import writer_lock

logger = logging.getLogger(__name__)
T = TypeVar("T")

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
        """One line for the command line: counts, what was skipped and the time per step."""
        timing = ", ".join(f"{step} {value:.1f}s" for step, value in self.seconds.items())
        return (
            f"{self.documents} documents, {self.chunks} chunks: {self.added} added, {self.unchanged} unchanged, "
            f"{self.deleted} deleted, {len(self.skipped)} files skipped"
            + (f", {self.empty} empty documents skipped" if self.empty else "")
            + f" ({timing})"
        )


@dataclass
class IngestPlan:
    """Everything an ingestion run needs; every engine executes the same plan.

    ``source``: a folder, a file, documents, or a function giving a fresh pass over documents.
    ``store``: ``faiss:DIR`` / ``lancedb:DIR``. A new store gets ``encoder`` (fitted here unless it
    is already) or one built from the recipe ``config`` (its shaping defaults to the recommended
    one), fitted on up to ``fit_samples`` chunks of the corpus; an existing
    store keeps the encoder that wrote it (run with ``config.backend`` when set). ``chunk_tokens <= 0``: one chunk per document.
    ``batch_size`` chunks are embedded at a time; a commit follows every ``commit_every`` chunks
    (or a quarter of the store, when larger). ``sync`` also deletes chunks of documents no longer
    in ``source``. ``loader_options`` go to the file loaders (e.g. ``text_field``).
    """

    source: DocumentSource
    store: str | Path
    encoder: ShapedEncoder | None = None
    config: EncoderConfig | None = None
    store_options: dict[str, Any] = field(default_factory=dict)
    loader_options: dict[str, Any] = field(default_factory=dict)
    chunk_tokens: int = 256
    overlap_tokens: int = 32
    fit_samples: int = 20_000
    batch_size: int = 256
    commit_every: int = 4096
    sync: bool = False
    show_progress: bool = True
    #: choose the default search of a store without one from its chunks once written (:mod:`isotrope.autofusion`)
    default_search: bool = True

    def __post_init__(self) -> None:
        self.store_options = dict(self.store_options or {})
        self.loader_options = dict(self.loader_options or {})
        for name in ("fit_samples", "batch_size", "commit_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1; got {getattr(self, name)}")

    def describe_source(self) -> str:
        """The source in a few words: a path as given, or what kind of Python object gave the documents."""
        if isinstance(self.source, (str, Path)):
            return str(self.source)
        if callable(self.source):
            return f"documents from {getattr(self.source, '__name__', type(self.source).__name__)}()"
        return f"documents given as a {type(self.source).__name__}"

    def documents(self, report: IngestReport) -> Callable[[], Iterator[Document]]:
        """A function that starts a fresh pass over the documents (files are re-read, lists reused);
        each unreadable file is added to ``report.skipped`` once."""
        source = self.source
        if isinstance(source, (str, Path)):
            path = Path(source)
            if not path.exists():
                raise FileNotFoundError(f"source not found: {path}")

            def skipped(entry: SkippedFile) -> None:
                if entry not in report.skipped:
                    logger.info("skipped %s", entry)
                    report.skipped.append(entry)

            return lambda: iter_documents(path, on_error=skipped, **self.loader_options)
        if callable(source):
            return lambda: iter(source())
        documents = list(source)
        return lambda: iter(documents)

    def chunker(self, encoder: ShapedEncoder) -> TokenChunker | None:
        """A token chunker, or None for ``chunk_tokens <= 0``: each document is one chunk (the encoder truncates)."""
        if self.chunk_tokens <= 0:
            return None
        backbone: Any = encoder.backbone
        core = getattr(backbone, "core_tokenizer", None)
        if core is not None:  # a folded table: its ``tokenizers`` object, no transformers needed
            return TokenChunker(core, self.chunk_tokens, self.overlap_tokens, max_length=backbone.max_length)
        return TokenChunker(encoder.tokenizer, self.chunk_tokens, self.overlap_tokens)

    def sample(self, items: Iterable[tuple[Hashable, T]], skipped: Sequence[SkippedFile] = ()) -> list[T]:
        """The fit sample of ``(file, item)`` pairs in corpus order: fair per file, so one huge file does
        not crowd out the rest; the same items whatever the engine. Nothing to sample is an error naming
        the first of the ``skipped`` files and why (a CSV without the text column, a file not in UTF-8)."""
        sample = fair_sample(items, self.fit_samples)
        if not sample:
            more = f" and {len(skipped) - 1} more" if len(skipped) > 1 else ""
            why = f" (skipped {skipped[0]}{more})" if skipped else ""
            raise ValueError(f"{self.describe_source()}: no text to index{why}")
        return sample

    @contextmanager
    def open(self) -> Iterator[Target]:
        """Hold the store's writer lock and yield the :class:`Target`; the store is closed on exit.

        A second writer, an existing folder that is not a store, or a store written by another
        encoder is refused here, before anything is fitted.
        """
        with writer_lock(parse_store_uri(self.store)[1], "indexed"):
            target = self._target()
            try:
                yield target
            finally:
                if target.collection is not None:
                    target.collection.close()

    def _target(self) -> Target:
        config = self.config
        if Collection.exists(self.store):
            collection = Collection.open(self.store, self.encoder, backend=config.backend if config else None)
            warn_if_encoder_differs(collection, config)
            logger.info("appending to %s (encoder %s)", self.store, collection.encoder.fingerprint[:12])
            return Target(self, collection.encoder, collection)
        Collection.check_creatable(self.store, self.store_options.get("index"))
        config = config or EncoderConfig()
        config = config.replace(shape=config.shape or default_shape(config.model))
        auto = config.shape == "auto"
        encoder = self.encoder or ShapedEncoder.create(config.replace(shape="none") if auto else config)
        built = self.encoder is None
        needs_fit = auto or (encoder.needs_corpus and (built or not encoder.is_fitted()))
        return Target(self, encoder, None, needs_fit, config if auto else None)


@dataclass
class Target:
    """The store a plan writes and the encoder it writes with: an existing store (``collection`` set),
    or a new one, created by :meth:`create` once the encoder is fitted."""

    plan: IngestPlan
    encoder: ShapedEncoder
    collection: Collection | None = None
    #: whether the encoder must be fitted on the corpus before the store is created
    needs_fit: bool = False
    #: ``shape="auto"``: the recipe :func:`~isotrope.autoshape.choose_shape` builds candidates from
    auto_config: EncoderConfig | None = None

    def fitted_on(self, n_texts: int) -> str:
        """How the encoder's metadata names the fit sample."""
        return f"{n_texts} sampled chunks of {self.plan.describe_source()}"

    def fit(self, texts: Sequence[str]) -> np.ndarray | None:
        """Fit the encoder on the sample ``texts`` in this process (``auto``: choose the shaping);
        returns the sample's raw vectors when fitting computed them, so they are not embedded twice."""
        if self.auto_config is not None:
            from isotrope.autoshape import choose_shape

            self.encoder = choose_shape(list(texts), self.auto_config, fitted_on=self.fitted_on(len(texts)))
            return None
        raw = self.encoder.fit_sample(texts, show_progress=self.plan.show_progress, fitted_on=self.fitted_on(len(texts)))
        return_freed_memory()  # the fit's activations: the writing and default-search stages peak on what stays
        return raw

    def create(self) -> Collection:
        """The store: the existing one, or a new one with the (fitted) encoder saved beside it."""
        if self.collection is None:
            self.collection = Collection.create(self.plan.store, self.encoder, **self.plan.store_options)
        return self.collection

    def resume_from(self) -> set[str]:
        """The chunk ids already stored (skipped by this run); rows sharing an id (left by writers that
        ran at once, before the writer lock) are deleted, so this run writes each of them again once."""
        collection = self.collection
        if collection is None:  # a new store, not created yet
            return set()
        store = collection.store
        ids = store.ids()
        existing = set(ids)
        if len(ids) != len(existing):
            duplicated = sorted(chunk_id for chunk_id, count in Counter(ids).items() if count > 1)
            logger.warning("%s: %d chunk ids were stored more than once; rewriting them once", collection.path, len(duplicated))
            store.delete(duplicated)
            store.commit()
            existing.difference_update(duplicated)
        return existing

    def writer(self, committed: int) -> ChunkWriter:
        """A writer into the store, which holds ``committed`` rows already."""
        plan = self.plan
        return ChunkWriter(self.create().store, committed, plan.commit_every, plan.show_progress)

    def finish(self, existing: set[str], produced: set[str], documents: set[str], report: IngestReport) -> None:
        """Delete stored chunks no longer produced (all with ``sync``, else those of re-read
        ``documents``), then commit; then choose the default search of a store without one."""
        collection = self.create()
        store = collection.store
        stale = existing - produced
        if stale and not self.plan.sync:
            hits = store.get(sorted(stale))
            stale = {hit.id for hit in hits if hit is not None and hit.metadata.get("document") in documents}
        if stale:
            store.delete(sorted(stale))
        report.deleted = len(stale)
        store.commit()
        if self.plan.default_search and len(store) and stored_default(store.properties)[2] is None:
            tick = time.perf_counter()
            collection.fit_default_search()
            report.seconds["default_search"] = time.perf_counter() - tick


class ChunkWriter:
    """Adds shaped chunks to a store in the order given, with their raw vectors where the store keeps
    them; commits grow with the store (a FAISS commit rewrites the whole index): O(n) work in all.
    While it is open the store's ANN index is not built or rebuilt (``deferred_index``): the commit
    that finishes the run builds the index for the final size once."""

    def __init__(self, store: Any, committed: int, commit_every: int, show_progress: bool) -> None:
        self.store = store
        self._deferral = ExitStack()
        self._deferral.enter_context(store.deferred_index())
        self.committed = committed
        self.commit_every = commit_every
        self.added = 0
        self.since_commit = 0
        self.seconds = 0.0
        self.progress = tqdm(desc="indexing", unit="chunk", disable=not show_progress)

    def add(
        self, ids: Sequence[str], vectors: np.ndarray, texts: Sequence[str], metadata: Sequence[dict[str, Any]], raw: np.ndarray
    ) -> None:
        """Write a batch of embedded chunks; commit once ``commit_every`` rows, or a quarter of those committed before, are pending."""
        tick = time.perf_counter()
        extra: dict[str, Any] = {"raw_vectors": raw} if self.store.stores_raw_vectors else {}
        if getattr(self.store, "appends_new_ids", False):
            extra["new_ids"] = True  # both callers drop stored (resume) and repeated chunk ids first
        self.store.add(list(ids), vectors, list(texts), list(metadata), **extra)
        self.added += len(ids)
        self.since_commit += len(ids)
        if self.since_commit >= max(self.commit_every, self.committed // 4):
            self.store.commit()
            self.committed += self.since_commit
            self.since_commit = 0
        self.seconds += time.perf_counter() - tick
        self.progress.update(len(ids))

    def close(self) -> None:
        """Leave the deferred-index context (the store builds its index at its next commit) and close the progress bar."""
        self._deferral.close()
        self.progress.close()

    def __enter__(self) -> ChunkWriter:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def chunk_document(document: Document, chunker: TokenChunker | None) -> list[Chunk]:
    """The chunks of ``document``: token windows with ``chunker``, else the whole text as one chunk."""
    return chunker.chunk(document) if chunker else make_chunks(document, [(0, len(document.text))])


#: documents (or characters of text) chunked together by :func:`chunk_stream`: a few batched tokenizer calls each
CHUNK_BATCH_DOCUMENTS = 512
CHUNK_BATCH_CHARACTERS = 2_000_000


def chunk_stream(
    documents: Iterable[Document], chunker: TokenChunker | None, report: IngestReport | None = None
) -> Iterator[tuple[Document, list[Chunk]]]:
    """Each document with its chunks, in order; empty (whitespace-only) documents are left out and counted in
    ``report``. Documents are chunked in batches (:meth:`TokenChunker.chunk_many`), a few hundred at a time."""
    batch: list[Document] = []
    characters = 0
    for document in documents:
        if not document.text.strip():
            if report is not None:
                report.empty += 1
            continue
        batch.append(document)
        characters += len(document.text)
        if len(batch) >= CHUNK_BATCH_DOCUMENTS or characters >= CHUNK_BATCH_CHARACTERS:
            yield from _chunk_batch(batch, chunker)
            batch, characters = [], 0
    yield from _chunk_batch(batch, chunker)


def _chunk_batch(documents: list[Document], chunker: TokenChunker | None) -> Iterator[tuple[Document, list[Chunk]]]:
    chunks = chunker.chunk_many(documents) if chunker else [chunk_document(d, None) for d in documents]
    return zip(documents, chunks)


def warn_if_encoder_differs(collection: Collection, config: EncoderConfig | None) -> None:
    """An existing store keeps its encoder: say so when another model or shape was asked for."""
    recorded = collection.store.properties
    if config is None:
        return
    if config.model != recorded.get("model") or (
        config.shape and config.shape != "auto" and format_shape(parse_shape(shape_value(config))) != collection.encoder.shape
    ):
        logger.warning(
            "%s exists: keeping its encoder (model %s, shape %s); the model/shape asked for are ignored "
            "(use `isotrope reshape` or a new store)",
            collection.path,
            recorded.get("model"),
            recorded.get("shape"),
        )
