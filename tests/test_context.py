"""Context-averaged tables and concatenated backbones (the paper's "BERT+Avg")."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from conftest import make_sentences
from isotrope.backbones.base import TokenBatch
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


def _random_batches(rng: np.random.Generator, vocab: int, dim: int, count: int) -> list[TokenBatch]:
    """Padded batches of random token ids (a few ids special, some positions padding) and random states."""
    batches = []
    for _ in range(count):
        rows, width = int(rng.integers(1, 6)), int(rng.integers(2, 9))
        ids = rng.integers(0, vocab, size=(rows, width))
        attention = rng.random((rows, width)) < 0.8
        batches.append(TokenBatch(rng.standard_normal((rows, width, dim)).astype(np.float32), ids, attention, ids < 3))
    return batches


def test_context_sums_keep_rows_for_seen_tokens_only_and_subtract_a_part(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sums over blocks of rows equal a dense float64 loop; subtracting the sums over some rows of each batch
    leaves the sums over the others (to 1e-12); only the tokens seen cost a row."""
    from isotrope.backbones import context

    monkeypatch.setattr(context, "BLOCK_ROWS", 4)  # several blocks even for a tiny vocabulary
    rng = np.random.default_rng(0)
    vocab, dim = 60, 5
    batches = _random_batches(rng, vocab, dim, 12)
    picked = [np.flatnonzero(rng.random(len(batch.input_ids)) < 0.4) for batch in batches]
    whole, part = context.ContextSums(vocab), context.ContextSums(vocab)
    dense = {name: (np.zeros((vocab, dim)), np.zeros(vocab)) for name in ("whole", "rest")}
    for batch, rows in zip(batches, picked):
        whole.add(batch)
        part.add(batch, rows=rows)
        for row in range(len(batch.input_ids)):
            for position in np.flatnonzero(batch.attention_mask[row] & ~batch.special_mask[row]):
                token = batch.input_ids[row, position]
                for name in ("whole", "rest") if row not in rows else ("whole",):
                    dense[name][0][token] += batch.states[row, position]
                    dense[name][1][token] += 1

    def mean(name: str) -> np.ndarray:
        sums, counts = dense[name]
        return np.divide(sums, counts[:, None], out=np.zeros_like(sums), where=counts[:, None] > 0)

    seen = int((dense["whole"][1] > 0).sum())
    assert 20 < seen < vocab - 3  # tokens never seen have no row
    assert len(whole._blocks) == -(-seen // 4) and part._rows < whole._rows
    np.testing.assert_allclose(whole.table(), mean("whole"), rtol=1e-6, atol=1e-7)  # float32 table
    np.testing.assert_array_equal(whole.counts, dense["whole"][1])
    whole.subtract(part)
    np.testing.assert_array_equal(whole.counts, dense["rest"][1])
    rest = whole._gather(whole._slot[np.flatnonzero(whole.counts > 0)])
    np.testing.assert_allclose(rest, dense["rest"][0][whole.counts > 0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(whole.table(), mean("rest"), rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="never saw"):
        part.subtract(whole)
    with pytest.raises(ValueError, match="no texts"):
        context.ContextSums(vocab).table()
