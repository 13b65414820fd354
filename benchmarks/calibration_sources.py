"""Issue 32: which calibration queries choose the search breadth real queries need, on a store the scale
benchmark built (``--keep``). At each breadth of the store's index (FAISS ``nprobe``, LanceDB ``ef``), through
the store's own search: recall@10 against exact search of the real held-out sentence queries, of the queries
made from stored vectors (``index_plan.calibration_set``, the rule before), and of pseudo-queries cut from the
stored chunks (``Collection.index_query_texts``), their source chunk kept or left out, those of them whose
source chunk is among their exact top 10, and those that are a whole line of the sentence file (as every real
query is) against those cut from within a line of several sentences; then the breadth each would
choose at each margin over 0.95 and the real queries' recall there. A FAISS IVF store also gets the other of
IVF,Flat / IVF,SQ8 on the very same lists (its coarse quantizer), searched bare, with and without an exact
re-ranking of 4 x 10 candidates, and the bytes each scans per real query.

    python -m benchmarks.calibration_sources --store faiss:DIR --data-dir ../shared/data \\
        --out benchmarks/results/calibration-sources-100k-faiss.json

Recall is deterministic (no timing): fine on a loaded machine.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import machine_info, set_threads
from benchmarks.scale import K, query_texts, read_sentences

MARGINS = (0.0, 0.01, 0.02, 0.03)
#: candidates per hit re-ranked by exact scores in the IVF,SQ8 rows
RERANK = 4

Search = Callable[[np.ndarray, int, int], list[list[int]]]


def recall_by_breadth(
    search: Search, ladder: list[int], queries: np.ndarray, truth: np.ndarray, sources: np.ndarray | None
) -> dict[int, float]:
    """Recall@10 at each breadth; with ``sources``, each query's source row is left out of what is found."""
    from isotrope.stores import index_plan

    out = {}
    for value in ladder:
        found = search(queries, K + (sources is not None), value)
        found_rows = index_plan.without_sources(found, sources, K) if sources is not None else [row[:K] for row in found]
        out[value] = round(index_plan.recall(found_rows, truth), 4)
    return out


def choices(recalls: dict[str, dict[int, float]], real: str) -> dict[str, Any]:
    """The breadth each set's recall first reaches 0.95 + margin at (None: never), and the real queries' recall there."""
    out: dict[str, Any] = {}
    for name, by_value in recalls.items():
        for margin in MARGINS if name != real else (0.0,):
            value = next((v for v, r in by_value.items() if r >= 0.95 + margin), None)
            out[f"{name} @ {0.95 + margin:.2f}"] = {
                "breadth": value,
                "real_recall": None if value is None else recalls[real][value],
            }
    return out


