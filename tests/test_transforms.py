"""Contract and numerical tests of the post-processing transforms.

The contract suite runs against every registered transform (like scikit-learn's
estimator checks); the numerical tests compare with independent float64 references
(NumPy SVD/eigh, scikit-learn).
"""

from __future__ import annotations

import json
import logging
import tracemalloc

import numpy as np
import pytest
from sklearn.decomposition import PCA as SklearnPCA
from sklearn.preprocessing import QuantileTransformer

from isotrope.transforms import TRANSFORMS, Moments, NotFittedError, make_transform

N_FEATURES = 12

#: a small, fast configuration of every registered kind for the contract suite
CONFIGS: dict[str, dict] = {
    "center": {},
    "zscore": {},
    "abtt": {"n_components": 2},
    "sif_removal": {"n_components": 1},
    "whiten": {"power": -0.5, "n_components": 8},
    "pca": {"n_components": 3},
    "quantile": {"n_quantiles": 50},
    "l2": {},
    "flow": {"n_blocks": 2, "hidden": 16, "max_epochs": 2, "device": "cpu"},
}
OUTPUT_WIDTH = {"whiten": 8, "pca": 3}
MOMENT_KINDS = ["center", "zscore", "whiten", "pca", "abtt"]


def anisotropic(n: int, d: int = N_FEATURES, seed: int = 0, offset: float = 3.0) -> np.ndarray:
    """Rows with a strongly anisotropic covariance (eigenvalues over four decades) and a non-zero mean."""
    rng = np.random.default_rng(seed)
    rotation, _ = np.linalg.qr(rng.normal(size=(d, d)))
    A = np.diag(np.logspace(1, -1, d)) @ rotation
    return rng.normal(size=(n, d)) @ A + offset * rng.normal(size=d)


@pytest.fixture(scope="module")
def X() -> np.ndarray:
    return anisotropic(300).astype(np.float32)


def fitted(kind: str, X: np.ndarray):
    return make_transform(kind, **CONFIGS[kind]).fit(X)


def assert_equal_up_to_column_sign(actual: np.ndarray, expected: np.ndarray, atol: float) -> None:
    signs = np.sign(np.sum(actual * expected, axis=0))
    np.testing.assert_allclose(actual * signs, expected, atol=atol)


