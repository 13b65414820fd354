"""``--model fast``: the distilled table, its fit, its validation and the saved encoder."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file
from scipy import sparse
from scipy.stats import spearmanr

import isotrope.distill as distill
from conftest import make_sentences
from isotrope.backbones.hf import HFBackbone
from isotrope.backbones.static import _input_embeddings
from isotrope.distill import distill_table, fast_source, solve_table
from isotrope.distill_proxy import token_bags
from isotrope.encoder import ShapedEncoder
from isotrope.fingerprint import fingerprint
from isotrope.shapes import build_chain
from test_cli import run_cli


def test_fast_names_resolve_to_a_teacher():
    assert fast_source("fast") == "fast:all-MiniLM-L6-v2"
    assert fast_source("FAST") == "fast:all-MiniLM-L6-v2"
    assert fast_source("fast:some/model") == "fast:some/model"
    assert fast_source("static:all-MiniLM-L6-v2") is None
    with pytest.raises(ValueError, match="name the teacher"):
        fast_source("fast:")


def test_conjugate_gradients_match_dense_least_squares():
    """min ||A T - Y||^2 + lam ||T - T0||^2 against NumPy's float64 least squares on the stacked system."""
    rng = np.random.default_rng(0)
    n, vocab, dim, lam = 60, 25, 7, 0.05
    dense = rng.random((n, vocab)) * (rng.random((n, vocab)) < 0.3)
    dense[:, [3, 17]] = 0  # tokens no text holds stay at T0
    dense[dense.sum(axis=1) == 0, 0] = 1.0
    dense /= dense.sum(axis=1, keepdims=True)
    targets, prior = rng.standard_normal((n, dim)), rng.standard_normal((vocab, dim))

    solved = solve_table(sparse.csr_matrix(dense), targets, prior, lam, iterations=2000, tol=1e-12, dtype=np.float64)
    default = solve_table(sparse.csr_matrix(dense), targets, prior, lam, iterations=2000, tol=1e-6)  # float32

    used = np.flatnonzero(dense.any(axis=0))
    stacked = np.vstack([dense[:, used], np.sqrt(lam) * np.eye(len(used))])
    rhs = np.vstack([targets, np.sqrt(lam) * prior[used]])
    reference = np.linalg.lstsq(stacked, rhs, rcond=None)[0]
    np.testing.assert_allclose(solved[used], reference, rtol=1e-6, atol=1e-8)
    np.testing.assert_array_equal(solved[[3, 17]], prior[[3, 17]])
    np.testing.assert_allclose(default[used], reference, rtol=1e-3, atol=1e-4)


def test_a_fit_is_kept_as_the_rows_it_moved():
    """solve_rows returns only the rows of the tokens the texts hold, equal to the whole table's solve; a fit
    warm-starts a solve on the same texts as the whole table would, and is scored in the prior without a copy:
    written in place (as is, or mixed with the prior's rows) and restored exactly."""
    rng = np.random.default_rng(1)
    n, vocab, dim, lam = 50, 30, 6, 0.1
    dense = rng.random((n, vocab)) * (rng.random((n, vocab)) < 0.3)
    dense[:, [0, 9, 20]] = 0
    dense[dense.sum(axis=1) == 0, 1] = 1.0
    bags = sparse.csr_matrix(dense / dense.sum(axis=1, keepdims=True))
    targets, prior = rng.standard_normal((n, dim)), rng.standard_normal((vocab, dim)).astype(np.float32)

    first = distill.solve_rows(bags, targets, prior, 3 * lam, iterations=5)
    assert list(first.rows) == [t for t in range(vocab) if t not in (0, 9, 20)] and first.values.dtype == np.float32
    np.testing.assert_array_equal(first.write(prior.copy()), solve_table(bags, targets, prior, 3 * lam, iterations=5))
    warm_rows = distill.solve_rows(bags, targets, prior, lam, iterations=5, start=first)
    warm_table = solve_table(bags, targets, prior, lam, iterations=5, start=first.write(prior.copy()))
    np.testing.assert_array_equal(warm_rows.write(prior.copy()), warm_table)
    with pytest.raises(ValueError, match="same texts"):
        distill.solve_rows(bags[:, :-1], targets, prior[:-1], lam, start=first)

    table, before = prior.copy(), prior.copy()
    with first.applied(table) as candidate:
        assert candidate is table
        np.testing.assert_array_equal(candidate, first.write(prior.copy()))
    np.testing.assert_array_equal(table, before)
    with first.applied(table, 0.5) as candidate:
        np.testing.assert_array_equal(candidate, 0.5 * prior + 0.5 * first.write(prior.copy()))
    np.testing.assert_array_equal(table, before)


def test_conjugate_gradients_need_a_positive_lambda():
    with pytest.raises(ValueError, match="positive"):
        solve_table(sparse.eye(3, format="csr"), np.zeros((3, 2)), np.zeros((3, 2)), 0.0)


