"""The set of metadata field names each store keeps on write (filters naming another field are refused
without a pass over the rows): always equal to the keys of the stored rows, through upserts, deletes,
reopening, an interrupted writer and a store written before the set existed."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

pytest.importorskip("faiss")
pytest.importorskip("lancedb")
from isotrope.connectors.faiss_store import DB_NAME, FaissStore
from isotrope.connectors.lancedb_store import LanceDBStore
from isotrope.stores.filters import check_fields

DIM = 8
KINDS = ["faiss", "faiss-ivf", "lance"]


def open_store(kind, tmp_path, **kw):
    if kind.startswith("faiss"):
        return FaissStore(tmp_path / kind, DIM, index="IVF4,Flat" if kind == "faiss-ivf" else "flat", **kw)
    return LanceDBStore(tmp_path / "lance", dim=DIM, index="flat", **kw)


def reopen(kind, store, tmp_path):
    store.commit()
    store.close()
    return FaissStore(tmp_path / kind) if kind.startswith("faiss") else LanceDBStore(tmp_path / "lance")


def stored_keys(store):
    """The reference: the keys of every stored row's metadata, read row by row."""
    return {key for hit in store.get(store.ids()) for key in hit.metadata}


def vectors(n, seed=0):
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


@pytest.mark.parametrize("kind", KINDS)
def test_field_set_follows_adds_upserts_deletes_and_reopening(kind, tmp_path):
    store = open_store(kind, tmp_path)
    assert store.metadata_fields() == set()
    ids = [f"r{i}" for i in range(300)]
    meta = [{"source": f"s{i % 3}", **({"year": i} if i % 2 else {}), **({"rare": 1} if i in (7, 8) else {})} for i in range(300)]
    store.add(ids[:150], vectors(150), None, meta[:150])
    store.add(ids[150:], vectors(150, 1), None, meta[150:])
    assert store.metadata_fields() == stored_keys(store) == {"source", "year", "rare"}
    store = reopen(kind, store, tmp_path)
    assert store.metadata_fields() == {"source", "year", "rare"}

    # an upsert replaces r7's metadata: "rare" stays (r8 has it), "lang" arrives
    store.add(["r7", "new"], vectors(2, 2), None, [{"lang": "en"}, {"source": "x"}])
    assert store.metadata_fields() == stored_keys(store) == {"source", "year", "rare", "lang"}
    # replacing r8 too removes the last row with "rare"
    store.add(["r8"], vectors(1, 3), None, [{"source": "y"}])
    assert store.metadata_fields() == stored_keys(store) == {"source", "year", "lang"}
    store = reopen(kind, store, tmp_path)
    assert store.metadata_fields() == {"source", "year", "lang"}

    # deleting every row with "year" removes it; unknown ids change nothing
    store.delete([hit.id for hit in store.get(store.ids()) if "year" in hit.metadata] + ["never-stored"])
    assert store.metadata_fields() == stored_keys(store) == {"source", "lang"}
    store = reopen(kind, store, tmp_path)
    assert store.metadata_fields() == {"source", "lang"}
    with pytest.raises(ValueError, match=r"^unknown filter field 'year'; the stored metadata fields are: lang, source$"):
        check_fields({"year": {"$ne": 3}}, store.metadata_fields())
    store.delete(store.ids())
    store = reopen(kind, store, tmp_path)
    assert store.metadata_fields() == set()


@pytest.mark.parametrize("kind", ["faiss", "faiss-ivf"])
def test_faiss_keeps_field_counts_in_sqlite(kind, tmp_path):
    store = open_store(kind, tmp_path)
    store.add(["a", "b", "c"], vectors(3), None, [{"x": 1, "y": 2}, {"x": 3}, {}])
    store.add(["b"], vectors(1), None, [{"y": 1, "z": 1}])
    store.commit()
    counts = dict(store._conn.execute("SELECT name, rows FROM metadata_fields"))
    assert counts == {"x": 1, "y": 2, "z": 1}
    store.delete(["a"])
    assert dict(store._conn.execute("SELECT name, rows FROM metadata_fields")) == {"y": 1, "z": 1}
    store.close()  # uncommitted: the delete and its counts are discarded together
    store = FaissStore(tmp_path / kind)
    assert dict(store._conn.execute("SELECT name, rows FROM metadata_fields")) == {"x": 1, "y": 2, "z": 1}


def test_faiss_store_from_before_the_field_counts(tmp_path):
    """A store without the metadata_fields table answers by a scan, and its first write creates the table."""
    store = open_store("faiss", tmp_path)
    store.add(["a", "b"], vectors(2), None, [{"x": 1}, {"y": 2}])
    store.commit()
    store.close()
    with sqlite3.connect(tmp_path / "faiss" / DB_NAME) as conn:
        conn.execute("DROP TABLE metadata_fields")
    store = FaissStore(tmp_path / "faiss")
    assert store.metadata_fields() == {"x", "y"}
    store.delete(["a"])
    store.commit()
    assert dict(store._conn.execute("SELECT name, rows FROM metadata_fields")) == {"y": 1}
    assert store.metadata_fields() == {"y"}


def test_lance_reads_the_saved_field_set_without_a_scan(tmp_path, monkeypatch):
    store = open_store("lance", tmp_path)
    store.add(["a", "b"], vectors(2), None, [{"x": 1}, {"y": 2}])
    store = reopen("lance", store, tmp_path)

    def no_scan(self):
        raise AssertionError("the metadata column was scanned")

    monkeypatch.setattr(LanceDBStore, "_scan_fields", no_scan)
    assert store.metadata_fields() == {"x", "y"}
    store.add(["c"], vectors(1), None, [{"z": 3}])  # new rows: the set grows without a scan
    assert store.metadata_fields() == {"x", "y", "z"}
    store.set_properties(note="a later version")
    store = reopen("lance", store, tmp_path)
    assert store.metadata_fields() == {"x", "y", "z"}


def test_lance_field_set_older_than_the_table_is_rescanned(tmp_path):
    """A writer that stopped before commit() leaves a saved set describing an older version: not trusted."""
    store = open_store("lance", tmp_path)
    store.add(["a"], vectors(1), None, [{"x": 1}])
    store = reopen("lance", store, tmp_path)
    store.add(["a", "b"], vectors(2), None, [{"y": 1}, {"z": 1}])  # r "a" loses "x"; no commit
    store.close()
    store = LanceDBStore(tmp_path / "lance")
    assert store.metadata_fields() == stored_keys(store) == {"y", "z"}
