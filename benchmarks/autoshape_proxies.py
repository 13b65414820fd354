"""Which label-free proxy ranks candidate shapings as labelled queries do, and what ``--shape auto``
then costs or gains against every fixed preset.

For each retrieval set (BEIR folders: SciFact and the sets of ``build_retrieval_sets.py``) and each
model, the corpus is embedded once (token states through the ``.cache/isotrope`` cache) and every
candidate shaping is fitted on the corpus (as ``isotrope eval retrieval --fit-corpus corpus``) and
scored by nDCG@10 on the labelled queries. Each proxy then scores the same candidates on its
pseudo-queries (:func:`isotrope.autoshape.gather_evidence`, the code ``--shape auto`` runs); the
agreement is the Spearman and Kendall correlation between the two rankings, and auto's choice is the
conservative rule applied to that proxy's evidence.

    .venv/bin/python -m benchmarks.autoshape_proxies --data-dir ../shared/data \\
        --sets retrieval/scifact .cache/isotrope/sets/20ng-topic .cache/isotrope/sets/stsb-para \\
        .cache/isotrope/sets/sick-para --out benchmarks/results/autoshape_proxies
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau, spearmanr

from benchmarks.common import run_per_set_and_model
from isotrope.autoshape import (
    DEFAULT_PROXY,
    FALLBACK_PROXY,
    PRESET_CANDIDATES,
    PROXIES,
    STATIC_CANDIDATES,
    TRANSFORMER_CANDIDATES,
    conservative_choice,
    fit_unshaped,
    format_candidate,
    gather_evidence,
    margin_for,
)
from isotrope.backbones import is_static_source
from isotrope.config import EncoderConfig
from isotrope.encoder import ShapedEncoder
from isotrope.evaluate.data import load_beir
from isotrope.evaluate.harness import Evaluator
from isotrope.evaluate.tasks import document_text, eval_retrieval

logger = logging.getLogger("autoshape_proxies")


def measure(folder: Path, model: str, cache_dir: str, seed: int = 0) -> dict:
    dataset = load_beir(folder, "test")
    documents = [document_text(doc) for doc in dataset.corpus.values()]
    queries = list(dataset.queries.values())
    static = is_static_source(model)
    candidates = STATIC_CANDIDATES if static else TRANSFORMER_CANDIDATES
    backbone = Evaluator(cache_dir=cache_dir)._backbone(EncoderConfig(model=model), documents)
    raw: dict = {}
    query_raws: dict = {}
    labelled, encode_seconds = [], 0.0
    for candidate in candidates:
        key = repr(sorted((k, v) for k, v in candidate.items() if k != "shape"))
        if key not in raw:
            tick = time.perf_counter()
            unshaped = ShapedEncoder.create(model=model, **{**candidate, "shape": "none"}, backbone=backbone)
            fit_unshaped(unshaped, documents)
            raw[key] = (unshaped, unshaped.embed_raw(documents))
            encode_seconds += time.perf_counter() - tick
            query_raws[key] = unshaped.embed_raw(queries, kind="query")
        unshaped, document_raw = raw[key]
        query_raw = query_raws[key]
        encoder = ShapedEncoder.create(model=model, **candidate, backbone=unshaped.backbone)
        encoder.weighting = unshaped.weighting
        if encoder.needs_corpus:
            encoder.fit_transforms(document_raw)
        rows = {text: i for i, text in enumerate(documents)}
        query_rows = {text: i for i, text in enumerate(queries)}

        def encode(
            texts: list[str],
            kind: str,
            encoder=encoder,
            document_raw=document_raw,
            query_raw=query_raw,
            rows=rows,
            query_rows=query_rows,
        ):
            if kind == "query":
                return encoder.apply_transforms(query_raw[[query_rows[t] for t in texts]])
            return encoder.apply_transforms(document_raw[[rows[t] for t in texts]])

        labelled.append(round(eval_retrieval(encode, dataset, k_values=(10,))["ndcg@10"], 2))
        logger.info("%s %s %s: nDCG@10 %.2f", folder.name, model, candidate, labelled[-1])
    proxies = {}
    for proxy in PROXIES:
        try:
            evidence = gather_evidence(
                documents, EncoderConfig(model=model), candidates, backbone, proxy=proxy, seed=seed, raw=raw
            )
        except ValueError as error:
            proxies[proxy] = {"error": str(error)}
            continue
        means = 100 * evidence.per_query.mean(axis=1)
        chosen, comparisons = conservative_choice(100 * evidence.per_query, margin_for(static, proxy), seed=seed)
        proxies[proxy] = {
            "pseudo_queries": int(evidence.per_query.shape[1]),
            "mrr@10": [round(float(m), 2) for m in means],
            "intervals": [[round(low, 2), round(high, 2)] for _, low, high in comparisons],
            "spearman": round(float(spearmanr(means, labelled).statistic), 3),
            "kendall": round(float(kendalltau(means, labelled).statistic), 3),
            "chosen": format_candidate(candidates[chosen]),
            "auto_ndcg@10": labelled[chosen],
            "selection_seconds": round(evidence.seconds, 1),
            "per_query": np.round(evidence.per_query, 4).tolist(),
        }
        logger.info("%s %s %s: %s", folder.name, model, proxy, proxies[proxy])
    return {
        "set": folder.name,
        "model": model,
        "documents": len(documents),
        "queries": len(queries),
        "candidates": [format_candidate(c) for c in candidates],
        "ndcg@10": labelled,
        "encode_corpus_seconds": round(encode_seconds, 1),
        "proxies": proxies,
    }


def report(results: list[dict], proxy: str = DEFAULT_PROXY) -> str:
    """Markdown: each proxy's rank agreement with the labels, then auto (the library's current
    candidates, baseline and margins, on ``proxy``'s stored per-query evidence) against every preset."""
    lines = ["| set | model | " + " | ".join(f"{p} ρ / τ" for p in PROXIES) + " |", "|---|---|" + "---|" * len(PROXIES)]
    sums: dict[str, list[float]] = {p: [] for p in PROXIES}
    for r in results:
        cells = []
        for p in PROXIES:
            entry = r["proxies"][p]
            if "error" in entry:
                cells.append("n/a (too few)")
                continue
            sums[p].append(entry["spearman"])
            cells.append(f"{entry['spearman']:+.2f} / {entry['kendall']:+.2f} ({entry['pseudo_queries']})")
        lines.append(f"| {r['set']} | {r['model']} | " + " | ".join(cells) + " |")
    lines.append("| mean ρ | | " + " | ".join(f"{np.mean(v):+.2f} ({len(v)} cells)" if v else "" for v in sums.values()) + " |")
    lines += [
        "",
        "| set | model | auto (proxy) | auto | none | "
        + " | ".join(PRESET_CANDIDATES[1:])
        + " | best fixed | auto − none | auto − best |",
        "|---|---|---|---|---|" + "---|" * (len(PRESET_CANDIDATES) + 2),
    ]
    for r in results:
        static = is_static_source(r["model"])
        candidates = [format_candidate(c) for c in (STATIC_CANDIDATES if static else TRANSFORMER_CANDIDATES)]
        ndcg = dict(zip(r["candidates"], r["ndcg@10"]))
        used = proxy if "error" not in r["proxies"][proxy] else FALLBACK_PROXY
        per_query = dict(zip(r["candidates"], np.asarray(r["proxies"][used]["per_query"])))
        chosen, _ = conservative_choice(100 * np.stack([per_query[c] for c in candidates]), margin_for(static, used))
        auto = ndcg[candidates[chosen]]
        presets = [ndcg[("uniform + " if static else "") + shape] for shape in PRESET_CANDIDATES]
        best = max(presets)
        lines.append(
            f"| {r['set']} | {r['model']} | {candidates[chosen]} ({used}) | {auto:.2f} | "
            + " | ".join(f"{v:.2f}" for v in presets)
            + f" | {best:.2f} | {auto - presets[0]:+.2f} | {auto - best:+.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--sets", nargs="+", required=True, help="BEIR folders (relative to --data-dir, or paths)")
    parser.add_argument("--models", nargs="+", default=["all-MiniLM-L6-v2", "static:all-MiniLM-L6-v2"])
    parser.add_argument("--cache-dir", default=".cache/isotrope")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/autoshape_proxies"))
    parser.add_argument("--report", nargs="+", type=Path, help="only write OUT.md from these result JSON files")
    args = parser.parse_args()
    if args.report:
        results = [row for path in args.report for row in json.loads(path.read_text())]
        args.out.with_suffix(".md").write_text(report(results))
        print(report(results))
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    results = run_per_set_and_model(
        args.out.with_suffix(".json"),
        args.data_dir,
        args.sets,
        args.models,
        lambda folder, model: measure(folder, model, args.cache_dir),
    )
    args.out.with_suffix(".md").write_text(report(results))


if __name__ == "__main__":
    main()
