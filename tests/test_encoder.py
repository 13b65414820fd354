"""ShapedEncoder on the tiny random BERT: encoding, fitting, shapes and input errors."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from conftest import make_sentences
from isotrope import encoder as encoder_module
from isotrope.backbones import base as batching
from isotrope.backbones.hf import HFBackbone
from isotrope.encoder import ShapedEncoder
from isotrope.fingerprint import fingerprint
from isotrope.sampling import reservoir_sample
from isotrope.shapes import PRESETS, format_shape, parse_shape
from isotrope.transforms import TRANSFORMS, NotFittedError

TEXTS = ["the cat sees a small bird.", "dogs run", "she loves the music of the river and the rain in the city!", "why?"]
LONG = " ".join(make_sentences(12, seed=9))
PROMPT = 'This sentence : "{text}" means [MASK] .'


def l2(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


@pytest.fixture(scope="module")
def reference(tiny_bert_path):
    """text -> hidden states of the last layer (T, d), from an independently loaded model."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_path)
    model = AutoModel.from_pretrained(tiny_bert_path).eval()

    def last_layer(text: str) -> np.ndarray:
        with torch.no_grad():
            output = model(**tokenizer(text, return_tensors="pt"))
        return output.last_hidden_state[0].double().numpy()

    last_layer.tokenizer = tokenizer
    last_layer.model = model
    return last_layer


@pytest.fixture(scope="module")
def plain(tiny_bert_path) -> ShapedEncoder:
    return ShapedEncoder.create(tiny_bert_path, device="cpu")


@pytest.fixture(scope="module")
def fit_texts() -> list[str]:
    return make_sentences(200)


# -- encoding ---------------------------------------------------------------------------------
def test_encode_mean_pooling_matches_torch(plain, reference):
    vectors = plain.encode(TEXTS)
    assert vectors.dtype == np.float32 and vectors.shape == (len(TEXTS), 32) and plain.dim == 32
    expected = np.stack([l2(reference(text).mean(axis=0)) for text in TEXTS])
    np.testing.assert_allclose(vectors, expected, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-6)


@pytest.mark.parametrize("pooling", ["mean", "cls", "max", "last_token"])
def test_a_text_encodes_the_same_alone_and_beside_a_longer_one(tiny_bert_path, pooling):
    encoder = ShapedEncoder.create(tiny_bert_path, pooling=pooling, device="cpu")
    alone = encoder.encode(["the cat runs"])
    batched = encoder.encode(["the cat runs", LONG, "a dog"])
    assert len(encoder.tokenizer(LONG)["input_ids"]) > 40
    np.testing.assert_allclose(batched[0], alone[0], atol=1e-5)
    np.testing.assert_allclose(batched[2], encoder.encode(["a dog"])[0], atol=1e-5)


def test_batches_keep_the_input_order(plain):
    texts = [*TEXTS, LONG, *make_sentences(5, seed=3)]
    together = plain.encode(texts, batch_size=3)
    one_by_one = np.concatenate([plain.encode([text]) for text in texts])
    np.testing.assert_allclose(together, one_by_one, atol=1e-5)


def test_torch_on_the_cpu_batches_the_cpu_tokens_and_static_tables_the_default(plain, tiny_glove_path):
    assert plain.backbone.device.type == "cpu"
    assert plain.max_batch_tokens == batching.CPU_BATCH_TOKENS < batching.BATCH_TOKENS  # onnx: tests/test_onnx.py
    assert ShapedEncoder.create(tiny_glove_path, shape="none").max_batch_tokens == batching.BATCH_TOKENS


def test_cls_and_prompt_mask_pooling(tiny_bert_path, reference):
    cls = ShapedEncoder.create(tiny_bert_path, pooling="cls", device="cpu")
    np.testing.assert_allclose(cls.encode(TEXTS), [l2(reference(t)[0]) for t in TEXTS], atol=1e-5)
    prompted = ShapedEncoder.create(tiny_bert_path, pooling="mask", prompt=PROMPT, device="cpu")
    mask_id = reference.tokenizer.mask_token_id
    expected = []
    for text in TEXTS:
        filled = PROMPT.replace("{text}", text)
        position = reference.tokenizer(filled)["input_ids"].index(mask_id)
        expected.append(l2(reference(filled)[position]))
    np.testing.assert_allclose(prompted.encode(TEXTS), expected, atol=1e-5)


