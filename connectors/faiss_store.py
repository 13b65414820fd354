"""A FAISS index beside a SQLite file: the SQLite transaction is the source of truth.

Directory layout::

    store.sqlite   meta (format, dim, factory, metric, index digest, calibrated breadth), properties, and the
                   rows with their metadata field counts (:mod:`.sqlite_rows`), all written in one transaction
    keyword.npz    the exact BM25 keyword index of the rows' texts, at SQLite's ``keyword_generation``
                   (:mod:`.sqlite_lexical`, :mod:`.keyword_index`)
    index.faiss    the faiss index over the stored vectors, keyed by the rows' int64 keys (:mod:`.faiss_index`)

Because the vectors are in SQLite, the index can always be rebuilt: when it is missing,
when its sha256 differs from the digest committed in SQLite (the process died between
writing the index and committing), to train an index that needs training once enough
vectors exist (until then, search is exact), and to delete from indexes without
``remove_ids`` (HNSW).

``commit()`` writes the index to a temporary file (fsync), records its digest in the open
SQLite transaction, commits it (the commit point) and renames the file over ``index.faiss``.

Inside ``deferred_index()`` (a bulk load) new rows go to SQLite only: the index holds no copy of
them (at a million rows, the flat index's vector doubling its buffer held two copies of 1.5 GB at
once). Its file then holds fewer vectors than SQLite rows, which an open treats as stale (rebuilt);
the first commit after the load builds the planned index from SQLite, or adds the rows it lacks.
"""

from __future__ import annotations

import functools
import logging
import os
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from isotrope.fusion import Candidates
from isotrope.stores import index_plan
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
)
from isotrope.stores.options import AUTO, FLAT, check_count, pick, renamed_attribute, renamed_options
from isotrope.stores.rows import chunks, dumps_metadata

from .faiss_index import (
    CHECK_DIM,
    SelectorUnsupported,
    can_remove,
    checked_factory,
    default_threshold,
    factory_of,
    file_sha256,
    fsync_dir,
    has_plain_lists,
    keyed,
    leaving_a_core,
    over_fetch,
    params_for,
    read_index,
    remove_stale_copies,
    rerank,
    serial_if_small,
    train_lists,
    working_index,
    write_copy,
)
from .sqlite_lexical import SqliteLexicalIndex
from .sqlite_rows import CHUNK, DB_NAME, connect_db, create_db

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
INDEX_NAME = "index.faiss"
_TRAIN_SAMPLE = 200_000
_TRAIN_PER_LIST = 39  # k-means sample points per IVF list (faiss's minimum: training cost is points x lists)


