"""A FAISS index beside a SQLite file: the SQLite transaction is the source of truth.

Directory layout::

    store.sqlite   meta (format, dim, factory, metric, index digest), properties, and one row
                   per item: int64 key, string id, text, metadata JSON, float32 vector blob;
                   items_fts, an FTS5 table of each item's analyzed text (rowid = key), written
                   in the same transaction as the items (lexical search, BM25)
                   metadata_fields: each top-level metadata key and how many rows have it, kept
                   in the same transaction (filters naming an unknown field are refused in O(1))
    index.faiss    the faiss index over the stored vectors, keyed by the int64 keys

Because the vectors are in SQLite, the index can always be rebuilt: when it is missing,
when its sha256 differs from the digest committed in SQLite (the process died between
writing the index and committing), to train an index that needs training once enough
vectors exist (until then, search is exact), and to delete from indexes without
``remove_ids`` (HNSW).

``commit()`` writes the index to a temporary file (fsync), records its digest in the open
SQLite transaction, commits it (the commit point) and renames the file over ``index.faiss``.
"""

from __future__ import annotations

import hashlib
import json
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

from isotrope.connectors.fts5_terms import TermScores
from isotrope.lexical import fts5_match, index_text, query_terms
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
    check_properties,
    dumps_metadata,
)
from isotrope.stores.filters import to_sqlite
from isotrope.stores.memory import exact_scores, top_k
from isotrope.stores.options import AUTO, FLAT, check_count, pick, renamed_attribute, renamed_options

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
DB_NAME = "store.sqlite"
INDEX_NAME = "index.faiss"
_CHUNK = 900  # SQLite variables per statement
_ADD_BATCH = 65_536  # rows per faiss call when rebuilding
_TRAIN_SAMPLE = 200_000
#: queries re-ranked together (their candidates' vectors are gathered into one array)
_REFINE_QUERIES = 256
_TRAIN_PER_LIST = 39  # k-means sample points per IVF list (faiss's minimum: training cost is points x lists)
_READ_BLOCK = 1 << 22
#: the dimension an index_factory string is checked with before the store's own is known (2^6 x 3 x 5 x 7:
#: divisible by the usual PQ sub-quantizer counts)
_CHECK_DIM = 6720
#: SQLite reads the database through a memory map up to this size: looking up the rows of the
#: hits then costs no read() system call per page
_MMAP_BYTES = 256 * 1024 * 1024
#: the map of the read-only connection searches use (SQLite caps it, at 2 GB in common builds)
_READ_MMAP_BYTES = 1 << 40
#: how long a connection waits for a lock another process holds on the database
_BUSY_SECONDS = 60.0
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS properties (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS items (
    key INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    text TEXT,
    metadata TEXT NOT NULL,
    vector BLOB NOT NULL
);
"""
#: the lexical index: isotrope.lexical's analyzed terms, split on spaces only (ascii tokenizer); a row
#: without terms has no entry (it counts in no BM25 statistic, as in LanceDB)
_FTS_SCHEMA = "CREATE VIRTUAL TABLE IF NOT EXISTS items_fts USING fts5(terms, tokenize = 'ascii')"
#: the metadata keys of the stored rows, with the number of rows having each
_FIELDS_SCHEMA = "CREATE TABLE IF NOT EXISTS metadata_fields (name TEXT PRIMARY KEY, rows INTEGER NOT NULL)"
#: the key counts of some stored rows' metadata (``{placeholders}`` filled with their keys)
_COUNT_FIELDS = (
    "SELECT j.key, COUNT(*) FROM items, json_each(items.metadata) AS j WHERE items.key IN ({placeholders}) GROUP BY j.key"
)


def _chunks(values: Sequence[Any], size: int = _CHUNK) -> Iterator[Sequence[Any]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


_decode_json = json.JSONDecoder().raw_decode


def _load_metadata(value: str) -> dict[str, Any]:
    """A stored metadata JSON object (written compact by this store: ``raw_decode`` parses it without
    ``json.loads``'s whitespace passes, at under half the cost); the common empty one is not parsed."""
    return {} if value == "{}" else _decode_json(value)[0]


#: the SELECT of the rows hits show (key, id, text, metadata) for 1 to 900 keys, and of their ids alone (text
#: '', metadata '{}'): one statement text per count, built once (sqlite3 prepares each once and finds it again)
_HIT_COLUMNS = {True: "text, metadata", False: "'', '{}'"}
_ROWS_SQL = {
    with_text: [f"SELECT key, id, {columns} FROM items WHERE key IN ({','.join('?' * count)})" for count in range(_CHUNK + 1)]
    for with_text, columns in _HIT_COLUMNS.items()
}


def _inner(index: faiss.Index) -> faiss.Index:
    """The index doing the work under id maps, pre-transforms and refinement."""
    index = faiss.downcast_index(index)
    while True:
        if isinstance(index, (faiss.IndexIDMap, faiss.IndexIDMap2, faiss.IndexPreTransform)):
            index = faiss.downcast_index(index.index)
        elif isinstance(index, faiss.IndexRefine):
            index = faiss.downcast_index(index.base_index)
        else:
            return index


def _default_threshold(index: faiss.Index) -> int:
    """Vectors needed before training: faiss's advice of 39 points per k-means centroid."""
    inner = _inner(index)
    need = 1
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        need = max(need, 39 * ivf.nlist)
    pq = getattr(inner, "pq", None)
    if pq is not None:
        need = max(need, 39 * pq.ksub)
    return need


class _SelectorUnsupported(Exception):
    """An index that cannot restrict its search to an id selector."""


def _params_for(
    index: faiss.Index, selector: faiss.IDSelector | None, nprobe: int, ef_search: int
) -> faiss.SearchParameters | None:
    """Search parameters shaped like the index: id maps and pre-transforms pass them down,
    a refinement stage wraps those of its base index."""
    index = faiss.downcast_index(index)
    if isinstance(index, (faiss.IndexIDMap, faiss.IndexIDMap2, faiss.IndexPreTransform)):
        return _params_for(index.index, selector, nprobe, ef_search)
    if isinstance(index, faiss.IndexRefine):
        if selector is not None:  # the refine stage would not translate it through an id map
            raise _SelectorUnsupported(type(index).__name__)
        base = _params_for(index.base_index, selector, nprobe, ef_search)
        # re-rank at least 4k candidates: the factory's default (k_factor 1) makes refinement a no-op
        params = faiss.IndexRefineSearchParameters(  # type: ignore[call-arg]  # the stubs lack the SWIG keyword constructor
            k_factor=max(index.k_factor, 4.0), base_index_params=base
        )
        params.referenced_objects = [base]  # type: ignore[attr-defined]  # keeps base alive (SWIG attribute, not in the stubs)
        return params
    if isinstance(index, faiss.IndexIVF):
        return faiss.SearchParametersIVF(sel=selector, nprobe=min(nprobe, index.nlist))  # type: ignore[call-arg]  # stubs lack the keyword constructor
    if isinstance(index, faiss.IndexHNSW):
        return faiss.SearchParametersHNSW(sel=selector, efSearch=ef_search)  # type: ignore[attr-defined]  # missing from the stubs
    return None if selector is None else faiss.SearchParameters(sel=selector)  # type: ignore[call-arg]  # stubs lack the keyword constructor


class FaissStore(VectorStore):
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
    #: the full-text and vector queries of a hybrid search run one after the other (measured: side by side
    #: on two cores they take longer, faiss's threads and FTS5's scoring compete)
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
        self._conn = self._connect(dim, None if index is None else _factory_of(index), metric, refine)
        self._reader: sqlite3.Connection | None = None  # the read-only connection of _db (opened on use)
        self._term_scores = TermScores("items_fts")  # frequent terms' BM25, for unfiltered lexical reads
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
        self.threshold = _default_threshold(fresh) if self._threshold_given is None else self._threshold_given

    @staticmethod
    def check_index(index: str) -> None:
        """Refuse an ``index`` this store cannot build, before any work (its dimension checked at creation)."""
        _checked_factory(_factory_of(index), _CHECK_DIM)

    @property
    def index(self) -> str:
        """The index asked for, in the shared vocabulary: "flat", "auto" or a faiss index_factory string."""
        return FLAT if self._factory == "Flat" else self._factory

    @property
    def _db(self) -> sqlite3.Connection:
        """The connection searches and lookups read through: the store's own inside its write transaction
        (it sees the rows not committed yet), else a read-only one that sees the last commit and maps as
        much of the file as SQLite allows (hit rows read without a system call each: about half the time
        for 10 rows of a 4.3 GB store); writes and scans keep the smaller map, so their memory stays bounded."""
        if self._conn.in_transaction:
            return self._conn
        if self._reader is None:
            uri = f"{(self.path / DB_NAME).absolute().as_uri()}?mode=ro"
            self._reader = sqlite3.connect(uri, uri=True, timeout=_BUSY_SECONDS)
            self._reader.execute(f"PRAGMA mmap_size={_READ_MMAP_BYTES}")
        return self._reader

    # ------------------------------------------------------------------ opening

    def _connect(self, dim: int | None, factory: str | None, metric: str | None, refine: int | None) -> sqlite3.Connection:
        db_path = self.path / DB_NAME
        if self.path.exists() and not self.path.is_dir():
            raise StoreFormatError(f"{self.path} is a file, not a FaissStore directory")
        created = not db_path.exists()
        if created:
            # a creation cut short leaves the temporary database and its journal, which _create_db replaces
            if self.path.exists() and any(not p.name.startswith(DB_NAME + ".new") for p in self.path.iterdir()):
                raise StoreFormatError(f"{self.path} is not empty and has no {DB_NAME}: not a FaissStore directory")
            if dim is None:
                raise ValueError(f"creating a FaissStore at {self.path} needs dim")
            if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
                raise ValueError(f"dim must be a positive integer; got {dim!r}")
            factory = _checked_factory(factory or "Flat", int(dim))
            metric = check_metric(metric or DEFAULT_METRIC)
            self.path.mkdir(parents=True, exist_ok=True)
            refine_count = check_count("refine", refine or 0, 0)
            _create_db(db_path, {"dim": str(int(dim)), "factory": factory, "metric": metric, "refine": str(refine_count)})
        try:
            # WAL: readers see the last commit while a writer writes; the busy timeout waits out
            # the short moments (checkpoints, switching the mode) when SQLite must lock the file
            conn = sqlite3.connect(db_path, isolation_level=None, timeout=_BUSY_SECONDS)
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(f"PRAGMA mmap_size={_MMAP_BYTES}")
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.OperationalError as error:
            if "locked" in str(error) or "busy" in str(error):
                raise RuntimeError(f"{db_path} stayed locked for {_BUSY_SECONDS} s by another process: {error}") from error
            raise StoreFormatError(f"{db_path} is not a FaissStore database: {error}") from error
        except sqlite3.DatabaseError as error:
            raise StoreFormatError(f"{db_path} is not a FaissStore database: {error}") from error
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
        for stale in self.path.glob(INDEX_NAME + ".*.tmp"):
            if not _process_alive(stale.name[len(INDEX_NAME) + 1 : -len(".tmp")]):  # not a live writer's
                stale.unlink(missing_ok=True)
        if digest is not None and index_path.is_file():
            if _file_sha256(index_path) == digest:
                index, mapped = _read_index(index_path, self.mmap_index)
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
        inner = _inner(index)
        if hasattr(inner, "do_polysemous_training"):
            inner.do_polysemous_training = False
        return index

    def _wrap(self, index: faiss.Index) -> faiss.Index:
        """Key the index by int64: IVF indexes hold ids natively, others get an ``IndexIDMap2``."""
        top = faiss.downcast_index(index)
        if isinstance(top, (faiss.IndexIDMap, faiss.IndexIDMap2)):
            return index
        if isinstance(top, faiss.IndexIVF) or (
            isinstance(top, faiss.IndexPreTransform) and isinstance(faiss.downcast_index(top.index), faiss.IndexIVF)
        ):
            return index
        return faiss.IndexIDMap2(index)

    def _exact_index(self) -> faiss.Index:
        return faiss.IndexIDMap2(faiss.IndexFlat(self.dim, self._faiss_metric))

    def _iter_vectors(self, where_sql: str = "1", params: Sequence[Any] = ()) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(keys, vectors) batches of the rows matching a trusted SQL condition, in key order."""
        cursor = self._conn.execute(f"SELECT key, vector FROM items WHERE {where_sql} ORDER BY key", params)
        while rows := cursor.fetchmany(_ADD_BATCH):
            keys = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
            vectors = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(len(rows), self.dim)
            yield keys, vectors

    def _rebuild(self) -> faiss.Index:
        """Build the index from the stored vectors, training it if it needs it and enough exist."""
        self._gpu_index = None
        self._dirty = True
        n = len(self)
        fresh = self._new_index()
        if fresh.is_trained:
            index = self._wrap(fresh)
        elif n >= self.threshold:
            index = self._wrap(fresh)
            index.train(self._training_sample(n))
        else:
            index = self._exact_index()
        for keys, vectors in self._iter_vectors():
            index.add_with_ids(vectors, keys)
        return index

    def _refill(self) -> faiss.Index:
        """The current index emptied (keeping what it learnt in training) and refilled from SQLite:
        how rows are deleted from indexes without ``remove_ids``."""
        index = faiss.clone_index(self._index)
        index.reset()
        for keys, vectors in self._iter_vectors():
            index.add_with_ids(vectors, keys)
        return index

    def _training_sample(self, n: int) -> np.ndarray:
        ivf = faiss.try_extract_index_ivf(self._new_index())
        size = _TRAIN_SAMPLE if ivf is None else min(_TRAIN_SAMPLE, max(_TRAIN_PER_LIST * ivf.nlist, self.threshold))
        if n <= size:
            return np.concatenate([v for _, v in self._iter_vectors()])
        keys = [k for (k,) in self._conn.execute("SELECT key FROM items").fetchall()]
        chosen = np.random.default_rng(0).choice(keys, size, replace=False)
        parts: list[np.ndarray] = []
        for part in _chunks(sorted(chosen.tolist())):
            parts.extend(v for _, v in self._iter_vectors(f"key IN ({','.join('?' * len(part))})", part))
        return np.concatenate(parts)

    @property
    def is_exact(self) -> bool:
        """Whether search is currently exact (a flat index, or one not trained yet)."""
        return isinstance(_inner(self._index), faiss.IndexFlat)

    def _can_remove(self) -> bool:
        top = faiss.downcast_index(self._index)
        if isinstance(top, (faiss.IndexIDMap, faiss.IndexIDMap2)):
            return isinstance(faiss.downcast_index(top.index), faiss.IndexFlatCodes)
        return faiss.try_extract_index_ivf(top) is not None

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
            return _params_for(self._index, selector, self.nprobe, self.ef)
        cached = self._plain_params
        if cached is None or cached[:2] != (self.nprobe, self.ef):
            cached = (self.nprobe, self.ef, _params_for(self._index, None, self.nprobe, self.ef))
            self._plain_params = cached
        return cached[2]

    # ------------------------------------------------------------------ writing

    def _begin(self) -> None:
        if self._mapped:  # a memory-mapped index is read-only: writes need it in memory
            self._index, self._mapped = faiss.read_index(str(self.path / INDEX_NAME)), False
        if not self._conn.in_transaction:
            self._conn.execute("BEGIN IMMEDIATE")

    def __len__(self) -> int:
        return self._conn.execute("SELECT COUNT(*) FROM items").fetchone()[0]

    def _keys(self, ids: Sequence[str]) -> dict[str, int]:
        found: dict[str, int] = {}
        for part in _chunks(ids):
            query = f"SELECT id, key FROM items WHERE id IN ({','.join('?' * len(part))})"
            found.update(self._db.execute(query, part).fetchall())
        return found

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
        terms = [index_text(text) for text in batch.texts]
        self._begin()
        self._ensure_lexical_index()
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
            self._delete_terms(list(existing.values()))
            self._conn.executemany(
                "INSERT INTO items_fts (rowid, terms) VALUES (?, ?)", [(keys[i], t) for i, t in zip(batch.ids, terms) if t]
            )
            if existing and not self._can_remove():
                self._index = self._refill()
            else:
                if existing:
                    self._index.remove_ids(faiss.IDSelectorBatch(np.fromiter(existing.values(), dtype=np.int64)))
                self._index.add_with_ids(vectors, np.array([keys[i] for i in batch.ids], dtype=np.int64))
                self._train_if_due()
        except BaseException:
            self._conn.execute("ROLLBACK TO isotrope_add")
            self._index = self._rebuild()
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
        that is due, once, instead of at every growth step."""
        rows = len(self)
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
            if len(self) != rows:  # the next commit follows the plan even if nothing is written in between
                self._dirty = True

    def delete(self, ids: Iterable[str]) -> None:
        """Remove the given ids; unknown ids are ignored."""
        keys = self._keys(as_ids(ids))
        if not keys:
            return
        self._begin()
        self._ensure_lexical_index()
        self._ensure_fields_table()
        removed: Counter[str] = Counter()
        removed.subtract(self._field_counts(list(keys.values())))
        self._update_fields(removed)
        for part in _chunks(list(keys.values())):
            self._conn.execute(f"DELETE FROM items WHERE key IN ({','.join('?' * len(part))})", part)
        self._delete_terms(list(keys.values()))
        if self._can_remove():
            self._index.remove_ids(faiss.IDSelectorBatch(np.fromiter(keys.values(), dtype=np.int64)))
        else:
            self._index = self._refill()
        self._gpu_index = None
        self._dirty = True

    # ------------------------------------------------------------------ the metadata field set

    def _field_counts(self, keys: Sequence[int]) -> Counter[str]:
        """How many of the given rows have each metadata key."""
        counts: Counter[str] = Counter()
        for part in _chunks(keys):
            counts.update(dict(self._conn.execute(_COUNT_FIELDS.format(placeholders=",".join("?" * len(part))), part)))
        return counts

    def _update_fields(self, delta: Counter[str]) -> None:
        """Add ``delta`` to the field counts (inside the open transaction); fields left on no row go."""
        changes = [(name, count) for name, count in delta.items() if count]
        if not changes:
            return
        self._conn.executemany(
            "INSERT INTO metadata_fields (name, rows) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET rows = rows + excluded.rows",
            changes,
        )
        self._conn.execute("DELETE FROM metadata_fields WHERE rows <= 0")

    def _ensure_fields_table(self) -> None:
        """Create and fill the field counts of a store written before they existed (inside the open transaction)."""
        if self._has_fields_table:
            return
        logger.info("%s: counting the metadata fields of its %d rows", self.path, len(self))
        self._conn.execute(_FIELDS_SCHEMA)
        self._conn.execute(
            "INSERT INTO metadata_fields (name, rows) SELECT j.key, COUNT(*) "
            "FROM items, json_each(items.metadata) AS j GROUP BY j.key"
        )
        self._has_fields_table = True

    def metadata_fields(self) -> set[str]:
        """The metadata keys of the stored rows (kept on write: no pass over the rows)."""
        if self._has_fields_table:
            return {name for (name,) in self._conn.execute("SELECT name FROM metadata_fields")}
        query = "SELECT DISTINCT j.key FROM items, json_each(items.metadata) AS j"  # a store from before the counts
        return {key for (key,) in self._conn.execute(query)}

    # ------------------------------------------------------------------ the lexical index

    def _delete_terms(self, keys: Sequence[int]) -> None:
        for part in _chunks(keys):
            self._conn.execute(f"DELETE FROM items_fts WHERE rowid IN ({','.join('?' * len(part))})", part)

    @property
    def has_lexical_index(self) -> bool:
        """Whether the FTS5 table of lexical search exists (a store written before it had none: ``build_lexical_index``)."""
        return self._db.execute("SELECT 1 FROM sqlite_master WHERE name = 'items_fts'").fetchone() is not None

    def _ensure_lexical_index(self) -> None:
        """Build the FTS5 table of a store written before it existed (inside the open transaction)."""
        if self.has_lexical_index:
            return
        logger.warning("%s has no lexical index: building it from the %d stored texts", self.path, len(self))
        self._conn.execute(_FTS_SCHEMA)
        cursor = self._conn.execute("SELECT key, text FROM items ORDER BY key")
        while rows := cursor.fetchmany(_ADD_BATCH):
            self._conn.executemany(
                "INSERT INTO items_fts (rowid, terms) VALUES (?, ?)",
                [(key, terms) for key, text in rows if (terms := index_text(text))],
            )

    def build_lexical_index(self) -> None:
        """Build the lexical index if the store has none: committed now, or with the pending writes."""
        if self.has_lexical_index:
            return
        if self._conn.in_transaction:
            self._ensure_lexical_index()
            return
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            self._ensure_lexical_index()
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def set_properties(self, **kv: str) -> None:
        """Set persisted string properties (committed with the data)."""
        props = check_properties(kv)
        self._begin()
        self._conn.executemany("INSERT OR REPLACE INTO properties (key, value) VALUES (?, ?)", props.items())

    @property
    def properties(self) -> dict[str, str]:
        """The persisted ``dict[str, str]`` committed with the data (the encoder's fingerprint, index settings)."""
        return dict(self._conn.execute("SELECT key, value FROM properties").fetchall())

    def commit(self) -> None:
        """Write the index if it changed (temp file, fsync), commit SQLite with its digest, then rename the
        index into place. A commit of settings or properties alone leaves the index file as it is."""
        if not self._dirty and not self._conn.in_transaction:
            return
        if not self._deferring and self._factory == AUTO:
            self._follow_plan()
        elif not self._deferring:
            self._train_if_due()
        if not self._dirty:
            self._conn.execute("COMMIT")
            return
        tmp = self.path / f"{INDEX_NAME}.{os.getpid()}.tmp"
        faiss.write_index(self._index, str(tmp))  # streamed to disk: no serialized copy in memory
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        self._begin()
        self._conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('index_sha256', ?)", (_file_sha256(tmp),))
        self._conn.execute("COMMIT")
        os.replace(tmp, self.path / INDEX_NAME)
        _fsync_dir(self.path)
        self._dirty = False

    # ------------------------------------------------------------------ index planning

    def _follow_plan(self) -> None:
        """An auto store: switch to the planned index when the store crosses into it, and rebuild it
        once the store has grown :data:`index_plan.REBUILD_GROWTH` times past its last build."""
        n = len(self)
        planned = index_plan.faiss_factory_for(n)
        crossed = planned != self.index_factory and (self.index_factory == "Flat" or planned == "Flat")
        if crossed or (planned != self.index_factory and n >= index_plan.REBUILD_GROWTH * max(self._built_rows, 1)):
            logger.info("%s: %d rows, building index %s", self.path, n, planned)
            self._build(planned)
        elif not self._calibrated and not self.is_exact:  # trained by add() once it had enough rows
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
        self._conn.execute("DELETE FROM meta WHERE key IN ('nprobe', 'ef_search', 'calibrated_recall')")
        self.calibrate()
        self._save_settings({"index_factory": factory, "index_rows": str(len(self))})

    def calibrate(self, target: float | None = None, queries: Any = None) -> dict[str, str]:
        """Set nprobe / efSearch to the smallest breadth reaching ``target`` recall@10 against exact search;
        returns the settings chosen (none for exact indexes), saved at the next commit.

        Without ``queries``: index_plan's calibration queries made from stored vectors, its doubling
        ladder, target 0.95 plus its margin. With ``queries`` (vectors of queries like the user's): the
        recall on them, the finer ladder, target 0.95.
        """
        ivf = faiss.try_extract_index_ivf(self._index)
        hnsw = isinstance(_inner(self._index), faiss.IndexHNSW)
        if self.is_exact or (ivf is None and not hnsw):
            return {}
        name, meta_key, ladder = (
            ("nprobe", "nprobe", [p for p in index_plan.NPROBE_LADDER if p <= ivf.nlist])
            if ivf is not None
            else ("ef", "ef_search", list(index_plan.EF_LADDER))
        )
        q = None
        if queries is not None:
            q = as_vectors(queries, self.dim, "queries").copy()
            if self.metric == "cosine":
                faiss.normalize_L2(q)

        def sample(chosen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            condition = f"key IN ({','.join('?' * len(chosen))})"
            return chosen, np.concatenate([v for _, v in self._iter_vectors(condition, chosen.tolist())])

        def search(q: np.ndarray, k: int, value: int) -> np.ndarray:
            setattr(self, name, value)
            params = self._search_params(None)
            return self._refined(q, k, lambda fetch: self._index.search(q, fetch, params=params))[1]

        keys = np.array([r[0] for r in self._conn.execute("SELECT key FROM items")], dtype=np.int64)
        value, reached = index_plan.calibrate_breadth(ladder, keys, sample, self._iter_vectors, search, self.metric, target, q)
        setattr(self, name, value)
        logger.info("%s: %s=%d reaches recall@10 %.3f", self.path, name, value, reached)
        self._save_settings({meta_key: str(value), "calibrated_recall": f"{reached:.4f}"})
        return {name: str(value), "calibrated_recall": f"{reached:.4f}"}

    def optimize(self, index: str | None = None, refine: int | None = None, **deprecated: Any) -> None:
        """Rebuild the index (the planned one for an auto store), recalibrate its breadth, and commit.

        ``index`` (see the class) replaces the store's index for good, as ``refine`` replaces its refinement.
        """
        index = pick("index", index, renamed_options("FaissStore.optimize", deprecated, ("factory",)))
        if refine is not None:
            self.refine = check_count("refine", refine, 0) or 0
            self._begin()
            self._conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('refine', ?)", (str(self.refine),))
        factory = None if index is None else _checked_factory(_factory_of(index), self.dim)
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
        inner = _inner(self._index)
        if isinstance(inner, faiss.IndexHNSW):
            m = inner.hnsw.nb_neighbors(1)  # type: ignore[attr-defined]  # exists at run time, missing from the stubs
            info.update(hnsw_m=m, ef=self.ef)
        if self.refine and not self.is_exact:
            info["refine"] = self.refine
        if "calibrated_recall" in meta and not self.is_exact:
            info["calibrated_recall_at_10"] = float(meta["calibrated_recall"])
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

    def _rows(self, keys: list[int], with_text: bool = True) -> dict[int, tuple[str, str | None, str]]:
        """``key -> (id, text, metadata JSON)`` of the given distinct keys: one SELECT per 900 keys, by rowid."""
        rows = {}
        for part in _chunks(keys):
            for key, id_, text, metadata in self._db.execute(_ROWS_SQL[with_text][len(part)], part):
                rows[key] = (id_, text, metadata)
        return rows

    def _hits(self, keys: np.ndarray, scores: np.ndarray, with_text: bool = True) -> list[list[Hit]]:
        """One list of hits per row of faiss results; a key of -1 (no result) is skipped. Each stored row is
        read once; every hit parses its own metadata dict."""
        key_rows, score_rows = keys.tolist(), scores.tolist()
        if len(key_rows) == 1:  # a single query: its keys are distinct
            wanted = [key for key in key_rows[0] if key >= 0]
        else:
            wanted = list({key for row in key_rows for key in row if key >= 0})
        rows = self._rows(wanted, with_text)
        out = []
        for key_row, score_row in zip(key_rows, score_rows):
            hits = []
            for key, score in zip(key_row, score_row):
                if key >= 0:
                    id_, text, metadata = rows[key]
                    hits.append(Hit(id_, score, text, _load_metadata(metadata)))
            out.append(hits)
        return out

    def _filtered_keys(self, where: Mapping[str, Any]) -> np.ndarray:
        sql, params = to_sqlite(where)
        rows = self._conn.execute(f"SELECT key FROM items WHERE {sql}", params).fetchall()
        return np.array([r[0] for r in rows], dtype=np.int64)

    def search(self, queries: Any, k: int, where: Mapping[str, Any] | None = None, with_text: bool = True) -> list[list[Hit]]:
        """The ``k`` best hits of each query (higher score is closer), among rows matching ``where``."""
        q = as_vectors(queries, self.dim, "queries")
        k = check_k(k)
        if self.metric == "cosine":
            q = q.copy()  # normalised in place: never the caller's array
            faiss.normalize_L2(q)
        if where:
            keys = self._filtered_keys(where)
            if len(keys) == 0:
                return [[] for _ in range(len(q))]
            if not self.is_exact and len(keys) <= self.exact_filter_limit:
                return self._exact_search(q, k, keys, with_text)
            distances, labels = self._refined(q, k, lambda fetch: self._selector_search(q, fetch, keys))
        else:
            distances, labels = self._refined(q, k, lambda fetch: self._unfiltered_search(q, fetch))
        scores = -distances if self.metric == "l2" else distances
        return self._hits(labels, scores, with_text)

    def lexical_search(
        self, texts: Sequence[str], k: int, where: Mapping[str, Any] | None = None, with_text: bool = True
    ) -> list[list[Hit]]:
        """The ``k`` best rows of each query text by FTS5's ``bm25()`` (negated: higher is better),
        among rows matching ``where``. A store without the lexical index gets it built first. Outside a write
        transaction an unfiltered query whose terms repeat is answered from their scores kept in memory
        (:mod:`.fts5_terms`): the same rows and scores, without FTS5 scoring every match again."""
        k = check_k(k)
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of query strings, not a single string")
        if not self.has_lexical_index:
            self.build_lexical_index()
        condition, params = "", []  # type: str, list[Any]
        if where:
            sql, params = to_sqlite(where)
            condition = f" AND rowid IN (SELECT key FROM items WHERE {sql})"
        query = f"SELECT rowid, -bm25(items_fts) FROM items_fts WHERE items_fts MATCH ?{condition} ORDER BY rank, rowid LIMIT ?"
        out = []
        db = self._db
        for text in texts:
            terms = query_terms(text)
            cached = self._term_scores.top(db, terms, k) if terms and not where and db is self._reader else None
            if cached is not None:
                keys, scores = cached
            else:
                found = db.execute(query, [fts5_match(terms), *params, k]).fetchall() if terms else []
                keys = np.array([key for key, _ in found], dtype=np.int64)
                scores = np.array([score for _, score in found], dtype=np.float64)
            out.append(self._hits(keys.reshape(1, -1), scores.reshape(1, -1), with_text)[0])
        return out

    def lexical_scores(self, texts: Sequence[str], ids: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """Each query text's ``-bm25()`` of each of its ids (0 for a row sharing no term): the FTS5 query
        restricted to those rows, with the whole index's statistics (or, as in ``lexical_search``, the sum
        of the terms' scores kept in memory)."""
        if not self.has_lexical_index:
            self.build_lexical_index()
        out = []
        db = self._db
        for text, wanted in zip(texts, ids):
            keys = self._keys(list(wanted))
            scores = dict.fromkeys(wanted, 0.0)
            terms = query_terms(text)
            cached = (
                self._term_scores.of(db, terms, np.array(list(keys.values()))) if terms and keys and db is self._reader else None
            )
            if cached is not None:
                scores.update(zip(keys, cached.tolist()))
            elif terms and keys:
                id_of = {key: id_ for id_, key in keys.items()}
                for part in _chunks(list(id_of)):
                    # ``+rowid``: one full-text query filtered by SQLite, not one per rowid (4x slower at 200 rows)
                    sql = f"SELECT rowid, -bm25(items_fts) FROM items_fts WHERE items_fts MATCH ? AND +rowid IN ({','.join('?' * len(part))})"
                    for key, score in self._db.execute(sql, [fts5_match(terms), *part]):
                        scores[id_of[key]] = score
            out.append(np.array([scores[i] for i in wanted], dtype=np.float64))
        return out

    def _exact_search(self, q: np.ndarray, k: int, keys: np.ndarray, with_text: bool) -> list[list[Hit]]:
        found_keys, vectors = [], []
        for part in _chunks(np.sort(keys).tolist()):
            for kk, vv in self._iter_vectors(f"key IN ({','.join('?' * len(part))})", part):
                found_keys.append(kk)
                vectors.append(vv)
        all_keys = np.concatenate(found_keys)
        scores = exact_scores(q, np.concatenate(vectors), self.metric)
        best = top_k(scores, k)
        rows = np.arange(len(q))[:, None]
        return self._hits(all_keys[best], scores[rows, best], with_text)

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
        for part in _chunks(wanted.tolist()):
            for keys, vectors in self._iter_vectors(f"key IN ({','.join('?' * len(part))})", part):
                stored[np.searchsorted(wanted, keys)] = vectors
        better = np.empty(labels.shape, dtype=np.float32)  # exact scores, higher is better
        for start in range(0, len(q), _REFINE_QUERIES):
            block = slice(start, start + _REFINE_QUERIES)
            candidates = stored[np.searchsorted(wanted, np.maximum(labels[block], 0))]  # (queries, refine * k, dim)
            if self.metric == "l2":
                difference = candidates - q[block, None, :]
                better[block] = -np.einsum("qcd,qcd->qc", difference, difference)
            else:
                better[block] = np.einsum("qcd,qd->qc", candidates, q[block])
        better[labels < 0] = -np.inf
        best = np.argsort(-better, axis=1, kind="stable")[:, :k]
        rows = np.arange(len(q))[:, None]
        out_labels = np.where(np.isfinite(better[rows, best]), labels[rows, best], -1)
        out_scores = (-better if self.metric == "l2" else better)[rows, best].astype(np.float32)
        return out_scores, out_labels

    def _selector_search(self, q: np.ndarray, k: int, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        selector = faiss.IDSelectorBatch(keys)
        try:
            return self._index.search(q, k, params=self._search_params(selector))
        except (RuntimeError, _SelectorUnsupported):  # no selector for this index: over-fetch and filter
            logger.debug("%s does not take an ID selector; over-fetching", type(_inner(self._index)).__name__)
        allowed = set(keys.tolist())
        fetch = k
        while True:
            fetch = min(fetch * 4, self._index.ntotal)
            distances, labels = self._index.search(q, fetch, params=self._search_params(None))
            keep = np.isin(labels, keys)
            if fetch >= self._index.ntotal or (keep.sum(axis=1) >= min(k, len(allowed))).all():
                break
        out_d = np.full((len(q), k), np.nan, dtype=np.float32)
        out_l = np.full((len(q), k), -1, dtype=np.int64)
        for row in range(len(q)):
            row_d, row_l = distances[row][keep[row]][:k], labels[row][keep[row]][:k]
            out_d[row, : len(row_d)], out_l[row, : len(row_l)] = row_d, row_l
        return out_d, out_l

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

    def get(self, ids: Sequence[str]) -> list[Hit | None]:
        """The stored row of each id (score ``nan``), or ``None``."""
        wanted = as_ids(ids)
        keys = self._keys(wanted)
        hits = self._hits(np.array([list(keys.values())], dtype=np.int64), np.full((1, len(keys)), np.nan))[0]
        by_id = {hit.id: hit for hit in hits}
        return [by_id.get(i) for i in wanted]

    def contains(self, ids: Iterable[str]) -> set[str]:
        """The subset of ``ids`` that is stored."""
        return set(self._keys(as_ids(ids)))

    def ids(self, where: Mapping[str, Any] | None = None) -> list[str]:
        """All stored ids (those whose metadata matches ``where``), in insertion order."""
        sql, params = to_sqlite(where) if where else ("1", [])
        return [r[0] for r in self._conn.execute(f"SELECT id FROM items WHERE {sql} ORDER BY key", params)]

    def vectors(self, ids: Sequence[str]) -> np.ndarray:
        """The stored vectors of ``ids`` (normalised for the cosine metric); KeyError names an unknown id."""
        wanted = as_ids(ids)
        keys = self._keys(wanted)
        missing = [i for i in wanted if i not in keys]
        if missing:
            raise KeyError(f"id {missing[0]!r} is not stored in {self.path}")
        found: dict[int, np.ndarray] = {}
        values = list(keys.values())
        for part in _chunks(values):
            for kk, vv in self._iter_vectors(f"key IN ({','.join('?' * len(part))})", part):
                found.update(zip(kk.tolist(), vv))
        return np.stack([found[keys[i]] for i in wanted]) if wanted else np.empty((0, self.dim), np.float32)


def _factory_of(index: str) -> str:
    """The faiss index_factory string of a shared ``index`` value ("flat" is faiss's "Flat")."""
    return "Flat" if index == FLAT else index


def _checked_factory(factory: str, dim: int) -> str:
    """``factory`` ("auto" or an index_factory string faiss can build), or a ValueError naming it."""
    if factory != AUTO:
        try:
            faiss.index_factory(dim, factory)
        except RuntimeError as error:
            raise ValueError(
                f"invalid index {factory!r}: neither auto, flat nor a faiss index_factory string ({error})"
            ) from error
    return factory


def _process_alive(pid: str) -> bool:
    """Whether ``pid`` (as written in a temporary file's name) is a running process."""
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:  # it exists, owned by someone else
        return True
    return True


def _create_db(db_path: Path, settings: dict[str, str]) -> None:
    """Write an empty store database under a temporary name, then rename it into place."""
    tmp = db_path.with_name(db_path.name + ".new")
    for leftover in (tmp, *(tmp.with_name(tmp.name + suffix) for suffix in ("-journal", "-wal", "-shm"))):
        leftover.unlink(missing_ok=True)  # a journal left by a killed creation must not replay into the new file
    conn = sqlite3.connect(tmp)
    try:
        conn.executescript(_SCHEMA)
        conn.execute(_FTS_SCHEMA)
        conn.execute(_FIELDS_SCHEMA)
        rows = {"format": "isotrope.faiss", "format_version": str(FORMAT_VERSION), **settings}
        conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", rows.items())
        conn.commit()
    finally:
        conn.close()
    os.replace(tmp, db_path)
    _fsync_dir(db_path.parent)


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_READ_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _read_index(path: Path, mmap: bool) -> tuple[faiss.Index, bool]:
    """The index file, memory-mapped (read-only) if asked and faiss can, else read into memory; and whether it is mapped."""
    if mmap:
        try:
            return faiss.read_index(str(path), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY), True
        except RuntimeError:
            logger.info("%s cannot be memory-mapped; reading it", path)
    return faiss.read_index(str(path)), False


def _fsync_dir(path: Path) -> None:
    """Make a rename durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
