"""An embedded LanceDB table as a vector store (no server), read and written through pylance alone: the
table is LanceDB's (``<path>/<table>.lance``, which LanceDB lists and opens), but ``lancedb`` is imported
only to find a table at an object-storage URI (its native library is a second copy of the Lance engine:
130 MB of a 1,526-chunk ingestion's 1.3 GB peak, and 1.4 s of a cold search).

Table columns::

    id          string, unique (upserts merge on it)
    text        string
    terms       string: the text analyzed by isotrope.lexical, under LanceDB's native full-text
                index (whitespace tokenizer, nothing else), for lexical and hybrid search
    metadata    lance.json (JSONB): filtered in Lance SQL by isotrope.stores.filters.to_lance
    vector      fixed_size_list<float32>[dim]
    raw_vector  fixed_size_list<float32>[raw_dim], optional: the pre-shaping vector, so the shaping
                can be refitted (iter_raw) and the vectors rewritten (update_vectors) without the backbone

The metric and the store's properties live in the table's schema metadata (keys ``isotrope.*``),
as does the set of metadata field names (filters naming another field are refused without a
scan), stamped with the rows it describes (each fragment and its deleted rows): a set written
before a later write (a process killed before ``commit()``) is not trusted, and the metadata
column is scanned once. Every Lance write (add, delete, property update) commits a new table
version atomically, so a process killed mid-write leaves the previous version readable, and
``commit()`` has no data to flush: it brings the full-text index up to date (new rows added to
it; rebuilt after deletes or updates, so BM25 statistics stay exact; rebuilt by the next
writer's commit when a writer was killed before its own), saves the BM25 statistics hybrid search
scores its dense candidates with (``<table>.bm25`` beside the table: :mod:`.lance_bm25`), creates
the ANN index once the table is large enough and, for a local indexed table, copies each new fragment's
``vector`` and ``terms`` into ``<table>.copies/`` (:mod:`.lance_copies`), where hybrid search reads its
candidates' vectors and terms. Between a write and its commit the new rows are still
found by full-text search (LanceDB scans unindexed rows), with statistics of the previous commit.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa

from isotrope.fusion import Candidates, KeyedVectors, run_beside
from isotrope.lexical import index_text
from isotrope.stores import index_plan
from isotrope.stores.base import (
    DEFAULT_METRIC,
    Hit,
    ReshapableStore,
    StoreFormatError,
    as_ids,
    as_vectors,
    check_batch,
    check_k,
    check_metric,
    check_properties,
)
from isotrope.stores.filters import to_lance
from isotrope.stores.options import AUTO, FLAT, check_count, pick, renamed_attribute, renamed_options
from isotrope.stores.rows import chunks, dumps_metadata

from .lance_copies import FragmentCopies
from .lance_exact import HeldVectors
from .lance_index import INDEX_TYPES, LANCE_DISTANCE, META_EF, META_INDEX, META_NPROBES, LanceVectorIndex
from .lance_lexical import TERMS, LanceLexicalIndex
from .lance_rows import ID_CHUNK, PROPERTY, id_filter, read_args, to_numpy, top_rows, vector_array

logger = logging.getLogger(__name__)

FORMAT_VERSION = "1"
_META_FORMAT = "isotrope.format_version"
_META_METRIC = "isotrope.metric"
#: rows at which the ANN index is built by default
_THRESHOLD = 50_000
#: the index whose distances hybrid search's dense candidates keep unrefined (8-bit scalar codes; "ip" and
#: "l2" only: unrefined, its cosine distance is the squared distance of the normalized vectors, twice 1 - cos)
_SQ_INDEX = "IvfHnswSq"


def _is_uri(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is an object-storage URI (``scheme://...``) rather than a local path."""
    scheme, sep, _ = str(path).partition("://")
    return bool(sep) and scheme.isalnum() and len(scheme) > 1


def _table_names(db: Any) -> list[str]:
    names: list[str] = []
    token = None
    while True:
        page = db.list_tables(page_token=token)
        names.extend(page.tables)
        token = page.page_token
        if not token:
            return names