def eigh_descending(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    values, vectors = np.linalg.eigh(matrix)
    return values[::-1], vectors[:, ::-1]


# -- contract suite: every registered transform ----------------------------------------


@pytest.fixture(params=sorted(TRANSFORMS))
def kind(request) -> str:
    if request.param not in CONFIGS:
        pytest.fail(f"registered transform {request.param!r} has no small test configuration in CONFIGS")
    return request.param


def test_unfitted_use_raises(kind, X):
    transform = make_transform(kind, **CONFIGS[kind])
    if not TRANSFORMS[kind].state_names:
        pytest.skip("stateless transform: always fitted")
    with pytest.raises(NotFittedError):
        transform.transform(X)
    with pytest.raises(NotFittedError):
        transform.get_state()


def test_fit_returns_self_and_float32_output(kind, X):
    transform = make_transform(kind, **CONFIGS[kind])
    assert transform.fit(X) is transform
    Y = transform.transform(X[:7])
    assert Y.dtype == np.float32
    assert Y.flags.c_contiguous
    assert Y.shape == (7, OUTPUT_WIDTH.get(kind, N_FEATURES))
    assert np.isfinite(Y).all()
    np.testing.assert_array_equal(transform.fit_transform(X), transform.transform(X))


def test_config_round_trips_through_make_transform(kind, X):
    config = fitted(kind, X).get_config()
    rebuilt = make_transform(kind, **json.loads(json.dumps(config)))
    assert type(rebuilt) is TRANSFORMS[kind]
    assert rebuilt.get_config() == config


def test_from_state_is_bit_identical(kind, X):
    transform = fitted(kind, X)
    state = transform.get_state()
    assert sorted(state) == sorted(type(transform).state_names)
    assert all(name.endswith("_") for name in state)
    copied = {name: np.array(array, copy=True) for name, array in state.items()}
    restored = type(transform).from_state(json.loads(json.dumps(transform.get_config())), copied)
    other = anisotropic(20, seed=1).astype(np.float32)
    np.testing.assert_array_equal(restored.transform(other), transform.transform(other))


def test_from_state_missing_array_raises(kind, X):
    state = fitted(kind, X).get_state()
    if not state:
        pytest.skip("stateless transform")
    state.pop(next(iter(state)))
    with pytest.raises(ValueError, match="missing"):
        TRANSFORMS[kind].from_state(CONFIGS[kind], state)


def test_wrong_width_raises(kind, X):
    transform = fitted(kind, X)
    if transform.n_features_in is None:
        pytest.skip("accepts any width")
    with pytest.raises(ValueError, match=str(N_FEATURES)):
        transform.transform(X[:, :-1])


def test_nan_input_raises(kind, X):
    bad = X.copy()
    bad[3, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        make_transform(kind, **CONFIGS[kind]).fit(bad)
    with pytest.raises(ValueError, match="NaN"):
        fitted(kind, X).transform(bad)


def test_empty_and_1d_input_raise(kind, X):
    empty = np.empty((0, N_FEATURES), dtype=np.float32)
    with pytest.raises(ValueError):
        make_transform(kind, **CONFIGS[kind]).fit(empty)
    with pytest.raises(ValueError):
        fitted(kind, X).transform(empty)
    with pytest.raises(ValueError, match="2-D"):
        fitted(kind, X).transform(X[0])


# -- registry and parameters ---------------------------------------------------------


def test_unknown_kind_names_known_kinds():
    with pytest.raises(ValueError, match=r"'nope'.*center.*whiten"):
        make_transform("nope")


@pytest.mark.parametrize(
    ("kind", "config"),
    [
        ("whiten", {"power": -1.0}),
        ("whiten", {"power": 0.1}),
        ("whiten", {"eps": -1.0}),
        ("whiten", {"n_components": 0}),
        ("pca", {"n_components": None}),
        ("pca", {"n_components": 2.5}),
        ("abtt", {"n_components": -1}),
        ("sif_removal", {"n_components": 0}),
        ("zscore", {"eps": -1.0}),
        ("quantile", {"output_distribution": "laplace"}),
        ("quantile", {"n_quantiles": 500, "subsample": 100}),
    ],
)
def test_invalid_parameters_raise(kind, config):
    with pytest.raises(ValueError, match=kind):
        make_transform(kind, **config)


@pytest.mark.parametrize("kind", ["pca", "whiten", "abtt", "sif_removal"])
def test_more_components_than_features_raises(kind, X):
    with pytest.raises(ValueError, match="n_components=13"):
        make_transform(kind, n_components=N_FEATURES + 1).fit(X)


@pytest.mark.parametrize(
    ("kind", "name", "blamed"),
    [
        ("zscore", "scale_", "scale_"),
        ("pca", "mean_", r"components_ has shape \(3, 12\); expected \(3, 11\)"),
        ("pca", "components_", "components_"),
        ("abtt", "components_", "components_"),
        ("whiten", "components_", "components_"),
        ("whiten", "scale_", "scale_"),
        ("sif_removal", "components_", "components_"),
        ("quantile", "references_", "references_"),
    ],
)
def test_from_state_inconsistent_shapes_raise(kind, name, blamed, X):
    """A loaded array that does not fit its config or its sibling arrays is named in the error."""
    state = fitted(kind, X).get_state()
    state[name] = state[name][:-1]
    with pytest.raises(ValueError, match=blamed):
        TRANSFORMS[kind].from_state(CONFIGS[kind], state)


# -- numerical checks against float64 references ----------------------------------------


def test_center_and_zscore_match_numpy(X):
    X64 = X.astype(np.float64)
    np.testing.assert_allclose(fitted("center", X).transform(X), X64 - X64.mean(axis=0), atol=1e-5)
    expected = (X64 - X64.mean(axis=0)) / X64.std(axis=0)
    np.testing.assert_allclose(fitted("zscore", X).transform(X), expected, rtol=1e-5, atol=1e-5)


def test_zscore_constant_dimension_is_only_centred(X):
    data = X.astype(np.float64)
    data[:, 4] = 2.5
    Y = make_transform("zscore").fit(data).transform(data)
    assert np.isfinite(Y).all()
    np.testing.assert_array_equal(Y[:, 4], 0.0)


def test_full_whitening_gives_identity_covariance(X):
    Y = make_transform("whiten").fit(X).transform(X).astype(np.float64)
    np.testing.assert_allclose(Y.mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(np.cov(Y.T, bias=True), np.eye(N_FEATURES), atol=1e-4)


def test_partial_power_tempers_the_spectrum(X):
    power = -0.25
    X64 = X.astype(np.float64)
    spectrum, _ = eigh_descending(np.cov(X64.T, bias=True))
    Y = make_transform("whiten", power=power, eps=0.0).fit(X).transform(X).astype(np.float64)
    covariance = np.cov(Y.T, bias=True)
    # the output axes are the principal axes: a diagonal covariance holding S^(1 + 2p), descending
    np.testing.assert_allclose(covariance, np.diag(spectrum ** (1 + 2 * power)), rtol=1e-4, atol=1e-5)


def test_whiten_with_k_keeps_the_top_k_directions(X):
    k = 4
    X64 = X.astype(np.float64)
    centred = X64 - X64.mean(axis=0)
    values, vectors = eigh_descending(np.cov(X64.T, bias=True))
    expected = centred @ vectors[:, :k] / np.sqrt(values[:k])
    Y = make_transform("whiten", n_components=k, eps=0.0).fit(X).transform(X)
    assert Y.shape == (len(X), k)
    assert_equal_up_to_column_sign(Y.astype(np.float64), expected, atol=1e-4)


def test_pca_matches_numpy_svd_and_sklearn(X):
    k = 5
    X64 = X.astype(np.float64)
    centred = X64 - X64.mean(axis=0)
    _, _, Vt = np.linalg.svd(centred, full_matrices=False)
    Y = make_transform("pca", n_components=k).fit(X).transform(X).astype(np.float64)
    assert_equal_up_to_column_sign(Y, centred @ Vt[:k].T, atol=1e-4)
    # same deterministic sign convention as scikit-learn (svd_flip on the rows of Vt)
    reference = SklearnPCA(n_components=k, svd_solver="full").fit(X64)
    np.testing.assert_allclose(Y, reference.transform(X64), atol=1e-4)
    components = make_transform("pca", n_components=k).fit(X).components_
    np.testing.assert_allclose(components, reference.components_, atol=1e-8)


def test_abtt_matches_svd_reference(X):
    X64 = X.astype(np.float64)
    centred = X64 - X64.mean(axis=0)
    _, _, Vt = np.linalg.svd(centred, full_matrices=False)
    top = Vt[:2]
    expected = centred - centred @ top.T @ top
    np.testing.assert_allclose(fitted("abtt", X).transform(X), expected, atol=1e-4)


def test_abtt_default_removes_one_direction_per_hundred_dimensions():
    data = anisotropic(400, d=300, seed=2)
    transform = make_transform("abtt").fit(data)
    assert transform.components_.shape == (3, 300)
    centred = data - data.mean(axis=0)
    _, _, Vt = np.linalg.svd(centred, full_matrices=False)
    expected = centred - centred @ Vt[:3].T @ Vt[:3]
    np.testing.assert_allclose(transform.transform(data), expected, atol=1e-4)


@pytest.mark.parametrize("k", [1, 2])
def test_sif_removal_matches_svd_of_uncentred_data(X, k):
    X64 = X.astype(np.float64)
    _, _, Vt = np.linalg.svd(X64, full_matrices=False)
    top = Vt[:k]
    expected = X64 - X64 @ top.T @ top
    Y = make_transform("sif_removal", n_components=k).fit(X).transform(X)
    np.testing.assert_allclose(Y, expected, atol=1e-4)
    # the data is not centred: removing the top direction of centred data would differ
    centred_top = np.linalg.svd(X64 - X64.mean(axis=0), full_matrices=False)[2][:k]
    assert not np.allclose(Y, X64 - X64 @ centred_top.T @ centred_top, atol=1e-2)


@pytest.mark.parametrize("distribution", ["uniform", "normal"])
def test_quantile_matches_sklearn(distribution):
    data = anisotropic(400, seed=3)
    new = anisotropic(50, seed=4)
    config = {"output_distribution": distribution, "n_quantiles": 100, "subsample": 300, "random_state": 7}
    reference = QuantileTransformer(**config).fit(data)
    shift = 0.5 if distribution == "uniform" else 0.0
    transform = make_transform("quantile", **config).fit(data)
    for rows in (data, new):
        np.testing.assert_allclose(transform.transform(rows), reference.transform(rows) - shift, atol=1e-6)


def test_quantile_subsamples_before_converting_to_float64():
    """More rows than ``subsample``: the same quantiles as scikit-learn on the whole float64 matrix,
    without ever allocating that matrix (only the kept rows are converted)."""
    data = anisotropic(20_000, seed=11).astype(np.float32)
    config = {"n_quantiles": 50, "subsample": 300, "random_state": 3}
    reference = QuantileTransformer(**config).fit(data.astype(np.float64))
    transform = make_transform("quantile", **config)
    tracemalloc.start()
    try:
        transform.fit(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(transform.quantiles_, reference.quantiles_)
    np.testing.assert_array_equal(transform.references_, reference.references_)
    assert peak < data.size * 8 / 2  # the float64 copy of every row alone would take data.size * 8 bytes


def test_quantile_uniform_output_is_centred(X):
    Y = make_transform("quantile", n_quantiles=300).fit(X).transform(X)
    assert Y.min() == pytest.approx(-0.5) and Y.max() == pytest.approx(0.5)
    np.testing.assert_allclose(Y.mean(axis=0), 0.0, atol=1e-3)


def test_l2_matches_numpy_and_keeps_zero_rows(X):
    data = X[:10].astype(np.float64)
    data[4] = 0.0
    Y = make_transform("l2").fit(X).transform(data)
    norms = np.linalg.norm(data, axis=1, keepdims=True)
    expected = np.where(norms > 0, data / np.where(norms > 0, norms, 1.0), 0.0)
    np.testing.assert_allclose(Y, expected, atol=1e-6)
    np.testing.assert_array_equal(Y[4], 0.0)


def test_small_products_and_eigendecompositions_run_on_one_blas_thread(monkeypatch):
    from threadpoolctl import threadpool_info

    from isotrope.transforms import _linalg

    rng = np.random.default_rng(12)
    limits = []
    controller = _linalg._blas_threads()
    original = type(controller).limit
    monkeypatch.setattr(type(controller), "limit", lambda self, **kw: limits.append(kw) or original(self, **kw))
    before = [(i["filepath"], i["num_threads"]) for i in threadpool_info()]
    for rows, expect_limit in ((8, True), (200, False)):
        a, b = rng.normal(size=(rows, 384)), rng.normal(size=(384, 384 if rows == 8 else 512))
        limits.clear()
        np.testing.assert_allclose(_linalg.matmul(a, b), np.einsum("ij,jk->ik", a, b), rtol=1e-10, atol=1e-10)
        assert limits == ([{"limits": 1}] if expect_limit else [])
    symmetric = np.cov(rng.normal(size=(100, 40)).T)
    limits.clear()
    values, vectors = _linalg.top_eigenpairs(symmetric, 5)
    assert limits == [{"limits": 1}]
    expected_values, expected_vectors = np.linalg.eigh(symmetric)
    np.testing.assert_allclose(values, expected_values[::-1][:5], rtol=1e-10)
    assert_equal_up_to_column_sign(vectors.T, expected_vectors[:, ::-1][:, :5], atol=1e-10)
    assert [(i["filepath"], i["num_threads"]) for i in threadpool_info()] == before  # restored


# -- sufficient statistics and partial_fit -----------------------------------------------


@pytest.mark.parametrize("full", [True, False])
def test_moments_merge_equals_moments_of_concatenation(full):
    data = anisotropic(250, seed=5, offset=1e6)  # a large offset breaks naive sum-of-squares formulas
    chunks = np.split(data, [1, 40, 41, 170])
    merged = Moments.from_array(chunks[0], full=full)
    for chunk in chunks[1:]:
        merged = merged.merge(Moments.from_array(chunk, full=full))
    centred = data - data.mean(axis=0)
    assert merged.count == len(data)
    np.testing.assert_allclose(merged.mean, data.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(merged.variance(), data.var(axis=0), rtol=1e-9)
    if full:
        np.testing.assert_allclose(merged.scatter, centred.T @ centred, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(merged.covariance(), np.cov(data.T, bias=True), rtol=1e-9, atol=1e-9)


def test_moments_state_round_trip_and_mismatch_errors():
    data = anisotropic(30, seed=6)
    moments = Moments.from_array(data)
    restored = Moments.from_state({name: np.array(v) for name, v in moments.to_state().items()})
    assert restored.count == moments.count
    np.testing.assert_array_equal(restored.mean, moments.mean)
    np.testing.assert_array_equal(restored.scatter, moments.scatter)
    with pytest.raises(ValueError, match="full"):
        moments.merge(Moments.from_array(data, full=False))
    with pytest.raises(ValueError, match="12 and 11"):
        moments.merge(Moments.from_array(data[:, :-1]))
    with pytest.raises(ValueError, match="full moments"):
        Moments.from_array(data, full=False).covariance()
    with pytest.raises(ValueError, match="missing"):
        Moments.from_state({"mean": moments.mean})


@pytest.mark.parametrize("kind", MOMENT_KINDS)
def test_partial_fit_over_chunks_equals_fit_on_concatenation(kind, X):
    X64 = X.astype(np.float64)
    reference = fitted(kind, X64)
    streamed = make_transform(kind, **CONFIGS[kind])
    for chunk in np.array_split(X64, [1, 90, 91, 200]):
        assert streamed.partial_fit(chunk) is streamed
    np.testing.assert_allclose(streamed._moments.mean, reference._moments.mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(streamed._moments.scatter, reference._moments.scatter, rtol=1e-10, atol=1e-10)
    for name, array in reference.get_state().items():
        np.testing.assert_allclose(streamed.get_state()[name], array, rtol=1e-8, atol=1e-10, err_msg=name)
    np.testing.assert_allclose(streamed.transform(X), reference.transform(X), rtol=1e-5, atol=1e-5)
    # fit() starts over: it forgets what partial_fit accumulated
    refit = streamed.fit(X64[:100])
    np.testing.assert_array_equal(refit.transform(X), fitted(kind, X64[:100]).transform(X))


@pytest.mark.parametrize("kind", MOMENT_KINDS)
def test_partial_fit_defers_the_fit_to_first_use(kind, X, monkeypatch):
    """A stream of blocks costs one fit from the merged statistics, when a fitted attribute is first read."""
    calls = []
    cls = TRANSFORMS[kind]
    original = cls._fit_from_moments
    monkeypatch.setattr(cls, "_fit_from_moments", lambda self, moments: calls.append(moments.count) or original(self, moments))
    streamed = make_transform(kind, **CONFIGS[kind])
    blocks = np.array_split(X, 5)
    for block in blocks:
        streamed.partial_fit(block)
    assert calls == [len(blocks[0])]  # the first block is a plain fit; the others only merge statistics
    assert streamed.is_fitted()
    assert calls == [len(blocks[0]), len(X)]
    expected = fitted(kind, X).transform(X)
    np.testing.assert_allclose(streamed.transform(X), expected, rtol=1e-5, atol=1e-5)
    assert calls[2:] == [len(X)]  # the reference fit; the streamed transform was not refitted
    streamed.partial_fit(X[:7])
    assert streamed.get_state()["mean_"].shape == (N_FEATURES,)
    assert calls[-1] == len(X) + 7
    with pytest.raises(AttributeError, match="nope_"):
        _ = streamed.nope_


@pytest.mark.parametrize("kind", MOMENT_KINDS)
def test_fit_moments_from_reduced_block_statistics(kind, X):
    blocks = [Moments.from_array(block) for block in np.array_split(X, 3)]
    states = [block.to_state() for block in blocks]  # as they would travel between processes
    total = Moments.from_state(states[0])
    for state in states[1:]:
        total = total.merge(Moments.from_state(state))
    transform = make_transform(kind, **CONFIGS[kind]).fit_moments(total)
    np.testing.assert_allclose(transform.transform(X), fitted(kind, X).transform(X), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["whiten", "pca", "abtt"])
def test_full_moment_transforms_reject_per_dimension_moments(kind, X):
    with pytest.raises(ValueError, match="full moments"):
        make_transform(kind, **CONFIGS[kind]).fit_moments(Moments.from_array(X, full=False))


# -- degenerate fits -----------------------------------------------------------------------


def test_sif_removal_on_two_sentences_is_finite(caplog):
    two = anisotropic(2, seed=7)
    with caplog.at_level(logging.WARNING, logger="isotrope.transforms.sif_removal"):
        Y = make_transform("sif_removal").fit(two).transform(anisotropic(5, seed=8))
    assert "collinear" in caplog.text
    assert np.isfinite(Y).all()


def test_whiten_on_singular_covariance_is_finite(caplog):
    few = anisotropic(5, d=20, seed=9)  # 5 samples in 20 dimensions: rank 4 after centring
    with caplog.at_level(logging.WARNING, logger="isotrope.transforms.whiten"):
        transform = make_transform("whiten").fit(few)
    assert "singular" in caplog.text and "shrunk" in caplog.text
    Y = transform.transform(few).astype(np.float64)
    other = transform.transform(anisotropic(10, d=20, seed=10))
    assert np.isfinite(Y).all() and np.isfinite(other).all()
    # the covariance is shrunk (tests/test_small_samples.py checks it against scikit-learn's OAS), so a
    # vector off the fitted span keeps that direction instead of mapping to zero, and nothing blows up
    centred = few - few.mean(axis=0)
    null_space = np.linalg.svd(centred)[2][4:]
    off_span = few.mean(axis=0) + 3.0 * null_space[0]
    assert np.linalg.norm(transform.transform(off_span[None])) > 0.1
    assert np.abs(other).max() < 1e3


@pytest.mark.parametrize("rows", [1, 2, 7, 1500])
def test_quantile_percentiles_equal_numpy_for_any_sample_size(rows):
    from isotrope.transforms.quantile import _linear_percentiles

    data = np.random.default_rng(rows).normal(size=(rows, 12))
    percents = np.linspace(0, 1, min(1000, rows)) * 100
    np.testing.assert_array_equal(_linear_percentiles(np.sort(data, axis=0), percents), np.nanpercentile(data, percents, axis=0))
