"""ONNX Runtime backends: the same vectors as torch (fp32), int8 within a stated tolerance, a cached
export, token-budget batching, the fingerprint and the store policy across backends."""

from __future__ import annotations

import logging
import sys

import numpy as np
import pytest

from conftest import make_sentences
from isotrope.backbones import backends
from isotrope.encoder import ShapedEncoder

ort = pytest.importorskip("onnxruntime")

#: fp32 ONNX vs torch: per-text cosine at least this (observed >= 0.999999 on the tiny model)
FP32_COSINE = 0.9999
#: dynamic int8 vs torch fp32 on the tiny random BERT: every text's cosine at least this (observed >= 0.99998)
INT8_COSINE = 0.999
#: and on all-MiniLM-L6-v2, mean cosine to torch fp32 (observed on 300 STS-B sentences: 0.970 per tensor,
#: 0.994 per channel; 0.956 and 0.992 on 2,000; STS-B Spearman within 0.3 % of fp32, see docs/benchmarks/onnx-and-ingestion.md)
INT8_MINILM_MEAN_COSINE = {"onnx-int8": 0.93, "onnx-int8-per-channel": 0.985}
PROMPT = 'this sentence : "{text}" means [MASK] .'
MODES = [  # (pooling, layers, prompt): every pooling and every kind of layer choice
    ("mean", "last", None),
    ("cls", "last", None),
    ("max", "last", None),
    ("mean_sqrt_len", "last", None),
    ("weighted_mean", "last", None),
    ("last_token", "last", None),
    ("mean", "first_last", None),
    ("mean", 1, None),
    ("mean", "1,3", None),
    ("mask", "last", PROMPT),
]


@pytest.fixture(scope="module", autouse=True)
def onnx_cache(tmp_path_factory):
    """One export cache for the module (exports take seconds), never the user's ~/.cache."""
    with pytest.MonkeyPatch.context() as patch:
        folder = tmp_path_factory.mktemp("onnx-cache")
        patch.setenv("ISOTROPE_CACHE_DIR", str(folder))
        yield folder


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return [*make_sentences(48, seed=5), "a", "the cat runs and the dog sleeps in the old house by the river ."]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def pair(path: str, backend: str, texts: list[str], **options) -> tuple[np.ndarray, np.ndarray]:
    torch_vectors = ShapedEncoder.create(path, device="cpu", **options).fit(texts).encode(texts)
    other = ShapedEncoder.create(path, device="cpu", backend=backend, **options).fit(texts)
    return torch_vectors, other.encode(texts)


@pytest.mark.parametrize("pooling,layers,prompt", MODES)
def test_fp32_onnx_matches_torch(tiny_bert_path, texts, pooling, layers, prompt):
    weights = "idf" if pooling == "weighted_mean" else "uniform"
    expected, actual = pair(tiny_bert_path, "onnx", texts, pooling=pooling, layers=layers, prompt=prompt, weights=weights)
    assert cosines(expected, actual).min() >= FP32_COSINE
    np.testing.assert_allclose(actual, expected, atol=1e-4)


@pytest.mark.parametrize("backend", ["onnx-int8", "onnx-int8-per-channel"])
@pytest.mark.parametrize("pooling,layers,prompt", [("mean", "last", None), ("cls", "first_last", None), ("mask", 2, PROMPT)])
def test_int8_is_within_the_stated_tolerance(tiny_bert_path, texts, onnx_cache, backend, pooling, layers, prompt):
    expected, actual = pair(tiny_bert_path, backend, texts, pooling=pooling, layers=layers, prompt=prompt)
    assert cosines(expected, actual).min() >= INT8_COSINE
    assert not np.array_equal(expected, actual)  # really quantised: not the fp32 graph again
    quantised = list(onnx_cache.glob(f"onnx/*/{'model.int8-per-channel.onnx' if 'channel' in backend else 'model.int8.onnx'}"))
    assert len(quantised) == 1


