"""Probe (research, not the product): variants of the ``fast`` table on one BEIR set, from one cached
teacher pass. Each variant is scored on the test labels (nDCG@10) and on the held-aside pseudo-queries
(MRR@10, the label-free signal ``distill`` uses), with the same sampling, held-aside split and proxy as
:func:`isotrope.distill.distill_table`. Fits use the training rows only (held-aside chunks out).

    python -m benchmarks.fast_variants_probe --cache-dir .cache/isotrope --sets S/sick-para S/20ng-topic
"""

from __future__ import annotations

import argparse
import json
import logging
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from scipy import sparse

from isotrope import distill
from isotrope.backbones.hf import HFBackbone
from isotrope.backbones.static import _input_embeddings
from isotrope.distill_proxy import fitted_chain, make_proxy, token_bags
from isotrope.evaluate.data import load_beir
from isotrope.evaluate.tasks import document_text, eval_retrieval
from isotrope.pseudo_queries import paired_interval, reciprocal_ranks_at_10
from isotrope.transforms.base import apply_chain

TEACHER = "all-MiniLM-L6-v2"


def prepare(folder: Path, cache: Path) -> dict[str, Any]:
    path = cache / f"probe-{folder.name}.pkl"
    if path.is_file():
        return pickle.loads(path.read_bytes())
    data = load_beir(folder, "test")
    texts = [document_text(data.corpus[d]) for d in data.corpus]
    teacher = HFBackbone(TEACHER)
    rng = np.random.default_rng(0)
    sample, parents, n_chunks = distill.teacher_texts(texts, distill.DEFAULT_DISTILL_SAMPLES, rng, "none")
    n_held = distill.held_aside_count(n_chunks)
    held_chunks = np.sort(rng.choice(n_chunks, size=n_held, replace=False))
    held = np.isin(parents, held_chunks)
    proxy = make_proxy([sample[i] for i in held_chunks], teacher.token_ids, teacher.vocab_size, teacher.special_ids(), 0)
    q_bags, q_parents, q_scale = distill.query_rows(sample, teacher, 1.0)
    q_bags = sparse.csr_matrix(sparse.diags(1 / np.maximum(q_scale, 1e-12)) @ q_bags)  # unscaled: rows sum to 1
    passed = distill.teacher_pass(teacher, sample, np.flatnonzero(held))
    inputs = _input_embeddings(TEACHER)
    state = {
        "sample": sample,
        "held_chunks": held_chunks,
        "proxy": proxy,
        "bags": passed.bags,
        "vectors": passed.vectors,
        "q_bags": q_bags,
        "q_parents": q_parents,
        "t0_fit": distill.initial_table(passed.fit_sums, inputs),
        "t0_all": distill.initial_table(passed.all_sums, inputs),
        "special": teacher.special_ids(),
        "vocab": teacher.vocab_size,
    }
    path.write_bytes(pickle.dumps(state))
    return state