def test_query_kind_uses_the_query_prefix(tiny_bert_path):
    encoder = ShapedEncoder(HFBackbone(tiny_bert_path, query_prefix="query : ", device="cpu"))
    queries = encoder.encode(["the cat", "a dog runs"], kind="query")
    np.testing.assert_allclose(queries, encoder.encode(["query : the cat", "query : a dog runs"]), atol=1e-6)
    documents = encoder.encode(["the cat", "a dog runs"])
    assert not np.allclose(queries, documents, atol=1e-3)


# -- fitting ------------------------------------------------------------------------------------
def test_fitted_chain_equals_the_steps_fitted_one_after_another(tiny_bert_path, fit_texts):
    shape = "center,whiten(power=-0.5),abtt(2),pca(n_components=8),quantile(n_quantiles=50)"
    encoder = ShapedEncoder.create(tiny_bert_path, shape=shape, device="cpu")
    assert encoder.dim == 32 and not encoder.is_fitted()
    assert encoder.fit(fit_texts) is encoder
    assert encoder.is_fitted() and encoder.dim == 8
    raw = encoder.embed_raw(fit_texts)
    new_raw = encoder.embed_raw(TEXTS)
    steps = [TRANSFORMS[step["kind"]](**step["config"]) for step in parse_shape(shape)]
    fitted, new = raw, new_raw
    for step in steps:
        fitted = step.fit(fitted).transform(fitted)
        new = step.transform(new)
    vectors = encoder.encode(TEXTS)
    assert vectors.shape == (len(TEXTS), 8) and vectors.dtype == np.float32
    np.testing.assert_allclose(vectors, new, atol=1e-6)
    np.testing.assert_array_equal(vectors, encoder.apply_transforms(new_raw))
    assert encoder.metadata["fit"]["n_texts"] == len(fit_texts)


def test_whitened_cosines_equal_the_mahalanobis_reference(tiny_bert_path, fit_texts, caplog):
    encoder = ShapedEncoder.create(tiny_bert_path, shape="whiten", device="cpu").fit(fit_texts)
    raw = encoder.embed_raw(fit_texts).astype(np.float64)
    mean = raw.mean(axis=0)
    # a final LayerNorm puts every state in a hyperplane: the covariance has one null direction,
    # which whitening drops (scale 0) like a pseudo-inverse
    precision = np.linalg.pinv(np.cov(raw, rowvar=False, bias=True), rcond=1e-10, hermitian=True)
    centred = encoder.embed_raw(TEXTS).astype(np.float64) - mean
    gram = centred @ precision @ centred.T
    expected = gram / np.sqrt(np.outer(np.diag(gram), np.diag(gram)))
    vectors = encoder.encode(TEXTS)
    np.testing.assert_allclose(vectors @ vectors.T, expected, atol=1e-4)
    assert "1 of 32 kept directions have ~zero variance" in caplog.text
    fitted = encoder.encode(fit_texts[:100])
    assert np.abs(fitted.mean(axis=0)).max() < 0.1  # whitened vectors are centred


def test_fit_samples_a_long_stream_deterministically(tiny_bert_path):
    corpus = make_sentences(500, seed=5)

    def fitted(seed: int, texts) -> ShapedEncoder:
        return ShapedEncoder.create(tiny_bert_path, shape="center,l2", device="cpu").fit(texts, max_samples=60, seed=seed)

    first = fitted(1, (text for text in corpus))
    assert first.metadata["fit"] == {"fitted_on": "texts passed to fit()", "n_texts": 60, "seed": 1}
    assert fitted(1, iter(corpus)).fingerprint == first.fingerprint
    sample = reservoir_sample(corpus, 60, seed=1)
    assert len(set(sample)) == 60 and set(sample) <= set(corpus) and sample != corpus[:60]
    np.testing.assert_allclose(first.transforms[0].mean_, first.embed_raw(sample).astype(np.float64).mean(axis=0), atol=1e-6)
    assert fitted(2, iter(corpus)).fingerprint != first.fingerprint