def ivf_variants(store: Any, vectors: np.ndarray, real: np.ndarray, truth: np.ndarray, ladder: list[int]) -> dict[str, Any]:
    """IVF,Flat against IVF,SQ8 (and SQ8 re-ranked) on the store's own coarse quantizer: real-query recall and
    the vector bytes scanned per query (probed lists' sizes x code size) at each nprobe."""
    import faiss

    from isotrope.stores import index_plan

    ivf = faiss.extract_index_ivf(store._index)
    metric = ivf.metric_type
    n, dim = vectors.shape
    rows = np.arange(n, dtype=np.int64)
    sample = vectors[np.sort(np.random.default_rng(0).choice(n, min(n, 39 * ivf.nlist), replace=False))]
    flat = faiss.IndexIVFFlat(ivf.quantizer, dim, ivf.nlist, metric)
    sq8 = faiss.IndexIVFScalarQuantizer(ivf.quantizer, dim, ivf.nlist, faiss.ScalarQuantizer.QT_8bit, metric)
    for index in (flat, sq8):  # the quantizer is trained: only SQ8's ranges are learnt
        index.train(sample)
        index.add_with_ids(vectors, rows)
    sizes = np.array([ivf.invlists.list_size(i) for i in range(ivf.nlist)])

    def bare(index: Any, rerank: bool) -> Search:
        def search(q: np.ndarray, k: int, nprobe: int) -> list[list[int]]:
            params = faiss.SearchParametersIVF(nprobe=nprobe)
            found = index.search(q, RERANK * k if rerank else k, params=params)[1]
            if rerank:
                scores = np.einsum("qcd,qd->qc", vectors[np.maximum(found, 0)], q)
                scores[found < 0] = -np.inf
                found = np.take_along_axis(found, np.argsort(-scores, axis=1, kind="stable")[:, :k], axis=1)
            return found.tolist()

        return search

    out: dict[str, Any] = {"nlist": ivf.nlist, "store_index": store.index_factory}
    for name, index, rerank in (("IVF,Flat", flat, False), ("IVF,SQ8", sq8, False), (f"IVF,SQ8 re-ranked x{RERANK}", sq8, True)):
        out[name] = {"recall_real": recall_by_breadth(bare(index, rerank), ladder, real, truth, None)}
    for name, code_bytes in (("IVF,Flat", 4 * dim), ("IVF,SQ8", dim)):
        out[name]["bytes_scanned_per_query"] = {
            p: int(sizes[ivf.quantizer.search(real, p)[1]].sum(axis=1).mean() * code_bytes) for p in ladder
        }
    out["target"] = index_plan.TARGET_RECALL
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", required=True, help="faiss:DIR or lancedb:DIR (a scale benchmark store)")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--queries", type=int, default=200, help="real queries, stored-vector queries and pseudo-queries, each")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    set_threads(args.threads)
    import faiss

    from isotrope.search import Collection
    from isotrope.stores import index_plan

    collection = Collection.open(args.store)
    store = collection.store
    ids, parts = [], []
    for chunk_ids, part in store.iter_vectors(65_536):
        ids.extend(chunk_ids)
        parts.append(np.asarray(part, dtype=np.float32))
    vectors = np.concatenate(parts)
    del parts
    n, dim = vectors.shape
    position = {id_: row for row, id_ in enumerate(ids)}
    exact = faiss.IndexFlat(dim, faiss.METRIC_L2 if store.metric == "l2" else faiss.METRIC_INNER_PRODUCT)
    exact.add(vectors)  # a cosine store keeps its vectors normalised: the inner product ranks them

    lines = read_sentences(args.data_dir)
    real = collection.encoder.encode(query_texts(lines, args.queries), kind="query").astype(np.float32)
    pseudo_texts, pseudo_ids = collection.index_query_texts(args.queries)
    assert pseudo_texts, "the store's chunks gave too few pseudo-queries"
    pseudo = collection.encoder.encode(pseudo_texts, kind="query").astype(np.float32)  # as Collection.index_queries
    line_set = set(lines)
    whole_line = np.array([text.strip() in line_set for text in pseudo_texts])
    pseudo_sources = np.array([position[i] for i in pseudo_ids], dtype=np.int64)
    chosen = np.sort(np.random.default_rng(1).choice(n, min(args.queries, n), replace=False))
    rows = np.arange(n, dtype=np.int64)
    batches = lambda: ((rows[s : s + 65_536], vectors[s : s + 65_536]) for s in range(0, n, 65_536))  # noqa: E731
    stored, stored_truth = index_plan.calibration_set(chosen, vectors[chosen], batches, store.metric)
    real_truth = exact.search(real, K)[1]
    pseudo_top = exact.search(pseudo, K + 1)[1]
    del exact

    info = store.index_info()
    if "ef" in info:
        knob = "ef"
        ladder = [v for v in index_plan.finer(index_plan.EF_LADDER) if v >= K * max(info.get("refine", 1), 1)]
    else:
        knob = "nprobe"
        ladder = list(index_plan.finer([p for p in index_plan.NPROBE_LADDER if p <= info["nlist"]]))

    def search(q: np.ndarray, k: int, value: int) -> list[list[int]]:
        setattr(store, knob, value)
        return [[position[hit.id] for hit in hits] for hits in store.search(q, k, with_text=False)]

    sets: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray | None]] = {
        "real held-out sentences": (real, real_truth, None),
        "stored vectors moved (before)": (stored, stored_truth, chosen),
        "pseudo-queries, source kept": (pseudo, pseudo_top[:, :K], None),
        "pseudo-queries, source left out": (pseudo, index_plan.without_sources(pseudo_top, pseudo_sources, K), pseudo_sources),
    }
    found_source = (pseudo_top[:, :K] == pseudo_sources[:, None]).any(axis=1)
    sets["pseudo-queries whose source is in their exact top 10"] = (pseudo[found_source], pseudo_top[found_source, :K], None)
    sets["pseudo-queries that are a whole line"] = (pseudo[whole_line], pseudo_top[whole_line, :K], None)
    sets["pseudo-queries cut from within a line"] = (pseudo[~whole_line], pseudo_top[~whole_line, :K], None)
    recalls = {}
    for name, (queries, truth, sources) in sets.items():
        recalls[name] = recall_by_breadth(search, ladder, queries, truth, sources)
        print(f"{name[:34]:34s}", " ".join(f"{v}:{r:.3f}" for v, r in recalls[name].items()), flush=True)
    result: dict[str, Any] = {
        "store": f"{collection.kind}:{Path(collection.path).name}",
        "chunks": n,
        "index": info,
        "knob": knob,
        "queries_each": args.queries,
        "pseudo_queries": len(pseudo),
        "pseudo_queries_source_in_top_10": int(found_source.sum()),
        "pseudo_queries_whole_lines": int(whole_line.sum()),
        "recall_at_10_by_breadth": recalls,
        "chosen": choices(recalls, "real held-out sentences"),
        "machine": {**machine_info(), "threads": args.threads},
    }
    print(json.dumps(result["chosen"], indent=1), flush=True)
    if knob == "nprobe":
        result["ivf_flat_vs_sq8"] = ivf_variants(store, vectors, real, real_truth, ladder)
        for name in ("IVF,Flat", "IVF,SQ8", f"IVF,SQ8 re-ranked x{RERANK}"):
            print(f"{name:24s}", " ".join(f"{v}:{r:.3f}" for v, r in result["ivf_flat_vs_sq8"][name]["recall_real"].items()))
    collection.close()
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