@pytest.fixture(scope="module")
def teacher(tiny_bert_path):
    return HFBackbone(tiny_bert_path, device="cpu")


@pytest.fixture(scope="module")
def inputs(tiny_bert_path):
    return _input_embeddings(tiny_bert_path)


def table_and_report(*args, **kwargs):
    distilled = distill_table(*args, **kwargs)
    return distilled.table, distilled.report


def test_distillation_is_deterministic_for_a_seed(teacher, inputs):
    texts = make_sentences(300, seed=3)
    first, report = table_and_report(teacher, texts, inputs, samples=200, seed=0, lambdas=(1.0, 0.1))
    again, report_again = table_and_report(teacher, texts, inputs, samples=200, seed=0, lambdas=(1.0, 0.1))
    other, _ = table_and_report(teacher, texts, inputs, samples=200, seed=1, lambdas=(1.0, 0.1))
    np.testing.assert_array_equal(first, again)
    assert report == report_again
    assert report["teacher_texts"] == 200 and report["held_aside"] == 60
    mixes = {f"mix {lam:g} center" for lam in distill.MIX_LAMBDAS}  # the default mixes, in the second shaping only
    pairs = {f"pairs {lam:g}" for lam in distill.PAIR_LAMBDAS}  # the token-pair tables, in the default shaping
    assert set(report["validation"]["mrr@10"]) == {"unfitted", "1", "1 center", "0.1", "0.1 center"} | mixes | pairs
    assert not np.array_equal(first, other)  # another seed samples other texts
    pair_rows = report["pairs"]["rows"] if report["pairs"]["chosen"] else 0  # the token pairs' rows after the tokens'
    assert first.shape == (inputs.shape[0] + pair_rows, inputs.shape[1]) and first.dtype == np.float32


def test_unfitted_table_is_each_tokens_mean_state(teacher, inputs):
    """With too few texts to validate, the table is the context average (independent NumPy loop)."""
    texts = make_sentences(40, seed=5)
    table, report = table_and_report(teacher, texts, inputs, samples=40)
    assert report["fitted"] is False
    sums, counts = np.zeros((teacher.vocab_size, teacher.dim)), np.zeros(teacher.vocab_size)
    for text in texts:
        batch = teacher.embed([text])
        for position, token in enumerate(batch.input_ids[0]):
            if not batch.special_mask[0, position]:
                sums[token] += batch.states[0, position]
                counts[token] += 1
    seen = counts > 0
    np.testing.assert_allclose(table[seen], sums[seen] / counts[seen, None], rtol=1e-4, atol=1e-5)
    assert np.abs(table[~seen]).sum() > 0  # unseen tokens: mapped input embeddings, not zeros


@pytest.mark.parametrize("shift", [-0.3, 0.0])
def test_the_proxy_vetoes_a_fit_only_when_its_interval_lies_below_zero(teacher, inputs, monkeypatch, shift):
    """The fit that agrees best with the teacher's neighbours is kept unless its pseudo-query interval against
    the unfitted table lies wholly below 0 (scores faked here: the proxy itself is tested below)."""
    import isotrope.distill_proxy as proxy_module

    texts = make_sentences(300, seed=4)
    unfitted, _ = table_and_report(teacher, texts, inputs, pair_lambdas=(), samples=250, lambdas=(), mixes=())
    rng = np.random.default_rng(0)
    calls: list[np.ndarray] = []

    def fake_ranks(table, fit_bags, proxy, shape="whiten-partial"):
        base = np.random.default_rng(1).uniform(0.4, 1.0, len(proxy.targets))
        calls.append(base if not calls else np.clip(base + shift + 0.05 * rng.standard_normal(len(base)), 0, 1))
        return calls[-1]

    monkeypatch.setattr(proxy_module, "reciprocal_ranks", fake_ranks)
    agreements = iter([0.5, 0.55, 0.6])  # unfitted, lam 1, lam 0.1: the weaker fit agrees best
    monkeypatch.setattr(distill, "neighbour_agreement", lambda *args, **kwargs: next(agreements))
    table, report = table_and_report(
        teacher, texts, inputs, pair_lambdas=(), samples=250, lambdas=(1.0, 0.1), shapes=distill.SHAPES[:1], mixes=()
    )
    means = report["validation"]["vs_unfitted"]
    best = "0.1"
    assert report["validation"]["mrr@10"]["unfitted"] == pytest.approx(100 * calls[0].mean(), abs=0.01)
    if shift < 0:
        assert report["fitted"] is False and "wholly below +0" in report["reason"] and "unfitted context" in report["reason"]
        assert means[best][2] < 0
        np.testing.assert_array_equal(table, unfitted)
    else:
        assert report["fitted"] is True and report["lam"] == float(best) and means[best][1] < 0 < means[best][2]
        assert not np.array_equal(table, unfitted)


