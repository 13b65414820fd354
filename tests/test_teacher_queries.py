"""``--model fast --teacher-queries``: documents through the table, queries mixed with the teacher's vector
through the table's fitted chain, checked against a reference built from the parts (the teacher run by
transformers directly, mean-pooled in float64)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import make_sentences
from isotrope import teacher_queries
from isotrope.config import EncoderConfig
from isotrope.encoder import ShapedEncoder
from isotrope.errors import EncoderFormatError
from isotrope.teacher_queries import WEIGHT, TeacherQueries

FIT = make_sentences(300, seed=6)
QUERIES = ["the cat runs fast", "a dog sleeps in the house", "blue music by the river"]


def fast(tiny_bert_path: str, **fields) -> ShapedEncoder:
    return ShapedEncoder.create(model=f"fast:{tiny_bert_path}", distill_samples=150, **fields)


@pytest.fixture(scope="module")
def encoders(tiny_bert_path):
    """The same fit three times: with teacher queries, without, and without folding (its chain kept)."""
    mixed = fast(tiny_bert_path, teacher_queries=True).fit(FIT)
    plain = fast(tiny_bert_path).fit(FIT)
    unfolded = fast(tiny_bert_path)
    unfolded._fold_in_place = lambda: False
    return mixed, plain, unfolded.fit(FIT)


def teacher_means(model_path: str, texts: list[str]) -> np.ndarray:
    """The teacher's mean-pooled last hidden states (special tokens included), float64, from transformers."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer, model = AutoTokenizer.from_pretrained(model_path), AutoModel.from_pretrained(model_path).eval()
    batch = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")  # at its model_max_length
    with torch.no_grad():
        states = model(**batch).last_hidden_state.double().numpy()
    mask = batch["attention_mask"].double().numpy()[:, :, None]
    return (states * mask).sum(axis=1) / mask.sum(axis=1)


def unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


@pytest.mark.slow
def test_queries_mix_the_teacher_through_the_fitted_chain_and_documents_stay_on_the_table(encoders, tiny_bert_path):
    mixed, plain, unfolded = encoders
    assert mixed.spec["backbone"]["type"] == "folded" and mixed.shape == "l2"
    assert mixed.query_teacher is not None and mixed.query_teacher.weight == WEIGHT == 0.5
    assert [t.kind for t in mixed.query_teacher.transforms] == [t.kind for t in unfolded.transforms]
    documents = make_sentences(20, seed=9)
    np.testing.assert_array_equal(mixed.encode(documents), plain.encode(documents))
    table = plain.encode(QUERIES, kind="query").astype(np.float64)
    teacher = unfolded.apply_transforms(teacher_means(tiny_bert_path, QUERIES).astype(np.float32)).astype(np.float64)
    expected = unit(WEIGHT * unit(teacher) + (1 - WEIGHT) * unit(table))
    got = mixed.encode(QUERIES, kind="query")
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, atol=2e-5)
    assert np.abs(got - table).max() > 1e-2  # the teacher changed them


@pytest.mark.slow
def test_save_load_keeps_the_teacher_queries_under_the_fingerprint(encoders, tmp_path):
    mixed, plain, _ = encoders
    assert mixed.fingerprint != plain.fingerprint
    mixed.save(tmp_path / "enc")
    loaded = ShapedEncoder.load(tmp_path / "enc")
    assert loaded.fingerprint == mixed.fingerprint
    assert loaded.config.teacher_queries and "teacher-queries" in loaded.config.label()
    np.testing.assert_array_equal(loaded.encode(QUERIES, kind="query"), mixed.encode(QUERIES, kind="query"))
    spec_file = tmp_path / "enc" / "isotrope.json"
    document = json.loads(spec_file.read_text())
    document["query_teacher"]["weight"] = 0.9  # the mix is part of what the fingerprint names
    spec_file.write_text(json.dumps(document))
    with pytest.raises(EncoderFormatError, match="do not match the saved fingerprint"):
        ShapedEncoder.load(tmp_path / "enc")


def test_teacher_queries_only_for_the_fast_model(tiny_bert_path):
    with pytest.raises(ValueError, match="teacher_queries applies to the fast model"):
        ShapedEncoder.create(model=tiny_bert_path, teacher_queries=True)
    assert not EncoderConfig(model="fast").teacher_queries
    assert EncoderConfig.from_dict({"model": "fast", "teacher_queries": True}).teacher_queries


