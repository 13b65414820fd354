"""Shaping fitted on a tiny sample degrades safely: a warning, never zero or non-finite vectors."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from sklearn.covariance import OAS

from isotrope.shapes import PRESETS, parse_shape
from isotrope.transforms import TRANSFORMS, make_transform
from isotrope.transforms.whiten import oas_shrinkage

D = 24
#: the smallest configuration of each kind (the others use their defaults)
CONFIGS = {
    "pca": {"n_components": 6},
    "abtt": {"n_components": 3},
    "sif_removal": {"n_components": 2},
    "flow": {"n_blocks": 1, "hidden": 8, "max_epochs": 2, "device": "cpu"},
}


def sample(n: int, seed: int) -> np.ndarray:
    """Anisotropic vectors with a common offset, as pooled embeddings are."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, D)) * np.linspace(0.2, 3.0, D) + 2.0).astype(np.float32)


def assert_usable(vectors: np.ndarray, inputs: np.ndarray) -> None:
    assert np.isfinite(vectors).all()
    # no vector collapses: each keeps a norm comparable to its input's (zero would make it unfindable)
    assert (np.linalg.norm(vectors, axis=1) > 1e-3 * np.linalg.norm(inputs, axis=1).min()).all()


@pytest.mark.parametrize("n", [1, 2, 10, D - 1])
@pytest.mark.parametrize("kind", sorted(TRANSFORMS))
def test_every_transform_fitted_on_few_samples_keeps_vectors(kind, n, caplog):
    fitted, fresh = sample(n, seed=n), sample(7, seed=100 + n)
    transform = make_transform(kind, **CONFIGS.get(kind, {}))
    if kind == "flow" and n == 1:
        with pytest.raises(ValueError, match="needs at least 2 samples"):
            transform.fit(fitted)
        return
    with caplog.at_level(logging.WARNING, logger="isotrope"):
        transform.fit(fitted)
    assert_usable(transform.transform(fitted), fitted)
    assert_usable(transform.transform(fresh), fresh)
    if n == 1 and transform.requires_fit and kind not in ("quantile", "flow"):
        assert "sample" in caplog.text  # the degradation is said, not silent


@pytest.mark.parametrize("preset", [name for name in PRESETS if name != "flow"])
@pytest.mark.parametrize("n", [1, 2])
def test_every_preset_chain_on_one_or_two_samples_gives_unit_vectors(preset, n):
    fitted, fresh = sample(n, seed=3), sample(5, seed=4)
    transforms = [TRANSFORMS[step["kind"]](**step["config"]) for step in parse_shape(preset)]
    vectors = fitted
    for transform in transforms:
        vectors = transform.fit(vectors).transform(vectors)
    for inputs in (fitted, fresh):
        out = inputs
        for transform in transforms:
            out = transform.transform(out)
        np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=1e-5)


def test_identical_samples_are_not_centred_to_zero(caplog):
    copies = np.repeat(sample(1, seed=5), 4, axis=0)
    with caplog.at_level(logging.WARNING, logger="isotrope"):
        out = make_transform("center").fit(copies).transform(copies)
    assert "without variance" in caplog.text
    np.testing.assert_allclose(out, copies)


@pytest.mark.parametrize("n", [2, 10, D - 1])
def test_whiten_on_fewer_samples_than_dimensions_uses_the_oas_covariance(n, caplog):
    X = sample(n, seed=20 + n).astype(np.float64)
    with caplog.at_level(logging.WARNING, logger="isotrope.transforms.whiten"):
        transform = make_transform("whiten").fit(X)
    assert "shrunk toward the identity" in caplog.text
    reference = OAS().fit(X)  # scikit-learn, from the samples
    assert oas_shrinkage(np.cov(X.T, bias=True), n) == pytest.approx(reference.shrinkage_, rel=1e-9)
    centred = X - X.mean(axis=0)
    Y = transform.transform(X).astype(np.float64)
    # full whitening with the OAS covariance C: the Gram matrix Y Y^T equals Xc C^-1 Xc^T (rotation-free)
    np.testing.assert_allclose(Y @ Y.T, centred @ np.linalg.solve(reference.covariance_, centred.T), rtol=1e-3, atol=1e-3)
