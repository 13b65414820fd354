"""``isotrope eval TASK`` and ``isotrope sweep``: every quality claim is one command."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from isotrope.config import EncoderConfig
from isotrope.encoder import resolve_config, with_distilled_shape
from isotrope.evaluate.harness import Evaluator, encode_function, isotropy_of

TASKS = ("sts", "retrieval", "clustering", "classification", "isotropy")


def run_sts(
    evaluator: Evaluator,
    config: EncoderConfig,
    *,
    tasks: Sequence[str] = (),
    data_dir: Path | None = None,
    pairs: Sequence[Path] = (),
    fit_corpus: str | None = None,
    transductive: bool = False,
    context_corpus: str | None = None,
    **_: Any,
) -> dict:
    """Spearman x100 per STS task (each task's pairs pooled and scored once: the "all" setting) and their mean."""
    from isotrope.evaluate.data import load_pairs, load_sick, load_stsb
    from isotrope.evaluate.tasks import eval_sts

    loaders = {"stsb": load_stsb, "sickr": load_sick}
    sets = []
    for task in tasks:
        if task not in loaders:
            raise ValueError(f"unknown STS task {task!r}; choose from {', '.join(loaders)} or pass --pairs FILE")
        if data_dir is None:
            raise ValueError("--task needs --data-dir (the folder holding sts/stsbenchmark and sts/sick)")
        sets.append((task, loaders[task](data_dir, "test")))
    sets += [(Path(path).stem, load_pairs(path)) for path in pairs]
    if not sets:
        raise ValueError("nothing to evaluate: pass --task stsb/sickr with --data-dir, or --pairs FILE")
    eval_texts = [s for _, p in sets for s in (*p.sentences1, *p.sentences2)]
    encoder, fitted_on = evaluator.fit(config, fit_corpus, eval_texts, transductive, context_corpus)
    encode = encode_function(encoder, evaluator.show_progress)
    scores = {name: round(eval_sts(encode, pair_set), 2) for name, pair_set in sets}
    return {
        "scores": scores,
        "average": round(sum(scores.values()) / len(scores), 2),
        **fit_report(encoder, fitted_on),
        "setting": "all: each task's pairs pooled and scored once",
    }


def fit_report(encoder: Any, fitted_on: str) -> dict:
    """What the shaping was fitted on, and what ``--shape auto`` weighed when it chose it."""
    auto = {"auto_shape": encoder.metadata["auto_shape"]} if "auto_shape" in encoder.metadata else {}
    distill = {"distill": encoder.metadata["distill"]} if "distill" in encoder.metadata else {}
    return {"fitted_on": fitted_on, **auto, **distill}


def run_retrieval(
    evaluator: Evaluator,
    config: EncoderConfig,
    *,
    beir: Path | None = None,
    fit_corpus: str | None = None,
    transductive: bool = False,
    split: str | None = None,
    context_corpus: str | None = None,
    modes: Sequence[str] = (),
    stores: Sequence[str] = (),
    alpha: float | None = None,
    fusion: str = "convex",
    **_: Any,
) -> dict:
    """nDCG@10, recall@100, MRR@10 and hit@1 (x100) by exact search on the qrels ``split`` (default test);
    ``fit_corpus="corpus"`` fits on the BEIR corpus.

    With ``modes`` (dense, lexical, hybrid) the corpus is indexed into a temporary store of each
    of ``stores`` (default faiss) and queried through it, as ``isotrope search`` does; ``auto`` adds
    the store's default search, calibrated on the corpus without labels, beside those three."""
    from isotrope.evaluate.data import load_beir
    from isotrope.evaluate.tasks import document_text, eval_retrieval

    if beir is None:
        raise ValueError("retrieval needs --beir DIR (corpus.jsonl, queries.jsonl, qrels/test.tsv)")
    dataset = load_beir(beir, split or "test")
    documents = [text for text in map(document_text, dataset.corpus.values()) if text]
    corpus = documents if fit_corpus == "corpus" else fit_corpus
    if transductive and corpus is None:
        raise ValueError("retrieval never fits on the queries: use --fit-corpus corpus to fit on the documents")
    encoder, fitted_on = evaluator.fit(config, corpus, context_corpus=context_corpus)
    if "auto" in modes:  # the default a user gets, beside what it chooses between
        modes = list(dict.fromkeys(["dense", "lexical", "hybrid", *modes]))
    if modes:
        from isotrope.evaluate.store_retrieval import eval_through_store

        chosen: dict[str, Any] = {}
        by_store = eval_through_store(
            encoder,
            dataset,
            kinds=list(stores) or ["faiss"],
            modes=modes,
            alphas=[alpha],
            fusions=[fusion],
            chosen=chosen,
            show_progress=evaluator.show_progress,
        )
        return {
            "scores": by_store,
            **fit_report(encoder, fitted_on),
            "queries": len(dataset.queries),
            "documents": len(dataset.corpus),
            "split": split or "test",
            "fusion": None if "hybrid" not in modes else {"method": fusion, "alpha": alpha},
            **({"default_search": chosen} if chosen else {}),
        }
    result = eval_retrieval(encode_function(encoder, evaluator.show_progress), dataset, k_values=(1, 10, 100))
    scores = {key: round(result[key], 2) for key in ("ndcg@10", "recall@100", "mrr@10")}
    scores["hit@1"] = round(result["mrr@1"], 2)  # a relevant document first
    return {
        "scores": scores,
        **fit_report(encoder, fitted_on),
        "queries": len(dataset.queries),
        "documents": len(dataset.corpus),
        "empty_queries": result["empty_queries"],
        "empty_documents": result["empty_documents"],
    }


def run_clustering(
    evaluator: Evaluator,
    config: EncoderConfig,
    *,
    jsonl: Path | None = None,
    split: str | None = None,
    limit: int | None = None,
    fit_corpus: str | None = None,
    transductive: bool = False,
    context_corpus: str | None = None,
    **_: Any,
) -> dict:
    """V-measure x100 of mini-batch k-means over 5 seeds (MTEB).

    ``limit`` keeps a seeded uniform sample of that many texts (in file order), not
    the first ones: files are often sorted by label. ``fit_corpus="split:NAME"`` fits on
    the texts of another split of the same file (their labels unused).
    """
    import numpy as np

    from isotrope.evaluate.data import load_clustering
    from isotrope.evaluate.tasks import eval_clustering

    if jsonl is None:
        raise ValueError("clustering needs --jsonl FILE with text and label fields")
    data = load_clustering(jsonl, split=split)
    texts, labels = data.texts, data.labels
    if limit is not None and limit < len(texts):
        keep = np.sort(np.random.default_rng(evaluator.seed).choice(len(texts), size=limit, replace=False))
        texts, labels = [texts[i] for i in keep], [labels[i] for i in keep]
    corpus_name = "the retrieval corpus"
    if fit_corpus is not None and fit_corpus.startswith("split:"):
        other = fit_corpus.removeprefix("split:")
        if other == (split or ""):
            raise ValueError(f"--fit-corpus {fit_corpus} is the evaluated split: pass --transductive to fit on it")
        fit_texts: str | list[str] | None = load_clustering(jsonl, split=other).texts
        corpus_name = f"{Path(jsonl).name} split {other}"
    else:
        fit_texts = fit_corpus
    encoder, fitted_on = evaluator.fit(config, fit_texts, texts, transductive, context_corpus, corpus_name)
    result = eval_clustering(encode_function(encoder, evaluator.show_progress), texts, labels)
    return {
        "scores": {"v_measure": round(result["v_measure"], 2)},
        "v_measure_std": round(result["v_measure_std"], 2),
        "texts": len(texts),
        "labels": len(set(labels)),
        **fit_report(encoder, fitted_on),
    }


def run_classification(
    evaluator: Evaluator,
    config: EncoderConfig,
    *,
    tasks: Sequence[str] = (),
    data_dir: Path | None = None,
    fit_corpus: str | None = None,
    transductive: bool = False,
    context_corpus: str | None = None,
    **_: Any,
) -> dict:
    """SentEval accuracy x100 (logistic regression; 10-fold CV, or the fixed split where one exists)."""
    from isotrope.evaluate.data import LabelledTexts, load_senteval
    from isotrope.evaluate.tasks import eval_classification

    if data_dir is None or not tasks:
        raise ValueError("classification needs --data-dir and --task (MR, CR, SUBJ, MPQA, TREC, SST2, SST5)")
    sets: dict[str, tuple[LabelledTexts, LabelledTexts | None]] = {}
    for task in tasks:
        if task in ("TREC", "SST2", "SST5"):
            sets[task] = (load_senteval(data_dir, task, "train"), load_senteval(data_dir, task, "test"))
        else:
            sets[task] = (load_senteval(data_dir, task), None)
    eval_texts = [t for train, test in sets.values() for t in train.texts + (test.texts if test else [])]
    encoder, fitted_on = evaluator.fit(config, fit_corpus, eval_texts, transductive, context_corpus)
    encode = encode_function(encoder, evaluator.show_progress)
    scores = {}
    for task, (train, test) in sets.items():
        if test is None:
            scores[task] = round(eval_classification(encode, train.texts, train.labels)["accuracy"], 2)
        else:
            scores[task] = round(
                eval_classification(encode, train.texts, train.labels, test_texts=test.texts, test_labels=test.labels)[
                    "accuracy"
                ],
                2,
            )
    return {"scores": scores, "average": round(sum(scores.values()) / len(scores), 2), **fit_report(encoder, fitted_on)}


def run_isotropy(
    evaluator: Evaluator,
    config: EncoderConfig,
    *,
    texts_file: Path | None = None,
    limit: int | None = 5000,
    fit_corpus: str | None = None,
    transductive: bool = False,
    context_corpus: str | None = None,
    **_: Any,
) -> dict:
    """Mean pairwise cosine, partition ratio I(W) and effective rank of the encoder's vectors for a text file."""
    from isotrope.corpus import iter_texts
    from isotrope.sampling import reservoir_sample

    if texts_file is None:
        raise ValueError("isotropy needs --texts FILE")
    texts = reservoir_sample(iter_texts(texts_file), limit or 5000)
    encoder, fitted_on = evaluator.fit(config, fit_corpus, texts, transductive, context_corpus)
    scores = {key: round(value, 4) for key, value in isotropy_of(encoder, texts).items()}
    return {"scores": scores, **fit_report(encoder, fitted_on)}


RUNNERS: dict[str, Callable[..., dict]] = {
    "sts": run_sts,
    "retrieval": run_retrieval,
    "clustering": run_clustering,
    "classification": run_classification,
    "isotropy": run_isotropy,
}


def evaluate(task: str, config: EncoderConfig, evaluator: Evaluator | None = None, **options: Any) -> dict:
    """Run one task for one recipe; the result names the recipe (``saved encoder: ...`` for the
    evaluator's saved encoder, whose recipe ``config`` then is) and what the shaping was fitted on."""
    if task not in RUNNERS:
        raise ValueError(f"unknown task {task!r}; choose one of {', '.join(RUNNERS)}")
    import time

    evaluator = evaluator or Evaluator()
    tick = time.perf_counter()
    result = RUNNERS[task](evaluator, config, **options)
    transductive = result["fitted_on"].startswith("TRANSDUCTIVE")
    label = with_distilled_shape(resolve_config(config), result.get("distill") or {}).label()
    if evaluator.encoder is not None:
        label = f"saved encoder: {label}"
    return {
        "task": task,
        "recipe": label,
        **result,
        "transductive": transductive,
        "seconds": round(time.perf_counter() - tick, 1),
    }


def write_json(result: Any, path: Path | None) -> str:
    text = json.dumps(result, indent=2)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return text
