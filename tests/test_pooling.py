"""Every pooling mode against an explicit per-row, per-token NumPy loop in float64."""

from __future__ import annotations

import math

import numpy as np
import pytest

import isotrope.pooling
from isotrope.pooling import POOLING_MODES, IdBatch, last_real_position, pool, table_mean

B, T, D = 5, 7, 6
LENGTHS = [7, 4, 1, 3, 6]


def make_batch(padding_side: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """States (B, T, D) float32, a bool attention mask and non-negative token weights with some zeros."""
    rng = np.random.default_rng(seed)
    states = rng.standard_normal((B, T, D)).astype(np.float32)
    mask = np.zeros((B, T), dtype=bool)
    for row, length in enumerate(LENGTHS):
        if padding_side == "right":
            mask[row, :length] = True
        else:
            mask[row, T - length :] = True
    weights = rng.uniform(0.1, 2.0, size=(B, T)).astype(np.float32)
    weights[rng.random((B, T)) < 0.25] = 0.0
    return states, mask, weights


def reference(states, mask, mode, weights=None, target=None) -> np.ndarray:
    """One row at a time, one token at a time."""
    out = np.zeros((states.shape[0], states.shape[2]))
    for b in range(states.shape[0]):
        real = [t for t in range(states.shape[1]) if mask[b, t]]
        if mode == "cls":
            out[b] = states[b, real[0]]
            continue
        if mode == "last_token":
            out[b] = states[b, real[-1]]
            continue
        if mode == "mask":
            out[b] = states[b, target[b]]
            continue
        w = {t: 1.0 if weights is None else float(weights[b, t]) for t in real}
        if sum(w.values()) <= 0:
            w = dict.fromkeys(real, 1.0)
        if mode == "max":
            kept = [t for t in real if w[t] > 0]
            for j in range(states.shape[2]):
                out[b, j] = max(float(states[b, t, j]) for t in kept)
            continue
        if mode == "weighted_mean":
            w = {t: w[t] * (position + 1) for position, t in enumerate(real)}
        total = sum(w.values())
        summed = sum(w[t] * states[b, t].astype(np.float64) for t in real)
        out[b] = summed / (math.sqrt(total) if mode == "mean_sqrt_len" else total)
    return out


MEAN_LIKE = ["mean", "max", "mean_sqrt_len", "weighted_mean"]


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("mode", ["cls", "last_token", *MEAN_LIKE])
def test_unweighted_modes_match_reference(mode, padding_side):
    states, mask, _ = make_batch(padding_side)
    result = pool(states, mask, mode)
    assert result.dtype == np.float32 and result.shape == (B, D)
    np.testing.assert_allclose(result, reference(states, mask, mode), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("mode", MEAN_LIKE)
def test_weighted_modes_match_reference(mode, padding_side):
    states, mask, weights = make_batch(padding_side, seed=1)
    result = pool(states, mask, mode, weights=weights)
    np.testing.assert_allclose(result, reference(states, mask, mode, weights), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", MEAN_LIKE)
def test_padding_is_ignored_even_with_large_weights(mode):
    states, mask, weights = make_batch("right", seed=2)
    weights[~mask] = 100.0
    states[~mask] = 1e6
    np.testing.assert_allclose(pool(states, mask, mode, weights), reference(states, mask, mode, weights), rtol=1e-6)


@pytest.mark.parametrize("mode", MEAN_LIKE)
def test_all_zero_weights_fall_back_to_uniform_over_real_tokens(mode):
    states, mask, weights = make_batch("right", seed=3)
    weights[1] = 0.0
    weights[1, ~mask[1]] = 5.0  # weight on padding only still counts as "all zero"
    result = pool(states, mask, mode, weights)
    np.testing.assert_allclose(result[1], pool(states[1:2], mask[1:2], mode)[0], rtol=1e-6)
    np.testing.assert_allclose(result, reference(states, mask, mode, weights), rtol=1e-6, atol=1e-6)
    assert np.abs(result[1]).sum() > 0


@pytest.mark.parametrize("mode", ["cls", "last_token", "mask", *MEAN_LIKE])
def test_left_and_right_padding_pool_the_same(mode):
    right_states, right_mask, right_weights = make_batch("right", seed=4)
    left_states = np.zeros_like(right_states)
    left_weights = np.zeros_like(right_weights)
    left_mask = np.zeros_like(right_mask)
    right_target = np.array([min(2, length - 1) for length in LENGTHS])
    left_target = right_target + np.array([T - length for length in LENGTHS])
    for row, length in enumerate(LENGTHS):
        left_states[row, T - length :] = right_states[row, :length]
        left_weights[row, T - length :] = right_weights[row, :length]
        left_mask[row, T - length :] = True
    right = pool(right_states, right_mask, mode, right_weights, right_target)
    left = pool(left_states, left_mask, mode, left_weights, left_target)
    np.testing.assert_allclose(left, right, rtol=1e-6, atol=1e-7)


def test_mask_mode_takes_the_target_position():
    states, mask, _ = make_batch("left")
    target = np.array([6, 5, 6, 4, 2])
    expected = reference(states, mask, "mask", target=target)
    np.testing.assert_array_equal(pool(states, mask, "mask", target_index=target), expected)


def test_mask_mode_without_target_raises():
    states, mask, _ = make_batch("right")
    with pytest.raises(ValueError, match="prompt template"):
        pool(states, mask, "mask")


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_last_real_position(padding_side):
    _, mask, _ = make_batch(padding_side)
    expected = [max(t for t in range(T) if mask[b, t]) for b in range(B)]
    np.testing.assert_array_equal(last_real_position(mask), expected)


def test_unknown_mode_names_the_known_ones():
    states, mask, _ = make_batch("right")
    with pytest.raises(ValueError, match=r"unknown pooling mode 'median'.*mean_sqrt_len"):
        pool(states, mask, "median")


def test_every_mode_is_covered():
    assert set(POOLING_MODES) == {"cls", "mask", "last_token", *MEAN_LIKE}


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
@pytest.mark.parametrize("batch_size", [512, 2])
def test_table_mean_is_each_texts_weighted_mean_of_its_rows(monkeypatch, dtype, batch_size):
    """table_mean against a float64 loop over each text's ids: ids of a text apart in the batch (a pair's
    ids come after every token's), repeated ids, a text whose weights are all 0 (the plain mean of its rows), a
    text without ids (0), one text alone (a query), batches cut mid-way, and float16 / int8 tables (int8
    with a scale per row)."""
    monkeypatch.setattr(isotrope.pooling, "TABLE_MEAN_BATCH", batch_size)
    rng = np.random.default_rng(3)
    vocab, dim = 40, 8
    table64 = rng.standard_normal((vocab, dim))
    row_scale = rng.uniform(0.01, 0.05, vocab).astype(np.float32) if dtype == "int8" else None
    table = np.round(table64 / row_scale[:, None]).astype(np.int8) if row_scale is not None else table64.astype(dtype)
    weights = rng.uniform(0.2, 2.0, vocab).astype(np.float32)
    weights[[5, 6]] = 0.0
    id_lists = [[1, 2, 3, 2, 30], [5, 6, 5], [], [7, 39, 39, 0, 11, 12], [9]]
    extra = {0: [31, 32], 3: [33]}  # appended after the batch's own ids, as a pair's are
    texts = [f"text {i}" for i in range(len(id_lists))]

    def token_ids(batch_texts):
        rows = [int(text.split()[1]) for text in batch_texts]
        batch = IdBatch.of([id_lists[row] for row in rows])
        added = [(at, i) for at, row in enumerate(rows) for i in extra.get(row, [])]
        return IdBatch(
            np.concatenate([batch.ids, np.array([i for _, i in added], dtype=np.intp)]),
            np.concatenate([batch.texts, np.array([at for at, _ in added], dtype=np.intp)]),
            batch.count,
        )

    rows64 = table.astype(np.float64) * (row_scale[:, None] if row_scale is not None else 1.0)
    expected = np.zeros((len(texts), dim))
    for row, ids in enumerate(id_lists):
        ids = ids + extra.get(row, [])
        if ids:
            w = weights[ids].astype(np.float64)
            w = w if w.sum() > 0 else np.ones(len(ids))
            expected[row] = w @ rows64[ids] / w.sum()
    pooled = table_mean(texts, token_ids, table, weights, row_scale)
    assert pooled.dtype == np.float32
    np.testing.assert_allclose(pooled, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(table_mean(texts[3:4], token_ids, table, weights, row_scale), expected[3:4], rtol=1e-5, atol=1e-6)