def test_context_tables_run_through_onnx(tiny_bert_path, texts):
    model = f"{tiny_bert_path}+context:{tiny_bert_path}"
    expected = ShapedEncoder.create(model, device="cpu").fit(texts).encode(texts)
    actual = ShapedEncoder.create(model, device="cpu", backend="onnx").fit(texts).encode(texts)
    assert cosines(expected, actual).min() >= FP32_COSINE


def test_the_export_is_cached_and_reused(tiny_bert_path, onnx_cache, monkeypatch):
    from isotrope.backbones import onnx

    ShapedEncoder.create(tiny_bert_path, backend="onnx")  # exported here or by an earlier test
    (model,) = onnx_cache.glob("onnx/*/model.onnx")
    stamp = model.stat().st_mtime_ns
    calls = []
    monkeypatch.setattr(onnx, "export_hidden_states", lambda *args: calls.append(args))
    monkeypatch.setattr(onnx, "quantise", lambda *args, **kw: calls.append(args))
    ShapedEncoder.create(tiny_bert_path, backend="onnx")
    ShapedEncoder.create(tiny_bert_path, backend="onnx-int8")
    assert calls == [] and model.stat().st_mtime_ns == stamp


def test_the_session_plans_no_memory_pattern_per_shape(tiny_bert_path, texts):
    """Batches differ in shape; a pattern kept per shape made the arena grow with the corpus."""
    encoder = ShapedEncoder.create(tiny_bert_path, backend="onnx")
    options = encoder.backbone.onnx.session.get_session_options()
    assert options.enable_mem_pattern is False
    widths = {batch.input_ids.shape[1] for _, batch in encoder.backbone.iter_batches(texts, batch_size=8)}
    assert len(widths) > 1  # the shapes a pattern would have been planned for


def test_a_changed_model_gets_its_own_export(tiny_bert_path, tmp_path):
    import shutil

    from isotrope.backbones.onnx import model_hash

    copy = tmp_path / "copy"
    shutil.copytree(tiny_bert_path, copy)
    assert model_hash(copy) == model_hash(type(copy)(tiny_bert_path))  # keyed by content, not by path
    (copy / "config.json").write_text((copy / "config.json").read_text().replace("\n", "\n "))
    assert model_hash(copy) != model_hash(type(copy)(tiny_bert_path))


def test_the_remembered_hash_follows_the_model_files(tiny_bert_path, tmp_path, monkeypatch):
    """The export's key is remembered against the files' size, mtime and inode; any change hashes again."""
    import shutil

    from isotrope.backbones import onnx

    copy, cache = tmp_path / "copy", tmp_path / "cache"
    shutil.copytree(tiny_bert_path, copy)
    hashed = []
    monkeypatch.setattr(onnx, "model_hash", lambda folder: hashed.append(folder) or f"h{len(hashed)}")
    assert onnx.remembered_model_hash(copy, cache) == "h1"
    assert onnx.remembered_model_hash(copy, cache) == "h1" and len(hashed) == 1  # remembered: not read again
    config = copy / "config.json"
    config.write_text(config.read_text() + " ")
    assert onnx.remembered_model_hash(copy, cache) == "h2"  # a changed file is hashed again
    (cache / "hashes.json").write_text("{not json")
    assert onnx.remembered_model_hash(copy, cache) == "h3"  # an unreadable memo is recomputed and rewritten
    assert onnx.remembered_model_hash(copy, cache) == "h3" and len(hashed) == 3
    monkeypatch.undo()
    assert onnx.remembered_model_hash(copy, tmp_path / "fresh") == onnx.model_hash(copy)


