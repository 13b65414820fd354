"""A LanceDB store's rows: reading them by id (by remembered Lance row id where it can), by filter and in
batches; the table's schema metadata (``isotrope.*`` keys: properties, settings); the set of metadata field
names kept there, stamped with the rows it describes. :class:`LanceRows` is the base of the store's
keyword index (:mod:`.lance_lexical`), vector index (:mod:`.lance_index`) and the store itself."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from isotrope.resources import usable_cores
from isotrope.stores.base import Hit, as_ids
from isotrope.stores.filters import lance_literal, to_lance
from isotrope.stores.rows import chunks, load_metadata

#: Lance's announced default, taken now: index statistics (read at each commit) without the IVF centroids,
#: which otherwise cost memory and print a warning on every commit of an indexed table; a user's setting stays
os.environ.setdefault("LANCE_INCLUDE_VECTOR_CENTROIDS", "false")
#: Lance computes on the cores it does not keep for I/O (two), on at least one thread: on two or three cores,
#: one, on which a hybrid query's vector and full-text searches queue. Two there (a user's setting stays): on a
#: million rows, dense search 10.5 -> 9.4 ms, hybrid 23.4 -> 19.5 ms (docs/SCALING.md). Rankings do not depend
#: on it (:func:`top_rows`).
if "LANCE_CPU_THREADS" not in os.environ and 2 <= usable_cores() < 4:
    os.environ["LANCE_CPU_THREADS"] = "2"

PROPERTY = "isotrope.property."
ID_CHUNK = 1000
#: ids whose Lance row id a store remembers from its reads (then it forgets them all and starts again)
_ROW_IDS_KEPT = 100_000
#: the metadata field names (a JSON list) and the rows they describe (:meth:`LanceRows.rows_signature`)
_META_FIELDS = "isotrope.metadata_fields"
_META_FIELDS_ROWS = "isotrope.metadata_fields_rows"
#: the rows the full-text index was last made exact over
META_LEXICAL_ROWS = "isotrope.lexical_index_rows"


def fragment_rows(dataset: Any) -> list[tuple[int, int]]:
    """``(fragment id, deleted rows)`` of each fragment of a pylance dataset: its rows, as its indexes see them."""
    return [(f.id, f.num_deletions) for f in (fragment.metadata for fragment in dataset.get_fragments())]


def signature(fragments: Iterable[tuple[int, int]]) -> str:
    """Rows given as :func:`fragment_rows`, hashed: the stamp of what describes them (indexes, field set)."""
    return hashlib.sha256(",".join(f"{i}:{d}" for i, d in fragments).encode()).hexdigest()


#: rows a Lance top-k query asks beyond k (and a tenth of k): a million rows, 200 sentence queries: 6-20 % of the
#: top 10 and top 200 lists had rows tied with the k-th beyond it, at most 17 and 20; asking 1 + k // 10 more,
#: 3-5 % of the top 10 asked again, which took keyword search's p99 from 65 to 105-110 ms (docs/SCALING.md)
TIE_MARGIN = 8


def top_rows(search: Callable[[int], pa.Table], k: int, column: str, descending: bool) -> pa.Table:
    """The best ``k`` rows by ``column`` of a Lance top-``limit`` query, ``search(limit)`` (its rows with
    ``_rowid``), ties by row id: Lance's order of tied rows, and its pick among rows tied at its limit, follow
    its threads' timing once it computes on more than one. :data:`TIE_MARGIN` rows more than ``k`` and a tenth
    of ``k`` are asked, and twice as many while the last row returned ties the ``k``-th (every row tied with the
    ``k``-th is then among those returned)."""
    limit = k + TIE_MARGIN + k // 10
    while True:
        table = search(limit)
        order = pc.sort_indices(table, [(column, "descending" if descending else "ascending"), ("_rowid", "ascending")])
        if table.num_rows < limit:
            break
        kth, last = table.column(column).take(order.take([k - 1, table.num_rows - 1])).to_pylist()
        if kth != last:
            break
        limit *= 2
    return table.take(order[:k])


def id_filter(ids: Sequence[str]) -> str:
    """A Lance SQL filter keeping the rows of ``ids``."""
    return f"id IN ({', '.join(lance_literal(i) for i in ids)})"


def read_args(columns: list[str], condition: str | None, row_ids: bool) -> dict[str, Any]:
    """A pylance scanner's arguments: these columns (and ``_rowid`` with ``row_ids``), prefiltered by ``condition``."""
    return {
        "columns": columns,
        "filter": condition,
        "prefilter": True,
        "with_row_id": row_ids,
        "disable_scoring_autoprojection": True,
    }


