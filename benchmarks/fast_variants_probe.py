"""Probe (research, not the product): variants of the ``fast`` table on one BEIR set, from one cached
teacher pass. Each variant is scored on the test labels (nDCG@10) and on the held-aside pseudo-queries
(MRR@10, the label-free signal ``distill`` uses), with the same sampling, held-aside split and proxy as
:func:`isotrope.distill.distill_table`. Fits use the training rows only (held-aside chunks out).

``--variants bigrams`` adds the corpus's frequent token bigrams as table rows (``--bigrams MIN_DF:WEIGHT[:LIMIT]``);
``--hybrid ALPHA...`` also scores convex fusion with BM25 as a store fuses (the union of both top 200).

Besides the held-aside chunks' agreement among themselves (``distill.neighbour_agreement``), each cell records two
agreements measured as retrieval compares: held-aside chunks, and the proxy's pseudo-queries, against the fit chunks
(the table's 10 nearest against the teacher's). ``--rules`` prints what label-free rules pick among the candidates
("c:SHAPE:TABLE") of the groups mix and low. docs/results/fast-small-corpora.md has the results.

    python -m benchmarks.fast_variants_probe --cache-dir .cache/isotrope --sets S/sick-para S/20ng-topic
    python -m benchmarks.fast_variants_probe --cache-dir .cache/isotrope --sets S/sick-para S/20ng-topic --rules
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
from isotrope.backbones.static import _input_embeddings
from isotrope.config import EncoderConfig
from isotrope.distill_proxy import fitted_chain, make_proxy, token_bags
from isotrope.evaluate.data import load_beir
from isotrope.evaluate.harness import Evaluator
from isotrope.evaluate.tasks import document_text, eval_retrieval
from isotrope.pseudo_queries import build_pseudo_queries, paired_interval, reciprocal_ranks_at_10
from isotrope.transforms.base import apply_chain

TEACHER = "all-MiniLM-L6-v2"


def prepare(folder: Path, cache: Path) -> dict[str, Any]:
    path = cache / f"probe-{folder.name}.pkl"
    if path.is_file():
        return pickle.loads(path.read_bytes())
    data = load_beir(folder, "test")
    texts = [document_text(data.corpus[d]) for d in data.corpus]
    # the transformer as the harness holds it: its token states come from (and go to) the cache
    teacher = Evaluator(cache_dir=cache)._backbone(EncoderConfig(model=TEACHER), None)
    rng = np.random.default_rng(0)
    sample, parents, n_chunks = distill.teacher_texts(texts, distill.DEFAULT_DISTILL_SAMPLES, rng, "none")
    n_held = distill.held_aside_count(n_chunks)
    held_chunks = np.sort(rng.choice(n_chunks, size=n_held, replace=False))
    held = np.isin(parents, held_chunks)
    proxy = make_proxy([sample[i] for i in held_chunks], teacher.token_ids, teacher.vocab_size, teacher.special_ids(), 0)
    q_bags, q_parents, q_scale = distill.query_rows(sample, teacher.token_ids, teacher.vocab_size, teacher.special_ids(), 1.0)
    q_bags = sparse.csr_matrix(sparse.diags(1 / np.maximum(q_scale, 1e-12)) @ q_bags)  # unscaled: rows sum to 1
    passed = distill.teacher_pass(teacher, sample, np.flatnonzero(held))
    # the teacher's vectors of the proxy's pseudo-queries (the same ones make_proxy cut): what retrieval compares
    made = build_pseudo_queries([sample[i] for i in held_chunks], n_held, proxy.proxy, seed=0) if proxy else []
    pq_vectors = distill.teacher_pass(teacher, [q.text for q in made], np.zeros(0, np.int64)).vectors if made else None
    inputs = _input_embeddings(TEACHER)
    sums, held_sums = passed.take_sums()
    t0_all = distill.initial_table(sums, inputs)
    sums.subtract(held_sums)  # the sums over the fitting texts only
    state = {
        "sample": sample,
        "held_chunks": held_chunks,
        "proxy": proxy,
        "bags": passed.bags,
        "vectors": passed.vectors,
        "pq_vectors": pq_vectors,
        "q_bags": q_bags,
        "q_parents": q_parents,
        "t0_fit": distill.initial_table(sums, inputs),
        "t0_all": t0_all,
        "special": teacher.special_ids(),
        "vocab": teacher.vocab_size,
    }
    path.write_bytes(pickle.dumps(state))
    return state


#: token windows ("windows" group): WINDOW_WORDS words at a stride of half that, from chunks longer than that
WINDOW_WORDS = 12


def word_windows(text: str) -> list[str]:
    words = text.split()
    if len(words) <= WINDOW_WORDS:
        return []
    step = WINDOW_WORDS // 2
    return [" ".join(words[i : i + WINDOW_WORDS]) for i in range(0, len(words) - step, step)]


def prepare_windows(folder: Path, cache: Path, state: dict[str, Any]) -> dict[str, Any]:
    """The budget a small corpus leaves (10,000 teacher texts less its chunks) spent on word windows of its
    chunks, each with its own teacher vector: their bags, vectors and chunks (a seeded sample of every window)."""
    path = cache / f"probe-{folder.name}-words.pkl"
    if path.is_file():
        return pickle.loads(path.read_bytes())
    found = [(window, parent) for parent, text in enumerate(state["sample"]) for window in word_windows(text)]
    room = distill.DEFAULT_DISTILL_SAMPLES - len(state["sample"])
    picked = np.sort(np.random.default_rng(1).choice(len(found), size=min(room, len(found)), replace=False))
    teacher = Evaluator(cache_dir=cache)._backbone(EncoderConfig(model=TEACHER), None)
    passed = distill.teacher_pass(teacher, [found[i][0] for i in picked], np.zeros(0, np.int64))
    windows = {"bags": passed.bags, "vectors": passed.vectors, "parents": np.array([found[i][1] for i in picked])}
    path.write_bytes(pickle.dumps(windows))
    return windows


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
        self._bags: dict[tuple[str, ...], sparse.csr_matrix] = {}
        self._fits: dict[tuple[float, bool], np.ndarray] = {}
        self.windows: dict[str, Any] | None = None  # prepare_windows(), for the "windows" group
        self.alphas: tuple[float, ...] = ()  # hybrid nDCG@10 at these fusion weights too (--hybrid)
        #: the "bigrams" group: feature sets (least document frequency in the sample, weight of an occurrence, most
        #: bigrams kept or 0), the strengths and the shapings each is fitted at (--bigrams, --bigram-lams, --bigram-shapes)
        self.bigrams: list[tuple[int, float, int]] = [(3, 1.0, 0), (3, 0.5, 0)]
        self.bigram_lams: tuple[float, ...] = (3.0, 1.0, 0.3)
        self.bigram_shapes: tuple[str, ...] = CANDIDATE_SHAPES
        self._bm25: np.ndarray | None = None

    def unfitted(self, final: bool) -> tuple[np.ndarray, None]:
        """The context-averaged table (over every sampled chunk when ``final``, else the fit chunks only)."""
        return self.s["t0_all" if final else "t0_fit"], None

    def bags(self, texts: list[str], weights: np.ndarray | None = None) -> sparse.csr_matrix:
        key = tuple(texts)
        if key not in self._bags:  # the corpus and the queries are tokenized once per set
            ids = self.tok(texts, add_special_tokens=False, truncation=True, max_length=8192)["input_ids"]
            self._bags[key] = token_bags(ids, self.s["vocab"], self.s["special"])
        return self.weigh(self._bags[key], weights)

    @staticmethod
    def weigh(bags: sparse.csr_matrix, weights: np.ndarray | None) -> sparse.csr_matrix:
        if weights is None:
            return bags
        weighted = sparse.csr_matrix(bags.multiply(weights[None, :]))
        sums = np.asarray(weighted.sum(axis=1)).ravel()
        return sparse.csr_matrix(sparse.diags(1 / np.maximum(sums, 1e-12)) @ weighted)

    def plain_fit(self, lam: float, final: bool) -> np.ndarray:
        """The product's fit at ``lam`` (pseudo-query rows weight 1, no token weights), solved once per set."""
        if (lam, final) not in self._fits:
            self._fits[(lam, final)] = self.fit(lam, final=final)
        return self._fits[(lam, final)]

    def mix(self, lam: float, alpha: float, final: bool) -> np.ndarray:
        """``alpha`` of the unfitted table and ``1 - alpha`` of the fit at ``lam`` (a convex mix)."""
        return alpha * self.unfitted(final)[0] + (1 - alpha) * self.plain_fit(lam, final)

    def fit(
        self,
        lam: float,
        query_weight: float = 1.0,
        weights: np.ndarray | None = None,
        prior: np.ndarray | None = None,
        query_only: bool = False,
        final: bool = False,
        window_weight: float = 0.0,
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
        if window_weight > 0 and self.windows is not None:  # each chunk's windows weigh window_weight x its row
            parents = self.windows["parents"]
            rows = np.flatnonzero(np.isin(parents, chunks))
            w = np.sqrt(window_weight / np.bincount(parents)[parents[rows]])
            a = sparse.vstack([a, sparse.diags(w) @ self.windows["bags"][rows]]).tocsr()
            t = np.vstack([t, w[:, None] * self.windows["vectors"][rows]])
        prior = s["t0_all" if final else "t0_fit"] if prior is None else prior
        return distill.solve_table(a, t, prior, lam * distill.lambda_scale(a))

    def hybrid(self, encode: Any, depth: int = 200) -> list[float]:
        """nDCG@10 of convex fusion at each of ``self.alphas``, as a store fuses: the union of the dense and the
        BM25 top ``depth``, each side's exact scores z-scored over the union."""
        if not self.alphas:
            return []
        from isotrope.evaluate.metrics import ndcg_at_k
        from isotrope.evaluate.tasks import _unit_rows
        from isotrope.fusion import _convex_ranked
        from isotrope.lexical import analyze, bm25_matrix

        doc_ids = sorted(self.data.corpus, reverse=True)
        query_ids = list(self.data.queries)
        texts = [document_text(self.data.corpus[d]) for d in doc_ids]
        if self._bm25 is None:
            self._bm25 = bm25_matrix([analyze(t) for t in texts], [analyze(self.data.queries[q]) for q in query_ids])
        dense = _unit_rows(encode([self.data.queries[q] for q in query_ids], "query")) @ _unit_rows(encode(texts, "document")).T
        out = []
        for alpha in self.alphas:
            run: dict[str, dict[str, float]] = {}
            for row, qid in enumerate(query_ids):
                d_top = np.argsort(-dense[row], kind="stable")[:depth]
                l_top = np.argsort(-self._bm25[row], kind="stable")[:depth]
                union = list(dict.fromkeys([*d_top.tolist(), *l_top.tolist()]))  # first appearance, dense first
                ranked = _convex_ranked(union, dense[row, union], self._bm25[row, union], 10, alpha)
                run[qid] = {doc_ids[i]: score for i, score in ranked}
            out.append(round(100 * ndcg_at_k(run, self.data.qrels, 10), 2))
        return out

    def teacher_vectors(self, texts: list[str]) -> np.ndarray:
        """The teacher's vector of each of ``texts`` from its pass (every document of a small corpus is sampled)."""
        where = {text: i for i, text in enumerate(self.s["sample"])}
        missing = sum(text not in where for text in texts)
        if missing:
            raise ValueError(f"{missing} documents are not in the teacher's sample")
        return self.s["vectors"][[where[text] for text in texts]]

    def evaluate(
        self, make: Any, weights: np.ndarray | None = None, shape: str = "whiten-partial", teacher_docs: bool = False
    ) -> dict:
        """``make(final)`` -> (document table, query table or None): fitted without the held-aside chunks
        (final False: the proxy and agreement) or with them (final True: the labels, as the product's final fit).
        ``teacher_docs``: the documents get the teacher's own vectors (from the distillation's pass), the queries
        the table's (unshaped; the labels only)."""
        doc_table, query_table = make(True)
        query_table = doc_table if query_table is None else query_table
        s = self.s
        corpus_texts = [document_text(self.data.corpus[d]) for d in self.data.corpus]
        chain = fitted_chain(shape, np.asarray(self.bags(corpus_texts, weights) @ doc_table, dtype=np.float32))

        def encode(texts: list[str], kind: str) -> np.ndarray:
            if teacher_docs:
                if kind == "query":
                    return np.asarray(self.bags(texts) @ query_table, dtype=np.float32)
                return self.teacher_vectors(texts).astype(np.float32)
            table = query_table if kind == "query" else doc_table
            return apply_chain(chain, np.asarray(self.bags(texts, weights) @ table, dtype=np.float32))

        ndcg = eval_retrieval(encode, self.data, k_values=(10,))["ndcg@10"]
        hybrid = {f"hybrid@{alpha:g}": value for alpha, value in zip(self.alphas, self.hybrid(encode))}
        # the proxy, as distill_proxy.reciprocal_ranks (whiten-partial on the sample's fit chunks)
        doc_table, query_table = make(False)
        query_table = doc_table if query_table is None else query_table
        proxy = s["proxy"]
        chunk_bags = self.weigh(s["bags"][self.train_chunks], weights).astype(np.float32)
        pchain = fitted_chain(shape, np.asarray(chunk_bags @ doc_table, dtype=np.float32))
        fit_docs = apply_chain(pchain, np.asarray(chunk_bags @ doc_table, dtype=np.float32))
        queries = apply_chain(pchain, np.asarray(self.weigh(proxy.queries, weights) @ query_table, dtype=np.float32))
        docs = apply_chain(
            pchain, np.asarray(sparse.vstack([self.weigh(proxy.documents, weights), chunk_bags]) @ doc_table, dtype=np.float32)
        )
        rr = reciprocal_ranks_at_10(queries, docs, proxy.targets.tolist())
        held = apply_chain(pchain, np.asarray(self.weigh(s["bags"][s["held_chunks"]], weights) @ doc_table, dtype=np.float32))
        held_q = apply_chain(pchain, np.asarray(self.weigh(s["bags"][s["held_chunks"]], weights) @ query_table, dtype=np.float32))
        teacher_fit, teacher_held = s["vectors"][self.train_chunks], s["vectors"][s["held_chunks"]]
        out = {
            "ndcg@10": round(ndcg, 2),
            **hybrid,
            "proxy": rr,
            "agreement": round(agreement(held, teacher_held), 4),
            # what retrieval compares: held-aside texts (unseen, as queries are) against the fit chunks (seen, as
            # a store's documents are by the final fit), their 10 nearest by the table against the teacher's
            "agreement_held_fit": round(overlap(held_q, fit_docs, teacher_held, teacher_fit), 4),
        }
        if s.get("pq_vectors") is not None:
            out["agreement_query_fit"] = round(overlap(queries, fit_docs, s["pq_vectors"], teacher_fit), 4)
        return out


#: the "bigrams" group: consecutive token pairs found in at least ``min_df`` sampled chunks become extra table rows
#: (their prior: the mean of their two tokens' rows), each occurrence counting ``weight`` in a text's mean
class Bigrams:
    def __init__(self, chunk_ids: list[np.ndarray], vocab: int, min_df: int, weight: float, limit: int = 0) -> None:
        self.vocab, self.weight = vocab, weight
        per_chunk = [np.unique(self.keys(ids)) for ids in chunk_ids]
        keys, df = np.unique(np.concatenate(per_chunk), return_counts=True)
        kept = np.flatnonzero(df >= min_df)
        if limit and len(kept) > limit:  # the most frequent ``limit`` (ties: the lower key)
            kept = np.sort(kept[np.argsort(-df[kept], kind="stable")[:limit]])
        self.table_keys = keys[kept]

    def keys(self, ids: np.ndarray) -> np.ndarray:
        return ids[:-1] * self.vocab + ids[1:] if len(ids) > 1 else np.zeros(0, np.int64)

    def bags(self, ids: list[np.ndarray]) -> sparse.csr_matrix:
        """(n, vocab + bigrams) rows summing to 1: each token counts 1, each known bigram ``weight``."""
        rows, cols, values = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0)]
        for row, kept in enumerate(ids):
            keys = self.keys(kept)
            at = np.searchsorted(self.table_keys, keys)
            found = at[(at < len(self.table_keys)) & (self.table_keys[np.minimum(at, len(self.table_keys) - 1)] == keys)]
            units = np.concatenate([kept, self.vocab + found])
            if units.size:
                unit, counts = np.unique(units, return_counts=True)
                weights = np.where(unit >= self.vocab, self.weight, 1.0) * counts
                rows.append(np.full(len(unit), row))
                cols.append(unit)
                values.append(weights / weights.sum())
        shape = (len(ids), self.vocab + len(self.table_keys))
        return sparse.csr_matrix((np.concatenate(values), (np.concatenate(rows), np.concatenate(cols))), shape=shape)

    def prior(self, table: np.ndarray) -> np.ndarray:
        first, second = self.table_keys // self.vocab, self.table_keys % self.vocab
        return np.vstack([table, 0.5 * (table[first] + table[second])]).astype(np.float32)


