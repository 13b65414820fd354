"""The store options every store shares (isotrope.stores.options): the same names and meanings in the
FAISS, LanceDB and memory stores, the default metric, and the per-store names they replaced, which keep
working for one release with a DeprecationWarning."""

from __future__ import annotations

import numpy as np
import pytest

from isotrope.stores.base import DEFAULT_METRIC
from isotrope.stores.memory import MemoryStore

pytest.importorskip("faiss")
pytest.importorskip("lancedb")
from isotrope.connectors.faiss_store import FaissStore
from isotrope.connectors.lancedb_store import LanceDBStore

DIM = 8


def test_every_new_store_defaults_to_the_same_metric_and_an_existing_one_keeps_its_own(tmp_path):
    stores = [MemoryStore(DIM), FaissStore(tmp_path / "f", DIM), LanceDBStore(tmp_path / "l", DIM)]
    assert [s.metric for s in stores] == [DEFAULT_METRIC] * 3 == ["ip"] * 3
    for store in stores[1:]:
        store.close()
    FaissStore(tmp_path / "fc", DIM, metric="cosine").close()
    LanceDBStore(tmp_path / "lc", DIM, metric="cosine").close()
    assert FaissStore(tmp_path / "fc").metric == LanceDBStore(tmp_path / "lc").metric == "cosine"


def test_the_shared_options_mean_the_same_in_both_stores(tmp_path):
    faiss_store = FaissStore(tmp_path / "f", DIM, index="flat", nprobe=3, ef=40, refine=2, threshold=70)
    lance = LanceDBStore(tmp_path / "l", DIM, index="flat", nprobe=3, ef=40, refine=2, threshold=70)
    assert (faiss_store.index, faiss_store.nprobe, faiss_store.ef, faiss_store.refine, faiss_store.threshold) == (
        "flat",
        3,
        40,
        2,
        70,
    )
    # a flat LanceDB table builds no index at any size; the threshold applies to the indexes it builds
    assert (lance.index, lance.nprobe, lance.ef, lance.refine, lance.threshold) == ("flat", 3, 40, 2, None)
    lance.close()
    assert LanceDBStore(tmp_path / "l").index == "flat"  # recorded with the table
    assert LanceDBStore(tmp_path / "l2", DIM, index="ivf_pq", threshold=70).threshold == 70
    faiss_store.close()
    assert FaissStore(tmp_path / "f").index == "flat" and FaissStore(tmp_path / "f", index="flat").index == "flat"
    assert MemoryStore(DIM, index="auto").dim == DIM
    with pytest.raises(ValueError, match="searches exactly"):
        MemoryStore(DIM, index="HNSW32")
    with pytest.raises(ValueError, match="unknown index 'IVF4,Flat'"):
        LanceDBStore(tmp_path / "l3", DIM, index="IVF4,Flat")
    with pytest.raises(ValueError, match="invalid index 'ivf_pq'"):
        FaissStore(tmp_path / "f2", DIM, index="ivf_pq")
    with pytest.raises(ValueError, match="nprobe must be an integer of at least 1"):
        FaissStore(tmp_path / "f3", DIM, nprobe=0)


@pytest.mark.parametrize(
    ("kind", "old", "value", "new", "expected"),
    [
        ("faiss", "factory", "HNSW32", "index", "HNSW32"),
        ("faiss", "ef_search", 33, "ef", 33),
        ("faiss", "train_min", 77, "threshold", 77),
        ("lancedb", "index_type", "hnsw_sq", "index", "hnsw_sq"),
        ("lancedb", "nprobes", 5, "nprobe", 5),
        ("lancedb", "refine_factor", 3, "refine", 3),
        ("lancedb", "index_threshold", 77, "threshold", 77),
    ],
)
def test_the_old_names_still_work_with_a_deprecation_warning(kind, old, value, new, expected, tmp_path):
    store_class = FaissStore if kind == "faiss" else LanceDBStore
    with pytest.warns(DeprecationWarning, match=f"'{old}' is deprecated.*use '{new}'"):
        store = store_class(tmp_path / kind, DIM, **{old: value})
    assert getattr(store, new) == expected
    with pytest.warns(DeprecationWarning, match=f"'{old}' is deprecated"):
        assert getattr(store, old) == expected  # the attribute under its old name too
    with pytest.raises(TypeError, match="given twice"):
        store_class(tmp_path / kind, DIM, **{old: value, new: value})
    store.close()


def test_old_lancedb_spellings_keep_their_meaning(tmp_path):
    with pytest.warns(DeprecationWarning):
        never = LanceDBStore(tmp_path / "a", dim=DIM, index_threshold=None)  # None was "never build an index"
    assert never.threshold is None
    assert LanceDBStore(tmp_path / "b", DIM, table="other").table_name == "other"  # dim second, as in FaissStore
    with pytest.raises(TypeError, match="unexpected option 'factory'"):
        LanceDBStore(tmp_path / "c", DIM, factory="Flat")


def test_optimize_takes_the_shared_index_name_and_the_old_one(tmp_path):
    store = FaissStore(tmp_path / "f", DIM)
    store.add([str(i) for i in range(50)], np.random.default_rng(0).standard_normal((50, DIM)))
    store.optimize(index="HNSW16")
    assert store.index_info()["index"] == "HNSW16" and "ef" in store.index_info()
    with pytest.warns(DeprecationWarning, match="'factory' is deprecated"):
        store.optimize(factory="flat")
    assert FaissStore.index.__get__(store) == "flat" and store.is_exact
    store.close()
