"""What hybrid search reads of its candidate rows, the ``vector`` and ``terms`` columns, copied per Lance
fragment into files beside a local table and read through memory maps.

Hybrid search completes each side's candidates with what fusion needs: the keyword rows' vectors and the
dense rows' terms (for their BM25). A take of 150 scattered rows from Lance costs 1 to 1.5 ms a column at
100,000 rows, and Lance runs both sides' reads on one compute thread on 2 cores; from a memory-mapped copy
it is a NumPy gather. At 100,000 rows, one process alternating query by query, three rounds of 200
queries: hybrid 10.0 to 11.3 ms with both takes, 7.9 to 8.6 ms with the copies (dense 5.1 to 5.9 ms), the
same top 10, ids and scores. The cost: a second copy of the two columns on disk (at 384 dimensions about
1.7 kB a row) and writing it once per fragment (0.2 to 1.5 s at 100,000 rows).

The copies live in ``<table>.copies/`` beside ``<table>.lance``: for each fragment, ``<name>.npy`` (its
rows' vectors, float32) and ``<name>.arrow`` (Arrow IPC: each row's offset in the fragment and its terms),
in the fragment's row order. ``<name>`` is the fragment id and a digest of its data files, which Lance
never rewrites: a copy describes fixed content. A deletion leaves it valid (a search never returns a
deleted row); a compaction, an update or a rewritten column makes new fragments or files, hence new
names. ``sync`` (at commit) writes the copies a table's fragments lack, each file under a temporary name
and renamed (the ``.npy``, which readers look for, last), and removes the rest. A row whose fragment has
no readable copy (a bulk load's rows before its last commit, a file removed) is read from Lance: the copies
make reads faster, never different.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from .lance_rows import to_numpy

logger = logging.getLogger(__name__)

#: the copies of table T are in ``T.copies/`` (not ``*.lance``: LanceDB lists no such table)
SUFFIX = ".copies"
#: a Lance row id (no stable row ids) is its fragment id << 32 | its offset in the fragment
_OFFSET_BITS = 32
_OFFSET_MASK = np.uint64((1 << _OFFSET_BITS) - 1)
#: rows per batch copied (at 100,000 rows, batches of 65,536 raised the copying process's peak by 420 MB, of 8,192 by 240)
_BATCH = 8_192
_SCHEMA = pa.schema([("offset", pa.uint32()), ("terms", pa.string())])


@dataclass(frozen=True)
class FragmentCopy:
    """One fragment's copied rows: their offsets in the fragment (ascending), vectors and terms (in chunks
    of the file's record batches, which ``starts`` at these rows)."""

    offsets: np.ndarray
    vectors: np.ndarray
    terms: pa.ChunkedArray
    starts: np.ndarray

    def positions(self, offsets: np.ndarray) -> np.ndarray | None:
        """The copy's row of each fragment offset, or None if one is not copied."""
        # in the copy's own type (uint32): searching it for uint64 offsets casts the whole column, 0.5 ms at 1M rows
        offsets = offsets.astype(self.offsets.dtype)
        found = np.searchsorted(self.offsets, offsets)
        if len(found) and (found.max() >= len(self.offsets) or not np.array_equal(self.offsets[found], offsets)):
            return None
        return found

    def terms_at(self, positions: np.ndarray) -> pa.Array:
        """The terms of the copy's rows at ``positions``, in their order: taken chunk by chunk (a take over
        the chunked column would join its chunks first, a copy of the whole column)."""
        order = np.argsort(positions, kind="stable")
        ordered = positions[order]
        bounds = np.searchsorted(ordered, self.starts)
        parts = [
            self.terms.chunk(i).take(pa.array(ordered[low:high] - self.starts[i]))
            for i, (low, high) in enumerate(itertools.pairwise(bounds))
            if high > low
        ]
        return _in_order(parts, order)


def _in_order(parts: list[pa.Array], order: np.ndarray) -> pa.Array:
    """``parts`` joined, row ``j`` of the join put at ``order[j]``."""
    joined = pa.concat_arrays(parts) if len(parts) != 1 else parts[0]
    return joined.take(pa.array(np.argsort(order, kind="stable")))


def copy_name(fragment: Any) -> str:
    """A fragment's copy name: its id and a digest of the data it holds (its files and overlays)."""
    meta = fragment.metadata.to_json()
    held = json.dumps({key: meta.get(key) for key in ("files", "overlays", "physical_rows")}, sort_keys=True)
    return f"{fragment.fragment_id}-{hashlib.sha256(held.encode()).hexdigest()[:20]}"


