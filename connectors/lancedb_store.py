"""An embedded LanceDB table as a vector store (no server).

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
scan), stamped with the table version it describes: a set written before a later write (a
process killed before ``commit()``) is not trusted, and the metadata column is scanned once.
Every Lance write (add, delete, property update) commits a new table version atomically, so a
process killed mid-write leaves the previous version readable, and ``commit()`` has no data to
flush: it brings the full-text index up to date (new rows added to it; rebuilt after deletes
or updates, so BM25 statistics stay exact) and creates the ANN index once the table is large
enough. Between a write and its commit the new rows are still found by full-text search
(LanceDB scans unindexed rows), with statistics of the previous commit.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import lancedb
import numpy as np
import pyarrow as pa
from lance.query import FullTextOperator, MatchQuery
from lancedb.index import FTS, HnswSq, IvfPq

from isotrope.lexical import index_text, query_terms
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
    dumps_metadata,
)
from isotrope.stores.filters import lance_literal, to_lance
from isotrope.stores.options import AUTO, FLAT, check_count, pick, renamed_attribute, renamed_options

logger = logging.getLogger(__name__)

FORMAT_VERSION = "1"
_META_FORMAT = "isotrope.format_version"
_META_METRIC = "isotrope.metric"
_PROPERTY = "isotrope.property."
_LANCE_DISTANCE = {"ip": "dot", "cosine": "cosine", "l2": "l2"}
_INDEX_TYPES = {"ivf_pq": IvfPq, "hnsw_sq": HnswSq}
_ID_CHUNK = 1000
#: ids whose Lance row id a store remembers from its reads (then it forgets them all and starts again)
_ROW_IDS_KEPT = 100_000
_TERMS = "terms"
#: delta segments of the vector index (one per commit that adds rows to it) merged into one from this many on
_MAX_INDEX_SEGMENTS = 4
#: the table version at which the full-text index was last made exact
_META_LEXICAL = "isotrope.lexical_index_version"
#: the index asked for ("auto" or an index type) and the search breadth calibrated when it was built
_META_INDEX = "isotrope.index"
_META_NPROBES = "isotrope.nprobes"
_META_RECALL = "isotrope.calibrated_recall"
_META_PARAMS = "isotrope.index_params"
#: the metadata field names (a JSON list) and the table version they describe
_META_FIELDS = "isotrope.metadata_fields"
_META_FIELDS_VERSION = "isotrope.metadata_fields_version"
#: rows at which the ANN index is built by default, and candidates per hit re-ranked by exact distance
_THRESHOLD = 50_000
_REFINE = 10
#: the analysis is isotrope.lexical's: the index only splits the analyzed terms on spaces
_FTS_CONFIG = {
    "base_tokenizer": "whitespace",
    "lower_case": False,
    "stem": False,
    "remove_stop_words": False,
    "ascii_folding": False,
    "max_token_length": None,
    "with_position": False,
}


def _is_uri(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is an object-storage URI (``scheme://...``) rather than a local path."""
    scheme, sep, _ = str(path).partition("://")
    return bool(sep) and scheme.isalnum() and len(scheme) > 1


def _id_filter(ids: Sequence[str]) -> str:
    return f"id IN ({', '.join(lance_literal(i) for i in ids)})"


def _chunks(values: Sequence[Any], size: int = _ID_CHUNK) -> Iterator[Sequence[Any]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


def _match(terms: Sequence[str]) -> MatchQuery:
    """The full-text query OR-ing analyzed terms on the ``terms`` column."""
    return MatchQuery(" ".join(terms), _TERMS, operator=FullTextOperator.OR)


def _read_args(columns: list[str], condition: str | None, row_ids: bool) -> dict[str, Any]:
    """A pylance scanner's arguments: these columns (and ``_rowid`` with ``row_ids``), prefiltered by ``condition``."""
    return {
        "columns": columns,
        "filter": condition,
        "prefilter": True,
        "with_row_id": row_ids,
        "disable_scoring_autoprojection": True,
    }


def _vector_array(vectors: np.ndarray) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel(), type=pa.float32()), vectors.shape[1])


def _table_names(db: Any) -> list[str]:
    names: list[str] = []
    token = None
    while True:
        page = db.list_tables(page_token=token)
        names.extend(page.tables)
        token = page.page_token
        if not token:
            return names


_decode_json = json.JSONDecoder().raw_decode


def _load_metadata(value: str | bytes | None) -> dict[str, Any]:
    """A stored metadata JSON object (written compact by this store: ``raw_decode`` skips ``json.loads``'s
    whitespace passes); the common empty one is not parsed."""
    if not value or value == "{}":
        return {}
    return _decode_json(value if isinstance(value, str) else value.decode())[0]