def test_a_vetoed_fit_gives_way_to_the_next_best_agreement(teacher, inputs, monkeypatch):
    import isotrope.distill_proxy as proxy_module

    texts = make_sentences(300, seed=4)
    base = np.random.default_rng(1).uniform(0.4, 1.0, 300)
    shifts = iter([0.0, 0.0, -0.3])  # unfitted, lam 1 (as good), lam 0.1 (clearly worse)
    monkeypatch.setattr(
        proxy_module,
        "reciprocal_ranks",
        lambda table, fit_bags, proxy, shape="whiten-partial": np.clip(base[: len(proxy.targets)] + next(shifts), 0, 1),
    )
    agreements = iter([0.5, 0.55, 0.6])  # lam 0.1 agrees best, but the proxy vetoes it
    monkeypatch.setattr(distill, "neighbour_agreement", lambda *args, **kwargs: next(agreements))
    _, report = table_and_report(
        teacher, texts, inputs, pair_lambdas=(), samples=250, lambdas=(1.0, 0.1), shapes=distill.SHAPES[:1], mixes=()
    )
    assert report["fitted"] is True and report["lam"] == 1.0 and "vetoed: lam 0.1 -30.00" in report["reason"]


def test_no_fit_that_agrees_better_with_the_teacher_keeps_the_unfitted_table(teacher, inputs, monkeypatch):
    texts = make_sentences(300, seed=4)
    unfitted, _ = table_and_report(teacher, texts, inputs, pair_lambdas=(), samples=250, lambdas=(), mixes=())
    agreements = iter([0.5, 0.4, 0.5])  # unfitted, lam 1, lam 0.1: none above the unfitted table
    monkeypatch.setattr(distill, "neighbour_agreement", lambda *args, **kwargs: next(agreements))
    table, report = table_and_report(
        teacher, texts, inputs, pair_lambdas=(), samples=250, lambdas=(1.0, 0.1), shapes=distill.SHAPES[:1], mixes=()
    )
    assert report["fitted"] is False and "agreement with the teacher's neighbours" in report["reason"]
    assert report["validation"]["agreement"] == {"unfitted": 0.5, "1": 0.4, "0.1": 0.5}
    np.testing.assert_array_equal(table, unfitted)


def test_the_fit_and_its_shaping_are_chosen_together_by_agreement(teacher, inputs, monkeypatch):
    """Each fit is scored in every shaping of ``SHAPES`` (agreement and proxy in that shaping): the candidate
    of best agreement, not vetoed, names both its strength and its shaping."""
    import isotrope.distill_proxy as proxy_module

    texts = make_sentences(300, seed=4)
    base = np.random.default_rng(1).uniform(0.4, 1.0, 300)
    seen: list[tuple[str, str]] = []

    def fake_ranks(table, fit_bags, proxy, shape="whiten-partial"):
        seen.append(("ranks", shape))
        return base[: len(proxy.targets)]

    scores = {"whiten-partial": iter([0.5, 0.55, 0.6]), "center": iter([0.65, 0.58])}  # lam 1 centred agrees best

    def fake_agreement(*args, shape="whiten-partial", **kwargs):
        seen.append(("agreement", shape))
        return next(scores[shape])

    monkeypatch.setattr(proxy_module, "reciprocal_ranks", fake_ranks)
    monkeypatch.setattr(distill, "neighbour_agreement", fake_agreement)
    _, report = table_and_report(
        teacher, texts, inputs, pair_lambdas=(), samples=250, lambdas=(1.0, 0.1), shapes=("whiten-partial", "center"), mixes=()
    )
    assert report["fitted"] is True and report["lam"] == 1.0 and report["shape"] == "center"
    assert report["reason"].startswith("lam 1 center: neighbour agreement 0.5000 -> 0.6500")
    assert list(report["validation"]["agreement"]) == ["unfitted", "1", "1 center", "0.1", "0.1 center"]
    assert seen.count(("ranks", "center")) == seen.count(("agreement", "center")) == 2


@pytest.mark.parametrize(("centred", "chosen"), [(0.61, "whiten-partial"), (0.63, "center")])
def test_another_shaping_needs_a_margin_of_agreement(teacher, inputs, monkeypatch, centred, chosen):
    """The default shaping's best candidate is kept unless another shaping's agrees better by more than
    ``SHAPE_MARGIN`` (0.02): 0.61 against 0.60 keeps it, 0.63 does not."""
    import isotrope.distill_proxy as proxy_module

    base = np.random.default_rng(1).uniform(0.4, 1.0, 300)
    monkeypatch.setattr(
        proxy_module, "reciprocal_ranks", lambda table, fit_bags, proxy, shape="whiten-partial": base[: len(proxy.targets)]
    )
    agreements = iter([0.5, 0.6, centred])  # unfitted, lam 1, lam 1 centred
    monkeypatch.setattr(distill, "neighbour_agreement", lambda *args, **kwargs: next(agreements))
    _, report = table_and_report(
        teacher,
        make_sentences(300, seed=4),
        inputs,
        pair_lambdas=(),
        samples=250,
        lambdas=(1.0,),
        mixes=(),
        shapes=("whiten-partial", "center"),
    )
    assert distill.SHAPE_MARGIN == 0.02 and report["fitted"] is True and report["shape"] == chosen


