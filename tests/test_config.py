"""EncoderConfig: one recipe from the CLI, the Python API, isotrope.json and the evaluation harness."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import make_sentences
from isotrope.config import EncoderConfig
from isotrope.encoder import ShapedEncoder
from isotrope.errors import ConfigError
from isotrope.persist import SPEC_FILE, read_spec
from isotrope.search import Collection
from test_cli import run_cli

TEXTS = ["the cat sees a small bird.", "dogs run", "she loves the music of the river and the rain in the city!"]


# -- the recipe itself -------------------------------------------------------------------------
def test_a_recipe_survives_a_json_round_trip():
    config = EncoderConfig(
        model="m",
        shape=[{"kind": "center", "config": {}}],
        layers=[1, 3],
        prompt="say {text}",
        max_length=64,
        weights="sif",
        frequencies=Path("counts.txt"),
        drop_top=2,
        exclude_special=False,
        exclude_punctuation=True,
        token_prepending=True,
        tp_layers=[1, 2],
        backend="onnx",
    )
    document = json.loads(json.dumps(config.to_dict()))
    assert EncoderConfig.from_dict(document) == config
    assert document["layers"] == [1, 3] and document["frequencies"] == "counts.txt"
    assert EncoderConfig.from_dict({}) == EncoderConfig()


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"modle": "x"}, "modle"),
        ({"drop_top": True}, "drop_top"),
        ({"drop_top": "2"}, "drop_top"),
        ({"drop_top": -1}, "drop_top"),
        ({"max_length": 0}, "max_length"),
        ({"exclude_punctuation": 1}, "exclude_punctuation"),
        ({"layers": [1, "a"]}, "layers"),
        ({"shape": 3}, "shape"),
        ({"shape": ["center"]}, "shape"),
        ({"model": ""}, "model"),
        ({"distill_samples": 0}, "distill_samples"),
    ],
)
def test_an_unknown_or_ill_typed_field_is_a_one_line_error_naming_it(data, field):
    with pytest.raises(ConfigError) as error:
        EncoderConfig.from_dict(data)
    assert error.value.field == field and f"{field}" in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(ConfigError, match=field):
        EncoderConfig().replace(**data)


def test_replace_returns_a_new_checked_recipe():
    config = EncoderConfig(model="m")
    assert config.replace(shape="whiten").shape == "whiten" and config.shape is None
    with pytest.raises(ConfigError, match="pooling"):
        config.replace(pooling=None)


def test_the_label_names_what_differs_from_the_defaults():
    assert EncoderConfig(model="m", shape="none").label() == "m pool=mean shape=none"
    config = EncoderConfig(
        model="m",
        shape="center",
        layers="first_last",
        weights="sif",
        frequencies="a/wf.txt",
        exclude_special=True,
        token_prepending=True,
        tp_layers=(1, 3),
        backend="onnx",
    )
    assert config.label() == "m pool=mean layers=first_last tp=1,3 w=sif[wf.txt] no-special shape=center backend=onnx"


# -- the Python API: one code path ---------------------------------------------------------------
def test_create_takes_a_recipe_and_its_keyword_form_builds_the_same_one(tiny_glove_path):
    config = EncoderConfig(model=tiny_glove_path, shape="center", weights="sif", drop_top=1)
    from_config = ShapedEncoder.create(config)
    from_keywords = ShapedEncoder.create(model=tiny_glove_path, shape="center", weights="sif", drop_top=1)
    positional = ShapedEncoder.create(tiny_glove_path, shape="center", weights="sif", drop_top=1)
    assert from_config.spec == from_keywords.spec == positional.spec
    # the encoder's recipe is the one asked for, with the defaults create fills in
    assert from_config.config == from_keywords.config == config.replace(backend="torch")
    assert ShapedEncoder.create(tiny_glove_path).config.shape == "none"
    with pytest.raises(ConfigError, match="shaep"):
        ShapedEncoder.create(tiny_glove_path, shaep="center")


def test_a_saved_encoder_keeps_its_recipe_under_one_key(tiny_bert_path, tmp_path):
    config = EncoderConfig(model=tiny_bert_path, shape="center,l2", layers="first_last", weights="idf", exclude_punctuation=True)
    encoder = ShapedEncoder.create(config, device="cpu").fit(make_sentences(60))
    folder = encoder.save(tmp_path / "enc")
    document = read_spec(folder)
    assert document["config"] == encoder.config.to_dict() and document["format_version"] == 2
    loaded = ShapedEncoder.load(folder, device="cpu")
    assert loaded.config == encoder.config and loaded.fingerprint == encoder.fingerprint
    # the recipe is not fingerprinted: what the encoder computes is, however it was asked for
    assert (
        encoder.fingerprint
        == ShapedEncoder.create(config.replace(layers=[1, 3]), device="cpu").fit(make_sentences(60)).fingerprint
    )


def test_an_encoder_saved_by_the_previous_version_still_loads(tiny_bert_path, tmp_path):
    """Version 1 wrote no recipe: isotrope.json held format_version 1 and the spec only."""
    encoder = ShapedEncoder.create(tiny_bert_path, shape="center,abtt(2),l2", weights="sif", drop_top=2, device="cpu").fit(
        make_sentences(80)
    )
    folder = encoder.save(tmp_path / "new")
    old = Path(shutil.copytree(folder, tmp_path / "old"))
    document = json.loads((old / SPEC_FILE).read_text())
    old_document = {
        key: document[key]
        for key in ("fingerprint", "backbone", "weighting", "pooling", "transforms", "metadata", "isotrope_version")
    }
    (old / SPEC_FILE).write_text(json.dumps({"format_version": 1, **old_document}, indent=2))
    loaded = ShapedEncoder.load(old, device="cpu")
    assert loaded.fingerprint == encoder.fingerprint
    np.testing.assert_array_equal(loaded.encode(TEXTS), encoder.encode(TEXTS))
    recipe = loaded.config  # read back from the spec
    assert (recipe.model, recipe.shape, recipe.weights, recipe.drop_top, recipe.pooling, recipe.backend) == (
        tiny_bert_path,
        "center,abtt(n_components=2),l2",
        "sif",
        2,
        "mean",
        "torch",
    )
    # and it can be rebuilt: the same chain, fitted the same way, gives the same encoder
    rebuilt = ShapedEncoder.create(recipe, device="cpu").fit(make_sentences(80))
    assert rebuilt.fingerprint == encoder.fingerprint


def test_a_store_written_by_the_previous_version_still_opens(tiny_glove_path, tmp_path):
    from isotrope.ingest.pipeline import index_documents
    from isotrope.stores.layout import ENCODER_DIR

    docs = tmp_path / "docs"
    docs.mkdir()
    for number, sentence in enumerate(make_sentences(30, seed=4)):
        (docs / f"{number}.txt").write_text(sentence)
    store = f"faiss:{tmp_path / 'store'}"
    index_documents(docs, store, config=EncoderConfig(model=tiny_glove_path, shape="center"), show_progress=False)
    spec_file = tmp_path / "store" / ENCODER_DIR / SPEC_FILE
    document = json.loads(spec_file.read_text())
    del document["config"]
    spec_file.write_text(json.dumps({**document, "format_version": 1}))
    with Collection.open(store) as collection:
        assert collection.encoder.config.shape == "center,l2" and collection.encoder.config.model == tiny_glove_path
        assert collection.search("the cat", k=3)


def test_derived_recipes_of_reshaped_and_folded_encoders(tiny_glove_path):
    from isotrope.fold import fold_encoder
    from isotrope.reshape import _reshaped_encoder

    encoder = ShapedEncoder.create(tiny_glove_path, shape="center").fit(make_sentences(60))
    assert _reshaped_encoder(encoder, "whiten").config == encoder.config.replace(shape="whiten")
    folded = fold_encoder(encoder)
    assert folded.config.model == f"folded:{tiny_glove_path}" and folded.config.label().startswith("folded:")


# -- the CLI -------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["index", "eval"])
@pytest.mark.parametrize(
    "flag",
    [
        ["--pooling", "max"],
        ["--weights", "sif"],
        ["--drop-top", "3"],
        ["--layers", "1"],
        ["--exclude-punctuation"],
        ["--max-length", "32"],
        ["--token-prepending"],
        ["--distill-samples", "10"],
        ["--frequencies", "wordfreq"],
        ["--prompt", "x {text}"],
        ["--include-special"],
        ["--pooling", "mean"],
    ],
)
def test_encoder_with_any_encoder_option_is_a_one_line_error(monkeypatch, capsys, tmp_path, command, flag):
    head = ["index", tmp_path, "--store", f"faiss:{tmp_path / 's'}"] if command == "index" else ["eval", "sts"]
    code, _, err = run_cli(monkeypatch, capsys, *head, "--encoder", tmp_path / "enc", *flag)
    assert code == 1 and err.count("\n") == 1 and "--encoder" in err
    assert flag[0].replace("--include-special", "--exclude-special") in err


def test_a_bad_option_value_names_the_option(monkeypatch, capsys, tmp_path, tiny_glove_path):
    code, _, err = run_cli(
        monkeypatch, capsys, "fit", tmp_path / "c.txt", "--out", tmp_path / "enc", "--model", tiny_glove_path, "--drop-top", "-2"
    )
    assert code == 1 and err.count("\n") == 1 and err.startswith("error: --drop-top: ") and "at least 0" in err


def test_fit_then_index_with_the_encoder_answers_as_indexing_with_the_options(monkeypatch, capsys, tmp_path, tiny_bert_path):
    """The issue's check: ``fit --model static:M --shape center`` then ``index --encoder`` gives the store
    that ``index --model static:M --shape center`` gives, when both fit on the same texts."""
    sentences = list(dict.fromkeys(make_sentences(80, seed=21)))
    docs = tmp_path / "docs"
    docs.mkdir()
    for number, sentence in enumerate(sentences):  # one chunk per file (the tiny tokenizer holds 128 tokens)
        (docs / f"{number:02d}.txt").write_text(sentence)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(sentences) + "\n")
    model = f"static:{tiny_bert_path}"
    code, _, err = run_cli(monkeypatch, capsys, "fit", corpus, "--model", model, "--shape", "center", "--out", tmp_path / "enc")
    assert code == 0, err
    code, _, err = run_cli(
        monkeypatch,
        capsys,
        "index",
        docs,
        "--store",
        f"faiss:{tmp_path / 'saved'}",
        "--encoder",
        tmp_path / "enc",
        "--chunk-tokens",
        "64",
    )
    assert code == 0, err
    code, _, err = run_cli(
        monkeypatch,
        capsys,
        "index",
        docs,
        "--store",
        f"faiss:{tmp_path / 'options'}",
        "--model",
        model,
        "--shape",
        "center",
        "--chunk-tokens",
        "64",
    )
    assert code == 0, err
    saved = ShapedEncoder.load(tmp_path / "enc")
    with Collection.open(f"faiss:{tmp_path / 'saved'}") as first, Collection.open(f"faiss:{tmp_path / 'options'}") as second:
        assert first.encoder.fingerprint == saved.fingerprint  # used as it is: not refitted
        assert first.encoder.config == second.encoder.config
        assert first.encoder.spec == second.encoder.spec
        ids = sorted(first.store.ids())
        assert ids == sorted(second.store.ids()) and len(ids) == len(sentences)
        np.testing.assert_allclose(first.store.vectors(ids), second.store.vectors(ids), atol=1e-6)
        for query in ("the cat sleeps", "music and rain", "a big dog runs"):
            hits, other = first.search(query, k=5), second.search(query, k=5)
            assert [hit.id for hit in hits] == [hit.id for hit in other]
            np.testing.assert_allclose([hit.score for hit in hits], [hit.score for hit in other], atol=1e-5)


def test_eval_with_a_saved_encoder_labels_its_recipe(monkeypatch, capsys, tmp_path, tiny_glove_path):
    config = EncoderConfig(model=tiny_glove_path, shape="center")
    ShapedEncoder.create(config).fit(make_sentences(60)).save(tmp_path / "enc")
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("the cat runs\tthe cat walks\t4.0\nthe dog eats\tthe sun is red\t0.5\nmusic is good\tmusic is bad\t2.5\n")
    code, out, err = run_cli(monkeypatch, capsys, "eval", "sts", "--encoder", tmp_path / "enc", "--pairs", pairs)
    assert code == 0, err
    assert json.loads(out)["recipe"] == f"saved encoder: {tiny_glove_path} pool=mean shape=center"


def test_a_sweep_point_with_a_bad_field_is_a_one_line_error(monkeypatch, capsys, tmp_path, tiny_glove_path):
    grid = tmp_path / "grid.json"
    grid.write_text(
        json.dumps({"tasks": {"isotropy": {"texts_file": "x.txt"}}, "recipes": [{"model": tiny_glove_path, "drop_top": "many"}]})
    )
    code, _, err = run_cli(monkeypatch, capsys, "sweep", grid, "--out", tmp_path / "sweep")
    assert code == 1 and err.count("\n") == 1 and "drop_top" in err and "sweep point" in err