def test_missing_onnxruntime_is_one_line(tiny_bert_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime now raises ImportError
    with pytest.raises(ImportError) as error:
        ShapedEncoder.create(tiny_bert_path, backend="onnx-int8")
    message = str(error.value)
    assert "\n" not in message and "pip install 'isotrope[onnx]'" in message


def test_unknown_backend_and_static_tables(tiny_glove_path, tiny_bert_path):
    with pytest.raises(ValueError, match="unknown backend 'tensorrt'; choose one of torch, onnx, onnx-int8"):
        ShapedEncoder.create(tiny_bert_path, backend="tensorrt")
    with pytest.raises(ValueError, match="static table"):
        ShapedEncoder.create(tiny_glove_path, backend="onnx")


def test_token_budget_batching_is_shared(tiny_bert_path, texts, monkeypatch):
    """The ONNX path batches through TokenizedBackbone.iter_batches: sorted by length, at most
    ``max_tokens`` padded tokens per batch, the same plan as the torch backbone."""
    encoder = ShapedEncoder.create(tiny_bert_path, backend="onnx")
    shapes = []
    run = encoder.backbone.onnx.states
    monkeypatch.setattr(
        encoder.backbone.onnx, "states", lambda ids, mask, layers: shapes.append(ids.shape) or run(ids, mask, layers)
    )
    plan = [
        (index.tolist(), batch.input_ids.shape)
        for index, batch in ShapedEncoder.create(tiny_bert_path).backbone.iter_batches(texts, batch_size=16, max_tokens=120)
    ]
    got = [
        (index.tolist(), batch.input_ids.shape)
        for index, batch in encoder.backbone.iter_batches(texts, batch_size=16, max_tokens=120)
    ]
    assert got == plan and [shape for _, shape in plan] == shapes
    assert all(rows * width <= 120 or rows == 1 for rows, width in shapes)
    widths = [width for _, width in shapes]
    assert widths == sorted(widths, reverse=True) and len(shapes) > len(texts) // 16


def test_fingerprint_records_backend_and_numeric_class(tiny_bert_path, texts, tmp_path):
    torch_encoder = ShapedEncoder.create(tiny_bert_path, shape="center").fit(texts)
    assert "backend" not in torch_encoder.spec["backbone"]  # torch encoders keep their fingerprints
    int8 = ShapedEncoder.create(tiny_bert_path, shape="center", backend="onnx-int8").fit(texts)
    assert int8.spec["backbone"]["backend"] == "onnx-int8" and int8.spec["backbone"]["numeric"] == "int8"
    assert int8.fingerprint != torch_encoder.fingerprint
    assert int8.fingerprint_as("torch") != torch_encoder.fingerprint  # int8 fitted its own mean
    int8.save(tmp_path / "int8")
    loaded = ShapedEncoder.load(tmp_path / "int8")
    assert loaded.backbone.backend == "onnx-int8" and loaded.fingerprint == int8.fingerprint
    np.testing.assert_array_equal(loaded.encode(texts[:5]), int8.encode(texts[:5]))
    torch_encoder.save(tmp_path / "torch")
    as_onnx = ShapedEncoder.load(tmp_path / "torch", backend="onnx")  # the saved fingerprint is checked as saved
    assert as_onnx.fingerprint_as("torch") == torch_encoder.fingerprint != as_onnx.fingerprint
    assert cosines(as_onnx.encode(texts), torch_encoder.encode(texts)).min() >= FP32_COSINE


def test_evaluation_cache_is_keyed_on_the_backend(tiny_bert_path, tmp_path):
    from isotrope.evaluate.cache import CachedBackbone

    prefixes = {
        backend: CachedBackbone(ShapedEncoder.create(tiny_bert_path, backend=backend).backbone, tmp_path)._prefix()
        for backend in ("torch", "onnx", "onnx-int8")
    }
    assert len(set(prefixes.values())) == 3


def test_store_policy_across_backends(tiny_bert_path, texts, tmp_path, caplog):
    pytest.importorskip("faiss")
    from isotrope.search import Collection

    chunks = [f"{text} ." for text in texts]
    for backend, store in (("torch", "faiss:" + str(tmp_path / "fp32")), ("onnx-int8", "faiss:" + str(tmp_path / "int8"))):
        encoder = ShapedEncoder.create(tiny_bert_path, shape="center", backend=backend).fit(texts)
        with Collection.create(store, encoder) as collection:
            collection.store.add([str(i) for i in range(len(chunks))], encoder.encode(chunks), chunks, [{}] * len(chunks))
            collection.store.commit()
    fp32, int8 = "faiss:" + str(tmp_path / "fp32"), "faiss:" + str(tmp_path / "int8")
    with caplog.at_level(logging.WARNING), Collection.open(fp32, backend="onnx") as collection:  # fp32 <-> fp32: a warning
        assert collection.encoder.backbone.backend == "onnx"
        assert collection.search(chunks[3], k=1)[0].id == "3"
    assert "written with backend 'torch' and is used with 'onnx'" in caplog.text
    with pytest.raises(backends.BackendMismatchError, match=r"holds fp32 vectors from backend 'torch'.*use backend 'torch'"):
        Collection.open(fp32, backend="onnx-int8")
    with pytest.raises(backends.BackendMismatchError, match=r"holds int8 vectors.*use backend 'onnx-int8'"):
        Collection.open(int8, backend="torch")
    with Collection.open(int8) as collection:  # as written
        assert collection.encoder.backbone.backend == "onnx-int8"


@pytest.mark.slow
def test_minilm_fp32_and_int8(texts):
    sentences = [
        "A man is playing a guitar.",
        "The new movie is awesome!",
        "Cheap flights to Paris in June",
        "A woman slices an onion on a wooden board while the soup boils.",
        *texts[:20],
    ]
    for pooling, layers in (("mean", "last"), ("cls", "first_last"), ("mean", 3)):
        torch_vectors = ShapedEncoder.create("all-MiniLM-L6-v2", pooling=pooling, layers=layers).encode(sentences)
        onnx_vectors = ShapedEncoder.create("all-MiniLM-L6-v2", pooling=pooling, layers=layers, backend="onnx").encode(sentences)
        assert cosines(torch_vectors, onnx_vectors).min() >= FP32_COSINE
    reference = ShapedEncoder.create("all-MiniLM-L6-v2").encode(sentences)
    for backend, bound in INT8_MINILM_MEAN_COSINE.items():
        int8 = ShapedEncoder.create("all-MiniLM-L6-v2", backend=backend).encode(sentences)
        assert bound <= cosines(reference, int8).mean() < 0.99999


def test_cli_fit_encode_and_index_with_a_backend(tiny_bert_path, texts, tmp_path, monkeypatch, capsys):
    pytest.importorskip("lancedb")
    from test_cli import run_cli

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(texts) + "\n")
    code, out, err = run_cli(
        monkeypatch,
        capsys,
        "fit",
        corpus,
        "--out",
        tmp_path / "enc",
        "--model",
        tiny_bert_path,
        "--shape",
        "center",
        "--backend",
        "onnx-int8",
    )
    assert code == 0, err
    saved = ShapedEncoder.load(tmp_path / "enc")
    assert saved.backbone.backend == "onnx-int8" and f"fingerprint {saved.fingerprint}" in out
    code, _, err = run_cli(
        monkeypatch, capsys, "encode", tmp_path / "enc", corpus, "--out", tmp_path / "v.npy", "--backend", "onnx"
    )
    assert code == 0, err
    reference = ShapedEncoder.load(tmp_path / "enc", backend="onnx").encode(texts)
    np.testing.assert_array_equal(np.load(tmp_path / "v.npy"), reference)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("\n\n".join(texts[:20]) + "\n")
    store = f"lancedb:{tmp_path / 'store'}"
    code, out, err = run_cli(
        monkeypatch,
        capsys,
        "index",
        docs,
        "--store",
        store,
        "--model",
        tiny_bert_path,
        "--chunk-tokens",
        "32",
        "--overlap-tokens",
        "8",
        "--backend",
        "onnx-int8",
    )
    assert code == 0, err
    code, out, err = run_cli(monkeypatch, capsys, "search", store, texts[3], "-k", "1", "--backend", "torch")
    assert code == 1 and err.count("\n") == 1 and "holds int8 vectors" in err
    code, out, err = run_cli(monkeypatch, capsys, "search", store, texts[3], "-k", "1")
    assert code == 0 and "1. " in out, err


