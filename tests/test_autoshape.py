"""--shape auto: label-free pseudo-queries and a deterministic choice among candidate shapings."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import GLOVE_WORDS

from isotrope.autoshape import build_pseudo_queries, choose_shape, mrr_at_10, simplest_close_to_best
from isotrope.encoder import ShapedEncoder

TOPICS = [
    "the river flows past the old house",
    "a cat sleeps by the warm window",
    "the dog runs across the green field",
    "children read books in the quiet school",
]


def _corpus(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    words = [w.lower() for w in GLOVE_WORDS]
    texts = []
    for _ in range(n):
        sentences = [" ".join(rng.choice(words, size=6)).capitalize() + "." for _ in range(int(rng.integers(3, 6)))]
        texts.append(" ".join(sentences))
    return texts


def test_pseudo_queries_are_sentences_cut_out_of_their_document() -> None:
    texts = ["First sentence is here. Second one follows now. Third closes the text.",
             "Too short.",
             "Alpha beta gamma delta. Epsilon zeta eta theta. Iota kappa lambda mu."]
    queries, documents = build_pseudo_queries(texts, n_queries=10, seed=3)
    assert {q.document for q in queries} == {0, 2}  # the one-sentence text gives no query
    for query in queries:
        assert query.text in texts[query.document]
        assert query.text not in documents[query.document]
        assert documents[query.document]  # the rest of the text remains
    assert documents[1] == texts[1]


def test_pseudo_queries_use_titles_when_given() -> None:
    queries, documents = build_pseudo_queries(["body one. more. text.", "body two"], titles=["Title A", "Title B"])
    assert sorted((q.text, q.document) for q in queries) == [("Title A", 0), ("Title B", 1)]
    assert documents == ["body one. more. text.", "body two"]


def test_pseudo_queries_are_deterministic_for_a_seed() -> None:
    texts = _corpus(50)
    assert build_pseudo_queries(texts, 20, seed=1) == build_pseudo_queries(texts, 20, seed=1)
    assert build_pseudo_queries(texts, 20, seed=1)[0] != build_pseudo_queries(texts, 20, seed=2)[0]


def test_mrr_at_10_matches_a_brute_force_ranking() -> None:
    rng = np.random.default_rng(0)
    queries, documents = rng.normal(size=(30, 8)), rng.normal(size=(40, 8))
    relevant = rng.integers(0, 40, size=30)
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    expected = []
    for q, r in zip(unit(queries), relevant):
        ranking = list(np.argsort(-(unit(documents) @ q), kind="stable"))
        rank = ranking.index(r) + 1
        expected.append(1.0 / rank if rank <= 10 else 0.0)
    assert mrr_at_10(queries, documents, relevant) == pytest.approx(np.mean(expected))


def test_the_simplest_candidate_close_to_the_best_is_chosen() -> None:
    rng = np.random.default_rng(0)
    best = rng.uniform(0.3, 1.0, size=400)
    noise = rng.normal(0, 0.2, size=400)  # per-query differences: standard error 0.01
    close = best - 0.005 + noise - noise.mean()  # 0.5 standard errors below: not a real difference
    far = best - 0.05 + noise - noise.mean()  # 5 standard errors below
    for order, expected in (([far, close, best], 1), ([best, close, far], 0), ([far, best, close], 1)):
        chosen, gaps = simplest_close_to_best(order, min_effect=0.0)
        assert chosen == expected
    # with many queries a tiny difference is many standard errors, yet below the minimum effect
    steady = best - 0.008
    assert simplest_close_to_best([steady, best], min_effect=0.0)[0] == 1
    assert simplest_close_to_best([steady, best], min_effect=0.01)[0] == 0
    difference = best - far
    assert gaps[0] == pytest.approx(difference.mean() / (difference.std(ddof=1) / np.sqrt(400)))
    assert gaps[1] == 0.0


def test_choose_shape_records_every_candidate_and_is_deterministic(tiny_glove_path: str, tmp_path) -> None:
    texts = _corpus(120)
    candidates = [{"shape": "none"}, {"shape": "center"}, {"shape": "whiten"}, {"weights": "sif", "shape": "none"}]
    first = choose_shape(texts, {"model": tiny_glove_path}, candidates=candidates, n_queries=40, seed=0)
    second = choose_shape(texts, {"model": tiny_glove_path}, candidates=candidates, n_queries=40, seed=0)
    report = first.metadata["auto_shape"]
    assert report == second.metadata["auto_shape"]
    assert [row["shape"] for row in report["candidates"]] == ["none", "center", "whiten", "none"]
    best = max(report["candidates"], key=lambda row: row["mrr@10"])
    assert best["standard_errors_below_best"] == 0.0
    top = best["mrr@10"]
    first_close = next(row for row in report["candidates"]
                       if row["standard_errors_below_best"] <= 1.0 or top - row["mrr@10"] <= 1.0 + 1e-9)
    assert report["chosen"] == candidates[report["candidates"].index(first_close)]
    assert first.fingerprint == second.fingerprint
    # the returned encoder is the chosen recipe fitted on all texts
    reference = ShapedEncoder.create(tiny_glove_path, **report["chosen"])
    if reference.needs_corpus:
        reference.fit_sample(texts)
    np.testing.assert_allclose(first.encode(texts[:5]), reference.encode(texts[:5]), atol=1e-6)
    first.save(tmp_path / "enc")
    saved = json.loads((tmp_path / "enc" / "isotrope.json").read_text())
    assert saved["metadata"]["auto_shape"]["chosen"] == report["chosen"]


def test_auto_in_the_harness_reuses_the_token_state_cache(tiny_bert_path: str, tmp_path, monkeypatch) -> None:
    from isotrope.backbones.hf import HFBackbone
    from isotrope.evaluate.commands import evaluate
    from isotrope.evaluate.harness import Evaluator, Recipe

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(_corpus(60)) + "\n")
    recipe = Recipe(model=tiny_bert_path, shape="auto")
    first, fitted_on = Evaluator(cache_dir=tmp_path / "cache").fit(recipe, str(corpus))
    assert "auto chose" in fitted_on
    result = evaluate("isotropy", recipe, Evaluator(cache_dir=tmp_path / "cache"), texts_file=corpus, fit_corpus=str(corpus))
    assert result["auto_shape"] == first.metadata["auto_shape"]
    calls = []
    forward = HFBackbone.forward
    monkeypatch.setattr(HFBackbone, "forward", lambda self, *args: calls.append(1) or forward(self, *args))
    second, _ = Evaluator(cache_dir=tmp_path / "cache").fit(recipe, str(corpus))
    assert not calls  # every candidate was scored from cached token states
    assert second.metadata["auto_shape"] == first.metadata["auto_shape"]


def test_choose_shape_needs_enough_text(tiny_glove_path: str) -> None:
    with pytest.raises(ValueError, match="larger corpus"):
        choose_shape(["one. two. three four five six."] * 3, {"model": tiny_glove_path})


def test_auto_is_not_a_fixed_chain() -> None:
    with pytest.raises(ValueError, match="chosen from a corpus"):
        ShapedEncoder.create("glove-6b-50d", shape="auto")