def plain_ids(probe: Probe, texts: list[str], limit: int = 8192) -> list[np.ndarray]:
    """Each text's token ids (truncated at ``limit``), special tokens out."""
    out = probe.tok(texts, add_special_tokens=False, truncation=True, max_length=limit)["input_ids"] if texts else []
    return [np.asarray(x, np.int64)[~np.isin(np.asarray(x, np.int64), probe.s["special"])] for x in out]


class BigramProbe(Probe):
    """``probe`` with every bag (chunks, pseudo-query rows, the proxy's, the corpus's and the queries') over tokens
    and the bigrams of :class:`Bigrams`, and the unfitted tables extended with their priors."""

    def __init__(self, probe: Probe, min_df: int, weight: float, limit: int = 0) -> None:
        from isotrope.distill_proxy import ProxyQueries, proxy_texts

        self.__dict__.update(probe.__dict__)
        s = probe.s
        chunk_ids = plain_ids(probe, s["sample"], 254)  # as the teacher's window saw them (256 with its special tokens)
        self.feats = Bigrams(chunk_ids, s["vocab"], min_df, weight, limit)
        made = proxy_texts([s["sample"][i] for i in s["held_chunks"]], seed=0)
        if made is None or not np.array_equal(made[3], s["proxy"].targets):
            raise ValueError("the proxy's queries were not rebuilt as made")
        _, queries, documents, targets = made
        self.s = dict(s)
        self._bags, self._fits = {}, {}
        self.s.update(
            bags=self.feats.bags(chunk_ids),
            q_bags=self.feats.bags(plain_ids(probe, distill.query_sentences(s["sample"])[0])),
            proxy=ProxyQueries(self.bags(queries).astype(np.float32), self.bags(documents).astype(np.float32), targets, made[0]),
            t0_fit=self.feats.prior(s["t0_fit"]),
            t0_all=self.feats.prior(s["t0_all"]),
            vocab=s["vocab"] + len(self.feats.table_keys),
        )
        # the chunks' tokens as re-tokenized here against the teacher pass's bags (a few long chunks differ at the cut)
        differing = (sparse.csr_matrix(s["bags"]).astype(bool) != self.s["bags"][:, : s["vocab"]].astype(bool)).nnz
        print(f"bigrams (df >= {min_df}): {len(self.feats.table_keys)}; {differing} token entries differ from the teacher's")

    def bags(self, texts: list[str], weights: np.ndarray | None = None) -> sparse.csr_matrix:
        key = tuple(texts)
        if key not in self._bags:
            self._bags[key] = self.feats.bags(plain_ids(self, texts))
        return self.weigh(self._bags[key], weights)


