"""``--model fast``: the distilled table, its fit, its validation and the saved encoder."""

from __future__ import annotations

import json

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
from isotrope.encoder import ShapedEncoder
from isotrope.fingerprint import fingerprint
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


def test_conjugate_gradients_need_a_positive_lambda():
    with pytest.raises(ValueError, match="positive"):
        solve_table(sparse.eye(3, format="csr"), np.zeros((3, 2)), np.zeros((3, 2)), 0.0)


@pytest.fixture(scope="module")
def teacher(tiny_bert_path):
    return HFBackbone(tiny_bert_path, device="cpu")


@pytest.fixture(scope="module")
def inputs(tiny_bert_path):
    return _input_embeddings(tiny_bert_path)


def test_distillation_is_deterministic_for_a_seed(teacher, inputs):
    texts = make_sentences(300, seed=3)
    first, report = distill_table(teacher, texts, inputs, samples=200, seed=0, lambdas=(1.0, 0.1), min_fit_texts=0)
    again, report_again = distill_table(teacher, texts, inputs, samples=200, seed=0, lambdas=(1.0, 0.1), min_fit_texts=0)
    other, _ = distill_table(teacher, texts, inputs, samples=200, seed=1, lambdas=(1.0, 0.1), min_fit_texts=0)
    np.testing.assert_array_equal(first, again)
    assert report == report_again
    assert report["teacher_texts"] == 200 and report["held_aside"] == 20
    assert set(report["validation"]) == {"unfitted", "1", "0.1"}
    assert not np.array_equal(first, other)  # another seed samples other texts
    assert first.shape == inputs.shape and first.dtype == np.float32


def test_unfitted_table_is_each_tokens_mean_state(teacher, inputs):
    """With too few texts to validate, the table is the context average (independent NumPy loop)."""
    texts = make_sentences(40, seed=5)
    table, report = distill_table(teacher, texts, inputs, samples=40)
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


def test_a_fit_that_does_not_help_falls_back_to_the_unfitted_table(teacher, inputs, monkeypatch):
    texts = make_sentences(300, seed=4)
    unfitted, _ = distill_table(teacher, texts, inputs, samples=250, lambdas=())
    rng = np.random.default_rng(0)
    monkeypatch.setattr(
        distill,
        "solve_table",  # a "fit" that scrambles the table
        lambda bags, targets, table, *args, **kwargs: rng.standard_normal(table.shape) * 100,
    )
    table, report = distill_table(teacher, texts, inputs, samples=250, lambdas=(1.0, 0.1), min_fit_texts=0)
    assert report["fitted"] is False and "no fit beat" in report["reason"]
    assert max(report["validation"]["1"], report["validation"]["0.1"]) < report["validation"]["unfitted"]
    np.testing.assert_array_equal(table, unfitted)


def test_a_sample_below_the_floor_keeps_the_unfitted_table(teacher, inputs, monkeypatch):
    """Fewer teacher texts than ``min_fit_texts`` never fit (small samples overfit): no solve runs."""
    texts = make_sentences(300, seed=4)
    unfitted, _ = distill_table(teacher, texts, inputs, samples=250, lambdas=(), min_fit_texts=0)
    monkeypatch.setattr(distill, "solve_table", lambda *args, **kwargs: pytest.fail("a fit ran below the floor"))
    table, report = distill_table(teacher, texts, inputs, samples=250, lambdas=(1.0, 0.1), min_fit_texts=251)
    assert report["fitted"] is False and "at least 251" in report["reason"] and "validation" not in report
    np.testing.assert_array_equal(table, unfitted)


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
    assert unfolded.shape == ShapedEncoder.create(model="glove-6b-50d", shape="whiten-partial").shape
    assert unfolded.weighting.exclude_special
    assert fast_encoder.spec["backbone"]["type"] == "folded" and fast_encoder.shape == "l2"
    assert fast_encoder.metadata["distill"] == unfolded.metadata["distill"]
    assert fast_encoder.metadata["distill"]["teacher_texts"] == 150
    cosine = (fast_encoder.encode(texts) * unfolded.encode(texts)).sum(axis=1)
    assert cosine.min() >= 0.9999


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
    solve = distill.solve_table

    def counting_solve(*args, **kwargs):
        gc.collect()
        alive_at_solve.append(sum(isinstance(thing, Teacher) for thing in gc.get_objects()))
        return solve(*args, **kwargs)

    monkeypatch.setattr(distill, "solve_table", counting_solve)
    table, report = distill_table(
        Teacher(tiny_bert_path, device="cpu"), make_sentences(300, seed=4), inputs, samples=250, lambdas=(1.0,), min_fit_texts=0
    )
    assert report["fitted"] in (True, False) and alive_at_solve and set(alive_at_solve) == {0}
    assert table.dtype == np.float32