def test_a_mix_candidate_is_half_the_unfitted_table_and_half_the_fit(teacher, inputs, monkeypatch):
    """``mixes``: MIX of the unfitted table and the rest of the fit at that strength, tried in the shapings after the
    first, in validation and in the final table (against the two ends computed on their own)."""
    texts = make_sentences(300, seed=4)
    unfitted, _ = table_and_report(teacher, texts, inputs, pair_lambdas=(), samples=250, lambdas=(), mixes=())
    agreements = iter([0.5, 0.6, 0.5, 0.6])  # unfitted, then the one candidate (lam 0.1; mix 0.1 center): chosen
    monkeypatch.setattr(distill, "neighbour_agreement", lambda *args, **kwargs: next(agreements))
    fitted, fit_report = table_and_report(
        teacher, texts, inputs, pair_lambdas=(), samples=250, lambdas=(0.1,), mixes=(), margin=-100.0, shapes=distill.SHAPES[:1]
    )
    mixed, report = table_and_report(
        teacher,
        texts,
        inputs,
        pair_lambdas=(),
        samples=250,
        lambdas=(),
        mixes=(0.1,),
        margin=-100.0,
        shapes=("whiten-partial", "center"),
    )
    assert list(report["validation"]["agreement"]) == ["unfitted", "mix 0.1 center"]
    assert report["reason"].startswith("lam mix 0.1 center:") and report["shape"] == "center"
    assert report["fitted"] and report["lam"] == fit_report["lam"] == 0.1 and report["mix"] == distill.MIX == 0.5
    assert fit_report["mix"] == 0.0
    np.testing.assert_allclose(mixed, 0.5 * unfitted.astype(np.float64) + 0.5 * fitted, rtol=1e-5, atol=1e-6)


def test_neighbour_agreement_in_a_shaping_matches_brute_force():
    """Agreement after ``center`` against a float64 reference: centre on the train vectors, cosine top-k overlap."""
    rng = np.random.default_rng(3)
    train, test, teacher = rng.standard_normal((80, 6)) + 2.0, rng.standard_normal((30, 6)) + 2.0, rng.standard_normal((30, 4))
    shaped = test - train.mean(axis=0)
    shaped /= np.linalg.norm(shaped, axis=1, keepdims=True)
    unit = teacher / np.linalg.norm(teacher, axis=1, keepdims=True)
    overlaps = []
    for i in range(30):
        mine = [j for j in np.argsort(-(shaped @ shaped[i])) if j != i][:5]
        theirs = [j for j in np.argsort(-(unit @ unit[i])) if j != i][:5]
        overlaps.append(len(set(mine) & set(theirs)) / 5)
    found = distill.neighbour_agreement(train, test, teacher, k=5, shape="center")
    assert found == pytest.approx(np.mean(overlaps))
    assert found != pytest.approx(distill.neighbour_agreement(train, test, teacher, k=5))  # whiten-partial differs


def paragraphs(n: int, seed: int) -> list[str]:
    """``n`` texts of 3 to 6 capitalised sentences (so the sentence splitter cuts them)."""
    sentences = make_sentences(6 * n, seed=seed)
    rng = np.random.default_rng(seed)
    texts, at = [], 0
    for _ in range(n):
        k = int(rng.integers(3, 7))
        texts.append(" ".join(s.rstrip(".!?").capitalize() + "." for s in sentences[at : at + k]))
        at += k
    return texts


def test_a_small_corpus_spends_the_budget_on_its_sentences():
    texts = paragraphs(50, seed=1)
    sample, parents, n_chunks = distill.teacher_texts(texts + texts[:5], 120, np.random.default_rng(0), "sentences")
    assert n_chunks == 50 and sample[:50] == texts and len(sample) == 120  # every distinct chunk, then 70 windows
    for window, parent in zip(sample[50:], parents[50:]):
        assert window in texts[parent] and window not in texts and len(window.split()) >= 4
    assert len(set(sample)) == len(sample)
    everything, _, _ = distill.teacher_texts(texts, 10_000, np.random.default_rng(0), "sentences")
    assert distill.teacher_texts(texts, 10_000, np.random.default_rng(0))[0] == texts  # the default: no windows
    expected = {s for t in texts for s in re.split(r"(?<=\.) (?=[A-Z])", t) if len(s.split()) >= 4}
    assert set(everything[50:]) == expected - set(texts)  # the budget exceeds them: all of them
    large, large_parents, _ = distill.teacher_texts(texts, 30, np.random.default_rng(0))
    assert len(large) == 30 and set(large) <= set(texts) and list(large_parents) == list(range(30))