class FaissStore(SqliteLexicalIndex, VectorStore):
    """A FAISS index with ids, texts, metadata and vectors in SQLite.

    Parameters
    ----------
    path: the store directory (created if missing).
    dim: vector dimension; required for a new store, checked against an existing one.

    The shared store options (:mod:`isotrope.stores.options`), mapped to faiss here:

    metric: "ip" (default), "cosine" (vectors are L2-normalised on the way in) or "l2"
        (scores are minus the squared distance).
    index: "flat" (faiss ``Flat``), "auto" (the index follows the row count:
        :mod:`isotrope.stores.index_plan`) or a ``faiss.index_factory`` string ("HNSW32", "IVF64,Flat",
        "IVF64,PQ16", ...); default "flat" for a new store, read from an existing one.
    nprobe / ef: search-time breadth of IVF and HNSW indexes (faiss ``nprobe`` / ``efSearch``; default:
        the breadth calibrated when the index was last built, else 16 / 128).
    threshold: vectors needed before an index that needs training is trained
        (default: 39 per k-means centroid); until then search is exact.
    exact_filter_limit: a filtered search over at most this many rows of an approximate index
        is done exactly on the stored vectors instead.
    use_gpu: search on all GPUs (None: when faiss sees any); filtered search stays on the CPU.
    refine: re-rank ``refine * k`` candidates of an approximate index by their exact scores, from the
        float32 vectors SQLite keeps (no second copy in RAM, unlike faiss's ``RFlat``): a quantised
        index (``IVF...,SQ8``, ``SQ4``, ``PQ``) then ranks as precisely as a flat one. 0: off. Saved
        with a new store; given for an existing one, it holds for this handle (``optimize`` saves it).
    mmap_index: memory-map the committed index on open (read-only, where faiss can: IVF lists,
        flat codes) instead of reading it; it is read into memory before the first write. Off by
        default: measured 2 to 5 times slower per single query (faiss's OnDiskInvertedLists), so
        it is for indexes larger than the RAM to spare.
    """

    #: only the shaped vectors are kept (reshape needs a LanceDB store)
    stores_raw_vectors = False
    #: the generic hybrid path (by id) runs the full-text and vector queries one after the other (side by side
    #: on two cores they took longer, faiss's threads and the keyword scoring compete); :meth:`hybrid_candidates`
    #: runs them side by side with faiss on a core fewer
    concurrent_queries = False
    #: add(new_ids=True) skips looking the ids up (a stored one still fails the UNIQUE constraint)
    appends_new_ids = True

    ef_search = renamed_attribute("ef")
    train_min = renamed_attribute("threshold")
    factory = renamed_attribute("index")

    def __init__(
        self,
        path: str | os.PathLike[str],
        dim: int | None = None,
        *,
        metric: str | None = None,
        index: str | None = None,
        nprobe: int | None = None,
        ef: int | None = None,
        refine: int | None = None,
        threshold: int | None = None,
        exact_filter_limit: int = 10_000,
        use_gpu: bool | None = None,
        mmap_index: bool = False,
        **deprecated: Any,
    ) -> None:
        renamed = renamed_options("FaissStore", deprecated, ("factory", "ef_search", "train_min"))
        index, ef, threshold = (
            pick(name, value, renamed) for name, value in (("index", index), ("ef", ef), ("threshold", threshold))
        )
        nprobe, ef, threshold = check_count("nprobe", nprobe), check_count("ef", ef), check_count("threshold", threshold)
        self.path = Path(path)
        self.mmap_index = mmap_index
        self.exact_filter_limit = exact_filter_limit
        self.use_gpu = faiss.get_num_gpus() > 0 if use_gpu is None else use_gpu
        self._gpu_index: faiss.Index | None = None
        self._plain_params: tuple[int, int, faiss.SearchParameters | None] | None = None
        self._dirty = False
        self._mapped = False
        self._calibrated = True  # whether the breadth was calibrated for the trained index
        self._deferring = False  # inside deferred_index(): no index training, switching or rebuilding
        self._lagging = False  # rows added inside deferred_index() are in SQLite only, not in the index yet
        self._conn = self._connect(dim, None if index is None else factory_of(index), metric, refine)
        self._reader: sqlite3.Connection | None = None  # the read-only connection of _db (opened on use)
        self._has_fields_table = (
            self._conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'metadata_fields'").fetchone() is not None
        )
        meta = dict(self._conn.execute("SELECT key, value FROM meta").fetchall())
        self.dim = int(meta["dim"])
        self._factory = meta["factory"]  # the faiss index_factory string asked for, or "auto"
        self.metric = meta["metric"]
        self.nprobe = nprobe or int(meta.get("nprobe", 16))
        self.ef = ef or int(meta.get("ef_search", 128))
        self.refine = check_count("refine", refine, 0) if refine is not None else int(meta.get("refine", 0))
        self._faiss_metric = faiss.METRIC_L2 if self.metric == "l2" else faiss.METRIC_INNER_PRODUCT
        self._threshold_given = threshold
        self._built_rows = int(meta.get("index_rows", 0))
        self._use_factory(
            meta.get("index_factory") or (index_plan.faiss_factory_for(0) if self._factory == AUTO else self._factory)
        )
        self._index, self._mapped = self._open_index(meta.get("index_sha256"))

    def _use_factory(self, factory: str) -> None:
        """Build indexes from ``factory`` from now on."""
        self.index_factory = factory
        fresh = self._new_index()
        self._needs_training = not fresh.is_trained
        self.threshold = default_threshold(fresh) if self._threshold_given is None else self._threshold_given

    @staticmethod
    def check_index(index: str) -> None:
        """Refuse an ``index`` this store cannot build, before any work (its dimension checked at creation)."""
        checked_factory(factory_of(index), CHECK_DIM)

    @property
    def index(self) -> str:
        """The index asked for, in the shared vocabulary: "flat", "auto" or a faiss index_factory string."""
        return FLAT if self._factory == "Flat" else self._factory

    # ------------------------------------------------------------------ opening

    def _connect(self, dim: int | None, factory: str | None, metric: str | None, refine: int | None) -> sqlite3.Connection:
        db_path = self.path / DB_NAME
        if self.path.exists() and not self.path.is_dir():
            raise StoreFormatError(f"{self.path} is a file, not a FaissStore directory")
        created = not db_path.exists()
        if created:
            # a creation cut short leaves the temporary database and its journal, which create_db replaces
            if self.path.exists() and any(not p.name.startswith(DB_NAME + ".new") for p in self.path.iterdir()):
                raise StoreFormatError(f"{self.path} is not empty and has no {DB_NAME}: not a FaissStore directory")
            if dim is None:
                raise ValueError(f"creating a FaissStore at {self.path} needs dim")
            if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
                raise ValueError(f"dim must be a positive integer; got {dim!r}")
            factory = checked_factory(factory or "Flat", int(dim))
            metric = check_metric(metric or DEFAULT_METRIC)
            self.path.mkdir(parents=True, exist_ok=True)
            refine_count = check_count("refine", refine or 0, 0)
            settings = {"dim": str(int(dim)), "factory": factory, "metric": metric, "refine": str(refine_count)}
            create_db(db_path, {"format": "isotrope.faiss", "format_version": str(FORMAT_VERSION), **settings})
        conn, meta = connect_db(db_path, "FaissStore")
        if meta.get("format") != "isotrope.faiss" or meta.get("format_version") != str(FORMAT_VERSION):
            raise StoreFormatError(
                f"{db_path}: expected format isotrope.faiss version {FORMAT_VERSION}; "
                f"got {meta.get('format')!r} version {meta.get('format_version')!r}"
            )
        stored = {"dim": meta["dim"], "index": meta["factory"], "metric": meta["metric"]}
        given = {
            "dim": None if dim is None else str(int(dim)),
            "index": factory,
            "metric": None if metric is None else check_metric(metric),
        }
        for name, value in given.items():
            if value is not None and value != stored[name]:
                raise StoreFormatError(f"{self.path} was created with {name}={stored[name]}; got {name}={value}")
        return conn

    def _open_index(self, digest: str | None) -> tuple[faiss.Index, bool]:
        """The committed index (memory-mapped where its type allows) and whether it is mapped; rebuilt if stale."""
        index_path = self.path / INDEX_NAME
        remove_stale_copies(index_path)
        if digest is not None and index_path.is_file():
            if file_sha256(index_path) == digest:
                index, mapped = read_index(index_path, self.mmap_index)
                if index.d == self.dim and index.ntotal == len(self):
                    return index, mapped
            logger.warning("%s does not match the committed state in %s; rebuilding it", index_path, DB_NAME)
        elif len(self):
            logger.warning("%s is missing; rebuilding it from the %d stored vectors", index_path, len(self))
        return self._rebuild(), False

    # ------------------------------------------------------------------ the faiss index

    def _new_index(self) -> faiss.Index:
        """A fresh index from the factory string. Polysemous training (slow, and only useful for
        Hamming-filtered search, which this store does not use) is switched off."""
        index = faiss.index_factory(self.dim, self.index_factory, self._faiss_metric)
        inner = working_index(index)
        if hasattr(inner, "do_polysemous_training"):
            inner.do_polysemous_training = False
        return index

    def _exact_index(self) -> faiss.Index:
        return faiss.IndexIDMap2(faiss.IndexFlat(self.dim, self._faiss_metric))

    def _rebuild(self) -> faiss.Index:
        """Build the index from the stored vectors, training it if it needs it and enough exist."""
        self._gpu_index = None
        self._dirty = True
        self._lagging = False
        n = len(self)
        fresh = self._new_index()
        if fresh.is_trained:
            index = keyed(fresh)
        elif n >= self.threshold:
            index = keyed(fresh)
            ivf = faiss.try_extract_index_ivf(index)
            sample = self._training_sample(n, ivf)
            if ivf is not None:
                ivf.cp.niter = index_plan.kmeans_iterations(len(sample), ivf.nlist)
                if index_plan.two_level_start(len(sample), ivf.nlist) and has_plain_lists(index):
                    train_lists(ivf, sample, index_plan.KMEANS_ITERATIONS[1])
            index.train(sample)
        else:
            index = self._exact_index()
        for keys, vectors in self._iter_vectors():
            index.add_with_ids(vectors, keys)
        return index

    def _refill(self) -> faiss.Index:
        """The current index emptied (keeping what it learnt in training) and refilled from SQLite:
        how rows are deleted from indexes without ``remove_ids``, and rows a bulk load left out added."""
        self._lagging = False
        index = faiss.clone_index(self._index)
        index.reset()
        for keys, vectors in self._iter_vectors():
            index.add_with_ids(vectors, keys)
        return index

    def _training_sample(self, n: int, ivf: faiss.IndexIVF | None) -> np.ndarray:
        """The vectors an index is trained on: 39 a list for an IVF index ``ivf`` (at least the training
        threshold), at most 200,000, drawn with a fixed seed."""
        size = _TRAIN_SAMPLE if ivf is None else min(_TRAIN_SAMPLE, max(_TRAIN_PER_LIST * ivf.nlist, self.threshold))
        if n <= size:
            return np.concatenate([v for _, v in self._iter_vectors()])
        keys = [k for (k,) in self._conn.execute("SELECT key FROM items").fetchall()]
        chosen = np.random.default_rng(0).choice(keys, size, replace=False)
        return self._key_vectors(sorted(chosen.tolist()))[1]

    @property
    def is_exact(self) -> bool:
        """Whether search is currently exact (a flat index, or one not trained yet)."""
        return isinstance(working_index(self._index), faiss.IndexFlat)

    @property
    def _index(self) -> faiss.Index:
        return self._cpu_index

    @_index.setter
    def _index(self, index: faiss.Index) -> None:
        self._cpu_index = index
        self._plain_params = None
        self._mapped = False
        self._ivf = None if index is None else faiss.try_extract_index_ivf(index)

    def _search_params(self, selector: faiss.IDSelector | None) -> faiss.SearchParameters | None:
        """Search breadth for IVF / HNSW, plus the selector; None where there is nothing to pass.

        The parameters without a selector are built once per index object and setting.
        """
        if selector is not None:
            return params_for(self._index, selector, self.nprobe, self.ef)
        cached = self._plain_params
        if cached is None or cached[:2] != (self.nprobe, self.ef):
            cached = (self.nprobe, self.ef, params_for(self._index, None, self.nprobe, self.ef))
            self._plain_params = cached
        return cached[2]

    # ------------------------------------------------------------------ writing

    def _begin(self) -> None:
        if self._mapped:  # a memory-mapped index is read-only: writes need it in memory
            self._index, self._mapped = faiss.read_index(str(self.path / INDEX_NAME)), False
        if not self._conn.in_transaction:
            self._conn.execute("BEGIN IMMEDIATE")

    def add(
        self,
        ids: Sequence[str],
        vectors: Any,
        texts: Sequence[str | None] | None = None,
        metadata: Sequence[Mapping[str, Any] | None] | None = None,
        *,
        new_ids: bool = False,
    ) -> None:
        """Upsert a batch: one SQLite statement per row kind and one faiss call for the batch.

        ``new_ids``: the caller knows none of the ids is stored; they are not looked up first.
        """
        batch = check_batch(ids, vectors, texts, metadata, self.dim)
        if not batch.ids:
            return
        vectors = batch.vectors.copy()
        if self.metric == "cosine":
            faiss.normalize_L2(vectors)
        rows = [
            (text, dumps_metadata(meta), vector.tobytes(), i)
            for i, text, meta, vector in zip(batch.ids, batch.texts, batch.metadata, vectors)
        ]
        self._keyword_index()  # loaded before the rows change: it follows them from here
        self._begin()
        self._ensure_fields_table()
        self._conn.execute("SAVEPOINT isotrope_add")
        try:
            existing = {} if new_ids else self._keys(batch.ids)
            fields = Counter(name for meta in batch.metadata for name in meta)
            fields.subtract(self._field_counts(list(existing.values())))
            self._update_fields(fields)
            self._conn.executemany(
                "UPDATE items SET text = ?, metadata = ?, vector = ? WHERE id = ?",
                [row for row in rows if row[3] in existing],
            )
            self._conn.executemany(
                "INSERT INTO items (text, metadata, vector, id) VALUES (?, ?, ?, ?)",
                [row for row in rows if row[3] not in existing],
            )
            keys = self._keys(batch.ids)
            if existing and not can_remove(self._index):
                self._index = self._refill()
            else:
                if existing:
                    self._index.remove_ids(faiss.IDSelectorBatch(np.fromiter(existing.values(), dtype=np.int64)))
                indexed = [n for n, i in enumerate(batch.ids) if i in existing or not self._deferring]
                self._lagging |= len(indexed) < len(batch.ids)  # the index keeps only stored keys: it lacks these
                if indexed:
                    self._index.add_with_ids(vectors[indexed], np.array([keys[batch.ids[n]] for n in indexed], dtype=np.int64))
                self._train_if_due()
            self._keyword_upsert([(keys[i], text) for i, text in zip(batch.ids, batch.texts)])
        except BaseException:
            self._conn.execute("ROLLBACK TO isotrope_add")
            self._index = self._rebuild()
            self._keyword_discard()
            raise
        finally:
            self._conn.execute("RELEASE isotrope_add")
        self._gpu_index = None
        self._dirty = True

    def _train_if_due(self) -> None:
        """Train an index that needs it once enough rows exist (until then search is exact)."""
        if not self._deferring and self._needs_training and self.is_exact and len(self) >= self.threshold:
            self._build_index(self._rebuild)
            self._calibrated = False

    def _build_index(self, build: Callable[[], faiss.Index]) -> None:
        """Replace the index by ``build()``'s, the old one released first (peak memory: one index)."""
        self._index = self._exact_index()
        self._index = build()

    @contextmanager
    def deferred_index(self) -> Iterator[None]:
        """A bulk load: inside, rows go into the current index as it is (no training, and an auto store
        neither switches nor rebuilds its index at commits); the first commit after it builds the index
        that is due, once, instead of at every growth step, and merges the keyword index's pending rows."""
        rows = len(self)
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
            if len(self) != rows:  # the next commit follows the plan even if nothing is written in between
                self._dirty = True
                self._keyword_merge_due = True

    def delete(self, ids: Iterable[str]) -> None:
        """Remove the given ids; unknown ids are ignored."""
        keys = self._keys(as_ids(ids))
        if not keys:
            return
        self._keyword_index()
        self._begin()
        self._ensure_fields_table()
        removed: Counter[str] = Counter()
        removed.subtract(self._field_counts(list(keys.values())))
        self._update_fields(removed)
        for part in chunks(list(keys.values()), CHUNK):
            self._conn.execute(f"DELETE FROM items WHERE key IN ({','.join('?' * len(part))})", part)
        self._keyword_delete(list(keys.values()))
        if can_remove(self._index):
            self._index.remove_ids(faiss.IDSelectorBatch(np.fromiter(keys.values(), dtype=np.int64)))
        else:
            self._index = self._refill()
        self._gpu_index = None
        self._dirty = True

    # ------------------------------------------------------------------ the metadata field set

    # ------------------------------------------------------------------ the lexical index

    def commit(self) -> None:
        """Write the index if it changed (temp file, fsync), commit SQLite with its digest, then rename the
        index into place. A commit of settings or properties alone leaves the index file as it is."""
        if not self._dirty and not self._conn.in_transaction:
            return
        keyword = self._stage_keyword()
        if self._lagging and not self._deferring:
            # saved (or as saved): the keyword index leaves memory while the index is filled from SQLite, the
            # peak of a bulk load; read from its file on next use (rebuilt from the open transaction's rows
            # should this commit fail before SQLite commits)
            self._keyword = None
        if not self._deferring and self._factory == AUTO:
            self._follow_plan()
        elif not self._deferring:
            self._train_if_due()
        if not self._deferring:
            self._catch_up()
        if not self._dirty:
            self._conn.execute("COMMIT")
            self._install_keyword(keyword)
            return
        tmp = write_copy(self._index, self.path / INDEX_NAME)
        self._begin()
        self._conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('index_sha256', ?)", (file_sha256(tmp),))
        self._conn.execute("COMMIT")
        os.replace(tmp, self.path / INDEX_NAME)
        fsync_dir(self.path)
        self._dirty = False
        self._install_keyword(keyword)

    # ------------------------------------------------------------------ index planning

    def _catch_up(self) -> None:
        """Add the rows a bulk load left out of the index (refilled from SQLite), before it is searched or kept."""
        if self._lagging:
            self._index = self._refill()

    def _follow_plan(self) -> None:
        """An auto store: switch to the planned index when the store crosses into it, and rebuild it
        once the store has grown :data:`index_plan.REBUILD_GROWTH` times past its last build."""
        n = len(self)
        planned = index_plan.faiss_factory_for(n)
        crossed = planned != self.index_factory and (self.index_factory == "Flat" or planned == "Flat")
        if crossed or (planned != self.index_factory and index_plan.outgrown(n, max(self._built_rows, 1))):
            logger.info("%s: %d rows, building index %s", self.path, n, planned)
            self._build(planned)
        elif not self._calibrated and not self.is_exact:  # trained by add() once it had enough rows
            self._catch_up()
            self.calibrate()
            self._save_settings({"index_rows": str(n)})

    def _save_settings(self, settings: dict[str, str]) -> None:
        self._begin()
        self._conn.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", settings.items())
        self._built_rows = int(settings.get("index_rows", self._built_rows))
        self._calibrated = True

    def _build(self, factory: str) -> None:
        """Rebuild the index from ``factory`` and calibrate its search breadth (inside the open transaction)."""
        self._use_factory(factory)
        self._build_index(self._rebuild)
        self._begin()  # the previous index's calibration does not describe this one
        self._conn.execute("DELETE FROM meta WHERE key IN ('nprobe', 'ef_search', 'calibrated_recall', 'calibrated_on')")
        self.calibrate()
        self._save_settings({"index_factory": factory, "index_rows": str(len(self))})

    def calibrate(self, target: float | None = None, queries: Any = None) -> dict[str, str]:
        """Set nprobe / efSearch to the smallest breadth reaching ``target`` recall@10 against exact search;
        returns the settings chosen (none for exact indexes), saved at the next commit.

        Without ``queries``: those :attr:`calibration_queries` makes (pseudo-queries, where a Collection set
        it), else index_plan's queries made from stored vectors (its doubling ladder, target 0.95 plus its
        margin). With ``queries`` (vectors of queries like the user's): the recall on them, the finer
        ladder, target 0.95 (:func:`index_plan.calibrate_breadth`).
        """
        self._catch_up()
        ivf = faiss.try_extract_index_ivf(self._index)
        hnsw = isinstance(working_index(self._index), faiss.IndexHNSW)
        if self.is_exact or (ivf is None and not hnsw):
            return {}
        name, meta_key, ladder = (
            ("nprobe", "nprobe", [p for p in index_plan.NPROBE_LADDER if p <= ivf.nlist])
            if ivf is not None
            else ("ef", "ef_search", list(index_plan.EF_LADDER))
        )
        given, source = index_plan.calibration_queries(queries, self.calibration_queries)
        q = None
        if given is not None:
            q = as_vectors(given, self.dim, "queries").copy()
            if self.metric == "cosine":
                faiss.normalize_L2(q)

        def search(q: np.ndarray, k: int, value: int) -> np.ndarray:
            setattr(self, name, value)
            params = self._search_params(None)
            return self._refined(q, k, lambda fetch: self._index.search(q, fetch, params=params))[1]

        keys = np.array([r[0] for r in self._conn.execute("SELECT key FROM items")], dtype=np.int64)
        value, reached = index_plan.calibrate_breadth(
            ladder,
            keys,
            lambda chosen: self._key_vectors(chosen.tolist()),
            self._iter_vectors,
            search,
            self.metric,
            target,
            q,
            source,
        )
        setattr(self, name, value)
        logger.info("%s: %s=%d reaches recall@10 %.3f on %s", self.path, name, value, reached, source)
        recall = f"{reached:.4f}"
        self._save_settings({meta_key: str(value), "calibrated_recall": recall, "calibrated_on": source})
        return {name: str(value), "calibrated_recall": recall, "calibrated_on": source}

    def optimize(self, index: str | None = None, refine: int | None = None, **deprecated: Any) -> None:
        """Rebuild the index (the planned one for an auto store), recalibrate its breadth, and commit.

        ``index`` (see the class) replaces the store's index for good, as ``refine`` replaces its refinement.
        """
        index = pick("index", index, renamed_options("FaissStore.optimize", deprecated, ("factory",)))
        if refine is not None:
            self.refine = check_count("refine", refine, 0) or 0
            self._begin()
            self._conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('refine', ?)", (str(self.refine),))
        factory = None if index is None else checked_factory(factory_of(index), self.dim)
        if factory is not None and factory != self._factory:
            self._begin()
            self._conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('factory', ?)", (factory,))
            self._factory = factory
        n = len(self)
        self._build(index_plan.faiss_factory_for(n) if self._factory == AUTO else self._factory)
        self._dirty = True
        self.commit()

    def index_info(self) -> dict[str, Any]:
        """The index type as asked and as built, and its search settings."""
        meta = dict(self._conn.execute("SELECT key, value FROM meta").fetchall())
        info: dict[str, Any] = {"index": self.index, "index_built": self.index_factory, "index_exact": self.is_exact}
        ivf = faiss.try_extract_index_ivf(self._index)
        if ivf is not None and not self.is_exact:
            info.update(nlist=ivf.nlist, nprobe=self.nprobe)
        inner = working_index(self._index)
        if isinstance(inner, faiss.IndexHNSW):
            m = inner.hnsw.nb_neighbors(1)  # type: ignore[attr-defined]  # exists at run time, missing from the stubs
            info.update(hnsw_m=m, ef=self.ef)
        if self.refine and not self.is_exact:
            info["refine"] = self.refine
        if "calibrated_recall" in meta and not self.is_exact:
            info["calibrated_recall_at_10"] = float(meta["calibrated_recall"])
            info["calibrated_on"] = meta.get("calibrated_on", index_plan.STORED_VECTORS)
        return info

    def close(self) -> None:
        """Close the SQLite connection; uncommitted changes are discarded."""
        if self._conn is None:
            return
        if self._conn.in_transaction:
            logger.warning("closing %s with uncommitted changes: they are discarded (call commit() first)", self.path)
        if self._reader is not None:  # first: the last connection to close (the writer) removes the WAL files
            self._reader.close()
        self._conn.close()
        self._conn = None  # type: ignore[assignment]
        self._index = None  # type: ignore[assignment]  # closed: like _conn, never used again
        self._gpu_index = None

    # ------------------------------------------------------------------ reading

    def search(self, queries: Any, k: int, where: Mapping[str, Any] | None = None, with_text: bool = True) -> list[list[Hit]]:
        """The ``k`` best hits of each query (higher score is closer), among rows matching ``where``."""
        labels, scores = self._dense_keys(queries, check_k(k), where)
        return self._hits(labels, scores, with_text)

    def _dense_keys(self, queries: Any, k: int, where: Mapping[str, Any] | None) -> tuple[np.ndarray, np.ndarray]:
        """The keys (-1: none) and scores of each query's ``k`` best rows among those matching ``where``."""
        q = as_vectors(queries, self.dim, "queries")
        if self.metric == "cosine":
            q = q.copy()  # normalised in place: never the caller's array
            faiss.normalize_L2(q)
        self._catch_up()
        if where:
            keys = self._filtered_keys(where)
            if len(keys) == 0:
                return np.empty((len(q), 0), np.int64), np.empty((len(q), 0), np.float32)
            if not self.is_exact and len(keys) <= self.exact_filter_limit:
                return self._exact_keys(q, k, keys, self.metric)
            search = functools.partial(self._selector_search, q, keys=keys)
        else:
            search = functools.partial(self._unfiltered_search, q)
        with serial_if_small(len(q), self._index.ntotal * self.dim if self.is_exact else None):
            distances, labels = self._refined(q, k, search)
        return labels, -distances if self.metric == "l2" else distances

    def hybrid_candidates(
        self,
        texts: Sequence[str],
        queries: Any,
        depth: int,
        keywords: int,
        where: Mapping[str, Any] | None,
        complete: bool,
    ) -> Candidates:
        """Hybrid search's candidates named by row key: the dense top ``depth`` and the keyword top ``keywords`` (in a
        second thread, faiss on a core fewer: :func:`.faiss_index.leaving_a_core`; faiss releases the GIL), then
        (``complete``) the dense candidates' BM25; only the fused top rows are read
        (:func:`isotrope.fusion.search_store`). 2 cores, faiss on both for dense search, 200 queries after open:
        1M chunks 8.45-11.22 ms against 11.38-11.57 after the dense side, 100k 3.01-3.17 against 3.30-3.51
        (docs/scaling/keyword-search.md)."""

        def dense() -> list[tuple[np.ndarray, np.ndarray]]:
            labels, scores = self._dense_keys(queries, depth, where)
            return [(row[row >= 0], row_scores[row >= 0].astype(np.float64)) for row, row_scores in zip(labels, scores)]

        with leaving_a_core() as beside:
            return self._keyword_candidates(texts, keywords, where, dense, complete, beside=beside)

    def _refined(
        self, q: np.ndarray, k: int, search: Callable[[int], tuple[np.ndarray, np.ndarray]]
    ) -> tuple[np.ndarray, np.ndarray]:
        """``search(k)``'s (distances, labels); with ``refine``, the best ``k`` of ``refine * k`` candidates
        by exact scores on the stored vectors (faiss's conventions: squared distances for l2)."""
        if not self.refine or self.is_exact:
            return search(k)
        _, labels = search(self.refine * k)
        wanted = np.unique(labels[labels >= 0])
        if len(wanted) == 0:
            return search(k)
        stored = np.empty((len(wanted), self.dim), dtype=np.float32)
        keys, vectors = self._key_vectors(wanted.tolist())
        stored[np.searchsorted(wanted, keys)] = vectors
        return rerank(q, labels, wanted, stored, self.metric, k)

    def _selector_search(self, q: np.ndarray, k: int, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        selector = faiss.IDSelectorBatch(keys)
        try:
            return self._index.search(q, k, params=self._search_params(selector))
        except (RuntimeError, SelectorUnsupported):  # no selector for this index: over-fetch and filter
            logger.debug("%s does not take an ID selector; over-fetching", type(working_index(self._index)).__name__)
        return over_fetch(self._index, q, k, keys, self._search_params(None))

    def _unfiltered_search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if self.use_gpu and self._gpu_index is None:
            try:
                self._gpu_index = faiss.index_cpu_to_all_gpus(self._index)
                if faiss.try_extract_index_ivf(self._index) is not None:
                    faiss.GpuParameterSpace().set_index_parameter(self._gpu_index, "nprobe", self.nprobe)
            except (RuntimeError, AttributeError) as error:
                logger.warning("cannot move a %s index to the GPU (%s); searching on the CPU", self.index_factory, error)
                self.use_gpu = False
        if self.use_gpu and self._gpu_index is not None:
            return self._gpu_index.search(q, k)
        if self._ivf is not None:  # faiss splits a batch by query; one query's probed lists go to all threads
            self._ivf.parallel_mode = 1 if len(q) == 1 else 0
        return self._index.search(q, k, params=self._search_params(None))
