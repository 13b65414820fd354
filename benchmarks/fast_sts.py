"""``--model fast`` on STS-B + SICK-R: which distillation corpus, fit and selection criterion.

Every variant is a distilled table (``isotrope.distill``) pooled as the fast encoder pools
(mean over the non-special tokens, optional token weights), then ``whiten-partial`` fitted
on the distillation sample, then cosine. Distillation corpora never hold a scored sentence:

* ``stsb-train``: the distinct sentences of the STS-B train split;
* ``general``: a seeded sample of the general-corpus sentences;
* ``both``: the two together.

Sentences of the STS-B test and dev splits and of the SICK test and trial splits are removed
from every corpus. Variants are chosen BEFORE the test is read, on the held-aside
selection data: STS-B dev + SICK trial (labelled, never scored), and two label-free criteria
on the texts the fit held aside (what the product can use): neighbour agreement with the
teacher (the current criterion) and the Spearman correlation of static and teacher cosines
over pairs of held-aside texts. The test scores of every variant are printed too, so the
choice can be checked, not made, on them.

    python -m benchmarks.fast_sts --data-dir ../shared/data --cache-dir .cache/isotrope \
        --out benchmarks/results/fast_sts.json
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from isotrope.backbones.static import _input_embeddings
from isotrope.corpus import iter_texts
from isotrope.distill import initial_table, lambda_scale, neighbour_agreement, solve_table, teacher_pass
from isotrope.encoder import ShapedEncoder, reservoir_sample
from isotrope.evaluate.cache import CachedBackbone
from isotrope.evaluate.data import STSPairs, load_sick, load_stsb
from isotrope.evaluate.metrics import spearman
from isotrope.shapes import parse_shape
from isotrope.transforms import TRANSFORMS
from isotrope.weighting import TokenCounts, TokenWeighting

logger = logging.getLogger(__name__)

LAMBDAS = (10.0, 3.0, 1.0, 0.3)
GENERAL = "corpus/general_english_sentences.txt.gz"


def sentences(pairs: STSPairs) -> set[str]:
    return set(pairs.sentences1) | set(pairs.sentences2)


def bags_of(teacher: Any, texts: list[str], weights: np.ndarray | None = None) -> Any:
    """Rows summing to 1 over each text's tokens (no special tokens), optionally token-weighted."""
    from scipy import sparse

    ids = teacher.token_ids(texts)
    special = {int(i) for i in teacher.special_ids()}
    rows, cols, values = [], [], []
    for row, text_ids in enumerate(ids):
        kept = np.array([i for i in text_ids if i not in special], dtype=np.int64)
        if not kept.size:
            continue
        tokens, counts = np.unique(kept, return_counts=True)
        mass = counts * (weights[tokens] if weights is not None else 1.0)
        if mass.sum() <= 0:
            mass = counts.astype(np.float64)
        rows.append(np.full(len(tokens), row))
        cols.append(tokens)
        values.append(mass / mass.sum())
    return sparse.csr_matrix(
        (np.concatenate(values), (np.concatenate(rows), np.concatenate(cols))), shape=(len(texts), teacher.vocab_size)
    )


def whitener(fit_vectors: np.ndarray) -> Any:
    steps = [TRANSFORMS[step["kind"]](**step["config"]) for step in parse_shape("whiten-partial")]
    vectors = np.asarray(fit_vectors, dtype=np.float32)
    for step in steps:
        vectors = step.fit(vectors).transform(vectors)

    def apply(raw: np.ndarray) -> np.ndarray:
        out = np.asarray(raw, dtype=np.float32)
        for step in steps:
            out = step.transform(out)
        return out

    return apply


def sts_score(encode: Any, pairs: STSPairs) -> float:
    first, second = encode(pairs.sentences1), encode(pairs.sentences2)
    first = first / np.maximum(np.linalg.norm(first, axis=1, keepdims=True), 1e-12)
    second = second / np.maximum(np.linalg.norm(second, axis=1, keepdims=True), 1e-12)
    return spearman(np.einsum("ij,ij->i", first.astype(np.float64), second.astype(np.float64)), pairs.scores)


def cosine_correlation(static: np.ndarray, teacher: np.ndarray, seed: int = 0, near: int = 5, far: int = 5) -> float:
    """Spearman x100 of static vs teacher cosines over pairs of held-aside texts: each text with its
    ``near`` nearest neighbours by the teacher and ``far`` random others (STS pairs are mostly related)."""
    static = static / np.maximum(np.linalg.norm(static, axis=1, keepdims=True), 1e-12)
    teacher = teacher / np.maximum(np.linalg.norm(teacher, axis=1, keepdims=True), 1e-12)
    teacher_sims = teacher @ teacher.T
    np.fill_diagonal(teacher_sims, -np.inf)
    nearest = np.argpartition(-teacher_sims, near, axis=1)[:, :near]
    rng = np.random.default_rng(seed)
    random = rng.integers(0, len(teacher), size=(len(teacher), far))
    left = np.repeat(np.arange(len(teacher)), near + far)
    right = np.concatenate([nearest, random], axis=1).ravel()
    keep = left != right
    left, right = left[keep], right[keep]
    return spearman(np.einsum("ij,ij->i", static[left], static[right]), np.einsum("ij,ij->i", teacher[left], teacher[right]))