def test_held_aside_chunks_and_their_windows_stay_out_of_the_validation_fit(teacher, inputs, monkeypatch):
    texts = paragraphs(220, seed=2)
    seen: dict[str, Any] = {}
    passes = distill.teacher_pass

    def recording_pass(teacher, sample, holdout, show_progress=False):
        seen["sample"], seen["holdout"] = list(sample), set(holdout.tolist())
        return passes(teacher, sample, holdout, show_progress)

    monkeypatch.setattr(distill, "teacher_pass", recording_pass)
    _, report = table_and_report(teacher, texts, inputs, samples=600, lambdas=(1.0,), windows="sentences")
    assert report["chunks"] == 220 and report["windows"] == 380 and report["held_aside"] == 66  # 30 % of 220
    held_chunks = {seen["sample"][i] for i in seen["holdout"] if i < 220}
    assert len(held_chunks) == 66
    for index, text in enumerate(seen["sample"][220:], start=220):
        assert (index in seen["holdout"]) == any(text in chunk for chunk in held_chunks)
    assert report["validation"]["proxy"] == "passage" and 30 <= report["validation"]["pseudo_queries"] <= 66


def test_query_rows_are_each_chunks_sentences_weighing_as_its_own_row(teacher):
    chunks = paragraphs(12, seed=5)
    chunks[3] = "A single sentence of several words."  # no query rows (and no division by zero)
    bags, parents, scale = distill.query_rows(chunks, teacher.token_ids, teacher.vocab_size, teacher.special_ids(), 2.0)
    split = [re.split(r"(?<=\.) (?=[A-Z])", c) for c in chunks]
    found = [[s for s in parts if len(s.split()) >= 4] if len(parts) >= 2 else [] for parts in split]
    expected = [(s, p) for p, kept in enumerate(found) if len(kept) >= 3 for s in kept]  # chunks of >= 3 sentences
    assert list(parents) == [p for _, p in expected]
    assert 3 not in parents and len(set(parents)) >= 6
    weights = np.bincount(parents, weights=scale**2, minlength=len(chunks))
    np.testing.assert_allclose(weights[np.unique(parents)], 2.0)  # each chunk's rows together: weight 2
    reference = token_bags(teacher.token_ids([s for s, _ in expected]), teacher.vocab_size, teacher.special_ids())
    np.testing.assert_allclose(bags.toarray(), reference.toarray() * scale[:, None])


def test_pseudo_query_rows_join_the_fit_and_respect_the_held_aside_chunks(teacher, inputs):
    texts = paragraphs(220, seed=2)
    _, report = table_and_report(teacher, texts, inputs, samples=220, lambdas=(0.1,), query_weight=0.0)
    _, rows_report = table_and_report(teacher, texts, inputs, samples=220, lambdas=(0.1,))  # the default: weight 1
    assert "query_rows" not in report and rows_report["query_rows"] > 220 and rows_report["windows"] == 0
    assert rows_report["held_aside"] == report["held_aside"]
    assert rows_report["validation"]["mrr@10"]["unfitted"] == report["validation"]["mrr@10"]["unfitted"]
    assert rows_report["validation"]["mrr@10"]["0.1"] != report["validation"]["mrr@10"]["0.1"]


def test_the_final_fit_leaves_out_the_held_aside_chunks_query_rows_and_names_them(teacher, inputs, monkeypatch):
    """The store's default-search calibration cuts pseudo-queries from the held-aside chunks: the final table
    must not have learned their sentences (their own chunk rows stay in)."""
    texts = paragraphs(220, seed=2)
    seen: dict[str, Any] = {}
    passes, solves = distill.teacher_pass, distill.solve_rows

    def recording_pass(teacher, sample, holdout, show_progress=False):
        seen["held"] = [sample[i] for i in sorted(holdout.tolist())]
        return passes(teacher, sample, holdout, show_progress)

    def recording_solve(bags, *args, **kwargs):
        seen["rows"] = bags.shape[0]
        return solves(bags, *args, **kwargs)

    monkeypatch.setattr(distill, "teacher_pass", recording_pass)
    monkeypatch.setattr(distill, "solve_rows", recording_solve)
    agreements = iter([0.5, 0.6])  # the fit agrees better than the unfitted table: it is kept
    monkeypatch.setattr(distill, "neighbour_agreement", lambda *args, **kwargs: next(agreements))
    _, report = table_and_report(
        teacher, texts, inputs, pair_lambdas=(), samples=220, lambdas=(0.1,), margin=-100.0, shapes=distill.SHAPES[:1], mixes=()
    )
    assert report["fitted"] is True and len(seen["held"]) == report["held_aside"] == 66
    assert set(report["held_aside_chunks"]) == {distill.text_key(t) for t in seen["held"]}
    held_rows = len(distill.query_rows(seen["held"], teacher.token_ids, teacher.vocab_size, teacher.special_ids(), 1.0)[1])
    assert held_rows > 0 and seen["rows"] == 220 + report["query_rows"] - held_rows  # the last solve: the final fit


