"""The command line through its entry point ``isotrope.cli.main`` (in process, and once as a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import make_sentences
from isotrope.cli import main
from isotrope.encoder import ShapedEncoder


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """Run ``isotrope ARGS`` in this process: (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["isotrope", *map(str, args)])
    code = 0
    try:
        main()
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return make_sentences(120, seed=11)


@pytest.fixture
def corpus(tmp_path, texts) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(texts[:60]) + "\n\n" + "\n".join(texts[60:]) + "\n")
    return path


def test_help_lists_the_commands(monkeypatch, capsys):
    code, out, _ = run_cli(monkeypatch, capsys, "--help")
    assert code == 0
    for command in ("fit", "encode"):
        assert command in out
    code, out, _ = run_cli(monkeypatch, capsys, "fit", "--help")
    assert code == 0 and "--shape" in out and "--model" in out


def test_fit_text_file_then_encode(monkeypatch, capsys, tmp_path, tiny_bert_path, corpus, texts):
    out_dir = tmp_path / "encoder"
    code, out, err = run_cli(monkeypatch, capsys, "fit", corpus, "--out", out_dir, "--model", tiny_bert_path, "--shape", "whiten")
    assert code == 0, err
    loaded = ShapedEncoder.load(out_dir, device="cpu")
    assert f"fingerprint {loaded.fingerprint}" in out
    assert loaded.metadata["fit"]["fitted_on"] == str(corpus) and loaded.metadata["fit"]["n_texts"] == len(texts)
    expected = ShapedEncoder.create(tiny_bert_path, shape="whiten", device="cpu").fit(texts)
    assert loaded.fingerprint == expected.fingerprint

    queries = tmp_path / "queries.txt"
    queries.write_text("the cat runs\nwhere is the river?\n")
    for kind in ("document", "query"):
        vectors_file = tmp_path / f"{kind}.npy"
        code, out, err = run_cli(monkeypatch, capsys, "encode", out_dir, queries, "--out", vectors_file, "--kind", kind)
        assert code == 0, err
        assert f"wrote 2 x {loaded.dim} vectors" in out
        vectors = np.load(vectors_file)
        assert vectors.dtype == np.float32
        np.testing.assert_array_equal(vectors, loaded.encode(["the cat runs", "where is the river?"], kind=kind))


def test_fit_jsonl_with_a_text_field(monkeypatch, capsys, tmp_path, tiny_bert_path, texts):
    path = tmp_path / "corpus.jsonl"
    records = [{"body": text, "id": index} for index, text in enumerate(texts[:50])]
    path.write_text("\n".join(json.dumps(record) for record in records) + "\n\n")
    out_dir = tmp_path / "encoder"
    code, _, err = run_cli(
        monkeypatch,
        capsys,
        "fit",
        path,
        "-o",
        out_dir,
        "-m",
        tiny_bert_path,
        "-s",
        "center",
        "--text-field",
        "body",
        "--weights",
        "idf",
    )
    assert code == 0, err
    expected = ShapedEncoder.create(tiny_bert_path, shape="center", weights="idf", device="cpu").fit(texts[:50])
    assert ShapedEncoder.load(out_dir, device="cpu").fingerprint == expected.fingerprint


def test_missing_corpus_is_one_error_line(monkeypatch, capsys, tmp_path, tiny_bert_path):
    missing = tmp_path / "nowhere.txt"
    code, _, err = run_cli(monkeypatch, capsys, "fit", missing, "-o", tmp_path / "out", "-m", tiny_bert_path)
    assert code == 1
    assert err.splitlines() == [f"error: corpus file not found: {missing}"]
    assert not (tmp_path / "out").exists()


def test_malformed_jsonl_names_file_and_line(monkeypatch, capsys, tmp_path, tiny_bert_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "the cat"}\n\n{"text": "a dog"\n')
    code, _, err = run_cli(monkeypatch, capsys, "fit", path, "-o", tmp_path / "out", "-m", tiny_bert_path)
    assert code == 1
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}:3: malformed JSON")
    path.write_text('{"text": "the cat"}\n{"title": "a dog"}\n')
    code, _, err = run_cli(monkeypatch, capsys, "fit", path, "-o", tmp_path / "out", "-m", tiny_bert_path)
    assert code == 1 and err.splitlines() == [f"error: {path}:2: no string field 'text'"]


def test_encode_with_a_damaged_encoder_folder(monkeypatch, capsys, tmp_path):
    (tmp_path / "enc").mkdir()
    (tmp_path / "enc" / "isotrope.json").write_text('{"format_version": 99}')
    inputs = tmp_path / "in.txt"
    inputs.write_text("the cat\n")
    code, _, err = run_cli(monkeypatch, capsys, "encode", tmp_path / "enc", inputs, "-o", tmp_path / "v.npy")
    assert code == 1
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "format_version 99" in err