def test_the_fingerprint_is_computed_once_per_fitted_state(tiny_bert_path, monkeypatch, tmp_path):
    """Reading the fingerprint again hashes nothing; fitting again (or loading) gives the new state's."""
    corpus = make_sentences(200, seed=5)
    encoder = ShapedEncoder.create(tiny_bert_path, shape="center,l2", device="cpu").fit(corpus[:80])
    calls = []
    monkeypatch.setattr(encoder_module, "fingerprint", lambda *args: calls.append(1) or fingerprint(*args))
    first = encoder.fingerprint
    assert [encoder.fingerprint for _ in range(5)] == [first] * 5 and len(calls) == 1
    assert first == fingerprint(encoder.spec, encoder.get_state())  # the hash of the current state
    encoder.fit(corpus[80:])  # refit on other texts: another state, another fingerprint
    second = encoder.fingerprint
    assert second != first and second == fingerprint(encoder.spec, encoder.get_state()) and len(calls) == 2
    encoder.fit_transforms(encoder.embed_raw(corpus[:40]))  # the chain alone refitted (reshape)
    assert encoder.fingerprint not in (first, second) and len(calls) == 3
    loaded = ShapedEncoder.load(encoder.save(tmp_path / "enc"), device="cpu")  # checked on load, then kept
    calls.clear()
    assert loaded.fingerprint == encoder.fingerprint and calls == []


def test_reservoir_sample_is_uniform_and_keeps_short_streams():
    assert reservoir_sample(["a", "b", "c"], 5) == ["a", "b", "c"]
    chosen = Counter(item for seed in range(3000) for item in reservoir_sample(range(10), 2, seed=seed))
    expected = 3000 * 2 / 10
    chi_square = sum((chosen[i] - expected) ** 2 / expected for i in range(10))
    assert chi_square < 27.9  # 9 degrees of freedom, p = 0.001


def test_static_encoder_with_idf(tiny_bert_path, fit_texts, reference):
    encoder = ShapedEncoder.create(f"static:{tiny_bert_path}", weights="idf")
    assert encoder.weighting.exclude_special and not encoder.is_fitted()
    with pytest.raises(NotFittedError, match="idf weighting"):
        encoder.encode(TEXTS)
    encoder.fit(fit_texts)
    tokenizer = reference.tokenizer
    table = reference.model.get_input_embeddings().weight.detach().double().numpy()
    doc_freq = Counter(token for text in fit_texts for token in set(tokenizer(text, add_special_tokens=False)["input_ids"]))
    n = len(fit_texts)
    expected = []
    for text in TEXTS:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        idf = np.array([np.log((1 + n) / (1 + doc_freq[i])) + 1 for i in ids])
        expected.append(l2(idf @ table[ids] / idf.sum()))
    np.testing.assert_allclose(encoder.encode(TEXTS), expected, atol=1e-5)


# -- bad input -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("texts", "error", "message"),
    [
        ([], ValueError, "texts is empty"),
        (["the cat", ""], ValueError, r"texts\[1\] is an empty string"),
        (["  \n"], ValueError, r"texts\[0\] is an empty string"),
        (["the cat", 3], TypeError, r"texts\[1\] is int, not str"),
        ([None], TypeError, r"texts\[0\] is NoneType"),
        ("the cat", TypeError, "not a single string"),
    ],
)
def test_bad_texts(plain, texts, error, message):
    with pytest.raises(error, match=message):
        plain.encode(texts)


def test_bad_fit_texts(tiny_bert_path):
    encoder = ShapedEncoder.create(tiny_bert_path, shape="center", device="cpu")
    with pytest.raises(ValueError, match="fit texts is empty"):
        encoder.fit(iter([]))
    with pytest.raises(TypeError, match=r"fit texts\[1\] is bytes"):
        encoder.fit(["a cat", b"a dog"])


def test_unknown_kind(plain):
    with pytest.raises(ValueError, match="kind must be 'document' or 'query'; got 'passage'"):
        plain.encode(["the cat"], kind="passage")


