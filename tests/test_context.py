"""Context-averaged tables and concatenated backbones (the paper's "BERT+Avg")."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from conftest import make_sentences
from isotrope.encoder import ShapedEncoder
from isotrope.transforms.base import NotFittedError


def _reference_table(path: str, texts: list[str]) -> tuple[np.ndarray, float]:
    """Per-token mean last-layer state over texts, special tokens left out, one text at a time."""
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    sums = np.zeros((len(tokenizer), model.config.hidden_size))
    counts = np.zeros(len(tokenizer))
    norms = []
    for text in texts:
        encoded = tokenizer(text, return_tensors="pt", return_special_tokens_mask=True)
        special = encoded.pop("special_tokens_mask")[0].bool().numpy()
        with torch.no_grad():
            states = model(**encoded).last_hidden_state[0].double().numpy()
        for token, state in zip(encoded["input_ids"][0].numpy()[~special], states[~special]):
            sums[token] += state
            counts[token] += 1
            norms.append(np.linalg.norm(state))
    table = np.divide(sums, counts[:, None], out=np.zeros_like(sums), where=counts[:, None] > 0)
    return table, float(np.mean(norms))


def test_context_table_is_the_mean_contextual_state(tiny_bert_path: str) -> None:
    texts = make_sentences(40)
    encoder = ShapedEncoder.create(f"context:{tiny_bert_path}")
    with pytest.raises(NotFittedError):
        encoder.encode(["a sentence"])
    encoder.fit(texts)
    expected, _ = _reference_table(tiny_bert_path, texts)
    np.testing.assert_allclose(encoder.backbone.table, expected, atol=1e-5)


def test_concatenated_tables_are_scaled_to_unit_mean_norm(tiny_bert_path: str) -> None:
    texts = make_sentences(40)
    encoder = ShapedEncoder.create(f"static:{tiny_bert_path}+context:{tiny_bert_path}").fit(texts)
    table = encoder.backbone.table
    half = table.shape[1] // 2
    for part in (table[:, :half], table[:, half:]):
        norms = np.linalg.norm(part, axis=1)
        assert norms[norms > 0].mean() == pytest.approx(1.0, rel=1e-5)
    static = AutoModel.from_pretrained(tiny_bert_path).get_input_embeddings().weight.detach().numpy()
    static_norms = np.linalg.norm(static, axis=1)
    np.testing.assert_allclose(table[:, :half], static / static_norms[static_norms > 0].mean(), atol=1e-6)


def test_bert_plus_avg_concatenates_scaled_contextual_states_and_the_table(tiny_bert_path: str, tmp_path) -> None:
    texts = make_sentences(40)
    joined = ShapedEncoder.create(f"{tiny_bert_path}+context:{tiny_bert_path}", shape="center,l2").fit(texts)
    plain = ShapedEncoder.create(tiny_bert_path)
    table, mean_norm = _reference_table(tiny_bert_path, texts)
    probe = ["the cat sat on the mat", "a dog"]
    raw = joined.embed_raw(probe)
    contextual = plain.embed_raw(probe) / mean_norm
    np.testing.assert_allclose(raw[:, : contextual.shape[1]], contextual, atol=1e-5)
    assert raw.shape[1] == 2 * contextual.shape[1]
    joined.save(tmp_path / "enc")
    reloaded = ShapedEncoder.load(tmp_path / "enc")
    assert reloaded.fingerprint == joined.fingerprint
    np.testing.assert_array_equal(reloaded.encode(probe), joined.encode(probe))
    assert table.shape[0] == reloaded.backbone.context_table_.shape[0]


def test_only_a_models_own_table_can_join_it(tiny_bert_path: str) -> None:
    with pytest.raises(ValueError, match="own table"):
        ShapedEncoder.create(f"{tiny_bert_path}+static:{tiny_bert_path}")