def overlap(
    queries: np.ndarray, documents: np.ndarray, teacher_queries: np.ndarray, teacher_documents: np.ndarray, k: int = 10
) -> float:
    """How many of each query's ``k`` nearest documents (cosine) by the table are among the teacher's ``k``, in [0, 1]."""

    def top(q: np.ndarray, d: np.ndarray) -> np.ndarray:
        q = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
        d = d / np.maximum(np.linalg.norm(d, axis=1, keepdims=True), 1e-12)
        return np.argpartition(-(q @ d.T), k, axis=1)[:, :k]

    mine, theirs = top(queries, documents), top(teacher_queries, teacher_documents)
    return float(np.mean([len(np.intersect1d(x, y)) for x, y in zip(mine, theirs)])) / k


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


#: the candidates of the "mix" group: each table in the product's two shapings; a mix (lam, alpha) is alpha of the
#: unfitted table and 1 - alpha of the fit at lam
CANDIDATE_SHAPES = distill.SHAPES
MIXES = ((1.0, 0.25), (1.0, 0.5), (1.0, 0.75), (3.0, 0.5), (0.3, 0.5))
LOW_MIXES = ((0.3, 0.25), (0.3, 0.75), (0.1, 0.25), (0.1, 0.5), (0.1, 0.75))