def run(data_dir: Path, cache_dir: Path, general_samples: int, teacher_name: str, corpora: list[str]) -> dict[str, Any]:
    test = {"stsb": load_stsb(data_dir, "test"), "sickr": load_sick(data_dir, "test")}
    select = {"stsb-dev": load_stsb(data_dir, "dev"), "sick-trial": load_sick(data_dir, "trial")}
    banned = set().union(*(sentences(p) for p in (*test.values(), *select.values())))
    stsb_train = [
        s
        for s in dict.fromkeys([*load_stsb(data_dir, "train").sentences1, *load_stsb(data_dir, "train").sentences2])
        if s not in banned
    ]
    general = [s for s in reservoir_sample(iter_texts(data_dir / GENERAL), general_samples, 0) if s not in banned]
    texts_of = {"stsb-train": stsb_train, "general": general, "both": list(dict.fromkeys(stsb_train + general))}
    teacher = CachedBackbone(ShapedEncoder.create(model=teacher_name).backbone, cache_dir)
    input_table = _input_embeddings(teacher_name)
    results: dict[str, Any] = {"teacher": teacher_name, "banned_sentences": len(banned), "corpora": {}}
    for corpus in corpora:
        texts = texts_of[corpus]
        rng = np.random.default_rng(0)
        n_held = min(1000, round(0.1 * len(texts)))
        holdout = np.sort(rng.choice(len(texts), size=n_held, replace=False))
        started = time.perf_counter()
        passed = teacher_pass(teacher, texts, holdout, show_progress=True)
        logger.info("%s: teacher pass over %d texts in %.0f s", corpus, len(texts), time.perf_counter() - started)
        keep = np.setdiff1d(np.arange(len(texts)), holdout)
        counts = TokenCounts.from_token_ids(teacher.token_ids([texts[i] for i in keep]), teacher.vocab_size)
        weightings = {"uniform": None}
        for scheme in ("sif", "usif"):
            weighting = TokenWeighting(scheme=scheme, exclude_special=True).fit(
                teacher.vocabulary(), teacher.special_ids(), counts
            )
            weightings[scheme] = np.asarray(weighting.weights_, dtype=np.float64)
        rows: list[dict[str, Any]] = []
        prior = initial_table(passed.fit_sums, input_table)
        for weight_name, weights in weightings.items():
            bags = passed.bags if weights is None else bags_of(teacher, texts, weights)
            train, held = bags[keep], bags[holdout]
            scale = lambda_scale(train)
            tables = {"unfitted": prior}
            table = prior
            for relative in sorted(LAMBDAS, reverse=True):
                table = solve_table(train, passed.vectors[keep], prior, relative * scale, start=table)
                tables[f"lam={relative:g}"] = table
            for name, table in tables.items():
                whiten = whitener(train @ table)

                def encode(
                    batch: list[str], table: np.ndarray = table, whiten: Any = whiten, weights: np.ndarray | None = weights
                ) -> np.ndarray:
                    return whiten(bags_of(teacher, batch, weights) @ table)

                row = {
                    "corpus": corpus,
                    "weights": weight_name,
                    "table": name,
                    "agreement": round(neighbour_agreement(train @ table, held @ table, passed.vectors[holdout]), 4),
                    "cosine_corr": round(cosine_correlation(whiten(held @ table), passed.vectors[holdout]), 2),
                    **{key: round(sts_score(encode, pairs), 2) for key, pairs in select.items()},
                    **{key: round(sts_score(encode, pairs), 2) for key, pairs in test.items()},
                }
                row["select_mean"] = round((row["stsb-dev"] + row["sick-trial"]) / 2, 2)
                row["test_mean"] = round((row["stsb"] + row["sickr"]) / 2, 2)
                logger.info("%s", row)
                rows.append(row)
        results["corpora"][corpus] = {"texts": len(texts), "held_aside": n_held, "rows": rows}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--cache-dir", type=Path, required=True)
    parser.add_argument("--general-samples", type=int, default=30000)
    parser.add_argument("--teacher", default="all-MiniLM-L6-v2")
    parser.add_argument("--corpus", action="append", choices=("stsb-train", "general", "both"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    result = run(
        args.data_dir, args.cache_dir, args.general_samples, args.teacher, args.corpus or ["stsb-train", "general", "both"]
    )
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