def test_unfitted_encoder_raises(tiny_bert_path):
    encoder = ShapedEncoder.create(tiny_bert_path, shape="whiten", device="cpu")
    with pytest.raises(NotFittedError, match=r"whiten need a corpus\): call fit\(texts\) first"):
        encoder.encode(["the cat"])
    with pytest.raises(NotFittedError):
        _ = encoder.fingerprint
    with pytest.raises(NotFittedError):
        encoder.get_state()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"pooling": "median"}, "unknown pooling 'median'"),
        ({"shape": "center,bogus"}, "unknown transform 'bogus'"),
        ({"weights": "bm25"}, "unknown weighting scheme"),
    ],
)
def test_bad_create_options(tiny_bert_path, options, message):
    with pytest.raises(ValueError, match=message):
        ShapedEncoder.create(tiny_bert_path, device="cpu", **options)


def test_prompt_needs_a_transformer(tiny_glove_path):
    with pytest.raises(ValueError, match="prompt templates need a transformer"):
        ShapedEncoder.create(tiny_glove_path, prompt="{text} [MASK]")


# -- shapes ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("preset", "expected"),
    [
        ("none", [("l2", {})]),
        ("center", [("center", {}), ("l2", {})]),
        ("abtt", [("abtt", {}), ("l2", {})]),
        ("whiten", [("whiten", {}), ("l2", {})]),
        ("whiten-partial", [("whiten", {"power": -0.25}), ("l2", {})]),
        ("quantile", [("quantile", {}), ("l2", {})]),
        ("quantile-normal", [("quantile", {"output_distribution": "normal"}), ("l2", {})]),
    ],
)
def test_presets(preset, expected):
    steps = parse_shape(preset)
    assert [(step["kind"], step["config"]) for step in steps] == expected
    for step in steps:
        TRANSFORMS[step["kind"]](**step["config"])


def test_chain_spec_with_positional_and_keyword_arguments():
    spec = "center, abtt(3), whiten(power=-0.25, n_components=16), quantile(output_distribution=normal), l2"
    steps = parse_shape(spec)
    assert steps == [
        {"kind": "center", "config": {}},
        {"kind": "abtt", "config": {"n_components": 3}},
        {"kind": "whiten", "config": {"power": -0.25, "n_components": 16}},
        {"kind": "quantile", "config": {"output_distribution": "normal"}},
        {"kind": "l2", "config": {}},
    ]
    assert parse_shape(format_shape(steps)) == steps
    as_json = '[{"kind": "pca", "config": {"n_components": 4}}]'
    assert parse_shape(as_json) == [{"kind": "pca", "config": {"n_components": 4}}]


def test_chain_spec_builds_a_working_encoder(tiny_bert_path, fit_texts):
    encoder = ShapedEncoder.create(
        tiny_bert_path, shape="center,abtt(3),whiten(power=-0.25,n_components=16),l2", device="cpu"
    ).fit(fit_texts[:80])
    assert [t.kind for t in encoder.transforms] == ["center", "abtt", "whiten", "l2"]
    assert encoder.transforms[1].components_.shape == (3, 32)
    assert encoder.dim == 16 and encoder.encode(TEXTS).shape == (len(TEXTS), 16)
    assert encoder.shape == "center,abtt(n_components=3),whiten(power=-0.25, n_components=16, eps=1e-08),l2"


def test_unknown_transform_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown transform 'blur'.*known: .*abtt.*whiten") as error:
        parse_shape("center,blur(2)")
    for kind in TRANSFORMS:
        assert kind in str(error.value)
    with pytest.raises(ValueError, match="unknown transform 'blur'"):
        parse_shape([{"kind": "blur"}])


def test_unparsable_shapes():
    with pytest.raises(ValueError, match="only the first argument may be positional"):
        parse_shape("abtt(2, 3)")
    with pytest.raises(ValueError, match="takes no parameters"):
        parse_shape("center(3)")
    with pytest.raises(ValueError, match="cannot parse shape"):
        parse_shape("center;l2")


def test_every_preset_but_flow_is_listed_here():
    assert set(PRESETS) - {"flow"} == {"none", "center", "abtt", "whiten", "whiten-partial", "quantile", "quantile-normal"}