#: the shapings compared ("shapes"): the product's whiten-partial, plain centring, and whitening half as strong
SHAPES = ("center", "center,whiten(power=-0.125),l2", "whiten-partial")


def variants(probe: Probe, groups: list[str]) -> list[tuple[str, Callable[[], dict]]]:
    """(name, job) for every variant of the asked groups: base (lam), qtable, sif, shapes."""

    def fitted(lam: float, shape: str = "whiten-partial", weights: np.ndarray | None = None) -> Callable[[], dict]:
        if weights is None:
            return lambda: probe.evaluate(lambda f: (probe.plain_fit(lam, f), None), shape=shape)
        return lambda: probe.evaluate(lambda f: (probe.fit(lam, weights=weights, final=f), None), weights=weights, shape=shape)

    def mixed(lam: float, alpha: float, shape: str) -> Callable[[], dict]:
        return lambda: probe.evaluate(lambda f: (probe.mix(lam, alpha, f), None), shape=shape)

    window_fits: dict[tuple[float, float, bool], np.ndarray] = {}  # shared by the shapings (query weights: negative)

    def windowed(lam: float, weight: float, shape: str) -> Callable[[], dict]:
        def make(final: bool) -> tuple[np.ndarray, None]:
            if (lam, weight, final) not in window_fits:
                window_fits[(lam, weight, final)] = probe.fit(lam, final=final, window_weight=weight)
            return window_fits[(lam, weight, final)], None

        return lambda: probe.evaluate(make, shape=shape)

    def weighted(lam: float, weight: float, shape: str) -> Callable[[], dict]:
        def make(final: bool) -> tuple[np.ndarray, None]:
            if (lam, -weight, final) not in window_fits:
                window_fits[(lam, -weight, final)] = probe.fit(lam, query_weight=weight, final=final)
            return window_fits[(lam, -weight, final)], None

        return lambda: probe.evaluate(make, shape=shape)

    def teacher_docs(lam: float | None) -> Callable[[], dict]:
        make = probe.unfitted if lam is None else (lambda f: (probe.plain_fit(lam, f), None))
        return lambda: probe.evaluate(make, teacher_docs=True)

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
    if "mix" in groups:  # candidates "c:SHAPE:TABLE" for the rules (see rules())
        for shape in CANDIDATE_SHAPES:
            todo += [(f"c:{shape}:lam-{lam:g}", fitted(lam, shape)) for lam in (100.0, 30.0, 10.0, 3.0, 1.0, 0.3)]
            todo += [(f"c:{shape}:unfitted", unfitted(shape))]
            todo += [(f"c:{shape}:mix-{lam:g}-{a:g}", mixed(lam, a, shape)) for lam, a in MIXES]
    if "low" in groups:  # weaker fits and their mixes with the unfitted table
        for shape in CANDIDATE_SHAPES:
            todo += [(f"c:{shape}:lam-0.1", fitted(0.1, shape))]
            todo += [(f"c:{shape}:mix-{lam:g}-{a:g}", mixed(lam, a, shape)) for lam, a in LOW_MIXES]
    if "abtt" in groups:  # two more shapings: all-but-the-top, and none (cosine of the means)
        for shape in ("abtt", "none"):
            todo += [(f"c:{shape}:lam-{lam:g}", fitted(lam, shape)) for lam in (3.0, 1.0, 0.3)]
            todo += [(f"c:{shape}:unfitted", unfitted(shape)), (f"c:{shape}:mix-0.3-0.5", mixed(0.3, 0.5, shape))]
    if "qweight" in groups:  # the pseudo-query rows weighing more than each chunk's own row
        for shape in CANDIDATE_SHAPES:
            todo += [(f"c:{shape}:qw-{w:g}-lam-{lam:g}", weighted(lam, w, shape)) for w in (3.0, 10.0) for lam in (1.0, 0.3)]
    if "windows" in groups:
        for shape in CANDIDATE_SHAPES:
            todo += [(f"c:{shape}:words-{w:g}-lam-{lam:g}", windowed(lam, w, shape)) for w in (1.0, 3.0) for lam in (3.0, 1.0)]
    if "bigrams" in groups:  # each feature set of probe.bigrams (min_df, weight, limit) at probe.bigram_lams
        for min_df, weight, limit in probe.bigrams:
            holder: dict[str, BigramProbe] = {}

            def bigram_fit(
                lam: float, shape: str, spec: tuple = (min_df, weight, limit), holder: dict = holder
            ) -> Callable[[], dict]:
                def job() -> dict:
                    if "p" not in holder:
                        holder["p"] = BigramProbe(probe, *spec)
                    inner = holder["p"]
                    return inner.evaluate(lambda f: (inner.plain_fit(lam, f), None), shape=shape)

                return job

            name = f"bigrams-{min_df}-{weight:g}" + (f"-top{limit}" if limit else "")
            for shape in probe.bigram_shapes:
                todo += [(f"c:{shape}:{name}-lam-{lam:g}", bigram_fit(lam, shape)) for lam in probe.bigram_lams]
    if "teacher-docs" in groups:
        todo += [(f"teacher-docs:lam-{lam:g}", teacher_docs(lam)) for lam in (3.0, 1.0, 0.3)]
        todo += [("teacher-docs:unfitted", teacher_docs(None))]
    return todo