@pytest.mark.parametrize("weight", [0.0, -0.5, 1.5])
def test_the_mix_weight_is_checked(weight):
    with pytest.raises(ValueError, match=r"weight must be in \(0, 1\]"):
        TeacherQueries("m", "torch", [], weight)


@pytest.mark.slow
def test_a_store_records_how_its_queries_are_encoded(encoders, tiny_bert_path):
    from isotrope.search import describe_encoder

    mixed, plain, _ = encoders
    assert describe_encoder(plain)["queries"] == "as documents"
    assert (
        describe_encoder(mixed)["queries"]
        == f"the table's vector and {tiny_bert_path}'s ({mixed.query_teacher.backend}), weight 0.5"
    )


@pytest.mark.slow
def test_export_refuses_an_encoder_whose_queries_go_through_the_teacher(encoders, tmp_path):
    from isotrope.export import export_encoder
    from isotrope.fold import FoldError

    mixed, plain, _ = encoders
    with pytest.raises(FoldError, match="--teacher-queries"):
        export_encoder(mixed, tmp_path / "m2v", "model2vec")
    assert not (tmp_path / "m2v").exists()
    assert export_encoder(plain, tmp_path / "plain", "model2vec").is_dir()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_the_teacher_means_on_either_runtime_equal_transformers(encoders, tiny_bert_path, backend):
    """The ONNX teacher runs through its cached export with tokenizers alone; torch through the backbone."""
    texts = [*QUERIES, "a much longer query about the cat and the dog " * 30]  # truncated at the tokenizer's limit
    got = TeacherQueries(tiny_bert_path, backend, []).teacher_vectors(texts)
    expected = teacher_means(tiny_bert_path, texts)
    np.testing.assert_allclose(got, expected, atol=2e-5)


@pytest.mark.slow
def test_a_cold_process_answers_teacher_queries_without_importing_torch(encoders, tmp_path):
    """On the ONNX teacher a store's query path imports neither torch nor transformers."""
    mixed, _, _ = encoders
    assert mixed.query_teacher.backend == "onnx"
    mixed.save(tmp_path / "enc")
    script = (
        "import sys, numpy as np\n"
        "from isotrope.encoder import ShapedEncoder\n"
        f"vectors = ShapedEncoder.load({str(tmp_path / 'enc')!r}).encode({QUERIES!r}, kind='query')\n"
        f"np.save({str(tmp_path / 'q.npy')!r}, vectors)\n"
        "print(sorted({'torch', 'transformers'} & set(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
    np.testing.assert_array_equal(np.load(tmp_path / "q.npy"), mixed.encode(QUERIES, kind="query"))


def test_a_teacher_that_cannot_be_loaded_is_named_in_one_line(tmp_path):
    queries = TeacherQueries(str(tmp_path / "nowhere"), "onnx", [])
    with pytest.raises(OSError, match=r"teacher .*nowhere \(onnx, --teacher-queries\), which cannot be loaded here"):
        queries.teacher_vectors(["a query"])


@pytest.mark.slow
def test_a_store_opened_for_search_starts_loading_its_teacher(encoders, tmp_path, monkeypatch):
    """Collection.open starts the teacher's load before it reads the index and the encoder; the queries it
    answers are the encoder's own."""
    from isotrope.search import Collection

    mixed, _, _ = encoders
    uri = f"faiss:{tmp_path / 's'}"
    with Collection.create(uri, mixed) as collection:
        collection.add([f"d{i}" for i in range(40)], FIT[:40])
    monkeypatch.setattr(teacher_queries, "_TEACHERS", {})
    with Collection.open(uri) as collection:
        key = (mixed.query_teacher.model, mixed.query_teacher.backend)
        assert list(teacher_queries._TEACHERS) == [key]
        hits = collection.search(QUERIES[0], k=5, mode="dense")
    expected = np.argsort(-(mixed.encode(FIT[:40]) @ mixed.encode(QUERIES[:1], kind="query")[0]))[:5]
    assert [hit.id for hit in hits] == [f"d{i}" for i in expected]


def test_a_failed_teacher_load_is_tried_again(tmp_path, monkeypatch):
    monkeypatch.setattr(teacher_queries, "_TEACHERS", {})
    first = teacher_queries.start_loading(str(tmp_path / "nowhere"), "onnx")
    with pytest.raises(OSError):
        first.result()
    assert teacher_queries.start_loading(str(tmp_path / "nowhere"), "onnx") is not first