class Probe:
    def __init__(self, folder: Path, state: dict[str, Any]) -> None:
        from transformers import AutoTokenizer

        from isotrope.backbones.resolve import resolve_model_path

        self.data = load_beir(folder, "test")
        self.s = state
        self.tok = AutoTokenizer.from_pretrained(resolve_model_path(TEACHER))
        n = len(state["sample"])
        self.held = np.zeros(n, dtype=bool)
        self.held[state["held_chunks"]] = True
        self.train_chunks = np.flatnonzero(~self.held)
        q_held = np.isin(state["q_parents"], state["held_chunks"])
        self.q_train = np.flatnonzero(~q_held)

    def unfitted(self, final: bool) -> tuple[np.ndarray, None]:
        """The context-averaged table (over every sampled chunk when ``final``, else the fit chunks only)."""
        return self.s["t0_all" if final else "t0_fit"], None

    def bags(self, texts: list[str], weights: np.ndarray | None = None) -> sparse.csr_matrix:
        ids = self.tok(texts, add_special_tokens=False, truncation=True, max_length=8192)["input_ids"]
        return self.weigh(token_bags(ids, self.s["vocab"], self.s["special"]), weights)

    @staticmethod
    def weigh(bags: sparse.csr_matrix, weights: np.ndarray | None) -> sparse.csr_matrix:
        if weights is None:
            return bags
        weighted = sparse.csr_matrix(bags.multiply(weights[None, :]))
        sums = np.asarray(weighted.sum(axis=1)).ravel()
        return sparse.csr_matrix(sparse.diags(1 / np.maximum(sums, 1e-12)) @ weighted)

    def fit(
        self,
        lam: float,
        query_weight: float = 1.0,
        weights: np.ndarray | None = None,
        prior: np.ndarray | None = None,
        query_only: bool = False,
        final: bool = False,
    ) -> np.ndarray:
        s = self.s
        chunks = np.arange(len(self.held)) if final else self.train_chunks
        chunk_bags = self.weigh(s["bags"][chunks], weights)
        y = s["vectors"][chunks]
        q_bags = self.weigh(s["q_bags"][self.q_train], weights)
        # q_bags rows were scaled by sqrt(1/k); rescale to the asked weight (weigh() renormalised them)
        scale = (
            np.sqrt(query_weight / np.bincount(s["q_parents"])[s["q_parents"][self.q_train]])
            if len(self.q_train)
            else np.zeros(0)
        )
        q_bags = sparse.csr_matrix(sparse.diags(scale) @ q_bags)
        q_y = scale[:, None] * s["vectors"][s["q_parents"][self.q_train]]
        if query_only:
            a, t = q_bags, q_y
        elif query_weight > 0 and q_bags.shape[0]:
            a, t = sparse.vstack([chunk_bags, q_bags]).tocsr(), np.vstack([y, q_y])
        else:
            a, t = chunk_bags, y
        prior = s["t0_all" if final else "t0_fit"] if prior is None else prior
        return distill.solve_table(a, t, prior, lam * distill.lambda_scale(a))

    def evaluate(self, make: Any, weights: np.ndarray | None = None, shape: str = "whiten-partial") -> dict:
        """``make(final)`` -> (document table, query table or None): fitted without the held-aside chunks
        (final False: the proxy and agreement) or with them (final True: the labels, as the product's final fit)."""
        doc_table, query_table = make(True)
        query_table = doc_table if query_table is None else query_table
        s = self.s
        corpus_texts = [document_text(self.data.corpus[d]) for d in self.data.corpus]
        chain = fitted_chain(shape, np.asarray(self.bags(corpus_texts, weights) @ doc_table, dtype=np.float32))

        def encode(texts: list[str], kind: str) -> np.ndarray:
            table = query_table if kind == "query" else doc_table
            return apply_chain(chain, np.asarray(self.bags(texts, weights) @ table, dtype=np.float32))

        ndcg = eval_retrieval(encode, self.data, k_values=(10,))["ndcg@10"]
        # the proxy, as distill_proxy.reciprocal_ranks (whiten-partial on the sample's fit chunks)
        doc_table, query_table = make(False)
        query_table = doc_table if query_table is None else query_table
        proxy = s["proxy"]
        chunk_bags = self.weigh(s["bags"][self.train_chunks], weights).astype(np.float32)
        pchain = fitted_chain(shape, np.asarray(chunk_bags @ doc_table, dtype=np.float32))
        queries = apply_chain(pchain, np.asarray(self.weigh(proxy.queries, weights) @ query_table, dtype=np.float32))
        docs = apply_chain(
            pchain, np.asarray(sparse.vstack([self.weigh(proxy.documents, weights), chunk_bags]) @ doc_table, dtype=np.float32)
        )
        rr = reciprocal_ranks_at_10(queries, docs, proxy.targets.tolist())
        held = apply_chain(pchain, np.asarray(self.weigh(s["bags"][s["held_chunks"]], weights) @ doc_table, dtype=np.float32))
        return {"ndcg@10": round(ndcg, 2), "proxy": rr, "agreement": round(agreement(held, s["vectors"][s["held_chunks"]]), 4)}


