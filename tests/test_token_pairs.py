"""Token-pair rows of a ``--model fast`` table: which pairs, how texts are extended, how the table pools them,
how the distillation chooses them, and the saved encoder (against Python/NumPy references)."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import numpy as np
import pytest

import isotrope.distill as distill
from conftest import make_sentences
from isotrope.backbones.hf import HFBackbone
from isotrope.backbones.static import StaticBackbone, _input_embeddings
from isotrope.encoder import ShapedEncoder
from isotrope.export import export_encoder
from isotrope.fold import FoldError
from isotrope.token_pairs import TokenPairs, batch_ids

SPECIAL = np.array([0, 1])


def test_pairs_are_the_consecutive_non_special_pairs_of_enough_texts():
    rng = np.random.default_rng(0)
    texts = [rng.integers(0, 12, size=int(rng.integers(0, 9))).tolist() for _ in range(300)]
    counted: Counter[tuple[int, int]] = Counter()
    for ids in texts:
        counted.update({(a, b) for a, b in pairwise(ids) if a not in (0, 1) and b not in (0, 1)})
    pairs = TokenPairs.found_in(texts, 12, SPECIAL, min_chunks=4)
    expected = sorted(pair for pair, n in counted.items() if n >= 4)
    assert [divmod(int(code), 12) for code in pairs.codes] == expected and len(pairs) > 10
    assert pairs.names([f"t{i}" for i in range(12)])[0] == f"t{expected[0][0]} t{expected[0][1]}"


def test_a_text_is_extended_by_the_ids_of_its_known_pairs_in_order():
    pairs = TokenPairs(np.array([2 * 10 + 3, 3 * 10 + 2, 5 * 10 + 5]), 10)
    texts = [[2, 3, 2, 3], [5, 5, 5], [1, 2, 3], [7], [], [3, 1, 2]]
    found = pairs.extend(texts)
    for ids, extended in zip(texts, found):
        known = [10 + [23, 32, 55].index(a * 10 + b) for a, b in pairwise(ids) if a * 10 + b in (23, 32, 55)]
        assert extended == ids + known
    batch = batch_ids(texts, pairs)  # the flat batch table_mean pools: the same ids per text, no pair across texts
    assert [sorted(batch.ids[batch.texts == row].tolist()) for row in range(len(texts))] == [sorted(ids) for ids in found]
    ids, masks = pairs.extend_with_mask([[1, 2, 3, 0]], [[1, 0, 0, 1]])
    assert ids == [[1, 2, 3, 0, 10]] and masks == [[1, 0, 0, 1, 0]]
    with pytest.raises(ValueError, match="distinct sorted"):
        TokenPairs(np.array([5, 3]), 10)


@pytest.mark.parametrize("size", [0, 1, 7, 5000])
def test_pair_codes_are_found_as_a_binary_search_finds_them(size):
    """index_of (a hash table, linear probing) against np.searchsorted on the sorted codes: codes crowded
    into few hash slots, codes just beside known ones, and none known."""
    rng = np.random.default_rng(size)
    vocab = 30_522
    codes = np.unique(rng.integers(0, vocab * vocab, size=size))
    codes = np.unique(np.concatenate([codes, np.arange(4 * len(codes) // 5)]))  # a dense run: long probes
    pairs = TokenPairs(codes, vocab)
    queries = np.concatenate([codes, codes + 1, codes - 1, rng.integers(0, vocab * vocab, size=2000)])
    queries = queries[(queries >= 0) & (queries < vocab * vocab)]
    at = np.minimum(np.searchsorted(codes, queries), max(len(codes) - 1, 0))
    expected = np.where(codes[at] == queries, at, -1) if len(codes) else np.full(len(queries), -1)
    np.testing.assert_array_equal(pairs.index_of(queries), expected)


def test_a_table_with_pair_rows_pools_the_mean_over_tokens_and_pairs(tiny_bert_path):
    """pool_mean (word cache, one gather) and the padded path (tokenize, forward, pool) against a float64 mean
    of the rows of each text's tokens and known pairs."""
    from isotrope.pooling import pool

    backbone = StaticBackbone(f"random:{tiny_bert_path}")
    texts = make_sentences(40, seed=2)
    vocab = len(backbone.tokenizer)
    backbone.pairs = TokenPairs.found_in(backbone.token_ids(texts), vocab, backbone.special_ids(), min_chunks=2)
    assert len(backbone.pairs) > 5 and backbone.vocab_size == vocab + len(backbone.pairs) == len(backbone.vocabulary())
    rng = np.random.default_rng(1)
    backbone.table = rng.standard_normal((backbone.vocab_size, backbone.dim)).astype(np.float32)
    weights = np.ones(backbone.vocab_size, dtype=np.float32)
    weights[backbone.special_ids()] = 0
    known = {int(code): vocab + i for i, code in enumerate(backbone.pairs.codes)}
    reference, with_pairs = [], 0
    for text in texts:
        ids = backbone.tokenizer(text, add_special_tokens=False)["input_ids"]
        units = ids + [known[a * vocab + b] for a, b in pairwise(ids) if a * vocab + b in known]
        with_pairs += len(units) > len(ids)
        reference.append(backbone.table[units].astype(np.float64).mean(axis=0))
    assert with_pairs >= 10
    np.testing.assert_allclose(backbone.pool_mean(texts, weights), np.array(reference), rtol=1e-5, atol=1e-6)
    ids, special = backbone.tokenize(texts)
    width = max(map(len, ids))
    padded = np.array([row + [0] * (width - len(row)) for row in ids])
    mask = np.array([[1] * len(row) + [0] * (width - len(row)) for row in ids])
    batch = backbone.forward(padded, mask, np.array([row + [1] * (width - len(row)) for row in special]).astype(bool))
    pooled = pool(batch.states, mask, "mean", weights[padded])
    np.testing.assert_allclose(pooled, np.array(reference), rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def teacher(tiny_bert_path):
    return HFBackbone(tiny_bert_path, device="cpu")


@pytest.mark.parametrize(("give_back", "chosen"), [(float("inf"), True), (-1.0, False)])
def test_pair_rows_replace_the_pick_where_they_agree_nearly_as_well_with_the_teacher(
    teacher, tiny_bert_path, monkeypatch, give_back, chosen
):
    """A pair table is kept when it gives back at most PAIR_GIVE_BACK of the pick's agreement gain (any, with an
    infinite share; none, with -1); the proxy's comparison is recorded either way."""
    monkeypatch.setattr(distill, "PAIR_GIVE_BACK", give_back)
    inputs = _input_embeddings(tiny_bert_path)
    texts = make_sentences(300, seed=4)
    distilled = distill.distill_table(teacher, texts, inputs, samples=250, lambdas=(1.0,), mixes=(), pair_lambdas=(1.0, 0.3))
    report = distilled.report
    assert set(report["validation"]["pairs_vs_pick"]) == {"pick", "pairs 1", "pairs 0.3"}
    assert report["pairs"]["chosen"] is chosen and report["pairs"]["rows"] > 0
    if chosen:
        agreements = report["validation"]["agreement"]
        best = max(("pairs 1", "pairs 0.3"), key=agreements.__getitem__)
        assert report["reason"].startswith(f"{best}: ") and report["lam"] == float(best.split()[1])
        assert distilled.pairs is not None and len(distilled.pairs) == report["pairs"]["rows"]
        assert distilled.table.shape == (inputs.shape[0] + len(distilled.pairs), inputs.shape[1])
        assert report["shape"] == distill.SHAPES[0] and report["mix"] == 0.0
    else:
        tokens_only = distill.distill_table(teacher, texts, inputs, samples=250, lambdas=(1.0,), mixes=(), pair_lambdas=())
        assert distilled.pairs is None and not report["reason"].startswith("pairs ")
        np.testing.assert_array_equal(distilled.table, tokens_only.table)  # the token table's fit, untouched


@pytest.fixture(scope="module")
def paired_encoder(tiny_bert_path):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(distill, "PAIR_GIVE_BACK", float("inf"))
        unfolded = ShapedEncoder.create(model=f"fast:{tiny_bert_path}", distill_samples=250, fast_pairs=True)
        unfolded._fold_in_place = lambda: False
        unfolded.fit(make_sentences(300, seed=6))
        folded = ShapedEncoder.create(model=f"fast:{tiny_bert_path}", distill_samples=250, fast_pairs=True)
        folded.fit(make_sentences(300, seed=6))
    return unfolded, folded


def test_a_fast_encoder_with_pair_rows_folds_saves_and_loads_the_same_vectors(paired_encoder, tmp_path):
    unfolded, folded = paired_encoder
    texts = make_sentences(30, seed=9)
    pairs = folded.backbone.pairs
    assert pairs is not None and np.array_equal(pairs.codes, unfolded.backbone.pairs.codes)
    assert folded.spec["backbone"]["type"] == "folded" and folded.metadata["distill"]["pairs"]["chosen"]
    assert len(folded.backbone.vocabulary()) == folded.backbone.vocab_size == len(folded.backbone.get_state()["table"])
    assert (folded.encode(texts) * unfolded.encode(texts)).sum(axis=1).min() >= 0.9999
    for encoder, folder in ((folded, tmp_path / "folded"), (unfolded, tmp_path / "unfolded")):
        encoder.save(folder)
        loaded = ShapedEncoder.load(folder)
        np.testing.assert_array_equal(loaded.encode(texts), encoder.encode(texts))
        assert loaded.fingerprint == encoder.fingerprint
    with pytest.raises(FoldError, match=f"{len(pairs)} token pairs"):
        export_encoder(folded, tmp_path / "m2v", "model2vec")


def test_pair_rows_are_asked_for_and_the_recipe_keeps_the_ask(tiny_bert_path, monkeypatch, tmp_path):
    """By default the fit tries no pair table, even where one would be kept; ``fast_pairs=True`` (``--fast-pairs``)
    asks for it, and the saved recipe says so. The option is refused for other models."""
    monkeypatch.setattr(distill, "PAIR_GIVE_BACK", float("inf"))
    for asked in (False, True):
        encoder = ShapedEncoder.create(model=f"fast:{tiny_bert_path}", distill_samples=250, fast_pairs=asked)
        encoder._fold_in_place = lambda: False
        encoder.fit(make_sentences(300, seed=6))
        assert (encoder.backbone.pairs is not None) is asked and ("pairs" in encoder.metadata["distill"]) is asked
        encoder.save(tmp_path / str(asked))
        assert ShapedEncoder.load(tmp_path / str(asked)).config.fast_pairs is asked
    with pytest.raises(ValueError, match="fast_pairs applies to the fast model"):
        ShapedEncoder.create(model=tiny_bert_path, fast_pairs=True)


def test_the_share_of_agreement_a_pair_table_gives_back():
    """What the rule compares with PAIR_GIVE_BACK: the agreement lost against the pick, over the pick's gain on the
    unfitted table (SciFact's figures: 0.5625 picked, 0.4819 unfitted, the pair table 0.5535: 11 %)."""
    pick = distill.Pick("1", np.zeros(3), 0.5625, 0.5625 - 0.4819)
    assert distill._given_back(0.5535, pick) == pytest.approx(0.009 / 0.0806)
    assert distill._given_back(0.5625, pick) == distill._given_back(0.6, pick) == 0.0
    assert distill._given_back(0.5, distill.Pick("unfitted", np.zeros(3), 0.5, 0.0)) == 0.0
    assert distill._given_back(0.49, distill.Pick("unfitted", np.zeros(3), 0.5, 0.0)) == float("inf")
    assert distill._given_back(0.5625 - 0.21 * 0.0806, pick) > distill.PAIR_GIVE_BACK == 0.2