def test_a_pair_tables_final_fit_sees_the_held_aside_chunks_as_tokens_alone(teacher, inputs, monkeypatch):
    """A pair table's rows learn phrases: in its final fit the held-aside chunks' own rows hold their tokens and no
    pair (and their pseudo-query rows stay out), so that the default-search calibration's pseudo-queries, cut from
    them, meet pair rows that never learned them."""
    texts = paragraphs(220, seed=2)
    seen: dict[str, Any] = {}
    passes, solves = distill.teacher_pass, distill.solve_rows

    def recording_pass(teacher, sample, holdout, show_progress=False):
        seen["held"] = sorted(holdout.tolist())
        return passes(teacher, sample, holdout, show_progress)

    def recording_solve(bags, *args, **kwargs):
        seen["bags"] = bags
        return solves(bags, *args, **kwargs)

    monkeypatch.setattr(distill, "teacher_pass", recording_pass)
    monkeypatch.setattr(distill, "solve_rows", recording_solve)
    monkeypatch.setattr(distill, "PAIR_GIVE_BACK", float("inf"))
    distilled = distill_table(teacher, texts, inputs, samples=220, lambdas=(0.1,), margin=-100.0, mixes=())
    assert distilled.report["pairs"]["chosen"] and distilled.pairs is not None
    bags, vocab = seen["bags"].tocsr(), teacher.vocab_size  # the last solve: the final fit (texts first, in order)
    pair_columns = (bags[:220, vocab:] != 0).sum(axis=1).A.ravel()
    held = np.zeros(220, dtype=bool)
    held[seen["held"]] = True
    assert len(seen["held"]) == 66 and not pair_columns[held].any() and pair_columns[~held].sum() > 0
    assert np.allclose(bags[:220][held].sum(axis=1), 1.0)  # still each chunk's bag of tokens
    held_rows = len(distill.query_rows([texts[i] for i in seen["held"]], teacher.token_ids, vocab, teacher.special_ids(), 1.0)[1])
    assert bags.shape[0] == 220 + distilled.report["query_rows"] - held_rows


def test_token_bags_match_a_dense_count():
    special = np.array([0, 2])
    bags = token_bags([[1, 1, 3, 0], [2], [4, 5, 5, 5]], 6, special).toarray()
    expected = np.array([[0, 2, 0, 1, 0, 0], [0] * 6, [0, 0, 0, 0, 1, 3]], dtype=float)
    expected[0] /= 3
    expected[2] /= 4
    np.testing.assert_allclose(bags, expected)


def test_the_proxy_ranks_each_query_against_the_rest_of_its_chunk():
    """Each query's document is its chunk without the cut sentence; reciprocal ranks among the held-aside
    and the fit chunks match a brute-force argsort of cosines after whiten-partial fitted on the fit
    chunks' vectors."""
    from isotrope.distill_proxy import make_proxy, reciprocal_ranks

    texts, others = paragraphs(40, seed=3), paragraphs(30, seed=4)
    vocabulary = sorted({w.strip(".").lower() for t in texts + others for w in t.split()})
    index = {w: i + 1 for i, w in enumerate(vocabulary)}

    def tokenize(batch: list[str]) -> list[list[int]]:
        return [[index[w.strip(".").lower()] for w in text.split()] for text in batch]

    proxy = make_proxy(texts, tokenize, len(index) + 1, np.array([0]), seed=0)
    assert proxy is not None and proxy.proxy == "passage" and len(proxy.targets) >= 30
    rng = np.random.default_rng(0)
    table = rng.standard_normal((len(index) + 1, 8)).astype(np.float32)
    fit_bags = token_bags(tokenize(others), len(index) + 1, np.array([0]))
    ranks = reciprocal_ranks(table, fit_bags, proxy)
    chain = build_chain("whiten-partial")
    fit = (fit_bags @ table).astype(np.float32)
    for transform in chain:
        transform.fit(fit)
        fit = transform.transform(fit)
    queries, documents = proxy.queries @ table, np.vstack([proxy.documents.toarray(), fit_bags.toarray()]) @ table
    for transform in chain:
        queries, documents = transform.transform(queries), transform.transform(documents)
    queries = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    documents = documents / np.linalg.norm(documents, axis=1, keepdims=True)
    for query, target, rank in zip(queries, proxy.targets, ranks):
        position = list(np.argsort(-(documents @ query), kind="stable")).index(target) + 1
        assert rank == pytest.approx(1 / position if position <= 10 else 0.0)
    assert 0 < ranks.mean() < 1
    for row in proxy.documents.toarray():
        assert row.sum() == pytest.approx(1)
    one_word = make_proxy(["Alpha beta gamma delta epsilon zeta eta."] * 40, lambda b: [[1] * 7 for _ in b], 2, np.array([0]), 0)
    assert one_word is not None and one_word.proxy == "masked"


@pytest.fixture(scope="module")
def fast_encoder(tiny_bert_path):
    encoder = ShapedEncoder.create(model=f"fast:{tiny_bert_path}", distill_samples=150)
    return encoder.fit(make_sentences(300, seed=6))