class LanceDBStore(ReshapableStore):
    """A LanceDB table with upsert, delete, prefiltered vector search and lexical (BM25) search.

    Parameters
    ----------
    path: the LanceDB database directory, or an object-storage URI (``s3://bucket/prefix``, ``gs://``,
        ``az://``: opened by LanceDB itself; credentials and endpoint from ``storage_options`` or the
        environment, e.g. ``AWS_ENDPOINT``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``).
    table: the table name.
    dim: vector dimension; required for a new table, checked against an existing one.
    table: the table name.
    raw_dim: dimension of the optional ``raw_vector`` column (new tables only; None: no column).

    The shared store options (:mod:`isotrope.stores.options`), mapped to LanceDB here:

    metric: "ip" (default for a new table; LanceDB's "dot"), "cosine" or "l2"; read from an existing table.
    index: the ANN index built automatically: "ivf_pq", "hnsw_sq", "flat" (none: exact search) or "auto"
        (exact below :data:`index_plan.EXACT_BELOW` rows, then IVF_PQ sized from the count and rebuilt as
        the table grows, nprobe calibrated: :mod:`isotrope.stores.index_plan`); default: the one the table
        was created with, else "ivf_pq". Given for an existing table, it replaces the recorded one.
    threshold: rows at which the ANN index is built (default 50,000; "auto": the plan's size).
    nprobe / refine / ef: search-time settings used once an ANN index exists (LanceDB's ``nprobes``,
        ``refine_factor``, ``ef``; default nprobe: the calibrated one of an auto index, else 20; refine 10).
        ``refine`` re-ranks that many times k candidates by exact distance; a search without text (hybrid's
        candidate lists) re-ranks ``max(1, refine * 10 // k)`` times k: at 200 candidates, 200 rows, not 2,000.
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
        self.refine = _REFINE if refine is None else check_count("refine", refine, 0)
        self.ef = check_count("ef", ef)
        self._vector_index: str | bool | None = False  # the cached vector_index; False: not looked up yet
        self._lexical_state: str | None = None  # since this process's first write: exact / appended / stale
        self._fields: set[str] | None = None  # the metadata field names (None: not read yet)
        self._fields_exact = True  # False after deletes and updates: a superset until rescanned
        self._deferring = False  # inside deferred_index(): commits build no ANN index
        self._row_ids: dict[str, int] = {}  # id -> Lance row id, from reads of table version _row_ids_version
        self._row_ids_version = -1
        self._lance: Any = None  # the pylance dataset reads go through (see _dataset)
        if isinstance(self.path, Path) and self.path.exists() and not self.path.is_dir():
            raise StoreFormatError(f"{self.path} is a file, not a LanceDB directory")
        self._db = lancedb.connect(self.path, storage_options=storage_options)
        if table in _table_names(self._db):
            self._table = self._db.open_table(table)
            self._check_existing(dim, metric, raw_dim)
        else:
            self._table = self._create(dim, metric, raw_dim)
        schema = self._table.schema
        self.dim = schema.field("vector").type.list_size
        self.raw_dim = schema.field("raw_vector").type.list_size if "raw_vector" in schema.names else None
        #: whether ``add`` takes ``raw_vectors`` (the table has a ``raw_vector`` column)
        self.stores_raw_vectors = self.raw_dim is not None
        self.metric = schema.metadata[_META_METRIC.encode()].decode()
        stored = {k.decode(): v.decode() for k, v in (schema.metadata or {}).items()}
        #: the index asked for: auto, flat, ivf_pq or hnsw_sq
        self.index = index or stored.get(_META_INDEX, "ivf_pq")
        if self.index == AUTO:
            self.threshold = index_plan.EXACT_BELOW
        elif self.index == FLAT:
            self.threshold = None
        if index is not None and stored.get(_META_INDEX, "ivf_pq") != index:
            self._set_meta({_META_INDEX: index})
        self.nprobe = check_count("nprobe", nprobe) or int(stored.get(_META_NPROBES, 20))
        self._indexed_rows = 0

    @staticmethod
    def check_index(index: str) -> None:
        """Refuse an ``index`` this store cannot build."""
        if index not in (AUTO, FLAT, *_INDEX_TYPES):
            raise ValueError(f"unknown index {index!r}; expected one of {', '.join([AUTO, FLAT, *_INDEX_TYPES])}")

    # ------------------------------------------------------------------ opening

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
            pa.field(_TERMS, pa.string()),
            pa.field("metadata", pa.json_(pa.utf8())),
            pa.field("vector", pa.list_(pa.float32(), int(dim))),
        ]
        if raw_dim is not None:
            fields.append(pa.field("raw_vector", pa.list_(pa.float32(), int(raw_dim))))
        metadata = {_META_FORMAT: FORMAT_VERSION, _META_METRIC: check_metric(metric or DEFAULT_METRIC)}
        return self._db.create_table(self.table_name, schema=pa.schema(fields, metadata=metadata))

    def _check_existing(self, dim: int | None, metric: str | None, raw_dim: int | None) -> None:
        schema = self._table.schema
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

    def __len__(self) -> int:
        return self._table.count_rows()

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
            _TERMS: pa.array([index_text(text) for text in batch.texts], pa.string()),
            "metadata": pa.array([dumps_metadata(m) for m in batch.metadata], pa.json_(pa.utf8())),
            "vector": _vector_array(batch.vectors),
        }
        if raw_vectors is not None:
            if self.raw_dim is None:
                raise ValueError(f"table {self.table_name!r} has no raw_vector column (create it with raw_dim)")
            raw = as_vectors(raw_vectors, self.raw_dim, "raw_vectors")
            if len(raw) != len(batch.ids):
                raise ValueError(f"got {len(batch.ids)} ids but {len(raw)} raw vectors")
            columns["raw_vector"] = _vector_array(raw)
        elif self.raw_dim is not None:
            columns["raw_vector"] = pa.nulls(len(batch.ids), pa.list_(pa.float32(), self.raw_dim))
        fields = self._known_fields()  # before the write: while the saved set describes the table
        appended = new_ids or self._table.count_rows() == 0
        if appended:
            self._table.add(pa.table(columns), on_bad_vectors="null")  # vectors are validated: only null raw vectors
        else:
            result = (
                self._table.merge_insert("id")
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .execute(pa.table(columns), on_bad_vectors="null")
            )
            replaced: int = getattr(result, "num_updated_rows", 1) or getattr(result, "num_deleted_rows", 0)
            if replaced:
                self._lexical_state = "stale"
                self._fields_exact = False  # the replaced rows' fields may have gone
        fields.update(name for meta in batch.metadata for name in meta)
        self._maybe_index()

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
        data = pa.table({"id": pa.array(wanted, pa.string()), "vector": _vector_array(array)})
        self._note_write(stale=True)
        self._table.merge_insert("id").when_matched_update_all().execute(data)

    def rewrite_vectors(self, batches: Iterable[tuple[Sequence[str], Any]]) -> None:
        """Replace the vectors of stored ids from a stream of ``(ids, vectors)`` batches in ONE table version.

        Memory stays bounded (batches are streamed into a single merge-insert), and a crash
        leaves either all old or all new vectors.
        """
        schema = pa.schema([pa.field("id", pa.string()), pa.field("vector", pa.list_(pa.float32(), self.dim))])

        def record_batches() -> Iterator[pa.RecordBatch]:
            for ids, vectors in batches:
                array = as_vectors(vectors, self.dim)
                yield pa.RecordBatch.from_arrays([pa.array(as_ids(ids), pa.string()), _vector_array(array)], schema=schema)

        reader = pa.RecordBatchReader.from_batches(schema, record_batches())
        self._note_write(stale=True)
        self._table.merge_insert("id").when_matched_update_all().execute(reader)

    @property
    def version(self) -> int:
        """The table's current Lance version."""
        return int(self._table.version)

    def restore(self, version: int) -> None:
        """Make ``version`` the latest again (a new version with its content)."""
        self._table.restore(version)
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
        for part in _chunks(wanted):
            self._table.delete(_id_filter(part))

    def set_properties(self, **kv: str) -> None:
        """Store string properties in the table's schema metadata (a new table version)."""
        props = check_properties(kv)
        if props:
            self._table.to_lance().update_schema_metadata({_PROPERTY + k: v for k, v in props.items()})
            self._table.checkout_latest()
            self._vector_index = False

    @property
    def properties(self) -> dict[str, str]:
        """The persisted ``dict[str, str]`` kept in the table's schema metadata (the encoder's fingerprint, index settings)."""
        meta = self._table.schema.metadata or {}
        prefix = _PROPERTY.encode()
        return {k[len(prefix) :].decode(): v.decode() for k, v in meta.items() if k.startswith(prefix)}

    def commit(self) -> None:
        """Every write is already a committed Lance version; bring the full-text index up to date
        and build the ANN index if it is now due (not inside :meth:`deferred_index`)."""
        self._maybe_index()
        if self._lexical_state is not None and self._lexical_state != "exact":
            self._refresh_lexical_index()
        self._save_fields()

    def close(self) -> None:
        """Drop the table handle (nothing is ever left uncommitted)."""
        self._table = None
        self._db = None
        self._lance = None

    # ------------------------------------------------------------------ indexes

    @property
    def vector_index(self) -> str | None:
        """The type of the ANN index on ``vector`` (e.g. "IvfPq", "IvfHnswSq"), or None: exact search.

        Looked up once and remembered until this store changes the table's indexes or version.
        """
        if self._vector_index is False:
            found = next((i for i in self._table.list_indices() if "vector" in i.columns), None)
            self._vector_index = None if found is None else found.index_type
        return cast("str | None", self._vector_index)  # never True: only False ("not looked up") or the found type

    @contextmanager
    def deferred_index(self) -> Iterator[None]:
        """A bulk load: inside, writes and commits neither build nor rebuild nor extend the ANN index; the
        first commit after it builds the index that is due, once, over every row."""
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False

    def _maybe_index(self) -> None:
        if self.threshold is None or self._deferring:
            return
        n = len(self)
        if self.vector_index is None and n >= self.threshold:
            logger.info("table %r reached %d rows: building a %s index", self.table_name, n, self.index)
            self.create_index()
        elif (
            self.index == AUTO
            and self.vector_index is not None
            and self._indexed_rows
            and n >= index_plan.REBUILD_GROWTH * self._indexed_rows
        ):
            logger.info("table %r grew to %d rows: rebuilding its index", self.table_name, n)
            self.create_index()
        elif self.vector_index is not None:
            self._index_new_rows()

    def _index_new_rows(self) -> None:
        """Add rows written since the ANN index was built to it (no retraining): LanceDB scans rows
        outside the index by brute force, which made a 100,000-row store answer in 54 ms, not 10 ms.
        Each addition is a delta segment that every query searches too (13 of them at 100,000 rows: 11.9
        against 8.4 ms a query merged), so from ``_MAX_INDEX_SEGMENTS`` on, all are merged into one (76 ms)."""
        name = next(i.name for i in self._table.list_indices() if "vector" in i.columns)
        stats = self._table.index_stats(name)
        if stats.num_unindexed_rows:
            merge = stats.num_indices if stats.num_indices >= _MAX_INDEX_SEGMENTS else 0  # 0: a new delta
            self._table.to_lance().optimize.optimize_indices(index_names=[name], num_indices_to_merge=merge)
            self._table.checkout_latest()
            self._vector_index = False

    def _set_meta(self, values: dict[str, str]) -> None:
        self._table.to_lance().update_schema_metadata(values)
        self._table.checkout_latest()

    def _planned_config(self) -> Any:
        distance = _LANCE_DISTANCE[self.metric]
        if self.index != AUTO:
            return _INDEX_TYPES.get(self.index, IvfPq)(distance_type=distance)
        plan = index_plan.lancedb_index_for(max(len(self), index_plan.EXACT_BELOW), self.dim)
        assert plan is not None  # at EXACT_BELOW rows or more the plan is an index, never exact search
        return IvfPq(distance_type=distance, **plan)

    def calibrate(self, target: float | None = None, queries: Any = None) -> dict[str, str]:
        """Set ``nprobe`` to the smallest breadth reaching ``target`` recall@10 against exact search
        (:func:`index_plan.calibrate_breadth`), saved in the table's metadata; the settings chosen."""
        if self.vector_index is None:
            return {}
        dataset = self._table.to_lance()
        # id -> row position in the scan, the key of the exact search
        positions = {id_: row for row, id_ in enumerate(dataset.to_table(columns=["id"]).column("id").to_pylist())}

        def batches() -> Iterator[tuple[np.ndarray, np.ndarray]]:
            start = 0
            for batch in dataset.to_batches(columns=["id", "vector"], batch_size=65_536):
                if batch.num_rows:
                    yield (
                        np.arange(start, start + batch.num_rows, dtype=np.int64),
                        _to_numpy(batch.column("vector"), self.dim, batch.column("id"), "vector"),
                    )
                    start += batch.num_rows

        def sample(chosen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            rows = dataset.take(chosen, columns=["id", "vector"])
            sources = np.array([positions[i] for i in rows.column("id").to_pylist()], dtype=np.int64)
            return sources, _to_numpy(rows.column("vector"), self.dim, rows.column("id"), "vector")

        def search(q: np.ndarray, k: int, value: int) -> list[list[int]]:
            self.nprobe = value
            return [[positions[h.id] for h in hits] for hits in self.search(q, k)]

        q = None if queries is None else as_vectors(queries, self.dim, "queries")
        keys = np.arange(len(positions), dtype=np.int64)
        value, reached = index_plan.calibrate_breadth(
            index_plan.NPROBE_LADDER, keys, sample, batches, search, self.metric, target, q
        )
        self.nprobe = value
        logger.info("table %r: nprobe=%d reaches recall@10 %.3f", self.table_name, value, reached)
        self._set_meta({_META_NPROBES: str(value), _META_RECALL: f"{reached:.4f}"})
        return {"nprobe": str(value), "calibrated_recall": f"{reached:.4f}"}

    def index_info(self) -> dict[str, Any]:
        """The index type as asked and as built, and its search settings."""
        meta = {k.decode(): v.decode() for k, v in (self._table.schema.metadata or {}).items()}
        info: dict[str, Any] = {"index": self.index, "index_built": self.vector_index or "exact"}
        if self.vector_index is not None:
            info.update(json.loads(meta.get(_META_PARAMS, "{}")))
            info.update(nprobe=self.nprobe, refine=self.refine)
            if _META_RECALL in meta:
                info["calibrated_recall_at_10"] = float(meta[_META_RECALL])
        return info

    def create_index(self, config: IvfPq | HnswSq | Any | None = None) -> None:
        """Build (or rebuild) the ANN index on ``vector``.

        ``config`` is a ``lancedb.index`` config (``IvfPq``, ``HnswSq``, ...) whose distance type
        must match the store's metric; by default one of ``index`` with LanceDB's defaults (IVF_PQ for "flat").
        """
        distance = _LANCE_DISTANCE[self.metric]
        if config is None:
            config = self._planned_config()
        elif getattr(config, "distance_type", distance) != distance:
            raise ValueError(
                f"index distance_type {config.distance_type!r} does not match the store metric {self.metric!r} ({distance!r})"
            )
        self._vector_index = False
        self._table.create_index("vector", config=config, replace=True)
        self._indexed_rows = len(self)
        params = {
            name: getattr(config, name)
            for name in ("num_partitions", "num_sub_vectors", "m", "ef_construction")
            if isinstance(getattr(config, name, None), int)
        }
        self._set_meta({_META_PARAMS: json.dumps(params)})
        if self.index == AUTO:
            self.calibrate()

    # ------------------------------------------------------------------ the lexical index

    @property
    def has_lexical_index(self) -> bool:
        """Whether the terms column and its full-text index exist (a store written before them has neither)."""
        return _TERMS in self._table.schema.names and any(_TERMS in i.columns for i in self._table.list_indices())

    def _lexical_exact(self) -> bool:
        meta = self._table.schema.metadata or {}
        return meta.get(_META_LEXICAL.encode()) == str(self.version).encode()

    def _note_write(self, stale: bool = False) -> None:
        """Before a write: remember whether the full-text index was exact, and whether it now needs a rebuild."""
        if self._lexical_state is None:
            self._lexical_state = "exact" if self.has_lexical_index and self._lexical_exact() else "stale"
        if stale:
            self._lexical_state = "stale"
        elif self._lexical_state == "exact":
            self._lexical_state = "appended"

    def _ensure_terms_column(self) -> None:
        """Add and fill the ``terms`` column of a table written before it existed (one new version)."""
        if _TERMS in self._table.schema.names:
            return
        logger.warning("table %r in %s has no lexical terms: analyzing its %d texts", self.table_name, self.path, len(self))
        self._table.add_columns(pa.field(_TERMS, pa.string()))
        schema = pa.schema([pa.field("id", pa.string()), pa.field(_TERMS, pa.string())])

        def batches() -> Iterator[pa.RecordBatch]:
            for batch in self._table.to_lance().to_batches(columns=["id", "text"], batch_size=4096):
                terms = [index_text(text) for text in batch.column("text").to_pylist()]
                yield pa.RecordBatch.from_arrays([batch.column("id"), pa.array(terms, pa.string())], schema=schema)

        reader = pa.RecordBatchReader.from_batches(schema, batches())
        self._table.merge_insert("id").when_matched_update_all().execute(reader)
        self._lexical_state = "stale"

    def _refresh_lexical_index(self) -> None:
        """Make the full-text index exact: add appended rows to it, or rebuild it after deletes and updates."""
        self._ensure_terms_column()
        if self._lexical_state == "appended" and self.has_lexical_index:
            name = next(i.name for i in self._table.list_indices() if _TERMS in i.columns)
            self._table.to_lance().optimize.optimize_indices(index_names=[name])
            self._table.checkout_latest()
        else:
            self._table.create_index(_TERMS, config=FTS(**_FTS_CONFIG), replace=True)
        self._vector_index = False
        self._table.to_lance().update_schema_metadata({_META_LEXICAL: str(self.version + 1)})
        self._table.checkout_latest()
        self._lexical_state = "exact"

    def build_lexical_index(self) -> None:
        """Build the full-text index if it is missing or out of date (a store written before it existed)."""
        if not self.has_lexical_index or not self._lexical_exact():
            self._lexical_state = "stale"
            self._refresh_lexical_index()

    def optimize(self) -> None:
        """Compact files, add new rows to the indexes and prune old versions (LanceDB's ``optimize``);
        an auto table also gets the index its size calls for, rebuilt and recalibrated."""
        self._vector_index = False
        self._table.optimize()
        self._vector_index = False
        if self.index == AUTO and len(self) >= index_plan.EXACT_BELOW:
            self.create_index()

    # ------------------------------------------------------------------ reading

    def _scores(self, distances: np.ndarray) -> np.ndarray:
        # LanceDB distances: cosine 1 - cos, dot 1 - x.y, l2 the squared distance
        return -distances if self.metric == "l2" else 1.0 - distances

    def _remember_rows(self, table: pa.Table) -> None:
        """Keep the row id of each id a search without text returned: its caller looks some of them up
        (hybrid search: vectors, BM25 scores, the final hits' text), and takes the rows directly."""
        version = self._table.version
        if version != self._row_ids_version or len(self._row_ids) > _ROW_IDS_KEPT:
            self._row_ids, self._row_ids_version = {}, version
        self._row_ids.update(zip(table.column("id").to_pylist(), table.column("_rowid").to_pylist()))

    def _remembered(self, ids: Sequence[str]) -> list[int] | None:
        """The row ids of ``ids`` remembered from reads of the current table version; None unless all are."""
        row_ids = [self._row_ids.get(i) for i in ids]
        if not ids or None in row_ids or self._table.version != self._row_ids_version:
            return None
        return cast(list[int], row_ids)

    def _dataset(self) -> Any:
        """The pylance dataset of the table's current version. Queries and takes go through it rather than
        LanceDB's query builder (same engine, same plan): at 100,000 rows a single vector query, a full-text
        query and a take of 10 rows cost 1.5 to 3 times less. Kept between reads with its index caches."""
        version = self._table.version
        if self._lance is None:
            self._lance = self._table.to_lance()
        elif self._lance.version != version:
            self._lance = self._lance.checkout_version(version)
        return self._lance

    def _read_rows(self, ids: Sequence[str], columns: list[str]) -> pa.Table:
        """``id`` and ``columns`` of the stored rows among distinct ``ids``, in any order: taken by their
        remembered row ids where all are remembered, else found by a filtered scan."""
        row_ids = self._remembered(ids)
        if row_ids is not None:
            table = self._dataset()._take_rows(row_ids, columns=["id", *columns])
            if table.num_rows == len(ids) and set(table.column("id").to_pylist()) == set(ids):
                return table
        return self._scan(["id", *columns], _id_filter(ids))

    def _hit_columns(self, with_text: bool) -> list[str]:
        return ["id", "text", "metadata"] if with_text else ["id"]

    def _hit_rows(self, table: pa.Table, with_text: bool) -> Iterator[tuple[str, str, dict[str, Any]]]:
        """``(id, text, metadata)`` of each row of a query result (``""`` and ``{}`` without text)."""
        ids = table.column("id").to_pylist()
        if not with_text:
            return ((i, "", {}) for i in ids)
        texts, metadata = table.column("text").to_pylist(), table.column("metadata").to_pylist()
        return ((i, t, _load_metadata(m)) for i, t, m in zip(ids, texts, metadata))

    def _index_settings(self, k: int, with_text: bool) -> dict[str, int]:
        """The ANN search breadth of a ``k``-hit query (none without an index)."""
        if self.vector_index is None:
            return {}
        settings = {"nprobes": self.nprobe}
        if self.refine:
            # candidate lists (no text) re-rank as many rows as a 10-hit search does, at least their own k
            settings["refine_factor"] = self.refine if with_text else max(1, self.refine * 10 // k)
        if self.ef:
            settings["ef"] = self.ef
        return settings

    def _vector_query(self, queries: np.ndarray, k: int, where: Mapping[str, Any] | None, with_text: bool) -> pa.Table:
        """The hits of every query in one table (``query_index`` names the query of each row when there are
        several): one query through pylance's scanner, a batch through LanceDB's multi-vector query."""
        columns, settings = [*self._hit_columns(with_text), "_distance"], self._index_settings(k, with_text)
        condition = to_lance(where) if where else None
        if len(queries) == 1:
            nearest = {"column": "vector", "q": queries[0], "k": k, "metric": _LANCE_DISTANCE[self.metric], **settings}
            return self._dataset().scanner(**_read_args(columns, condition, not with_text), nearest=nearest).to_table()
        query = (
            self._table.search(list(queries), vector_column_name="vector")
            .distance_type(_LANCE_DISTANCE[self.metric])
            .limit(k)
            .select(columns)
            .with_row_id(not with_text)
        )
        if condition:
            query = query.where(condition, prefilter=True)
        for name, value in settings.items():
            query = getattr(query, name)(value)
        return query.to_arrow()

    def search(self, queries: Any, k: int, where: Mapping[str, Any] | None = None, with_text: bool = True) -> list[list[Hit]]:
        """The ``k`` best hits of each query (higher score is closer), prefiltered by ``where``."""
        q = as_vectors(queries, self.dim, "queries")
        k = check_k(k)
        out: list[list[Hit]] = [[] for _ in range(len(q))]
        if len(q) == 0:
            return out
        table = self._vector_query(q, k, where, with_text)
        if not with_text:
            self._remember_rows(table)
        distances = table.column("_distance").to_numpy().astype(np.float64)
        if "query_index" in table.column_names:
            query_index = table.column("query_index").to_numpy()
        else:  # a single query
            query_index = np.zeros(len(distances), dtype=np.int64)
        order = np.lexsort((distances, query_index)).tolist()  # by query, then distance; stable
        rows = list(self._hit_rows(table, with_text))
        scores, query_index = self._scores(distances).tolist(), query_index.tolist()
        for row in order:
            out[query_index[row]].append(Hit(rows[row][0], scores[row], rows[row][1], rows[row][2]))
        return out

    def lexical_search(
        self, texts: Sequence[str], k: int, where: Mapping[str, Any] | None = None, with_text: bool = True
    ) -> list[list[Hit]]:
        """The ``k`` best rows of each query text by LanceDB's BM25 over the ``terms`` index (OR of the
        query's terms), prefiltered by ``where``. A store without the index gets it built first."""
        k = check_k(k)
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of query strings, not a single string")
        if not self.has_lexical_index:
            self.build_lexical_index()
        condition = to_lance(where) if where else None
        out: list[list[Hit]] = []
        for text in texts:
            terms = query_terms(text)
            if not terms:
                out.append([])
                continue
            args = _read_args([*self._hit_columns(with_text), "_score"], condition, not with_text)
            table = self._dataset().scanner(**args, full_text_query=_match(terms), limit=k).to_table()
            if not with_text:
                self._remember_rows(table)
            scores = table.column("_score").to_pylist()
            rows = sorted(zip(scores, self._hit_rows(table, with_text)), key=lambda pair: -pair[0])  # stable
            out.append([Hit(i, float(score), text, metadata) for score, (i, text, metadata) in rows])
        return out

    def lexical_scores(self, texts: Sequence[str], ids: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """Each query text's BM25 score of each of its ids (0 for a row sharing no term): the full-text
        query prefiltered to those rows, with the whole index's statistics."""
        if not self.has_lexical_index:
            self.build_lexical_index()
        out = []
        for text, wanted in zip(texts, ids):
            scores = dict.fromkeys(wanted, 0.0)
            terms = query_terms(text)
            for part in _chunks(list(wanted)) if terms else ():
                args = _read_args(["id", "_score"], self._rows_filter(part), row_ids=False)
                for row in self._dataset().scanner(**args, full_text_query=_match(terms), limit=len(part)).to_table().to_pylist():
                    scores[row["id"]] = float(row["_score"])
            out.append(np.array([scores[i] for i in wanted], dtype=np.float64))
        return out

    def metadata_fields(self) -> set[str]:
        """The metadata keys of the stored rows: the set saved at the last commit (no scan), kept
        up to date by this process's writes; scanned after deletes and updates, or when the saved
        set is older than the table."""
        return set(self._known_fields(exact=True))

    def _known_fields(self, exact: bool = False) -> set[str]:
        """The field set this process keeps (mutable): read or scanned if not known yet (or, with
        ``exact``, when deletes or updates may have made it a superset)."""
        if self._fields is None or (exact and not self._fields_exact):
            meta = self._table.schema.metadata or {}
            saved = meta.get(_META_FIELDS.encode())
            if saved is not None and meta.get(_META_FIELDS_VERSION.encode()) == str(self.version).encode():
                self._fields = set(json.loads(saved))
            else:
                self._fields = self._scan_fields()
            self._fields_exact = True
        return self._fields

    def _scan_fields(self) -> set[str]:
        """The metadata keys of the stored rows, from one scan of the metadata column."""
        fields: set[str] = set()
        for batch in self._table.to_lance().to_batches(columns=["metadata"], batch_size=65_536):
            for value in set(batch.column("metadata").to_pylist()):
                fields.update(_load_metadata(value))
        return fields

    def _save_fields(self) -> None:
        """Save the field set (exact: rescanned after deletes and updates) stamped with the version it
        describes, unless the saved one is current; a table this process has not written is left alone."""
        if self._fields is None or self._lexical_state is None:
            return
        if not self._fields_exact:
            self._known_fields(exact=True)
        meta = self._table.schema.metadata or {}
        if (
            meta.get(_META_FIELDS_VERSION.encode()) == str(self.version).encode()
            and meta.get(_META_FIELDS.encode()) == json.dumps(sorted(self._fields)).encode()
        ):
            return
        # one schema-metadata update is one new version: the stamp names it
        self._set_meta({_META_FIELDS: json.dumps(sorted(self._fields)), _META_FIELDS_VERSION: str(self.version + 1)})

    def _rows_filter(self, ids: Sequence[str]) -> str:
        """A filter keeping the rows of ``ids``: by remembered row id (no scan of the id column) where it can."""
        row_ids = self._remembered(ids)
        return _id_filter(ids) if row_ids is None else f"_rowid IN ({', '.join(map(str, row_ids))})"

    def _scan(self, columns: list[str], filter: str | None) -> pa.Table:
        return self._dataset().to_table(columns=columns, filter=filter)

    def get(self, ids: Sequence[str]) -> list[Hit | None]:
        """The stored row of each id (score ``nan``), or ``None``."""
        wanted = as_ids(ids)
        found: dict[str, Hit] = {}
        for part in _chunks(list(dict.fromkeys(wanted))):
            for row in self._read_rows(part, ["text", "metadata"]).to_pylist():
                found[row["id"]] = Hit(row["id"], float("nan"), row["text"], _load_metadata(row["metadata"]))
        return [found.get(i) for i in wanted]

    def contains(self, ids: Iterable[str]) -> set[str]:
        """The subset of ``ids`` that is stored."""
        wanted = as_ids(ids)
        found: set[str] = set()
        for part in _chunks(wanted):
            found.update(self._scan(["id"], _id_filter(part)).column("id").to_pylist())
        return found

    def ids(self, where: Mapping[str, Any] | None = None) -> list[str]:
        """All stored ids (those whose metadata matches ``where``)."""
        return self._scan(["id"], to_lance(where) if where else None).column("id").to_pylist()

    def vectors(self, ids: Sequence[str]) -> np.ndarray:
        """The stored vectors of ``ids``; KeyError names an unknown id."""
        return self._column_vectors(ids, "vector", self.dim)

    def raw_vectors(self, ids: Sequence[str]) -> np.ndarray:
        """The stored raw (pre-shaping) vectors of ``ids``; ValueError without the column or for a null row."""
        if self.raw_dim is None:
            raise ValueError(f"table {self.table_name!r} has no raw_vector column")
        return self._column_vectors(ids, "raw_vector", self.raw_dim)

    def _column_vectors(self, ids: Sequence[str], column: str, dim: int) -> np.ndarray:
        wanted = as_ids(ids)
        found: dict[str, np.ndarray] = {}
        for part in _chunks(list(dict.fromkeys(wanted))):
            table = self._read_rows(part, [column])
            id_column = table.column("id")
            found.update(zip(id_column.to_pylist(), _to_numpy(table.column(column), dim, id_column, column)))
        missing = [i for i in wanted if i not in found]
        if missing:
            raise KeyError(f"id {missing[0]!r} is not stored in table {self.table_name!r}")
        return np.stack([found[i] for i in wanted]) if wanted else np.empty((0, dim), np.float32)

    def iter_raw(self, batch_size: int = 4096) -> Iterator[tuple[list[str], np.ndarray]]:
        """Yield ``(ids, raw_vectors)`` batches over the whole table (a consistent snapshot)."""
        if self.raw_dim is None:
            raise ValueError(f"table {self.table_name!r} has no raw_vector column")
        for batch in self._table.to_lance().to_batches(columns=["id", "raw_vector"], batch_size=batch_size):
            if batch.num_rows:
                ids = batch.column("id")
                yield ids.to_pylist(), _to_numpy(batch.column("raw_vector"), self.raw_dim, ids, "raw_vector")


def _to_numpy(column: pa.Array | pa.ChunkedArray, dim: int, ids: pa.Array | pa.ChunkedArray, name: str) -> np.ndarray:
    """A fixed-size-list column as a float32 ``(n, dim)`` array; a null row is an error naming its id."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if column.null_count:
        first = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise ValueError(f"id {ids[first].as_py()!r} has no stored {name}")
    values = column.flatten().to_numpy(zero_copy_only=False)
    return values.astype(np.float32, copy=False).reshape(len(column), dim)