class FragmentCopies:
    """The ``vector`` and ``terms`` copies of a local Lance table's fragments (``dim``-wide vectors)."""

    def __init__(self, table_uri: str, dim: int) -> None:
        self.folder = Path(table_uri).with_suffix(SUFFIX)
        self.dim = dim
        self._names: tuple[tuple[str, int], dict[int, str]] | None = None  # (uri, version) -> fragment id -> name
        self._open: dict[str, FragmentCopy | None] = {}  # by name; None: unreadable

    def _names_of(self, dataset: Any) -> dict[int, str]:
        """Each fragment id of ``dataset``'s version and its copy's name (looked up once per version)."""
        key = (dataset.uri, dataset.version)
        if self._names is None or self._names[0] != key:
            names = {fragment.fragment_id: copy_name(fragment) for fragment in dataset.get_fragments()}
            self._open = {name: self._open[name] for name in names.values() if name in self._open}
            self._names = (key, names)
        return self._names[1]

    def sync(self, dataset: Any) -> None:
        """Write the copies ``dataset``'s fragments lack and remove every other file in the folder."""
        names = self._names_of(dataset)
        self.folder.mkdir(exist_ok=True)
        present = {path.name for path in self.folder.iterdir()}
        wanted = {f"{name}{ext}" for name in names.values() for ext in (".arrow", ".npy")}
        for fragment in dataset.get_fragments():
            name = names[fragment.fragment_id]
            if not ({f"{name}.arrow", f"{name}.npy"} <= present and self._copy(name) is not None):
                self._write(dataset, fragment, name)
                self._open.pop(name, None)
        for left in present - wanted:
            (self.folder / left).unlink(missing_ok=True)

    def _write(self, dataset: Any, fragment: Any, name: str) -> None:
        """Copy one fragment's rows: the Arrow file, then the vectors, each renamed into place when whole."""
        rows = fragment.count_rows()
        logger.debug("copying %d rows of fragment %d to %s", rows, fragment.fragment_id, self.folder)
        vectors_tmp, terms_tmp = self.folder / f"{name}.npy.tmp", self.folder / f"{name}.arrow.tmp"
        scanner = dataset.scanner(columns=["vector", "terms"], fragments=[fragment], with_row_id=True, batch_size=_BATCH)
        header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)), "fortran_order": False, "shape": (rows, self.dim)}
        with open(vectors_tmp, "wb") as vectors_file, open(terms_tmp, "wb") as terms_file:
            np.lib.format.write_array_header_1_0(vectors_file, header)
            with pa.ipc.new_file(terms_file, _SCHEMA) as writer:
                for batch in scanner.to_batches():
                    row_ids = batch.column("_rowid").to_numpy()
                    vectors = to_numpy(batch.column("vector"), self.dim, pa.array(row_ids), "vector")
                    vectors.tofile(vectors_file)
                    offsets = pa.array((row_ids & _OFFSET_MASK).astype(np.uint32))
                    writer.write_batch(pa.record_batch([offsets, batch.column("terms")], schema=_SCHEMA))
            for file in (vectors_file, terms_file):
                file.flush()
                os.fsync(file.fileno())
        os.replace(terms_tmp, self.folder / f"{name}.arrow")
        os.replace(vectors_tmp, self.folder / f"{name}.npy")

    def _copy(self, name: str) -> FragmentCopy | None:
        """One fragment's copy, memory-mapped on first use; None if it is missing or unreadable (an unreadable
        one is remembered as such, a missing one looked for again)."""
        if name in self._open:
            return self._open[name]
        try:
            vectors = np.load(self.folder / f"{name}.npy", mmap_mode="r")
            table = pa.ipc.open_file(pa.memory_map(str(self.folder / f"{name}.arrow"))).read_all()
        except FileNotFoundError:
            return None
        except (OSError, ValueError, pa.ArrowInvalid) as error:
            logger.warning("copy %s in %s unreadable (%s): its rows are read from the table", name, self.folder, error)
            self._open[name] = None
            return None
        offsets, terms = table.column("offset").to_numpy(), table.column("terms")
        if vectors.shape != (len(offsets), self.dim) or vectors.dtype != np.float32:
            logger.warning(
                "copy %s in %s holds %s vectors for %d rows: its rows are read from the table",
                name,
                self.folder,
                vectors.shape,
                len(offsets),
            )
            self._open[name] = None
            return None
        self._open[name] = FragmentCopy(offsets, vectors, terms, np.cumsum([0, *(len(chunk) for chunk in terms.chunks)]))
        return self._open[name]

    def _located(self, dataset: Any, rows: Sequence[int]) -> list[tuple[np.ndarray, FragmentCopy, np.ndarray]] | None:
        """``(where in rows, copy, its positions)`` per fragment of Lance row ids ``rows``; None if one is not copied."""
        row_ids = np.asarray(rows, dtype=np.uint64)
        fragments, offsets = row_ids >> np.uint64(_OFFSET_BITS), row_ids & _OFFSET_MASK
        names = self._names_of(dataset)
        out = []
        for fragment in np.unique(fragments):
            name = names.get(int(fragment))
            copy = None if name is None else self._copy(name)
            where = np.flatnonzero(fragments == fragment)
            found = None if copy is None else copy.positions(offsets[where])
            if copy is None or found is None:
                return None
            out.append((where, copy, found))
        return out

    def vectors(self, dataset: Any, rows: Sequence[int]) -> np.ndarray | None:
        """The copied vectors of Lance row ids ``rows`` (of ``dataset``'s version), or None if one is not copied."""
        located = self._located(dataset, rows)
        if located is None:
            return None
        out = np.empty((len(rows), self.dim), dtype=np.float32)
        for where, copy, found in located:
            out[where] = copy.vectors[found]
        return out

    def terms(self, dataset: Any, rows: Sequence[int]) -> pa.Array | None:
        """The copied terms of Lance row ids ``rows``, or None if one is not copied."""
        located = self._located(dataset, rows)
        if located is None:
            return None
        parts = [copy.terms_at(found) for _, copy, found in located]
        if len(parts) < 2:
            return parts[0] if parts else pa.array([], pa.string())
        return _in_order(parts, np.concatenate([where for where, _, _ in located]))