@pytest.mark.slow
def test_fast_encoder_is_the_folded_whiten_partial_chain(fast_encoder, tiny_bert_path):
    """The fitted fast encoder is one folded table equal to the unfolded chain: distilled table,
    special tokens left out, whiten-partial."""
    texts = make_sentences(20, seed=9)
    unfolded = ShapedEncoder.create(model=f"fast:{tiny_bert_path}", distill_samples=150)
    unfolded._fold_in_place = lambda: False
    unfolded.fit(make_sentences(300, seed=6))
    chosen = unfolded.metadata["distill"]["shape"]
    assert unfolded.shape == ShapedEncoder.create(model="glove-6b-50d", shape=chosen).shape
    assert unfolded.config.shape == chosen
    assert unfolded.weighting.exclude_special
    assert fast_encoder.spec["backbone"]["type"] == "folded" and fast_encoder.shape == "l2"
    assert fast_encoder.metadata["distill"] == unfolded.metadata["distill"]
    assert fast_encoder.metadata["distill"]["teacher_texts"] == 150
    cosine = (fast_encoder.encode(texts) * unfolded.encode(texts)).sum(axis=1)
    assert cosine.min() >= 0.9999


@pytest.mark.parametrize("shape", ["whiten-partial", "whiten(power=-0.25),l2", "center"])
def test_the_encoder_takes_the_distilled_shaping_only_at_its_default(tiny_bert_path, monkeypatch, shape):
    """The default ``whiten-partial`` gives way to the shaping the distillation chose; a shaping asked for otherwise
    stays, and the saved recipe says what was fitted."""
    from isotrope.backbones.static import StaticBackbone

    fit = StaticBackbone.fit

    def choosing_center(self, texts, show_progress=False, **kwargs):
        fit(self, texts, show_progress, **kwargs)
        self.distill_report["shape"] = "center"
        return self

    monkeypatch.setattr(StaticBackbone, "fit", choosing_center)
    encoder = ShapedEncoder.create(model=f"fast:{tiny_bert_path}", distill_samples=150, shape=shape)
    encoder._fold_in_place = lambda: False
    encoder.fit(make_sentences(200, seed=6))
    expected = "center" if shape == "whiten-partial" else shape
    assert encoder.config.shape == expected
    assert encoder.shape == ShapedEncoder.create(model="glove-6b-50d", shape=expected).shape
    folded = ShapedEncoder.create(model=f"fast:{tiny_bert_path}", distill_samples=150, shape=shape).fit(
        make_sentences(200, seed=6)
    )
    texts = make_sentences(20, seed=9)
    assert folded.spec["backbone"]["type"] == "folded"  # the centred chain folds as whiten-partial does
    assert (folded.encode(texts) * encoder.encode(texts)).sum(axis=1).min() >= 0.9999


def test_the_recipe_names_the_distilled_shaping():
    """What an evaluation reports as the recipe: the shaping the distillation chose, at the default only."""
    from isotrope.config import EncoderConfig
    from isotrope.encoder import resolve_config, with_distilled_shape

    default = resolve_config(EncoderConfig(model="fast"))
    assert (
        with_distilled_shape(default, {"shape": "center"}).label()
        == resolve_config(EncoderConfig(model="fast", shape="center")).label()
    )
    assert with_distilled_shape(default, {}) == default
    spelled = resolve_config(EncoderConfig(model="fast", shape="whiten(power=-0.25),l2"))
    assert with_distilled_shape(spelled, {"shape": "center"}) == spelled


def test_distill_samples_only_for_fast(tiny_bert_path):
    with pytest.raises(ValueError, match="distill_samples applies to the fast model"):
        ShapedEncoder.create(model=tiny_bert_path, distill_samples=10)


def test_save_load_gives_identical_vectors_and_the_fingerprint_covers_the_table(fast_encoder, tmp_path):
    texts = ["the cat runs fast.", "a dog sleeps in the house", "blue music"]
    fast_encoder.save(tmp_path / "enc")
    state = load_file(tmp_path / "enc" / "state.safetensors")
    np.testing.assert_array_equal(state["backbone.table"], fast_encoder.backbone.get_state()["table"])
    loaded = ShapedEncoder.load(tmp_path / "enc")
    np.testing.assert_array_equal(loaded.encode(texts), fast_encoder.encode(texts))
    assert loaded.fingerprint == fast_encoder.fingerprint
    loaded.backbone.get_state()["table"][7] += 1.0  # hashed with the table: another table, another fingerprint
    assert fingerprint(loaded.spec, loaded.get_state()) != fast_encoder.fingerprint