def vector_array(vectors: np.ndarray) -> pa.FixedSizeListArray:
    """A float32 ``(n, dim)`` array as Arrow's fixed-size-list column."""
    return pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel(), type=pa.float32()), vectors.shape[1])


def to_numpy(column: pa.Array | pa.ChunkedArray, dim: int, ids: pa.Array | pa.ChunkedArray, name: str) -> np.ndarray:
    """A fixed-size-list column as a float32 ``(n, dim)`` array; a null row is an error naming its id."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if column.null_count:
        first = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise ValueError(f"id {ids[first].as_py()!r} has no stored {name}")
    values = column.flatten().to_numpy(zero_copy_only=False)
    return values.astype(np.float32, copy=False).reshape(len(column), dim)


class LanceRows:
    """The rows of a LanceDB table, read and written through pylance (``import lance``) alone."""

    path: Path | str
    table_name: str
    dim: int
    raw_dim: int | None
    _storage_options: dict[str, str] | None
    _db: Any
    _writer: Any
    _lance: Any
    _row_ids: dict[str, int]
    _row_ids_version: int
    _fields: set[str] | None
    _fields_exact: bool
    _lexical_state: str | None
    _vector_index: str | bool | None

    def _writable(self) -> Any:
        """The pylance dataset writes and index builds go through, opened on first use (sharing the read
        dataset's caches) and kept at the latest version by its own writes. Nothing here imports
        ``lancedb``: its native library is a second copy of the Lance engine, whose import and code paged in
        by the writes cost a 1,526-chunk ingestion 130 MB of its 1.3 GB peak."""
        if self._writer is None:
            self._writer = self._open(session=None if self._lance is None else self._lance.session())
        return self._writer

    def _open(self, version: int | None = None, session: Any = None) -> Any:
        """The table's pylance dataset (``version``: that one, else the latest)."""
        return lance.dataset(self._table_uri(), version=version, storage_options=self._storage_options, session=session)

    def lancedb_table(self) -> Any:
        """LanceDB's own handle on this table (imports ``lancedb``): for comparisons with LanceDB's query
        API (benchmarks); the store itself never needs it."""
        import lancedb

        if self._db is None:
            self._db = lancedb.connect(self.path, storage_options=self._storage_options)
        return self._db.open_table(self.table_name)

    @property
    def _schema(self) -> pa.Schema:
        return self._dataset().schema

    def __len__(self) -> int:
        return int(self._dataset().count_rows())

    @property
    def version(self) -> int:
        """The table's current Lance version."""
        return int(self._dataset().version)

    def rows_signature(self) -> str:
        """The table's rows, as an index or a field set describing them sees them: each fragment and its
        deleted rows (metadata writes leave it as it is; appends, deletes, updates and compaction change it)."""
        return signature(fragment_rows(self._dataset()))

    @contextmanager
    def _rows_kept(self) -> Iterator[None]:
        """Around a rewrite that keeps every row as it is (compaction): the field set and the full-text
        index that described the rows before describe them after (Lance remaps its indexes)."""
        before = self.rows_signature().encode()
        yield
        meta = self._schema.metadata or {}
        current = [key for key in (_META_FIELDS_ROWS, META_LEXICAL_ROWS) if meta.get(key.encode()) == before]
        if current:
            self._set_meta(dict.fromkeys(current, self.rows_signature()))

    @property
    def properties(self) -> dict[str, str]:
        """The persisted ``dict[str, str]`` kept in the table's schema metadata (the encoder's fingerprint, index settings)."""
        meta = self._schema.metadata or {}
        prefix = PROPERTY.encode()
        return {k[len(prefix) :].decode(): v.decode() for k, v in meta.items() if k.startswith(prefix)}

    def _set_meta(self, values: dict[str, str]) -> None:
        self._writable().update_schema_metadata(values)

    def _indices(self) -> list[tuple[str, str, list[str]]]:
        """``(name, type, columns)`` of the table's indexes, types as LanceDB names them ("IvfPq", "IvfHnswSq", "Inverted")."""
        return [
            (i.name, "".join(part.capitalize() for part in i.index_type.split("_")), i.field_names)
            for i in self._dataset().describe_indices()
        ]

    def _remember_rows(self, table: pa.Table) -> None:
        """Keep the row id of each id a search without text returned: its caller looks some of them up
        (hybrid search: vectors, BM25 scores, the final hits' text), and takes the rows directly."""
        version = self.version
        if version != self._row_ids_version or len(self._row_ids) > _ROW_IDS_KEPT:
            self._row_ids, self._row_ids_version = {}, version
        self._row_ids.update(zip(table.column("id").to_pylist(), table.column("_rowid").to_pylist()))

    def _remembered(self, ids: Sequence[str]) -> list[int] | None:
        """The row ids of ``ids`` remembered from reads of the current table version; None unless all are."""
        row_ids = [self._row_ids.get(i) for i in ids]
        if not ids or None in row_ids or self.version != self._row_ids_version:
            return None
        return cast(list[int], row_ids)

    def _dataset(self) -> Any:
        """The pylance dataset of the table's current version. Reads go
        through it rather than LanceDB's query builder (same engine, same plan): at 100,000 rows a single
        vector query, a full-text query and a take of 10 rows cost 1.5 to 3 times less. Kept between reads
        with its index caches; once this process writes, the writer's version, as an object of its own (a
        search reads one version while a write moves the writer on)."""
        if self._writer is not None:
            version = self._writer.version
            if self._lance is None or self._lance.version != version:
                self._lance = self._open(version, self._writer.session())
        elif self._lance is None:
            self._lance = self._open()
        return self._lance

    def _table_uri(self) -> str:
        """Where LanceDB keeps the table: ``<database>/<table>.lance``."""
        return f"{str(self.path).rstrip('/')}/{self.table_name}.lance"

    def _read_rows(self, ids: Sequence[str], columns: list[str]) -> pa.Table:
        """``id`` and ``columns`` of the stored rows among distinct ``ids``, in any order: taken by their
        remembered row ids where all are remembered, else found by a filtered scan."""
        row_ids = self._remembered(ids)
        if row_ids is not None:
            table = self._dataset()._take_rows(row_ids, columns=["id", *columns])
            if table.num_rows == len(ids) and set(table.column("id").to_pylist()) == set(ids):
                return table
        return self._scan(["id", *columns], id_filter(ids))

    def _hit_columns(self, with_text: bool) -> list[str]:
        return ["id", "text", "metadata"] if with_text else ["id"]

    def _hit_rows(self, table: pa.Table, with_text: bool) -> Iterator[tuple[str, str, dict[str, Any]]]:
        """``(id, text, metadata)`` of each row of a query result (``""`` and ``{}`` without text)."""
        ids = table.column("id").to_pylist()
        if not with_text:
            return ((i, "", {}) for i in ids)
        texts, metadata = table.column("text").to_pylist(), table.column("metadata").to_pylist()
        return ((i, t, load_metadata(m)) for i, t, m in zip(ids, texts, metadata))

    def metadata_fields(self) -> set[str]:
        """The metadata keys of the stored rows: the set saved at the last commit (no scan), kept
        up to date by this process's writes; scanned after deletes and updates, or when the saved
        set is older than the table."""
        return set(self._known_fields(exact=True))

    def _known_fields(self, exact: bool = False) -> set[str]:
        """The field set this process keeps (mutable): read or scanned if not known yet (or, with
        ``exact``, when deletes or updates may have made it a superset)."""
        if self._fields is None or (exact and not self._fields_exact):
            meta = self._schema.metadata or {}
            saved = meta.get(_META_FIELDS.encode())
            if saved is not None and meta.get(_META_FIELDS_ROWS.encode()) == self.rows_signature().encode():
                self._fields = set(json.loads(saved))
            else:
                self._fields = self._scan_fields()
            self._fields_exact = True
        return self._fields

    def _scan_fields(self) -> set[str]:
        """The metadata keys of the stored rows, from one scan of the metadata column."""
        fields: set[str] = set()
        for batch in self._dataset().to_batches(columns=["metadata"], batch_size=65_536):
            for value in set(batch.column("metadata").to_pylist()):
                fields.update(load_metadata(value))
        return fields

    def _save_fields(self) -> None:
        """Save the field set (exact: rescanned after deletes and updates) stamped with the rows it
        describes, unless the saved one is current; a table this process has not written is left alone."""
        if self._fields is None or self._lexical_state is None:
            return
        if not self._fields_exact:
            self._known_fields(exact=True)
        meta = self._schema.metadata or {}
        if (
            meta.get(_META_FIELDS_ROWS.encode()) == self.rows_signature().encode()
            and meta.get(_META_FIELDS.encode()) == json.dumps(sorted(self._fields)).encode()
        ):
            return
        self._set_meta({_META_FIELDS: json.dumps(sorted(self._fields)), _META_FIELDS_ROWS: self.rows_signature()})

    def _rows_filter(self, ids: Sequence[str]) -> str:
        """A filter keeping the rows of ``ids``: by remembered row id (no scan of the id column) where it can."""
        row_ids = self._remembered(ids)
        return id_filter(ids) if row_ids is None else f"_rowid IN ({', '.join(map(str, row_ids))})"

    def _scan(self, columns: list[str], filter: str | None) -> pa.Table:
        return self._dataset().to_table(columns=columns, filter=filter)

    def get(self, ids: Sequence[str]) -> list[Hit | None]:
        """The stored row of each id (score ``nan``), or ``None``."""
        wanted = as_ids(ids)
        found: dict[str, Hit] = {}
        for part in chunks(list(dict.fromkeys(wanted)), ID_CHUNK):
            for row in self._read_rows(part, ["text", "metadata"]).to_pylist():
                found[row["id"]] = Hit(row["id"], float("nan"), row["text"], load_metadata(row["metadata"]))
        return [found.get(i) for i in wanted]

    def contains(self, ids: Iterable[str]) -> set[str]:
        """The subset of ``ids`` that is stored."""
        wanted = as_ids(ids)
        found: set[str] = set()
        for part in chunks(wanted, ID_CHUNK):
            found.update(self._scan(["id"], id_filter(part)).column("id").to_pylist())
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
        for part in chunks(list(dict.fromkeys(wanted)), ID_CHUNK):
            table = self._read_rows(part, [column])
            id_column = table.column("id")
            found.update(zip(id_column.to_pylist(), to_numpy(table.column(column), dim, id_column, column)))
        missing = [i for i in wanted if i not in found]
        if missing:
            raise KeyError(f"id {missing[0]!r} is not stored in table {self.table_name!r}")
        return np.stack([found[i] for i in wanted]) if wanted else np.empty((0, dim), np.float32)

    def iter_raw(self, batch_size: int = 4096) -> Iterator[tuple[list[str], np.ndarray]]:
        """Yield ``(ids, raw_vectors)`` batches over the whole table (a consistent snapshot)."""
        if self.raw_dim is None:
            raise ValueError(f"table {self.table_name!r} has no raw_vector column")
        for batch in self._dataset().to_batches(columns=["id", "raw_vector"], batch_size=batch_size):
            if batch.num_rows:
                ids = batch.column("id")
                yield ids.to_pylist(), to_numpy(batch.column("raw_vector"), self.raw_dim, ids, "raw_vector")