def agreement(vectors: np.ndarray, teacher: np.ndarray, k: int = 10) -> float:
    """distill.neighbour_agreement with the shaping already applied to ``vectors``."""
    teacher = teacher / np.linalg.norm(teacher, axis=1, keepdims=True)
    vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    a, b = vectors @ vectors.T, teacher @ teacher.T
    np.fill_diagonal(a, -np.inf)
    np.fill_diagonal(b, -np.inf)
    mine, theirs = np.argpartition(-a, k, axis=1)[:, :k], np.argpartition(-b, k, axis=1)[:, :k]
    return float(np.mean([len(np.intersect1d(x, y)) for x, y in zip(mine, theirs)])) / k


def sif_weights(state: dict[str, Any], a: float) -> np.ndarray:
    counts = np.asarray(state["bags"].astype(bool).sum(axis=0)).ravel().astype(np.float64)  # document frequency
    p = counts / max(counts.sum(), 1)
    return a / (a + p)


#: the shapings compared ("shapes"): the product's whiten-partial, plain centring, and whitening half as strong
SHAPES = ("center", "center,whiten(power=-0.125),l2", "whiten-partial")


def variants(probe: Probe, groups: list[str]) -> list[tuple[str, Callable[[], dict]]]:
    """(name, job) for every variant of the asked groups: base (lam), qtable, sif, shapes."""

    def fitted(lam: float, shape: str = "whiten-partial", weights: np.ndarray | None = None) -> Callable[[], dict]:
        return lambda: probe.evaluate(lambda f: (probe.fit(lam, weights=weights, final=f), None), weights=weights, shape=shape)

    def unfitted(shape: str) -> Callable[[], dict]:
        return lambda: probe.evaluate(probe.unfitted, shape=shape)

    def query_table(lam: float, query_lam: float) -> Callable[[], dict]:
        def make(final: bool) -> tuple[np.ndarray, np.ndarray]:
            doc = probe.fit(lam, final=final)
            return doc, probe.fit(query_lam, prior=doc, query_only=True, final=final)

        return lambda: probe.evaluate(make)

    todo: list[tuple[str, Callable[[], dict]]] = []
    if "base" in groups:
        todo += [(f"lam-{lam:g}", fitted(lam)) for lam in (10.0, 3.0, 1.0, 0.3)]
    if "qtable" in groups:
        todo += [(f"qtable-lam-{lam:g}-q{q:g}", query_table(lam, q)) for lam in (3.0, 1.0) for q in (3.0, 1.0, 0.3)]
    if "sif" in groups:
        todo += [
            (f"sif-{a:g}-lam-{lam:g}", fitted(lam, weights=sif_weights(probe.s, a)))
            for a in (1e-3, 1e-2, 1e-1)
            for lam in (3.0, 1.0)
        ]
    if "shapes" in groups:
        todo += [(f"shape-{shape}-lam-{lam:g}", fitted(lam, shape)) for shape in SHAPES for lam in (10.0, 3.0, 1.0)]
        todo += [(f"shape-{shape}-unfitted", unfitted(shape)) for shape in SHAPES]
    return todo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", type=Path, required=True)
    parser.add_argument("--sets", type=Path, nargs="+", required=True, help="BEIR folders")
    parser.add_argument("--variants", nargs="+", default=["base"], choices=["base", "qtable", "sif", "shapes"])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/fast_variants_probe.json"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    results = json.loads(args.out.read_text()) if args.out.is_file() else {}
    for folder in args.sets:
        probe = Probe(folder, prepare(folder, args.cache_dir))
        cell = results.setdefault(folder.name, {})
        base = probe.evaluate(probe.unfitted)
        cell["unfitted"] = {
            "ndcg@10": base["ndcg@10"],
            "proxy_mrr": round(100 * float(base["proxy"].mean()), 2),
            "agreement": base["agreement"],
        }
        print(folder.name, "unfitted", cell["unfitted"], flush=True)
        for name, job in variants(probe, args.variants):
            out = job()
            mean, low, high = paired_interval(100 * (out["proxy"] - base["proxy"]))
            cell[name] = {
                "ndcg@10": out["ndcg@10"],
                "proxy_mrr": round(100 * float(out["proxy"].mean()), 2),
                "vs_unfitted": [round(mean, 2), round(low, 2), round(high, 2)],
                "agreement": out["agreement"],
            }
            print(folder.name, name, cell[name], flush=True)
            args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