#: label-free signals a rule can choose by (each cell's keys)
SIGNALS = ("agreement", "agreement_held_fit", "agreement_query_fit")


#: the tables a rule chooses among (in each of CANDIDATE_SHAPES): the product's, and wider sets
TABLE_SETS = {
    "product": ("lam-10", "lam-3", "lam-1"),
    "+unfitted": ("lam-10", "lam-3", "lam-1", "unfitted"),
    "+lam 30,100": ("lam-100", "lam-30", "lam-10", "lam-3", "lam-1", "unfitted"),
    "+mixes": ("lam-10", "lam-3", "lam-1", "unfitted", *(f"mix-{lam:g}-{a:g}" for lam, a in MIXES)),
    "all": ("lam-100", "lam-30", "lam-10", "lam-3", "lam-1", "lam-0.3", "unfitted", *(f"mix-{lam:g}-{a:g}" for lam, a in MIXES)),
    "all+low": (
        "lam-100",
        "lam-30",
        "lam-10",
        "lam-3",
        "lam-1",
        "lam-0.3",
        "lam-0.1",
        "unfitted",
        *(f"mix-{lam:g}-{a:g}" for lam, a in MIXES + LOW_MIXES),
    ),
}


def rules(results: dict[str, dict[str, dict[str, Any]]]) -> None:
    """What each rule picks among the "mix" candidates of each set, with no label: of a set of tables
    (:data:`TABLE_SETS`) in each shaping, the candidate of best ``signal`` whose pseudo-query interval against the
    unfitted whiten-partial table does not lie wholly below 0 (the product's veto; "no veto": every candidate);
    the unfitted whiten-partial table when none beats it. Prints the pick and its nDCG@10 per set."""
    for tables_name, tables in TABLE_SETS.items():
        for signal in SIGNALS:
            for veto in (True, False):
                picks = []
                for name, cell in results.items():
                    base = cell["unfitted"]
                    found = [
                        (cell[key][signal], key)
                        for key in (f"c:{shape}:{table}" for shape in CANDIDATE_SHAPES for table in tables)
                        if key in cell and signal in cell[key] and (not veto or cell[key]["vs_unfitted"][2] >= 0)
                    ]
                    best, key = max(found, default=(-1.0, "unfitted"))
                    key = key if best > base.get(signal, -1.0) else "unfitted"
                    picks.append(f"{name} {key[2:] if key.startswith('c:') else key} {cell[key]['ndcg@10']}")
                print(f"[{tables_name}] {signal}{'' if veto else ' (no veto)'}: " + "; ".join(picks))
    print("[product: mixes in center, SHAPE_MARGIN] agreement: " + "; ".join(product_rule(results)))