class LanceDBStore(LanceVectorIndex, LanceLexicalIndex, ReshapableStore):
    """A LanceDB table with upsert, delete, prefiltered vector search and lexical (BM25) search.

    Parameters
    ----------
    path: the LanceDB database directory, or an object-storage URI (``s3://bucket/prefix``, ``gs://``,
        ``az://``: opened by Lance; credentials and endpoint from ``storage_options`` or the
        environment, e.g. ``AWS_ENDPOINT``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``).
    table: the table name.
    dim: vector dimension; required for a new table, checked against an existing one.
    table: the table name.
    raw_dim: dimension of the optional ``raw_vector`` column (new tables only; None: no column).

    The shared store options (:mod:`isotrope.stores.options`), mapped to LanceDB here:

    metric: "ip" (default for a new table; LanceDB's "dot"), "cosine" or "l2"; read from an existing table.
    index: the ANN index built automatically: "ivf_pq", "hnsw_sq", "flat" (none: exact search) or "auto"
        (exact below :data:`index_plan.EXACT_BELOW` rows, then IVF_HNSW_SQ sized from the count and rebuilt
        as the table grows, ef calibrated: :mod:`isotrope.stores.index_plan`); default: the one the table
        was created with, else "ivf_pq". Given for an existing table, it replaces the recorded one.
    threshold: rows at which the ANN index is built (default 50,000; "auto": the plan's size).
    nprobe / refine / ef: search-time settings used once an ANN index exists (LanceDB's ``nprobes``,
        ``refine_factor``, ``ef``; default nprobe: the calibrated one of an auto IVF_PQ index, every
        partition of an auto IVF_HNSW_SQ one, else 20; ef: the calibrated one, searched as at least k x
        refine; refine 2 for an IVF_HNSW_SQ index, else 10).
        ``refine`` re-ranks that many times k candidates by exact distance; a search without text (hybrid's
        candidate lists) re-ranks ``max(1, refine * 10 // k)`` times k: at 200 candidates, 200 rows, not 2,000
        (none for an IVF_HNSW_SQ index with the ip or l2 metric: hybrid search keeps its 8-bit distances).
    storage_options: LanceDB's object-store settings for a URI (e.g. ``{"aws_endpoint": ...,
        "allow_http": "true"}`` for an S3-compatible server).
    """

    #: a vector and a full-text query may run at the same time (hybrid search does)
    concurrent_queries = True
    #: add(new_ids=True) appends instead of merging on id
    appends_new_ids = True

    nprobes = renamed_attribute("nprobe")
    refine_factor = renamed_attribute("refine")
    index_type = renamed_attribute("index")
    index_threshold = renamed_attribute("threshold")

    def __init__(
        self,
        path: str | os.PathLike[str],
        dim: int | None = None,
        *,
        table: str = "chunks",
        metric: str | None = None,
        index: str | None = None,
        nprobe: int | None = None,
        ef: int | None = None,
        refine: int | None = None,
        threshold: int | None = None,
        raw_dim: int | None = None,
        storage_options: dict[str, str] | None = None,
        **deprecated: Any,
    ) -> None:
        never = "index_threshold" in deprecated and deprecated["index_threshold"] is None  # its old "no index"
        renamed = renamed_options("LanceDBStore", deprecated, ("index_type", "nprobes", "refine_factor", "index_threshold"))
        index, nprobe, refine, threshold = (
            pick(name, value, renamed)
            for name, value in (("index", index), ("nprobe", nprobe), ("refine", refine), ("threshold", threshold))
        )
        if index is not None:
            self.check_index(index)
        #: a local directory, or the object-storage URI as given (a Path would fold its "//")
        self.path: Path | str = str(path) if _is_uri(path) else Path(path)
        self.table_name = table
        #: rows at which the ANN index is built (None: never)
        self.threshold: int | None = None if never else check_count("threshold", threshold) or _THRESHOLD
        self.refine = None if refine is None else check_count("refine", refine, 0)  # None: by the index type
        self.ef = check_count("ef", ef)
        self._vector_index = False  # the cached vector_index; False: not looked up yet
        self._lexical_state = None  # since this process's first write: exact / appended / stale
        self._bm25_stats = (-1, None)  # the BM25 statistics hybrid search scores its dense candidates with
        self._fields = None  # the metadata field names (None: not read yet)
        self._fields_exact = True  # False after deletes and updates: a superset until rescanned
        self._deferring = False  # inside deferred_index(): commits build no ANN index
        self._compaction_due = False  # an index was built: the next commit merges the table's fragments
        self._row_ids: dict[str, int] = {}  # id -> Lance row id, from reads of table version _row_ids_version
        self._row_ids_version = -1
        self._lance = None  # the pylance dataset reads go through (see _dataset)
        self._storage_options = storage_options
        self._db = None  # LanceDB's connection: only to find a table at a URI, and for lancedb_table()
        self._writer = None  # the pylance dataset writes go through (see _writable)
        if isinstance(self.path, Path) and self.path.exists() and not self.path.is_dir():
            raise StoreFormatError(f"{self.path} is a file, not a LanceDB directory")
        if self._exists():
            self._check_existing(dim, metric, raw_dim)
        else:
            self._writer = self._create(dim, metric, raw_dim)
        schema = self._schema
        self.dim = schema.field("vector").type.list_size
        self.raw_dim = schema.field("raw_vector").type.list_size if "raw_vector" in schema.names else None
        #: whether ``add`` takes ``raw_vectors`` (the table has a ``raw_vector`` column)
        self.stores_raw_vectors = self.raw_dim is not None
        self.metric = schema.metadata[_META_METRIC.encode()].decode()
        self._held = HeldVectors(self.metric)  # a small table's vectors, for exact search without a scan
        #: copies of the columns hybrid search reads, per fragment, beside a local table
        self._copies = None if isinstance(self.path, str) else FragmentCopies(self._table_uri(), self.dim)
        stored = {k.decode(): v.decode() for k, v in (schema.metadata or {}).items()}
        #: the index asked for: auto, flat, ivf_pq or hnsw_sq
        self.index = index or stored.get(META_INDEX, "ivf_pq")
        if self.index == AUTO:
            self.threshold = index_plan.EXACT_BELOW
        elif self.index == FLAT:
            self.threshold = None
        if index is not None and stored.get(META_INDEX, "ivf_pq") != index:
            self._set_meta({META_INDEX: index})
        self.nprobe = check_count("nprobe", nprobe) or int(stored.get(META_NPROBES, 20))
        self.ef = self.ef or (int(stored[META_EF]) if META_EF in stored else None)
        self._indexed_rows = 0

    @staticmethod
    def check_index(index: str) -> None:
        """Refuse an ``index`` this store cannot build."""
        if index not in (AUTO, FLAT, *INDEX_TYPES):
            raise ValueError(f"unknown index {index!r}; expected one of {', '.join([AUTO, FLAT, *INDEX_TYPES])}")

    # ------------------------------------------------------------------ opening

    def _exists(self) -> bool:
        """Whether the table exists: a local one is looked for on disk (no ``import lancedb``), a URI's asked of LanceDB."""
        if isinstance(self.path, Path):
            return (self.path / f"{self.table_name}.lance" / "_versions").is_dir()
        import lancedb

        self._db = lancedb.connect(self.path, storage_options=self._storage_options)
        return self.table_name in _table_names(self._db)

    def _create(self, dim: int | None, metric: str | None, raw_dim: int | None) -> Any:
        if isinstance(self.path, Path) and self.path.is_dir() and any(self.path.iterdir()) and not any(self.path.glob("*.lance")):
            raise StoreFormatError(f"{self.path} is not empty and holds no Lance tables: not a LanceDB directory")
        if dim is None:
            raise ValueError(f"creating table {self.table_name!r} in {self.path} needs dim")
        for name, value in (("dim", dim), ("raw_dim", raw_dim)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1):
                raise ValueError(f"{name} must be a positive integer; got {value!r}")
        fields = [
            pa.field("id", pa.string(), nullable=False),
            pa.field("text", pa.string()),
            pa.field(TERMS, pa.string()),
            pa.field("metadata", pa.json_(pa.utf8())),
            pa.field("vector", pa.list_(pa.float32(), int(dim))),
        ]
        if raw_dim is not None:
            fields.append(pa.field("raw_vector", pa.list_(pa.float32(), int(raw_dim))))
        metadata = {_META_FORMAT: FORMAT_VERSION, _META_METRIC: check_metric(metric or DEFAULT_METRIC)}
        schema = pa.schema(fields, metadata=metadata)
        uri, options = self._table_uri(), self._storage_options
        return lance.write_dataset(schema.empty_table(), uri, schema=schema, mode="create", storage_options=options)

    def _check_existing(self, dim: int | None, metric: str | None, raw_dim: int | None) -> None:
        schema = self._schema
        where = f"table {self.table_name!r} in {self.path}"
        meta = schema.metadata or {}
        if meta.get(_META_FORMAT.encode()) != FORMAT_VERSION.encode():
            raise StoreFormatError(f"{where} was not written by LanceDBStore format {FORMAT_VERSION}")
        for name in ("id", "text", "metadata", "vector"):
            if name not in schema.names:
                raise StoreFormatError(f"{where} has no {name!r} column (columns: {schema.names})")
        vector_type = schema.field("vector").type
        if not pa.types.is_fixed_size_list(vector_type) or vector_type.value_type != pa.float32():
            raise StoreFormatError(f"{where}: column 'vector' must be fixed_size_list<float32>; got {vector_type}")
        stored = {
            "dim": vector_type.list_size,
            "metric": meta[_META_METRIC.encode()].decode(),
            "raw_dim": schema.field("raw_vector").type.list_size if "raw_vector" in schema.names else None,
        }
        given = {"dim": dim, "metric": None if metric is None else check_metric(metric), "raw_dim": raw_dim}
        for name, value in given.items():
            if value is not None and value != stored[name]:
                raise StoreFormatError(f"{where} has {name}={stored[name]}; got {name}={value}")

    # ------------------------------------------------------------------ writing

    def add(
        self,
        ids: Sequence[str],
        vectors: Any,
        texts: Sequence[str | None] | None = None,
        metadata: Sequence[Mapping[str, Any] | None] | None = None,
        raw_vectors: Any = None,
        *,
        new_ids: bool = False,
    ) -> None:
        """Upsert a batch in one ``merge_insert`` on id (one new table version).

        ``raw_vectors`` fills the ``raw_vector`` column (the table must have been created with
        ``raw_dim``); rows added without one have a null raw vector. ``new_ids``: the caller knows
        none of the ids is stored (e.g. ingestion, which read the stored ids first), so the batch is
        appended: a ``merge_insert`` joins the batch against the whole id column, O(n) per batch.
        An empty table is always appended to.
        """
        batch = check_batch(ids, vectors, texts, metadata, self.dim)
        if not batch.ids:
            return
        self._ensure_terms_column()
        self._note_write()
        columns: dict[str, pa.Array] = {
            "id": pa.array(batch.ids, pa.string()),
            "text": pa.array(batch.texts, pa.string()),
            TERMS: pa.array([index_text(text) for text in batch.texts], pa.string()),
            "metadata": pa.array([dumps_metadata(m) for m in batch.metadata], pa.json_(pa.utf8())),
            "vector": vector_array(batch.vectors),
        }
        if raw_vectors is not None:
            if self.raw_dim is None:
                raise ValueError(f"table {self.table_name!r} has no raw_vector column (create it with raw_dim)")
            raw = as_vectors(raw_vectors, self.raw_dim, "raw_vectors")
            if len(raw) != len(batch.ids):
                raise ValueError(f"got {len(batch.ids)} ids but {len(raw)} raw vectors")
            columns["raw_vector"] = vector_array(raw)
        elif self.raw_dim is not None:
            columns["raw_vector"] = pa.nulls(len(batch.ids), pa.list_(pa.float32(), self.raw_dim))
        fields = self._known_fields()  # before the write: while the saved set describes the table
        appended = new_ids or len(self) == 0
        table = self._as_rows(columns)
        if appended:
            self._writable().insert(table)
        else:
            result = self._writable().merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(table)
            if result.get("num_updated_rows", 1) or result.get("num_deleted_rows", 0):
                self._lexical_state = "stale"
                self._fields_exact = False  # the replaced rows' fields may have gone
        fields.update(name for meta in batch.metadata for name in meta)
        self._maybe_index()

    def _as_rows(self, columns: Mapping[str, pa.Array]) -> pa.Table:
        """Columns as a table whose fields are nullable as the table's are (pylance appends and merges
        only a batch whose schema matches)."""
        schema = self._schema
        fields = [pa.field(name, array.type, schema.field(name).nullable) for name, array in columns.items()]
        return pa.Table.from_arrays(list(columns.values()), schema=pa.schema(fields))

    def update_vectors(self, ids: Sequence[str], vectors: Any) -> None:
        """Replace the (shaped) vectors of stored ids, leaving text, metadata and raw vectors as they are."""
        wanted = as_ids(ids)
        array = as_vectors(vectors, self.dim)
        if len(array) != len(wanted):
            raise ValueError(f"got {len(wanted)} ids but {len(array)} vectors")
        missing = set(wanted) - self.contains(wanted)
        if missing:
            raise KeyError(f"id {sorted(missing)[0]!r} is not stored in table {self.table_name!r}")
        if len(set(wanted)) != len(wanted):
            raise ValueError("update_vectors got the same id more than once")
        data = self._as_rows({"id": pa.array(wanted, pa.string()), "vector": vector_array(array)})
        self._note_write(stale=True)
        self._writable().merge_insert("id").when_matched_update_all().execute(data)

    def rewrite_vectors(self, batches: Iterable[tuple[Sequence[str], Any]]) -> None:
        """Replace the vectors of stored ids from a stream of ``(ids, vectors)`` batches in ONE table version.

        Memory stays bounded (batches are streamed into a single merge-insert), and a crash
        leaves either all old or all new vectors.
        """
        empty = {"id": pa.array([], pa.string()), "vector": vector_array(np.empty((0, self.dim), np.float32))}
        schema = self._as_rows(empty).schema

        def record_batches() -> Iterator[pa.RecordBatch]:
            for ids, vectors in batches:
                array = as_vectors(vectors, self.dim)
                yield pa.RecordBatch.from_arrays([pa.array(as_ids(ids), pa.string()), vector_array(array)], schema=schema)

        reader = pa.RecordBatchReader.from_batches(schema, record_batches())
        self._note_write(stale=True)
        self._writable().merge_insert("id").when_matched_update_all().execute(reader)

    def restore(self, version: int) -> None:
        """Make ``version`` the latest again (a new version with its content)."""
        restored = self._open(version, self._writable().session())
        restored.restore()
        self._writer = restored
        self._vector_index = False
        self._lexical_state = "stale"
        self._fields = None

    def delete(self, ids: Iterable[str]) -> None:
        """Remove the given ids; unknown ids are ignored."""
        wanted = as_ids(ids)
        if wanted:
            self._note_write(stale=True)
            self._known_fields()
            self._fields_exact = False
        for part in chunks(wanted, ID_CHUNK):
            self._writable().delete(id_filter(part))

    def set_properties(self, **kv: str) -> None:
        """Store string properties in the table's schema metadata (a new table version)."""
        props = check_properties(kv)
        if props:
            self._set_meta({PROPERTY + k: v for k, v in props.items()})
            self._vector_index = False

    def commit(self) -> None:
        """Every write is already a committed Lance version; bring the full-text index up to date (also
        when a writer was interrupted before it did), build the ANN index if it is now due and, after an
        index build, merge the table's fragments. Inside :meth:`deferred_index` (a bulk load) neither index
        is touched: the commit after it brings both up to date once (full-text search meanwhile reads the
        rows its index lacks unindexed, as after an interrupted writer)."""
        self._maybe_index()
        if self._lexical_state is None and len(self) and not self._lexical_exact():
            self._lexical_state = "stale"  # left behind by a writer interrupted before its commit
        if self._lexical_state not in (None, "exact") and not self._deferring:
            self._refresh_lexical_index()
        self._save_fields()
        if self._compaction_due and not self._deferring:
            self._compact()
        if not self._deferring:
            self._sync_copies()
        # Arrow's allocator (mimalloc) keeps what the batches and the BM25 statistics freed; given back here,
        # it is not held through what follows (an ingestion's default search: 20 to 50 MB of its peak)
        pa.default_memory_pool().release_unused()

    def optimize(self) -> None:
        """:meth:`LanceVectorIndex.optimize`, then the fragments' copies of the compacted table."""
        super().optimize()
        self._sync_copies()

    def _sync_copies(self) -> None:
        """Bring the fragments' copies of what hybrid search reads up to date (:mod:`.lance_copies`): a local
        table with an ANN index and a ``terms`` column only (a small table's takes cost little)."""
        if self._copies is not None and self.vector_index is not None and TERMS in self._schema.names:
            self._copies.sync(self._dataset())

    def close(self) -> None:
        """Drop the table handles (nothing is ever left uncommitted)."""
        self._writer = None
        self._db = None
        self._lance = None
        self._held = HeldVectors(self.metric)

    # ------------------------------------------------------------------ indexes

    # ------------------------------------------------------------------ the lexical index

    # ------------------------------------------------------------------ reading

    def _scores(self, distances: np.ndarray) -> np.ndarray:
        # LanceDB distances: cosine 1 - cos, dot 1 - x.y, l2 the squared distance
        return -distances if self.metric == "l2" else 1.0 - distances

    def _index_settings(self, k: int, with_text: bool, refine: bool = True) -> dict[str, int]:
        """The ANN search breadth of a ``k``-hit query (none without an index); without ``refine``, the
        index's own (approximate) top ``k``."""
        if self.vector_index is None:
            return {}
        settings = {"nprobes": self.nprobe}
        if refine and self.refine:
            # candidate lists (no text) re-rank as many rows as a 10-hit search does, at least their own k
            settings["refine_factor"] = self.refine if with_text else max(1, self.refine * 10 // k)
        if self.ef:  # an HNSW search finds at least the candidates it hands the refinement (Lance requires it)
            settings["ef"] = max(self.ef, k * settings.get("refine_factor", 1))
        return settings

    def _nearest(
        self,
        dataset: Any,
        query: np.ndarray,
        k: int,
        condition: str | None,
        columns: list[str],
        with_text: bool,
        refine: bool = True,
    ) -> pa.Table:
        """One query's ``k`` nearest rows with their ``_rowid``, closest first, ties by row id: from the vectors
        held in memory when the table has no ANN index and no filter applies (:mod:`.lance_exact`), else through
        pylance's scanner (:func:`.lance_rows.top_rows`; without ``refine``: an index's own top ``k`` and
        approximate distances)."""
        held = None if condition or self.vector_index is not None else self._held.nearest(dataset, query, k)
        if held is not None:
            rows, distances = held
            wanted = [column for column in columns if column != "_distance"]
            taken = dataset._take_rows(rows.tolist(), columns=wanted) if wanted and len(rows) else None
            found = {name: taken.column(name) if taken else pa.array([], pa.string()) for name in wanted}
            found["_distance"] = pa.array(distances, pa.float32())
            found["_rowid"] = pa.array(rows, pa.uint64())
            return pa.table(found)

        def nearest(limit: int) -> pa.Table:
            settings = self._index_settings(limit, with_text, refine)
            asked = {"column": "vector", "q": query, "k": limit, "metric": LANCE_DISTANCE[self.metric], **settings}
            return dataset.scanner(**read_args(columns, condition, True), nearest=asked).to_table()

        return top_rows(nearest, k, "_distance", descending=False)

    def hybrid_candidates(
        self,
        texts: Sequence[str],
        queries: Any,
        depth: int,
        keywords: int,
        where: Mapping[str, Any] | None,
        complete: bool,
    ) -> Candidates:
        """Hybrid search's candidates named by Lance row id, all read from one version of the table: the
        keyword top ``keywords`` (row ids and BM25) in a second thread while this one finds the dense top
        ``depth``; then (``complete``) each side reads at once what fusion needs of its own rows, less those
        the other side has listed if it is done: the keyword side their stored vectors, the dense side their
        BM25 from their terms (:meth:`_rows_bm25`), both from the fragments' copies where they have them
        (:mod:`.lance_copies`). An IVF_HNSW_SQ index's dense list keeps the index's 8-bit distances (a
        refinement would read every candidate's vector: 2 ms of a 12 ms query at 100,000 rows) except for the
        cosine metric (:data:`_SQ_INDEX`); other indexes refine it. Only the fused top rows' id, text and
        metadata are read (:func:`isotrope.fusion.search_store`); no ``id`` column is read before that."""
        dataset, condition = self._dataset(), to_lance(where) if where else None
        stats = self._term_stats(dataset) if complete else None
        listed: dict[str, list[tuple[list[int], np.ndarray]]] = {}  # each side's lists, once it has them

        def unlisted(mine: str, theirs: str) -> list[list[int]]:
            """Each query's rows of side ``mine`` that side ``theirs`` has not listed (all, if it is not done)."""
            if theirs not in listed:
                return [rows for rows, _ in listed[mine]]
            others = (set(rows) for rows, _ in listed[theirs])
            return [[row for row in rows if row not in other] for (rows, _), other in zip(listed[mine], others)]

        def dense_side() -> tuple[list[tuple[list[int], np.ndarray]], list[dict[int, float]] | None]:
            listed["dense"] = self._dense_top(dataset, as_vectors(queries, self.dim, "queries"), depth, condition)
            if stats is None:
                return listed["dense"], None
            return listed["dense"], self._rows_bm25(dataset, stats, texts, unlisted("dense", "lexical"))

        def keyword_side() -> tuple[list[tuple[list[int], np.ndarray]], KeyedVectors]:
            listed["lexical"] = self._keyword_top(dataset, texts, keywords, condition)
            lacking = dict.fromkeys(row for rows in unlisted("lexical", "dense") for row in rows) if complete else {}
            return listed["lexical"], self._row_vectors(dataset, list(lacking))

        (dense, bm25), (lexical, vectors) = run_beside(keyword_side, dense_side)
        if not complete:
            return Candidates(dense, lexical, [], vectors, lambda rankings: self._ranked_rows(dataset, rankings))
        bm25s = self._dense_bm25(dataset, texts, [rows for rows, _ in dense], lexical, bm25)
        return Candidates(dense, lexical, bm25s, vectors, lambda rankings: self._ranked_rows(dataset, rankings))

    def _dense_top(
        self, dataset: Any, queries: np.ndarray, depth: int, condition: str | None
    ) -> list[tuple[list[int], np.ndarray]]:
        """Each query's dense top ``depth`` as Lance row ids and scores, best first."""
        refine = self.vector_index != _SQ_INDEX or self.metric == "cosine"
        dense = []
        for query in queries:
            table = self._nearest(dataset, query, depth, condition, ["_distance"], with_text=False, refine=refine)
            distances = table.column("_distance").to_numpy().astype(np.float64)
            dense.append((table.column("_rowid").to_pylist(), self._scores(distances)))
        return dense

    def _row_vectors(self, dataset: Any, rows: list[int]) -> KeyedVectors:
        """The stored vectors of Lance row ids (of ``dataset``'s version): from the fragments' copies where they have them."""
        if not rows:
            return KeyedVectors.of([], np.empty((0, self.dim), np.float32))
        copied = None if self._copies is None else self._copies.vectors(dataset, rows)
        if copied is not None:
            return KeyedVectors.of(rows, copied)
        column = dataset._take_rows(rows, columns=["vector"]).column("vector")
        return KeyedVectors.of(rows, to_numpy(column, self.dim, pa.array(rows, pa.uint64()), "vector"))

    def _ranked_rows(self, dataset: Any, rankings: list[list[tuple[Any, float]]]) -> list[list[Hit]]:
        """Rankings of Lance row ids (of ``dataset``'s version) as hits with their text and metadata."""
        wanted = list(dict.fromkeys(row for ranking in rankings for row, _ in ranking))
        if not wanted:
            return [[] for _ in rankings]
        rows = dict(zip(wanted, self._hit_rows(dataset._take_rows(wanted, columns=["id", "text", "metadata"]), True)))
        return [[Hit(rows[r][0], score, rows[r][1], rows[r][2]) for r, score in ranking] for ranking in rankings]

    def search(self, queries: Any, k: int, where: Mapping[str, Any] | None = None, with_text: bool = True) -> list[list[Hit]]:
        """The ``k`` best hits of each query (higher score is closer), prefiltered by ``where``: each query
        through pylance's scanner, all of one table version."""
        q = as_vectors(queries, self.dim, "queries")
        k = check_k(k)
        dataset, condition = self._dataset(), to_lance(where) if where else None
        columns = [*self._hit_columns(with_text), "_distance"]
        out: list[list[Hit]] = []
        for query in q:
            table = self._nearest(dataset, query, k, condition, columns, with_text)
            if not with_text:
                self._remember_rows(table)
            scores = self._scores(table.column("_distance").to_numpy().astype(np.float64)).tolist()
            out.append([Hit(i, score, text, meta) for (i, text, meta), score in zip(self._hit_rows(table, with_text), scores)])
        return out