def test_export_and_quantisation_run_in_a_child_process(tiny_bert_path, tmp_path, monkeypatch):
    from isotrope.backbones import onnx

    def in_this_process(*args, **kwargs):
        raise AssertionError("built in the indexing process")

    monkeypatch.setattr(onnx, "export_hidden_states", in_this_process)
    monkeypatch.setattr(onnx, "quantise", in_this_process)
    path = onnx.exported_model(tiny_bert_path, "onnx-int8-per-channel", cache_dir=tmp_path)
    assert path.name == "model.int8-per-channel.onnx" and path.is_file() and (path.parent / "model.onnx").is_file()
    with pytest.raises(RuntimeError, match=r"^ONNX export of .*missing.*failed: ") as error:
        onnx.build_in_child("export", str(tmp_path / "missing"), str(tmp_path / "out"))
    assert "\n" not in str(error.value)


def test_a_fast_table_is_distilled_from_the_onnx_teacher_as_from_torch(tiny_bert_path, monkeypatch):
    from isotrope.backbones import static

    assert static.teacher_backend() == "onnx"  # onnxruntime and the exporter are installed here, no GPU
    texts = make_sentences(300, seed=7)
    model = f"fast:{tiny_bert_path}"
    onnx = ShapedEncoder.create(model, shape="none", distill_samples=150).fit(texts)
    monkeypatch.setattr(static, "TEACHER_BACKEND", "torch")
    torch_fit = ShapedEncoder.create(model, shape="none", distill_samples=150).fit(texts)
    assert (onnx.metadata["distill"]["teacher_backend"], torch_fit.metadata["distill"]["teacher_backend"]) == ("onnx", "torch")
    chosen = ("fitted", "lam", "shape")
    assert {k: onnx.metadata["distill"].get(k) for k in chosen} == {k: torch_fit.metadata["distill"].get(k) for k in chosen}
    probe = make_sentences(40, seed=8)
    assert cosines(onnx.encode(probe), torch_fit.encode(probe)).min() >= FP32_COSINE


