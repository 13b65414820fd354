"""--shape auto: label-free proxies, a paired bootstrap, a conservative rule, one backbone pass."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from conftest import GLOVE_WORDS, make_sentences
from isotrope.autoshape import (
    PROXY_DISAGREEMENT,
    STATIC_MARGIN,
    TRANSFORMER_MARGIN,
    choose_shape,
    conservative_choice,
    margin_for,
    proxy_is_reliable,
)
from isotrope.config import EncoderConfig
from isotrope.encoder import ShapedEncoder
from isotrope.pseudo_queries import (
    PROXIES,
    build_pseudo_queries,
    lead_query,
    masked_query,
    mrr_at_10,
    neighbour_query,
    number_of_queries,
    paired_interval,
    passage_query,
)

TEXT = "The river rises in spring. Farmers watch the water closely. Floods reach the old mill. The town builds a wall."


def _corpus(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    words = [w.lower() for w in GLOVE_WORDS if w.isalpha()]
    texts = []
    for _ in range(n):
        sentences = [" ".join(rng.choice(words, size=6)).capitalize() + "." for _ in range(int(rng.integers(3, 6)))]
        texts.append(" ".join(sentences))
    return texts


def test_passage_proxy_cuts_a_sentence_out_of_its_text() -> None:
    for seed in range(5):
        query, document = passage_query(TEXT, random.Random(seed))
        assert query in TEXT and query not in document
        assert sorted((query + " " + document).split()) == sorted(TEXT.split())
    assert passage_query("One sentence only here.", random.Random(0)) is None


def test_lead_proxy_is_the_first_sentence_against_the_body() -> None:
    assert lead_query(TEXT, random.Random(0)) == (
        "The river rises in spring.",
        "Farmers watch the water closely. Floods reach the old mill. The town builds a wall.",
    )
    assert lead_query("Short one. Two. Three.", random.Random(0)) is None  # lead too short to be a query


def test_neighbour_proxy_pairs_the_two_halves_of_a_text() -> None:
    halves = {"The river rises in spring. Farmers watch the water closely.", "Floods reach the old mill. The town builds a wall."}
    seen = set()
    for seed in range(10):
        query, document = neighbour_query(TEXT, random.Random(seed))
        assert {query, document} == halves
        seen.add(query)
    assert seen == halves  # either half can be the query
    assert neighbour_query("A b c d. E f g h. I j k l.", random.Random(0)) is None


def test_masked_proxy_is_a_shortened_subsequence_of_the_whole_text() -> None:
    sentence = "a man is slicing a large red tomato on the wooden board"
    for seed in range(10):
        query, document = masked_query(sentence, random.Random(seed))
        assert document is None  # the relevant text is the sample text itself
        words, position = sentence.split(), 0
        for word in query.split():  # the query's words appear in the text, in order
            position = words.index(word, position) + 1
        assert 3 <= len(query.split()) < len(words)
    assert masked_query("too short", random.Random(0)) is None


def test_pseudo_queries_take_at_most_one_text_each_and_are_seeded() -> None:
    texts = _corpus(50)
    for proxy in PROXIES:
        queries = build_pseudo_queries(texts, 20, proxy, seed=1)
        assert len({q.target for q in queries}) == len(queries) <= 20
        for query in queries:
            made = PROXIES[proxy](texts[query.target], random.Random(0))
            assert made is not None  # only texts the proxy can use
        assert queries == build_pseudo_queries(texts, 20, proxy, seed=1)
        assert queries != build_pseudo_queries(texts, 20, proxy, seed=2)
    with pytest.raises(ValueError, match="unknown proxy"):
        build_pseudo_queries(texts, 5, "guess")


def test_the_number_of_pseudo_queries_scales_with_the_corpus_within_bounds() -> None:
    assert [number_of_queries(n) for n in (50, 3000, 5183, 20000)] == [200, 300, 518, 1000]


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


def test_paired_interval_agrees_with_a_numpy_bootstrap() -> None:
    rng = np.random.default_rng(3)
    differences = rng.normal(0.4, 3.0, size=400)
    mean, low, high = paired_interval(differences, n_resamples=4000, seed=0)
    # reference: resample the queries with replacement, take percentiles of the resampled means
    draws = np.random.default_rng(99).integers(0, len(differences), size=(4000, len(differences)))
    reference = np.percentile(differences[draws].mean(axis=1), [2.5, 97.5])
    error = differences.std(ddof=1) / np.sqrt(len(differences))
    assert mean == pytest.approx(differences.mean())
    assert low == pytest.approx(reference[0], abs=0.25 * error)
    assert high == pytest.approx(reference[1], abs=0.25 * error)
    assert low == pytest.approx(mean - 1.96 * error, abs=0.25 * error)  # and with the normal approximation
    assert paired_interval(np.full(10, 2.0)) == (2.0, 2.0, 2.0)


def _scores(rng: np.random.Generator, n: int = 500) -> np.ndarray:
    return rng.uniform(0, 100, size=n)


def test_the_baseline_wins_when_differences_are_within_noise() -> None:
    rng = np.random.default_rng(0)
    base = _scores(rng)
    noisy = [base + rng.normal(0.3, 10.0, size=base.size) for _ in range(4)]  # +0.3 +- 0.45 (s.e.)
    chosen, comparisons = conservative_choice(np.stack([base, *noisy]), margin=0.0)
    assert chosen == 0
    assert comparisons[0] == (0.0, 0.0, 0.0)
    assert all(low <= 0 <= high for _, low, high in comparisons[1:])


def test_a_clearly_better_candidate_wins_and_the_bar_is_higher_for_transformers() -> None:
    rng = np.random.default_rng(1)
    base = _scores(rng)
    tie = base + rng.normal(0.0, 5.0, size=base.size)
    better = base + rng.normal(1.5, 1.0, size=base.size)  # +1.5 points, interval about [1.41, 1.59]
    much_better = base + rng.normal(5.0, 1.0, size=base.size)
    assert conservative_choice(np.stack([base, tie, better]), margin=0.5)[0] == 2  # static table margin
    assert conservative_choice(np.stack([base, tie, better]), margin=2.0)[0] == 0  # trained encoder margin
    assert conservative_choice(np.stack([base, better, much_better, tie]), margin=2.0)[0] == 2


def test_choose_shape_reports_its_evidence_and_is_deterministic(tiny_glove_path: str, tmp_path) -> None:
    texts = _corpus(400)
    candidates = [{"shape": "none"}, {"shape": "center"}, {"shape": "whiten"}, {"weights": "sif", "shape": "none"}]
    first = choose_shape(texts, EncoderConfig(model=tiny_glove_path), candidates=candidates, proxy="passage", seed=0)
    second = choose_shape(texts, EncoderConfig(model=tiny_glove_path), candidates=candidates, proxy="passage", seed=0)
    report = first.metadata["auto_shape"]
    seconds = [
        r.pop(key) for r in (report, second.metadata["auto_shape"]) for key in ("selection_seconds", "selection_cpu_seconds")
    ]
    assert all(s >= 0 for s in seconds)
    assert report == second.metadata["auto_shape"]
    assert report["proxy"] == "passage" and report["pseudo_queries"] >= 200 and report["splits"] == 3
    assert report["margin"] == 0.5 and "interval" in report["rule"]
    assert [row["shape"] for row in report["candidates"]] == ["none", "center", "whiten", "none"]
    for row in report["candidates"]:
        low, high = row["interval"]
        assert low <= row["vs_baseline"] <= high
    clearing = [row for row in report["candidates"][1:] if row["interval"][0] > 0.5]
    expected = max(clearing, key=lambda row: row["interval"][0]) if clearing else report["candidates"][0]
    assert report["chosen"] == candidates[report["candidates"].index(expected)]
    assert first.fingerprint == second.fingerprint
    # the returned encoder is the chosen recipe fitted on all texts
    reference = ShapedEncoder.create(tiny_glove_path, **report["chosen"])
    if reference.needs_corpus:
        reference.fit_sample(texts)
    np.testing.assert_allclose(first.encode(texts[:5]), reference.encode(texts[:5]), atol=1e-5)
    first.save(tmp_path / "enc")
    saved = json.loads((tmp_path / "enc" / "isotrope.json").read_text())
    assert saved["metadata"]["auto_shape"]["chosen"] == report["chosen"]


def test_one_sentence_texts_fall_back_to_the_masked_proxy(tiny_glove_path: str) -> None:
    texts = [" ".join(np.random.default_rng(i).choice(["cat", "dog", "sat", "mat", "runs", "fast"], 8)) + "." for i in range(300)]
    encoder = choose_shape(
        texts, EncoderConfig(model=tiny_glove_path), candidates=[{"shape": "none"}, {"shape": "center"}], proxy="passage"
    )
    assert encoder.metadata["auto_shape"]["proxy"] == "masked"
    assert encoder.metadata["auto_shape"]["margin"] == 2 * STATIC_MARGIN  # the fallback proxy's higher bar
    assert "doubled for the masked proxy" in encoder.metadata["auto_shape"]["rule"]


def test_the_backbone_runs_once_over_the_sample(tiny_bert_path: str) -> None:
    texts = _corpus(300)
    backbone = ShapedEncoder.create(tiny_bert_path).backbone
    seen: list[str] = []
    iter_batches = backbone.iter_batches
    backbone.iter_batches = lambda batch_texts, *args, **kwargs: (
        seen.extend(batch_texts) or iter_batches(batch_texts, *args, **kwargs)
    )
    encoder = choose_shape(texts, EncoderConfig(model=tiny_bert_path), proxy="passage", backbone=backbone)
    report = encoder.metadata["auto_shape"]
    assert len(report["candidates"]) == 6
    # the sample once, then each pseudo-query and each text it was cut from: never once per candidate
    assert sum(text in set(texts) for text in seen) == len(texts)
    assert len(seen) == len(texts) + 2 * report["pseudo_queries"]


def test_auto_in_the_harness_reuses_the_token_state_cache(tiny_bert_path: str, tmp_path, monkeypatch) -> None:
    from isotrope.backbones.hf import HFBackbone
    from isotrope.evaluate.commands import evaluate
    from isotrope.evaluate.harness import Evaluator

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(_corpus(100)) + "\n")
    recipe = EncoderConfig(model=tiny_bert_path, shape="auto")
    first, fitted_on = Evaluator(cache_dir=tmp_path / "cache").fit(recipe, str(corpus))
    assert "auto chose" in fitted_on
    result = evaluate("isotropy", recipe, Evaluator(cache_dir=tmp_path / "cache"), texts_file=corpus, fit_corpus=str(corpus))
    assert result["auto_shape"]["candidates"] == first.metadata["auto_shape"]["candidates"]
    calls = []
    forward = HFBackbone.forward
    monkeypatch.setattr(HFBackbone, "forward", lambda self, *args: calls.append(1) or forward(self, *args))
    second, _ = Evaluator(cache_dir=tmp_path / "cache").fit(recipe, str(corpus))
    assert not calls  # every candidate was scored from cached token states
    assert second.metadata["auto_shape"]["chosen"] == first.metadata["auto_shape"]["chosen"]


def test_choose_shape_needs_enough_text(tiny_glove_path: str) -> None:
    with pytest.raises(ValueError, match="larger corpus"):
        choose_shape(["one. two. three four five six."] * 3, EncoderConfig(model=tiny_glove_path))


def test_auto_is_not_a_fixed_chain() -> None:
    with pytest.raises(ValueError, match="chosen from a corpus"):
        ShapedEncoder.create("glove-6b-50d", shape="auto")


def test_candidates_fitted_from_shared_moments_equal_a_fresh_fit(tiny_glove_path: str) -> None:
    from isotrope.autoshape import PRESET_CANDIDATES, _fit_chain
    from isotrope.shapes import build_chain
    from isotrope.transforms import apply_chain
    from isotrope.transforms.moments import Moments

    rng = np.random.default_rng(3)
    fit_raw = (rng.normal(size=(400, 50)) * np.linspace(3, 0.1, 50) + 2.0).astype(np.float32)
    other = rng.normal(size=(20, 50)).astype(np.float32)
    moments = Moments.from_array(fit_raw)
    for preset in PRESET_CANDIDATES:
        chain = build_chain(preset)
        _fit_chain(chain, fit_raw, moments)
        reference = ShapedEncoder.create(tiny_glove_path, shape=preset).fit_transforms(fit_raw)
        np.testing.assert_allclose(apply_chain(chain, other), reference.apply_transforms(other), atol=1e-6, err_msg=preset)


def test_auto_on_fast_fits_the_presets_recipe_and_folds_it(tiny_bert_path: str) -> None:
    """For ``--model fast`` the candidates are fitted on the distilled table's unfolded vectors, as
    ``--shape PRESET`` is, and the chosen chain is folded into one table as that recipe is."""
    texts = make_sentences(400, seed=6)
    model = f"fast:{tiny_bert_path}"
    auto = choose_shape(
        texts, EncoderConfig(model=model, distill_samples=150), candidates=[{"weights": "sif", "shape": "whiten-partial"}]
    )
    reference = ShapedEncoder.create(model=model, weights="sif", shape="whiten-partial", distill_samples=150).fit(texts)
    assert auto.spec["backbone"]["type"] == "folded" and auto.shape == "l2"
    assert auto.metadata["auto_shape"]["chosen"] == {"weights": "sif", "shape": "whiten-partial"}
    assert auto.metadata["distill"] == reference.metadata["distill"]
    probe = make_sentences(30, seed=9)
    cosine = (auto.encode(probe) * reference.encode(probe)).sum(axis=1)
    assert cosine.min() >= 0.9999


def test_the_masked_proxy_never_moves_a_trained_encoder_where_it_has_disagreed_with_labels() -> None:
    # issue 31: masked rated whiten-partial +8.18 [4.59, 11.96] over none; the labels gave it -2.23
    assert not proxy_is_reliable("masked", static=False) and proxy_is_reliable("passage", static=False)
    assert margin_for(False, "masked") == PROXY_DISAGREEMENT[("masked", False)] > 2 * TRANSFORMER_MARGIN
    rng = np.random.default_rng(0)
    base = rng.random(400)
    whitened = base + 0.0818 + 0.03 * rng.standard_normal(400)  # that evidence, in MRR@10 units
    assert conservative_choice(100 * np.stack([base, whitened]), margin_for(False, "masked"))[0] == 0
    assert conservative_choice(100 * np.stack([base, whitened]), margin_for(False, "passage"))[0] == 1
    assert margin_for(True, "masked") == 2 * STATIC_MARGIN  # static tables: no recorded disagreement


def test_lower_case_abstracts_give_passage_pseudo_queries() -> None:
    texts = [t.lower().replace(". ", " . ") for t in _corpus(200)]
    assert len(build_pseudo_queries(texts, 100, "passage")) == 100
