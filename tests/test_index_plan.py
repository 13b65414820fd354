"""--index auto: the index follows the row count, its breadth is calibrated for recall, optimize keeps every row.

Recall is checked against an independent exact search (NumPy float64, full sort) with fresh queries.
"""

from __future__ import annotations

import json

import faiss
import numpy as np
import pytest
from lancedb.index import IvfPq

from conftest import make_sentences
from isotrope.connectors.faiss_store import FaissStore
from isotrope.connectors.lancedb_store import LanceDBStore
from isotrope.stores import index_plan

DIM = 32
CENTRES = np.random.default_rng(123).standard_normal((40, DIM)).astype(np.float32)


def draw(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    vectors = CENTRES[rng.integers(0, len(CENTRES), n)] + 0.6 * rng.standard_normal((n, DIM)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def brute_force(queries: np.ndarray, data: np.ndarray, k: int = 10) -> np.ndarray:
    scores = queries.astype(np.float64) @ data.astype(np.float64).T
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


def recall_of(hits: list, truth: np.ndarray) -> float:
    found = [{int(hit.id) for hit in row} for row in hits]
    return float(np.mean([len(f & set(t.tolist())) / len(t) for f, t in zip(found, truth)]))


@pytest.fixture
def small_threshold(monkeypatch):
    monkeypatch.setattr(index_plan, "EXACT_BELOW", 1000)


def fill(store, data: np.ndarray, batch: int = 700, first: int = 0) -> None:
    """Add ``data`` as ids ``first``, ``first + 1``, ... committing every ``batch`` rows."""
    for start in range(0, len(data), batch):
        part = data[start : start + batch]
        store.add([str(first + start + i) for i in range(len(part))], part)
        store.commit()


def test_rules_follow_the_count():
    assert index_plan.faiss_factory_for(index_plan.EXACT_BELOW - 1) == "Flat"
    assert index_plan.faiss_factory_for(400_000) == "IVF2048,SQ8"  # 4 sqrt(n) = 2530
    assert index_plan.faiss_factory_for(1_000_000) == "IVF8192,SQ8"  # from 500,000 rows 8 sqrt(n) = 8000
    assert index_plan.nlist_for(100_000) == 1024 and index_plan.nlist_for(10) == 64
    assert index_plan.nlist_for(9000) == 128  # 4 sqrt(n) = 379, but 39 training points per list allow 230
    assert index_plan.lancedb_index_for(index_plan.EXACT_BELOW - 1, 384) is None
    assert index_plan.lancedb_ivf_pq_for(1_000_000, 384) == {"num_partitions": 1000, "num_sub_vectors": 48}
    plan = index_plan.lancedb_index_for(1_000_000, 384)
    assert plan == {"type": "hnsw_sq", "num_partitions": 2, **index_plan.HNSW_BUILD}  # 524,288 rows a graph
    assert index_plan.lancedb_index_for(1_083_961, 384)["num_partitions"] == 3  # the scale benchmark's million
    assert index_plan.lancedb_index_for(index_plan.EXACT_BELOW, 384)["num_partitions"] == 1


def test_kmeans_iterations_stay_within_the_work_budget():
    assert index_plan.kmeans_iterations(39 * 4096, 4096) == 10  # the budget: 4,096 lists at faiss's default
    assert index_plan.kmeans_iterations(200_000, 8192) == 4  # a million rows' 8,192 lists
    assert index_plan.kmeans_iterations(200_000, 65_536) == 4  # never fewer than 4
    assert index_plan.kmeans_iterations(3000, 64) == 10  # never more than faiss's default
    assert index_plan.two_level_start(200_000, 8192) and not index_plan.two_level_start(39 * 1024, 1024)


def test_capped_training_starts_its_lists_from_two_levels(tmp_path, monkeypatch):
    """With its iterations cut (here to one), k-means started from two levels ends nearer the data than faiss's
    start from random rows at the same iteration, on the same sample (mean squared distance to the nearest
    list, NumPy float64): 256 tight clusters in 16 groups, as passages group by topic."""
    monkeypatch.setattr(index_plan, "kmeans_iterations", lambda points, nlist: 1)
    rng = np.random.default_rng(2)
    groups = rng.normal(0.0, 20.0, (16, 16))
    clusters = np.repeat(groups, 16, axis=0) + rng.normal(0.0, 3.0, (256, 16))
    data = (np.repeat(clusters, 40, axis=0) + rng.normal(0.0, 1.0, (256 * 40, 16))).astype(np.float32)
    store = FaissStore(tmp_path / "s", dim=16, index="IVF256,Flat", metric="l2")
    fill(store, data, batch=len(data))
    ivf = faiss.extract_index_ivf(store._index)
    lists = ivf.quantizer.reconstruct_n(0, ivf.nlist)
    reference = faiss.index_factory(16, "IVF256,Flat")
    faiss.extract_index_ivf(reference).cp.niter = 1
    reference.train(store._training_sample(len(store), ivf))
    random_start = faiss.extract_index_ivf(reference).quantizer.reconstruct_n(0, 256)
    store.close()

    def spread(centroids: np.ndarray) -> float:
        return float((((data[:, None, :] - centroids[None]).astype(np.float64)) ** 2).sum(-1).min(1).mean())

    assert spread(lists) < 0.9 * spread(random_start)


@pytest.mark.parametrize("block", [1 << 23, 7 * 37])  # whole batches; blocks of 37 rows across the batches' ends
def test_exact_neighbours_matches_a_full_sort(monkeypatch, block):
    monkeypatch.setattr(index_plan, "SCORE_BLOCK", block)
    data, queries = draw(3000, 1), draw(7, 2)
    batches = ((np.arange(s, s + 500) + 100, data[s : s + 500]) for s in range(0, 3000, 500))
    found = index_plan.exact_neighbours(queries, batches, 10, "ip")
    np.testing.assert_array_equal(found, brute_force(queries, data) + 100)


def test_calibrate_takes_the_smallest_setting_reaching_the_target():
    truth = np.array([[1, 2, 3, 4]])
    results = {1: [[1]], 2: [[1, 2, 3]], 4: [[1, 2, 3, 4]], 8: [[1, 2, 3, 4]]}
    assert index_plan.calibrate([1, 2, 4, 8], results.__getitem__, truth, target=0.7) == (2, 0.75)
    assert index_plan.calibrate([1, 2], results.__getitem__, truth, target=0.9) == (2, 0.75)


def test_faiss_auto_switches_to_ivf_with_recall_over_the_target(tmp_path, small_threshold):
    data, queries = draw(4000, 3), draw(100, 4)
    store = FaissStore(tmp_path / "s", dim=DIM, index="auto", metric="ip")
    fill(store, data[:700])
    assert store.index_info()["index_built"] == "Flat" and store.is_exact
    fill(store, data[700:], batch=1100, first=700)
    info = store.index_info()
    assert info["index_built"] == index_plan.faiss_factory_for(4000) and not store.is_exact
    assert info["calibrated_recall_at_10"] >= index_plan.TARGET_RECALL
    assert info["nprobe"] < info["nlist"]  # calibration stopped before searching everything
    assert recall_of(store.search(queries, 10), brute_force(queries, data)) >= index_plan.TARGET_RECALL
    store.close()
    reopened = FaissStore(tmp_path / "s")  # the calibrated breadth is saved with the index
    assert reopened.nprobe == info["nprobe"] and reopened.index_info() == info
    reopened.close()


def test_finer_ladder_puts_one_and_a_half_steps_between_doublings():
    assert index_plan.finer((1, 2, 4, 8, 16)) == (1, 2, 3, 4, 6, 8, 12, 16)
    assert index_plan.finer(index_plan.EF_LADDER)[:4] == (16, 24, 32, 48)


def assert_smallest_breadth_reaching(store, name, queries, data, target, ladder):
    """The breadth ``calibrate(queries=...)`` chose is the first of ``ladder`` whose recall on the queries,
    against a NumPy brute force, reaches ``target`` (each smaller one falls short); it is saved."""
    truth = brute_force(queries, data)
    chosen = getattr(store, name)
    reached = {}
    for value in ladder[: ladder.index(chosen) + 1]:
        setattr(store, name, value)
        reached[value] = recall_of(store.search(queries, 10), truth)
    setattr(store, name, chosen)
    assert reached[chosen] >= target and all(r < target for v, r in reached.items() if v < chosen)
    assert store.index_info()["calibrated_recall_at_10"] == pytest.approx(reached[chosen], abs=1e-4)


@pytest.mark.parametrize("kind", ["faiss", "lancedb"])
def test_calibrating_on_queries_sets_the_smallest_breadth_reaching_the_target(kind, tmp_path):
    data, queries = draw(3000, 5), draw(80, 6) * 0.5 + draw(80, 7) * 0.5  # between clusters: harder queries
    if kind == "faiss":
        store = FaissStore(tmp_path / "s", dim=DIM, index="IVF64,Flat", metric="ip")
        fill(store, data, batch=3000)
        name, ladder = "nprobe", index_plan.finer([p for p in index_plan.NPROBE_LADDER if p <= 64])
    else:
        store = LanceDBStore(tmp_path / "db", dim=DIM, metric="ip", index="flat")
        fill(store, data, batch=3000)
        store.create_index(IvfPq(distance_type="dot", num_partitions=64, num_sub_vectors=DIM // 4))
        name, ladder = "nprobe", index_plan.finer(index_plan.NPROBE_LADDER)
    index_file = tmp_path / "s" / "index.faiss"
    written = (index_file.stat().st_ino, index_file.stat().st_mtime_ns) if kind == "faiss" else None
    for target in (0.9, 0.99):
        settings = store.calibrate(target, queries=queries)
        assert settings and int(next(iter(settings.values()))) == getattr(store, name)
        assert_smallest_breadth_reaching(store, name, queries, data, target, list(ladder))
    store.commit()
    if kind == "faiss":  # the settings are committed without writing the index again
        assert (index_file.stat().st_ino, index_file.stat().st_mtime_ns) == written
    store.close()
    reopened = FaissStore(tmp_path / "s") if kind == "faiss" else LanceDBStore(tmp_path / "db")
    assert getattr(reopened, name) == int(next(iter(settings.values())))  # saved with the index
    reopened.close()


def test_faiss_nprobe_override_takes_effect(tmp_path, small_threshold):
    data, queries = draw(3000, 5), draw(50, 6)
    store = FaissStore(tmp_path / "s", dim=DIM, index="auto", metric="ip")
    fill(store, data, batch=3000)
    store.close()
    nlist = index_plan.nlist_for(3000)
    bare = faiss.read_index(str(tmp_path / "s" / "index.faiss"))
    recalls = []
    for nprobe in (1, nlist):  # one list, then every list
        store = FaissStore(tmp_path / "s", nprobe=nprobe)
        _, keys = bare.search(queries, 10, params=faiss.SearchParametersIVF(nprobe=nprobe))
        hits = store.search(queries, 10)
        assert [[int(h.id) for h in row] for row in hits] == [[int(key) - 1 for key in row if key >= 0] for row in keys]
        recalls.append(recall_of(hits, brute_force(queries, data)))  # keys are 1-based rowids
        store.close()
    assert recalls[0] < 0.9 < recalls[1]  # SQ8 codes: every list is near exact, not exact


def test_faiss_optimize_keeps_every_row_and_resizes(tmp_path, small_threshold):
    data = draw(9000, 7)
    store = FaissStore(tmp_path / "s", dim=DIM, index="auto", metric="ip")
    fill(store, data[:3000], batch=3000)  # built at 3000 rows
    assert store.index_info()["nlist"] == index_plan.nlist_for(3000)
    store.add([str(i) for i in range(3000, 9000)], data[3000:])
    store.commit()  # grown 3x: below the rebuild factor, the index keeps its lists
    assert store.index_info()["nlist"] == index_plan.nlist_for(3000) != index_plan.nlist_for(9000)
    store.delete(["5", "6"])
    store.optimize()
    assert store.index_info()["nlist"] == index_plan.nlist_for(8998)
    assert sorted(store.ids(), key=int) == [str(i) for i in range(9000) if i not in (5, 6)]
    assert store._index.ntotal == 8998
    np.testing.assert_array_equal(store.vectors(["7", "8999"]), data[[7, 8999]])
    store.close()


def test_faiss_index_is_memory_mapped_until_written(tmp_path, small_threshold):
    data = draw(3000, 8)
    store = FaissStore(tmp_path / "s", dim=DIM, index="auto", metric="ip")
    fill(store, data, batch=3000)
    store.close()
    assert not FaissStore(tmp_path / "s")._mapped  # read into memory by default
    reopened = FaissStore(tmp_path / "s", mmap_index=True)
    assert reopened._mapped  # IVF lists read through a memory map
    before = reopened.search(data[:3], 5)
    reopened.add(["new"], data[:1] * -1)
    reopened.commit()
    assert reopened._mapped is False and len(reopened) == reopened._index.ntotal == 3001
    assert [h.id for h in reopened.search(data[:3], 5)[0]] == [h.id for h in before[0]]
    reopened.close()


@pytest.mark.slow
def test_lancedb_auto_builds_a_calibrated_index_and_optimize_keeps_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(index_plan, "EXACT_BELOW", 2000)
    data, queries = draw(3000, 9), draw(50, 10)
    store = LanceDBStore(tmp_path / "db", dim=DIM, metric="ip", index="auto")
    fill(store, data[:1500], batch=1500)
    assert store.vector_index is None
    fill(store, data[1500:], batch=1500, first=1500)
    info = store.index_info()
    assert info["index_built"] == "IvfHnswSq" and info["num_partitions"] == 1 and info["nprobe"] == 1
    assert info["ef"] in index_plan.EF_LADDER
    assert info["calibrated_recall_at_10"] >= index_plan.TARGET_RECALL
    assert recall_of(store.search(queries, 10), brute_force(queries, data)) >= index_plan.TARGET_RECALL
    store.close()
    reopened = LanceDBStore(tmp_path / "db", ef=16)  # the override wins over the saved breadth
    assert reopened.index == "auto" and reopened.ef == 16
    reopened.delete(["3"])
    reopened.optimize()
    assert sorted(reopened.ids(), key=int) == [str(i) for i in range(3000) if i != 3]
    assert reopened.index_info()["index_built"] == "IvfHnswSq"
    reopened.close()


def test_cli_index_info_search_optimize(monkeypatch, capsys, tmp_path, tiny_bert_path):
    from test_cli import run_cli

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("\n\n".join(make_sentences(40, seed=3)))
    store = f"faiss:{tmp_path / 's'}"
    code, out, err = run_cli(
        monkeypatch,
        capsys,
        "index",
        docs,
        "--store",
        store,
        "--model",
        tiny_bert_path,
        "--shape",
        "center",
        "--chunk-tokens",
        "16",
        "--overlap-tokens",
        "0",
    )
    assert code == 0, err
    code, out, err = run_cli(monkeypatch, capsys, "info", store)
    info = json.loads(out)
    assert (info["index"], info["index_built"], info["index_exact"]) == ("auto", "Flat", True)
    code, out, err = run_cli(monkeypatch, capsys, "search", store, "the cat", "--nprobe", "0")
    assert code != 0 and "--nprobe" in err
    code, out, err = run_cli(monkeypatch, capsys, "search", store, "the cat", "--nprobe", "3", "--json", "-k", "2")
    assert code == 0, err
    code, out, err = run_cli(monkeypatch, capsys, "optimize", store)
    assert code == 0, err
    assert json.loads(out)["chunks"] == info["chunks"]
    queries = tmp_path / "queries.txt"
    queries.write_text("\n".join(make_sentences(30, seed=8)))
    code, out, err = run_cli(monkeypatch, capsys, "calibrate", store, queries)  # an exact index: nothing to set
    assert code == 0, err
    assert json.loads(out)["index_exact"] is True
    ivf, more = f"faiss:{tmp_path / 'ivf'}", tmp_path / "more.txt"
    more.write_text("\n\n".join(make_sentences(400, seed=4)))  # enough chunks to train 4 lists
    args = ("--model", tiny_bert_path, "--shape", "center", "--chunk-tokens", "16", "--overlap-tokens", "0")
    code, out, err = run_cli(monkeypatch, capsys, "index", more, "--store", ivf, "--index", "IVF4,Flat", *args)
    assert code == 0, err
    code, out, err = run_cli(monkeypatch, capsys, "calibrate", ivf, queries, "--target", "0.99")
    assert code == 0, err
    calibrated = json.loads(out)
    assert calibrated["nprobe"] in index_plan.finer([1, 2, 4]) and calibrated["calibrated_recall_at_10"] >= 0.99
    code, out, err = run_cli(monkeypatch, capsys, "info", ivf)
    assert json.loads(out)["nprobe"] == calibrated["nprobe"]  # saved
    code, out, err = run_cli(monkeypatch, capsys, "calibrate", ivf, tmp_path / "missing.txt")
    assert code != 0 and "missing.txt" in err and "Traceback" not in err
    lance = ("index", docs, "--store", f"lancedb:{tmp_path / 'l'}", "--model", tiny_bert_path)
    code, out, err = run_cli(monkeypatch, capsys, *lance, "--index", "ivf")
    assert code != 0 and "--index" in err and "ivf" in err
    code, out, err = run_cli(monkeypatch, capsys, *lance, "--factory", "HNSW32")  # the old flag: an alias of --index
    assert code != 0 and "--factory is deprecated" in err and "unknown index 'HNSW32'" in err