def test_the_cli_words_core_errors_as_its_flags(monkeypatch, capsys, tmp_path, tiny_bert_path):
    """The core raises in the API's terms (``distill_samples``); the command line names the flag."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(make_sentences(20, seed=1)) + "\n")
    args = ("fit", corpus, "--model", tiny_bert_path, "--distill-samples", "10", "--out", tmp_path / "enc")
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert code == 1 and "error: --distill-samples applies to the fast model" in err and "distill_samples" not in err


def test_fit_then_index_and_eval_with_the_saved_encoder(monkeypatch, capsys, tmp_path, tiny_bert_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(make_sentences(200, seed=8)) + "\n")
    code, out, err = run_cli(
        monkeypatch,
        capsys,
        "fit",
        corpus,
        "--model",
        f"fast:{tiny_bert_path}",
        "--distill-samples",
        "120",
        "--out",
        tmp_path / "enc",
    )
    assert code == 0, err
    encoder = ShapedEncoder.load(tmp_path / "enc")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("the cat sleeps on the house.\n\nthe dog runs in the rain.")
    (docs / "b.txt").write_text("music is good and the sun is big.")
    code, out, err = run_cli(
        monkeypatch,
        capsys,
        "index",
        docs,
        "--store",
        f"faiss:{tmp_path / 's'}",
        "--encoder",
        tmp_path / "enc",
        "--chunk-tokens",
        "64",
        "--overlap-tokens",
        "8",
    )
    assert code == 0, err
    code, out, err = run_cli(monkeypatch, capsys, "info", f"faiss:{tmp_path / 's'}")
    assert json.loads(out)["fingerprint"] == encoder.fingerprint
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(
        "the cat runs\tthe cat walks\t4.0\nthe dog eats\tthe sun is red\t0.5\n"
        "music is good\tmusic is bad\t2.5\nthe car is fast\ta car is fast\t5.0\n"
    )
    code, out, err = run_cli(monkeypatch, capsys, "eval", "sts", "--encoder", tmp_path / "enc", "--pairs", pairs)
    assert code == 0, err
    result = json.loads(out)
    assert result["fitted_on"].startswith("saved encoder") and result["recipe"].startswith("saved encoder")
    rows = [line.split("\t") for line in pairs.read_text().splitlines()]
    first, second = encoder.encode([row[0] for row in rows]), encoder.encode([row[1] for row in rows])
    cosine = (first * second).sum(axis=1) / np.linalg.norm(first, axis=1) / np.linalg.norm(second, axis=1)
    expected = spearmanr(cosine, [float(row[2]) for row in rows]).statistic * 100
    assert result["scores"]["pairs"] == pytest.approx(expected, abs=0.01)


@pytest.mark.parametrize("command", ["index", "eval"])
@pytest.mark.parametrize("flag", [["--model", "all-MiniLM-L6-v2"], ["--shape", "whiten"]])
def test_encoder_with_model_or_shape_is_a_one_line_error(monkeypatch, capsys, tmp_path, command, flag):
    head = ["index", tmp_path, "--store", f"faiss:{tmp_path / 's'}"] if command == "index" else ["eval", "sts"]
    code, _out, err = run_cli(monkeypatch, capsys, *head, "--encoder", tmp_path / "enc", *flag)
    assert code == 1
    assert err.count("\n") == 1 and "--encoder" in err and flag[0] in err


def test_the_teacher_is_released_before_the_table_is_solved(tiny_bert_path, inputs, monkeypatch):
    """The solves run without the transformer in memory (its weights and activations are the peak)."""
    import gc

    class Teacher(HFBackbone):
        pass

    alive_at_solve: list[int] = []
    solve = distill.solve_rows

    def counting_solve(*args, **kwargs):
        gc.collect()
        alive_at_solve.append(sum(isinstance(thing, Teacher) for thing in gc.get_objects()))
        return solve(*args, **kwargs)

    monkeypatch.setattr(distill, "solve_rows", counting_solve)
    distilled = distill_table(  # the teacher passed as a temporary: the helper's arguments would hold it
        Teacher(tiny_bert_path, device="cpu"), make_sentences(300, seed=4), inputs, samples=250, lambdas=(1.0,)
    )
    assert distilled.report["fitted"] in (True, False) and alive_at_solve and set(alive_at_solve) == {0}
    assert distilled.table.dtype == np.float32


def test_the_input_table_is_loaded_after_the_teachers_pass(teacher, inputs, monkeypatch):
    """A loader of the input embeddings runs once the teacher is done (the two are never in memory together),
    and gives the table an array gives."""
    events: list[str] = []
    passes = distill.teacher_pass

    def recording_pass(*args, **kwargs):
        events.append("pass")
        return passes(*args, **kwargs)

    def load() -> np.ndarray:
        events.append("load")
        return inputs

    monkeypatch.setattr(distill, "teacher_pass", recording_pass)
    texts = make_sentences(300, seed=4)
    table, report = table_and_report(teacher, texts, load, samples=250, lambdas=(1.0,), mixes=())
    assert events == ["pass", "load"]
    again, report_again = table_and_report(teacher, texts, inputs, samples=250, lambdas=(1.0,), mixes=())
    np.testing.assert_array_equal(table, again)
    assert report == report_again
