"""Exported folders load in model2vec and sentence-transformers and give isotrope's vectors."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import make_sentences
from isotrope.encoder import ShapedEncoder
from isotrope.export import export_encoder
from isotrope.fold import FoldError, fold_encoder

TEXTS = [
    "the cat sees a small bird.",
    "dogs run",
    "she loves the music of the river and the rain in the city!",
    "red car , blue house ; old tree",
    "zzz qqq",
    "a new word means a new sentence",
]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return (a64 * b64).sum(1) / (np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1))


@pytest.fixture(scope="module", params=["whiten-partial", "center,abtt(1),whiten(power=-0.5),l2"])
def encoder(request, tiny_bert_path) -> ShapedEncoder:
    return ShapedEncoder.create(f"static:{tiny_bert_path}", shape=request.param, weights="sif", exclude_punctuation=True).fit(
        make_sentences(200)
    )


def test_model2vec_loads_the_export(encoder, tmp_path):
    model2vec = pytest.importorskip("model2vec")
    out = export_encoder(encoder, tmp_path / "m2v", "model2vec")  # folds on the way
    model = model2vec.StaticModel.from_pretrained(out)
    assert cosines(model.encode(TEXTS), encoder.encode(TEXTS)).min() >= 0.9999
    np.testing.assert_allclose(np.linalg.norm(model.encode(TEXTS), axis=1), 1.0, atol=1e-5)


def test_sentence_transformers_loads_the_export(encoder, tmp_path):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    out = export_encoder(fold_encoder(encoder, dtype="float16"), tmp_path / "st", "sentence-transformers")
    model = sentence_transformers.SentenceTransformer(str(out), device="cpu")
    folded16 = fold_encoder(encoder, dtype="float16")
    assert cosines(model.encode(TEXTS), folded16.encode(TEXTS)).min() >= 0.9999
    assert cosines(model.encode(TEXTS), encoder.encode(TEXTS)).min() >= 0.9999


def test_word_vector_export(tiny_glove_path, tmp_path):
    model2vec = pytest.importorskip("model2vec")
    encoder = ShapedEncoder.create(tiny_glove_path, shape="whiten-partial").fit(
        ["the cat sat on the mat .", "the dog runs fast", "House , River", "the river runs"] * 10
    )
    texts = ["The cat runs fast.", "a dog on the mat", "River House unknownword"]
    model = model2vec.StaticModel.from_pretrained(export_encoder(encoder, tmp_path / "glove", "model2vec"))
    assert cosines(model.encode(texts), encoder.encode(texts)).min() >= 0.9999


def test_export_errors_name_the_step(tiny_bert_path, tmp_path):
    static = f"static:{tiny_bert_path}"
    quantile = ShapedEncoder.create(static, shape="quantile(n_quantiles=20),l2").fit(make_sentences(100))
    with pytest.raises(FoldError, match=r"step 0 \(quantile\)"):
        export_encoder(quantile, tmp_path / "q", "model2vec")
    unnormalised = ShapedEncoder.create(static, shape="center,whiten").fit(make_sentences(100))
    with pytest.raises(FoldError, match="ends in l2"):
        export_encoder(unnormalised, tmp_path / "u", "sentence-transformers")
    specials = ShapedEncoder.create(static, shape="whiten-partial", exclude_special=False).fit(make_sentences(100))
    with pytest.raises(FoldError, match=r"special tokens .*\[CLS\].* carry weight"):
        export_encoder(specials, tmp_path / "s", "model2vec")
    with pytest.raises(ValueError, match="unknown export format"):
        export_encoder(specials, tmp_path / "x", "onnx")
    assert not any(tmp_path.iterdir())  # nothing half-written


def test_cli_fold_and_export(monkeypatch, capsys, tmp_path, tiny_bert_path):
    from test_cli import run_cli

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(make_sentences(150, seed=2)) + "\n")
    code, out, err = run_cli(
        monkeypatch,
        capsys,
        "fit",
        corpus,
        "--out",
        tmp_path / "enc",
        "--model",
        f"static:{tiny_bert_path}",
        "--shape",
        "whiten-partial",
    )
    assert code == 0, err
    code, out, err = run_cli(
        monkeypatch, capsys, "fold", tmp_path / "enc", "--out", tmp_path / "folded", "--dtype", "float16", "--dims", "16"
    )
    assert code == 0 and "16 dims, float16" in out, err
    folded = ShapedEncoder.load(tmp_path / "folded")
    assert folded.dim == 16
    code, out, err = run_cli(
        monkeypatch, capsys, "export", tmp_path / "folded", "--format", "model2vec", "--out", tmp_path / "m2v"
    )
    assert code == 0 and (tmp_path / "m2v" / "model.safetensors").is_file(), err

    code, out, err = run_cli(
        monkeypatch,
        capsys,
        "fit",
        corpus,
        "--out",
        tmp_path / "quantile",
        "--model",
        f"static:{tiny_bert_path}",
        "--shape",
        "quantile(n_quantiles=20),l2",
    )
    assert code == 0, err
    code, out, err = run_cli(
        monkeypatch, capsys, "export", tmp_path / "quantile", "--format", "sentence-transformers", "--out", tmp_path / "st"
    )
    assert code == 1 and err.count("\n") == 1 and "step 0 (quantile) is not linear" in err