def test_debug_lets_the_exception_through(monkeypatch, capsys, tmp_path, tiny_bert_path):
    with pytest.raises(FileNotFoundError, match="corpus file not found"):
        run_cli(monkeypatch, capsys, "--debug", "fit", tmp_path / "nowhere.txt", "-o", tmp_path / "out", "-m", tiny_bert_path)


@pytest.mark.slow
def test_entry_point_prints_a_traceback_with_debug(tmp_path, tiny_glove_path):
    missing = tmp_path / "nowhere.txt"
    command = [
        sys.executable,
        "-m",
        "isotrope.cli",
        "--debug",
        "fit",
        str(missing),
        "-o",
        str(tmp_path / "out"),
        "-m",
        tiny_glove_path,
    ]  # a static table: the quickest model to start
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert result.returncode != 0
    assert "Traceback (most recent call last)" in result.stderr
    assert f"FileNotFoundError: corpus file not found: {missing}" in result.stderr


def test_fit_samples_is_the_one_name_and_max_samples_its_deprecated_alias(monkeypatch, capsys, tmp_path, tiny_glove_path, corpus):
    args = ("fit", corpus, "--model", tiny_glove_path, "--shape", "center")
    code, _, err = run_cli(monkeypatch, capsys, *args, "--fit-samples", "25", "--out", tmp_path / "a")
    assert code == 0, err
    assert ShapedEncoder.load(tmp_path / "a").metadata["fit"]["n_texts"] == 25
    code, _, err = run_cli(monkeypatch, capsys, *args, "--max-samples", "30", "--out", tmp_path / "b")
    assert code == 0 and "--max-samples is deprecated" in err
    assert ShapedEncoder.load(tmp_path / "b").metadata["fit"]["n_texts"] == 30


def test_the_encoder_options_take_their_defaults_from_the_recipe():
    """fit, index and eval declare each encoder option once; a default the recipe has is the recipe's."""
    import typer.main

    from isotrope.cli import app
    from isotrope.config import FIELDS, EncoderConfig

    recipe = EncoderConfig()
    commands = {
        info.name or info.callback.__name__: typer.main.get_command_from_info(
            info, pretty_exceptions_short=True, rich_markup_mode=None
        )
        for info in app.registered_commands
    }
    for name in ("fit", "index", "eval"):
        params = {param.name: param for param in commands[name].params}
        for field in FIELDS - {"model", "shape", "backend"}:
            assert field in params, (name, field)
            default = params[field].default
            assert default is None or default == getattr(recipe, field), (name, field, default)


def test_a_usage_error_names_the_option_with_exit_code_2(monkeypatch, capsys, tmp_path):
    """typer (>= 0.26) raises its vendored click's exceptions: they are still shown as usage errors, not as
    'error: MissingParameter: Missing parameter: store' with exit code 1."""
    code, _, err = run_cli(monkeypatch, capsys, "index", tmp_path)
    assert code == 2 and "Usage: " in err and "Missing option '--store'" in err
    code, _, err = run_cli(monkeypatch, capsys, "search", "faiss:x", "a query", "-k", "many")
    assert code == 2 and "Invalid value for '-k'" in err
    code, _, err = run_cli(monkeypatch, capsys, "index", tmp_path, "--store", "faiss:x", "--engine", "rey")
    assert code == 2 and "--engine" in err and "'rey'" in err
    code, _, err = run_cli(monkeypatch, capsys, "search")
    assert code == 2 and "Missing argument" in err


def test_ctrl_c_exits_130_with_one_line(monkeypatch, capsys, tmp_path):
    """Ctrl-C is not a success: typer >= 0.26 turns it into an exit code that main must not drop."""
    import isotrope.search

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(isotrope.search.Collection, "open", interrupted)
    code, _, err = run_cli(monkeypatch, capsys, "info", f"faiss:{tmp_path}")
    assert code == 130 and err.splitlines()[-1] == "interrupted"


def test_a_bad_index_is_named_once_without_faiss_internals(monkeypatch, capsys, tmp_path):
    code, _, err = run_cli(monkeypatch, capsys, "index", tmp_path, "--store", f"faiss:{tmp_path / 's'}", "--index", "hnsw")
    assert code == 2 and err.count("--index") == 1, err
    assert "Invalid value for --index: invalid index 'hnsw': neither auto, flat nor a faiss index_factory string" in err
    assert "could not parse index string hnsw" in err and "std::" not in err and ".cpp" not in err
    assert not (tmp_path / "s").exists()