def test_the_evaluation_harness_distils_with_the_products_teacher(tiny_bert_path, monkeypatch, tmp_path):
    """`isotrope eval --model fast` (and benchmarks.fast_small) fit through the cached teacher on the runtime the
    product uses (`teacher_backend`), and the report names it."""
    from isotrope.backbones import static
    from isotrope.config import EncoderConfig
    from isotrope.evaluate.harness import Evaluator

    texts = make_sentences(300, seed=7)
    for backend in ("onnx", "torch"):
        monkeypatch.setattr(static, "TEACHER_BACKEND", backend)
        config = EncoderConfig(model=f"fast:{tiny_bert_path}", distill_samples=150)
        encoder, _ = Evaluator(cache_dir=tmp_path / backend).fit(config, texts)
        assert encoder.metadata["distill"]["teacher_backend"] == backend


def test_onnx_on_the_cpu_batches_fewer_tokens_with_the_same_vectors(tiny_bert_path, monkeypatch, tmp_path):
    from isotrope.backbones import base as batching

    onnx = ShapedEncoder.create(tiny_bert_path, device="cpu", backend="onnx")
    assert onnx.max_batch_tokens == batching.CPU_BATCH_TOKENS < batching.BATCH_TOKENS
    assert ShapedEncoder.load(onnx.save(tmp_path / "e"), device="cpu").max_batch_tokens == batching.CPU_BATCH_TOKENS
    long = " ".join(make_sentences(12, seed=9))
    texts = [long] * onnx.batch_size + make_sentences(5)
    widths: list[int] = []
    forward = onnx.backbone.forward

    def spy(input_ids, *args):
        widths.append(input_ids.size)
        return forward(input_ids, *args)

    monkeypatch.setattr(onnx.backbone, "forward", spy)
    small = onnx.encode(texts)
    # one batch of batch_size texts would hold more: the token cap split them
    assert max(widths) <= batching.CPU_BATCH_TOKENS < onnx.batch_size * len(onnx.tokenizer(long)["input_ids"])
    monkeypatch.setattr(onnx, "max_batch_tokens", batching.BATCH_TOKENS)
    np.testing.assert_allclose(small, onnx.encode(texts), atol=1e-5)
