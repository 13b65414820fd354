"""isotrope.errors: one home for the exception types, each still the built-in it was; the command line
prints any of them as one line (no traceback without --debug)."""

from __future__ import annotations

import importlib
import os

import numpy as np
import pytest

import isotrope
from isotrope import errors
from isotrope.errors import IsotropeError, one_line
from test_cli import run_cli

#: each error, the built-in base existing ``except`` clauses rely on, and the modules it used to live in
ERRORS = {
    "StoreFormatError": (ValueError, ["isotrope.stores.base", "isotrope.stores"]),
    "StoreLockedError": (RuntimeError, ["isotrope.stores.lock"]),
    "ReshapeInProgressError": (RuntimeError, ["isotrope.stores.layout"]),
    "StoreCapabilityError": (ValueError, []),
    "NotFittedError": (RuntimeError, ["isotrope.transforms.base", "isotrope.transforms"]),
    "EncoderFormatError": (ValueError, ["isotrope.persist"]),
    "EncoderMismatchError": (ValueError, ["isotrope.search", "isotrope"]),
    "EncoderMissingError": (FileNotFoundError, ["isotrope.search"]),
    "BackendMismatchError": (ValueError, ["isotrope.backbones.backends"]),
    "FoldError": (ValueError, ["isotrope.fold"]),
    "DataFormatError": (ValueError, ["isotrope.evaluate.data"]),
}


def test_every_error_is_an_isotrope_error_and_keeps_its_builtin_base():
    declared = {name for name in errors.__all__ if isinstance(getattr(errors, name), type)} - {"IsotropeError"}
    assert declared == set(ERRORS)
    assert isotrope.IsotropeError is IsotropeError
    for name, (builtin, old_homes) in ERRORS.items():
        error_type = getattr(errors, name)
        assert issubclass(error_type, IsotropeError) and issubclass(error_type, builtin), name
        for module in old_homes:  # code written against the old locations still gets the same class
            assert getattr(importlib.import_module(module), name) is error_type, (module, name)


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (errors.StoreFormatError("s/store.sqlite is not a FaissStore database"), "s/store.sqlite is not a FaissStore database"),
        (errors.EncoderMissingError("s holds vectors but no encoder/ folder"), "s holds vectors but no encoder/ folder"),
        (errors.NotFittedError("call fit first"), "call fit first"),
        (KeyError("id 'x' is not stored"), "id 'x' is not stored"),  # without the quotes str() adds
        (FileNotFoundError(2, "No such file or directory", "/no/file"), "No such file or directory: /no/file"),
        (ValueError("first line\n   second line\n"), "first line | second line"),
        (ZeroDivisionError("division by zero"), "ZeroDivisionError: division by zero"),  # a bug: named by its type
        (AssertionError(), "AssertionError"),
    ],
)
def test_one_line(error, line):
    assert one_line(error) == line


def assert_one_line(code, err, start):
    assert code == 1 and "Traceback" not in err
    assert len(err.splitlines()) == 1 and err.startswith(f"error: {start}"), err


def test_a_damaged_store_is_one_line(monkeypatch, capsys, tmp_path):
    pytest.importorskip("faiss")
    store = tmp_path / "store"
    (store / "encoder").mkdir(parents=True)
    (store / "encoder" / "isotrope.json").write_text("{}")
    (store / "store.sqlite").write_bytes(b"not a database" * 100)
    code, _, err = run_cli(monkeypatch, capsys, "search", f"faiss:{store}", "fox")
    assert_one_line(code, err, f"{store / 'store.sqlite'} is not a FaissStore database")
    with pytest.raises(errors.StoreFormatError):
        run_cli(monkeypatch, capsys, "--debug", "search", f"faiss:{store}", "fox")


def test_a_store_without_its_encoder_is_one_line(monkeypatch, capsys, tmp_path):
    pytest.importorskip("faiss")
    from isotrope.connectors.faiss_store import FaissStore

    with FaissStore(tmp_path / "store", dim=4) as store:
        store.add(["a"], np.ones((1, 4)), ["a text"])
    code, _, err = run_cli(monkeypatch, capsys, "info", f"faiss:{tmp_path / 'store'}")
    assert_one_line(code, err, f"{tmp_path / 'store'} holds vectors but no encoder/ folder")


def test_a_locked_store_is_one_line(monkeypatch, capsys, tmp_path):
    from isotrope.stores.lock import writer_lock

    with writer_lock(tmp_path / "store", "indexed"):
        code, _, err = run_cli(monkeypatch, capsys, "reshape", f"lancedb:{tmp_path / 'store'}", "--shape", "center")
    assert_one_line(code, err, f"{tmp_path / 'store'} is being indexed by process {os.getpid()}")


def test_a_malformed_corpus_is_a_data_format_error(monkeypatch, capsys, tmp_path, tiny_glove_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "the cat"}\n{"text": "a dog"\n')
    code, _, err = run_cli(monkeypatch, capsys, "fit", path, "-o", tmp_path / "out", "-m", tiny_glove_path)
    assert_one_line(code, err, f"{path}:2: malformed JSON")
    with pytest.raises(errors.DataFormatError, match=":2: malformed JSON"):
        run_cli(monkeypatch, capsys, "--debug", "fit", path, "-o", tmp_path / "out", "-m", tiny_glove_path)


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (
            errors.EncoderMismatchError("store s was written by encoder a but the encoder given has fingerprint b"),
            "store s was written by encoder a but the encoder given has fingerprint b",
        ),
        (
            errors.ReshapeInProgressError("s is being reshaped;\nopen it when the reshape has finished"),
            "s is being reshaped; | open it when the reshape has finished",
        ),
        (RuntimeError("faiss: out of memory"), "faiss: out of memory"),
        (ZeroDivisionError("division by zero"), "ZeroDivisionError: division by zero"),
    ],
)
def test_any_error_reaching_the_command_line_is_one_line(monkeypatch, capsys, error, line):
    from isotrope.search import Collection

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(Collection, "open", fail)
    code, _, err = run_cli(monkeypatch, capsys, "info", "faiss:anywhere")
    assert code == 1 and err.splitlines() == [f"error: {line}"]
