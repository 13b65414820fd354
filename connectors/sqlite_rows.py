"""A vector store's rows in SQLite, the FAISS store's source of truth (``store.sqlite``)::

    meta              the store's settings (key, value)
    properties        its persisted properties (key, value)
    items             one row per item: int64 key, string id, text, metadata JSON, float32 vector blob
    metadata_fields   each top-level metadata key and how many rows have it (filters naming an unknown
                      field are refused in O(1))

The keyword index lives beside it (``keyword.npz``, :mod:`.sqlite_lexical`), at ``meta``'s
``keyword_generation``.

All are written in the same transaction. :class:`SqliteRows` reads rows by id, by key and by filter.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from isotrope.stores.base import Hit, StoreFormatError, as_ids, check_properties
from isotrope.stores.filters import to_sqlite
from isotrope.stores.memory import exact_scores, top_k
from isotrope.stores.rows import chunks, load_metadata

from .faiss_index import fsync_dir

logger = logging.getLogger(__name__)

DB_NAME = "store.sqlite"
CHUNK = 900  # SQLite variables per statement
READ_BATCH = 65_536  # rows per batch read (vectors for the index, texts for the keyword index)
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
#: the metadata keys of the stored rows, with the number of rows having each
_FIELDS_SCHEMA = "CREATE TABLE IF NOT EXISTS metadata_fields (name TEXT PRIMARY KEY, rows INTEGER NOT NULL)"
#: the key counts of some stored rows' metadata (``{placeholders}`` filled with their keys)
_COUNT_FIELDS = (
    "SELECT j.key, COUNT(*) FROM items, json_each(items.metadata) AS j WHERE items.key IN ({placeholders}) GROUP BY j.key"
)
#: the SELECT of the rows hits show (key, id, text, metadata) for 1 to 900 keys, and of their ids alone (text
#: '', metadata '{}'): one statement text per count, built once (sqlite3 prepares each once and finds it again)
_HIT_COLUMNS = {True: "text, metadata", False: "'', '{}'"}
_ROWS_SQL = {
    with_text: [f"SELECT key, id, {columns} FROM items WHERE key IN ({','.join('?' * count)})" for count in range(CHUNK + 1)]
    for with_text, columns in _HIT_COLUMNS.items()
}


def create_db(db_path: Path, meta: dict[str, str]) -> None:
    """Write an empty store database with its ``meta`` rows under a temporary name, then rename it into place."""
    tmp = db_path.with_name(db_path.name + ".new")
    for leftover in (tmp, *(tmp.with_name(tmp.name + suffix) for suffix in ("-journal", "-wal", "-shm"))):
        leftover.unlink(missing_ok=True)  # a journal left by a killed creation must not replay into the new file
    conn = sqlite3.connect(tmp)
    try:
        conn.executescript(_SCHEMA)
        conn.execute(_FIELDS_SCHEMA)
        conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", meta.items())
        conn.commit()
    finally:
        conn.close()
    os.replace(tmp, db_path)
    fsync_dir(db_path.parent)


def connect_db(db_path: Path, owner: str) -> tuple[sqlite3.Connection, dict[str, str]]:
    """The writing connection to a store database (WAL, full sync, memory-mapped reads) and its meta rows;
    a file that is not a SQLite database is a StoreFormatError naming ``owner``'s format."""
    try:
        # WAL: readers see the last commit while a writer writes; the busy timeout waits out
        # the short moments (checkpoints, switching the mode) when SQLite must lock the file
        conn = sqlite3.connect(db_path, isolation_level=None, timeout=_BUSY_SECONDS)
        if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(f"PRAGMA mmap_size={_MMAP_BYTES}")
        return conn, dict(conn.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.OperationalError as error:
        if "locked" in str(error) or "busy" in str(error):
            raise RuntimeError(f"{db_path} stayed locked for {_BUSY_SECONDS} s by another process: {error}") from error
        raise StoreFormatError(f"{db_path} is not a {owner} database: {error}") from error
    except sqlite3.DatabaseError as error:
        raise StoreFormatError(f"{db_path} is not a {owner} database: {error}") from error


class SqliteRows:
    """The rows of a store in its SQLite database (``_conn``, the store's writing connection, opened by it)."""

    path: Path
    dim: int
    _conn: sqlite3.Connection
    _reader: sqlite3.Connection | None
    _has_fields_table: bool

    def _begin(self) -> None:
        """Open the write transaction, if none is open."""
        if not self._conn.in_transaction:
            self._conn.execute("BEGIN IMMEDIATE")

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
            # hybrid search's keyword side reads through it in a second thread while this one waits
            self._reader = sqlite3.connect(uri, uri=True, timeout=_BUSY_SECONDS, check_same_thread=False)
            self._reader.execute(f"PRAGMA mmap_size={_READ_MMAP_BYTES}")
        return self._reader

    def __len__(self) -> int:
        return self._conn.execute("SELECT COUNT(*) FROM items").fetchone()[0]

    def _keys(self, ids: Sequence[str]) -> dict[str, int]:
        found: dict[str, int] = {}
        for part in chunks(ids, CHUNK):
            query = f"SELECT id, key FROM items WHERE id IN ({','.join('?' * len(part))})"
            found.update(self._db.execute(query, part).fetchall())
        return found

    def _iter_vectors(
        self, where_sql: str = "1", params: Sequence[Any] = (), db: sqlite3.Connection | None = None
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(keys, vectors) batches of the rows matching a trusted SQL condition, in key order (read through
        ``db``, else the store's own connection)."""
        cursor = (db or self._conn).execute(f"SELECT key, vector FROM items WHERE {where_sql} ORDER BY key", params)
        while rows := cursor.fetchmany(READ_BATCH):
            keys = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
            vectors = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(len(rows), self.dim)
            yield keys, vectors

    def _rows(self, keys: list[int], with_text: bool = True) -> dict[int, tuple[str, str | None, str]]:
        """``key -> (id, text, metadata JSON)`` of the given distinct keys: one SELECT per 900 keys, by rowid."""
        rows = {}
        for part in chunks(keys, CHUNK):
            for key, id_, text, metadata in self._db.execute(_ROWS_SQL[with_text][len(part)], part):
                rows[key] = (id_, text, metadata)
        return rows

    def _hits(self, keys: np.ndarray, scores: np.ndarray, with_text: bool = True) -> list[list[Hit]]:
        """One list of hits per row of faiss results; a key of -1 (no result) is skipped."""
        rankings = [
            [(k, s) for k, s in zip(key_row, score_row) if k >= 0] for key_row, score_row in zip(keys.tolist(), scores.tolist())
        ]
        return self._ranked_hits(rankings, with_text)

    def _ranked_hits(self, rankings: Sequence[Sequence[tuple[int, float]]], with_text: bool = True) -> list[list[Hit]]:
        """Each ranking's ``(key, score)`` as hits (a row gone since is skipped). Each stored row is read
        once; every hit parses its own metadata dict."""
        if len(rankings) == 1:  # a single query: its keys are distinct
            wanted = [key for key, _ in rankings[0]]
        else:
            wanted = list({key for ranking in rankings for key, _ in ranking})
        rows = self._rows(wanted, with_text)
        return [
            [Hit(row[0], score, row[1], load_metadata(row[2])) for key, score in ranking if (row := rows.get(key)) is not None]
            for ranking in rankings
        ]

    def _filtered_keys(self, where: Mapping[str, Any]) -> np.ndarray:
        sql, params = to_sqlite(where)
        rows = self._conn.execute(f"SELECT key FROM items WHERE {sql}", params).fetchall()
        return np.array([r[0] for r in rows], dtype=np.int64)

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
        found_keys, found_vectors = self._key_vectors(sorted(keys.values()))
        found = dict(zip(found_keys.tolist(), found_vectors))
        return np.stack([found[keys[i]] for i in wanted]) if wanted else np.empty((0, self.dim), np.float32)

    def _key_vectors(self, keys: Sequence[int], db: sqlite3.Connection | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The ``(keys, vectors)`` stored under the given ascending keys, in key order (a statement per 900;
        read through ``db``, else the store's own connection)."""
        found, vectors = [np.empty(0, np.int64)], [np.empty((0, self.dim), np.float32)]
        for part in chunks(list(keys), CHUNK):
            for kk, vv in self._iter_vectors(f"key IN ({','.join('?' * len(part))})", part, db):
                found.append(kk)
                vectors.append(vv)
        return np.concatenate(found), np.concatenate(vectors)

    def _exact_keys(self, q: np.ndarray, k: int, keys: np.ndarray, metric: str) -> tuple[np.ndarray, np.ndarray]:
        """The keys and scores of each query's ``k`` best rows among those of ``keys``, by exact scores on
        their stored vectors."""
        all_keys, vectors = self._key_vectors(np.sort(keys).tolist())
        scores = exact_scores(q, vectors, metric)
        best = top_k(scores, k)
        return all_keys[best], scores[np.arange(len(q))[:, None], best]

    def _field_counts(self, keys: Sequence[int]) -> Counter[str]:
        """How many of the given rows have each metadata key."""
        counts: Counter[str] = Counter()
        for part in chunks(keys, CHUNK):
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

    def set_properties(self, **kv: str) -> None:
        """Set persisted string properties (committed with the data)."""
        props = check_properties(kv)
        self._begin()
        self._conn.executemany("INSERT OR REPLACE INTO properties (key, value) VALUES (?, ?)", props.items())

    @property
    def properties(self) -> dict[str, str]:
        """The persisted ``dict[str, str]`` committed with the data (the encoder's fingerprint, index settings)."""
        return dict(self._conn.execute("SELECT key, value FROM properties").fetchall())