def _best_kept(cell: dict[str, dict[str, Any]], keys: list[str]) -> tuple[float, str]:
    """The best agreement (and its key) of ``keys`` not vetoed and above the unfitted table's; else (-1, unfitted)."""
    found = [(cell[k]["agreement"], k) for k in keys if k in cell and cell[k]["vs_unfitted"][2] >= 0]
    return max((f for f in found if f[0] > cell["unfitted"]["agreement"]), default=(-1.0, "unfitted"))


def product_rule(results: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """The pick of :func:`isotrope.distill.distill_table`'s rule, per set: the fits in both shapings and the mixes in
    ``center``, the product's veto, and a centred candidate only when it agrees better by more than SHAPE_MARGIN."""
    default, other = distill.SHAPES
    fits = [f"lam-{lam:g}" for lam in distill.LAMBDAS]
    mixes = [f"mix-{lam:g}-{distill.MIX:g}" for lam in distill.MIX_LAMBDAS]
    picks = []
    for name, cell in results.items():
        mine = _best_kept(cell, [f"c:{default}:{t}" for t in fits])
        theirs = _best_kept(cell, [f"c:{other}:{t}" for t in fits + mixes])
        key = theirs[1] if theirs[0] > max(mine[0], cell["unfitted"]["agreement"]) + distill.SHAPE_MARGIN else mine[1]
        picks.append(f"{name} {key[2:] if key.startswith('c:') else key} {cell[key]['ndcg@10']}")
    return picks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", type=Path, required=True)
    parser.add_argument("--sets", type=Path, nargs="+", required=True, help="BEIR folders")
    parser.add_argument(
        "--variants",
        nargs="+",
        default=["base"],
        choices=["base", "qtable", "sif", "shapes", "mix", "low", "abtt", "qweight", "windows", "teacher-docs", "bigrams"],
    )
    parser.add_argument("--hybrid", type=float, nargs="*", default=[], help="also hybrid nDCG@10 at these fusion weights")
    parser.add_argument("--bigrams", nargs="*", default=["3:1", "3:0.5"], help="bigram sets MIN_DF:WEIGHT[:LIMIT]")
    parser.add_argument("--bigram-lams", type=float, nargs="*", default=[3.0, 1.0, 0.3])
    parser.add_argument("--bigram-shapes", nargs="*", default=list(CANDIDATE_SHAPES))
    parser.add_argument("--rules", action="store_true", help="only print what each selection rule picks from --out's cells")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/fast_variants_probe.json"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    results = json.loads(args.out.read_text()) if args.out.is_file() else {}
    if args.rules:
        rules({folder.name: results[folder.name] for folder in args.sets})
        return
    for folder in args.sets:
        probe = Probe(folder, prepare(folder, args.cache_dir))
        probe.alphas = tuple(args.hybrid)
        probe.bigrams = [(int(p[0]), float(p[1]), int(p[2]) if len(p) > 2 else 0) for p in (b.split(":") for b in args.bigrams)]
        probe.bigram_lams, probe.bigram_shapes = tuple(args.bigram_lams), tuple(args.bigram_shapes)
        if "windows" in args.variants:
            probe.windows = prepare_windows(folder, args.cache_dir, probe.s)
        cell = results.setdefault(folder.name, {})
        base = probe.evaluate(probe.unfitted)
        cell["unfitted"] = {"proxy_mrr": round(100 * float(base["proxy"].mean()), 2)}
        cell["unfitted"].update((key, value) for key, value in base.items() if key != "proxy")
        print(folder.name, "unfitted", cell["unfitted"], flush=True)
        for name, job in variants(probe, args.variants):
            out = job()
            mean, low, high = paired_interval(100 * (out["proxy"] - base["proxy"]))
            cell[name] = {
                "proxy_mrr": round(100 * float(out["proxy"].mean()), 2),
                "vs_unfitted": [round(mean, 2), round(low, 2), round(high, 2)],
            }
            cell[name].update((key, value) for key, value in out.items() if key != "proxy")
            print(folder.name, name, cell[name], flush=True)
            args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
