"""The on-disk format: exact round trips, fingerprints, and clear errors for damaged folders."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from conftest import make_sentences
from isotrope.encoder import ShapedEncoder
from isotrope.fingerprint import fingerprint
from isotrope.persist import CHECKED_FILE, FORMAT_VERSION, SPEC_FILE, STATE_FILE, EncoderFormatError, read_spec
from isotrope.transforms import NotFittedError

TEXTS = ["the cat sees a small bird.", "dogs run", "she loves the music of the river and the rain in the city!"]
SHAPE = "center,abtt(2),whiten(power=-0.25,n_components=12),quantile(n_quantiles=40),l2"


@pytest.fixture(scope="module")
def fitted(tiny_bert_path) -> ShapedEncoder:
    encoder = ShapedEncoder.create(
        tiny_bert_path, shape=SHAPE, weights="sif", drop_top=2, exclude_punctuation=True, layers="first_last", device="cpu"
    )
    return encoder.fit(make_sentences(150), fitted_on="tiny sentences")


@pytest.fixture(scope="module")
def saved(fitted, tmp_path_factory) -> Path:
    return fitted.save(tmp_path_factory.mktemp("saved") / "encoder")


@pytest.fixture
def copy(saved, tmp_path) -> Path:
    """A private copy of the saved folder that a test may damage."""
    return Path(shutil.copytree(saved, tmp_path / "encoder"))


def edit_spec(folder: Path, change) -> None:
    document = json.loads((folder / SPEC_FILE).read_text())
    change(document)
    (folder / SPEC_FILE).write_text(json.dumps(document))


# -- round trips ---------------------------------------------------------------------------------
def test_save_load_is_bit_identical(fitted, saved):
    assert sorted(p.name for p in saved.iterdir()) == [SPEC_FILE, STATE_FILE]
    loaded = ShapedEncoder.load(saved, device="cpu")
    assert loaded.fingerprint == fitted.fingerprint
    assert loaded.spec == fitted.spec
    assert loaded.metadata["fit"]["fitted_on"] == "tiny sentences"
    np.testing.assert_array_equal(loaded.encode(TEXTS), fitted.encode(TEXTS))
    np.testing.assert_array_equal(loaded.encode(TEXTS, kind="query"), fitted.encode(TEXTS, kind="query"))
    document = read_spec(saved)
    assert document["format_version"] == FORMAT_VERSION and document["fingerprint"] == fitted.fingerprint
    assert [step["kind"] for step in document["transforms"]] == ["center", "abtt", "whiten", "quantile", "l2"]


def test_state_file_holds_every_array(fitted, saved):
    state = load_file(saved / STATE_FILE)
    expected = fitted.get_state()
    assert set(state) == set(expected)
    assert {"weighting.weights_", "transforms.0.mean_", "transforms.2.scale_", "transforms.3.quantiles_"} <= set(state)
    for name, array in expected.items():
        np.testing.assert_array_equal(state[name], array)
        assert state[name].dtype == array.dtype


def test_static_random_encoder_round_trip(tiny_bert_path, tmp_path):
    encoder = ShapedEncoder.create(f"random:{tiny_bert_path}", weights="idf", shape="center").fit(make_sentences(50))
    loaded = ShapedEncoder.load(encoder.save(tmp_path / "static"))
    assert loaded.fingerprint == encoder.fingerprint
    np.testing.assert_array_equal(loaded.encode(TEXTS), encoder.encode(TEXTS))


def test_unfitted_encoder_cannot_be_saved(tiny_bert_path, tmp_path):
    encoder = ShapedEncoder.create(tiny_bert_path, shape="whiten", device="cpu")
    with pytest.raises(NotFittedError):
        encoder.save(tmp_path / "nope")
    assert not (tmp_path / "nope").exists()


def test_saving_over_a_folder_replaces_it(tiny_bert_path, fitted, tmp_path):
    target = tmp_path / "encoder"
    fitted.save(target)
    (target / "stale.txt").write_text("from an older save")
    other = ShapedEncoder.create(tiny_bert_path, shape="center", device="cpu").fit(make_sentences(30, seed=4))
    assert other.save(target) == target
    assert sorted(p.name for p in tmp_path.iterdir()) == ["encoder"]  # no temporary or retired folders left
    assert sorted(p.name for p in target.iterdir()) == [SPEC_FILE, STATE_FILE]
    assert ShapedEncoder.load(target, device="cpu").fingerprint == other.fingerprint != fitted.fingerprint


# -- fingerprints -----------------------------------------------------------------------------------
def test_fingerprint_changes_with_any_array_or_the_spec(fitted):
    spec, state = fitted.spec, fitted.get_state()
    reference = fingerprint(spec, state)
    assert len(reference) == 64 and reference == fitted.fingerprint
    assert fingerprint(spec, dict(reversed(list(state.items())))) == reference
    for name in state:
        changed = {key: value.copy() for key, value in state.items()}
        flat = changed[name].reshape(-1)
        flat[-1] = np.nextafter(flat[-1], np.inf)  # one ulp in one float
        assert fingerprint(spec, changed) != reference, name
    renamed = dict(state)
    renamed["weighting.weights_x"] = renamed.pop("weighting.weights_")
    assert fingerprint(spec, renamed) != reference
    recast = dict(state, **{"weighting.weights_": state["weighting.weights_"].astype(np.float64)})
    assert fingerprint(spec, recast) != reference
    reshaped = dict(state, **{"transforms.0.mean_": state["transforms.0.mean_"].reshape(1, -1)})
    assert fingerprint(spec, reshaped) != reference
    assert fingerprint({**spec, "pooling": {"mode": "max"}}, state) != reference
    other_transforms = json.loads(json.dumps(spec))
    other_transforms["transforms"][1]["config"]["n_components"] = 3
    assert fingerprint(other_transforms, state) != reference


def test_modified_array_fails_the_fingerprint_check(copy):
    state = load_file(copy / STATE_FILE)
    state["transforms.2.scale_"][0] *= 1.001
    save_file(state, copy / STATE_FILE)
    with pytest.raises(EncoderFormatError, match="do not match the saved fingerprint"):
        ShapedEncoder.load(copy, device="cpu")


def test_modified_spec_fails_the_fingerprint_check(copy):
    edit_spec(copy, lambda d: d["pooling"].update(mode="max"))
    with pytest.raises(EncoderFormatError, match="do not match the saved fingerprint"):
        ShapedEncoder.load(copy, device="cpu")


def count_hashes(monkeypatch) -> list[int]:
    """Count the fingerprints computed from here on (by the file check and by the rebuilt encoder's check)."""
    import isotrope.encoder
    import isotrope.persist

    hashed: list[int] = []
    for module in (isotrope.encoder, isotrope.persist):
        monkeypatch.setattr(module, "fingerprint", lambda spec, state, real=fingerprint: hashed.append(1) or real(spec, state))
    return hashed


def test_a_load_hashes_the_arrays_once_and_still_checks_the_rebuilt_encoder(copy, monkeypatch):
    """The fingerprint is computed once (the file's check) when the rebuilt encoder holds the very arrays read; a
    rebuilt encoder whose arrays differ from them is hashed again and refused."""
    import isotrope.encoder

    hashed = count_hashes(monkeypatch)
    assert ShapedEncoder.load(copy, device="cpu").fingerprint == read_spec(copy)["fingerprint"] and len(hashed) == 1
    (copy / CHECKED_FILE).unlink()  # the file check hashes again
    real_state = isotrope.encoder.ShapedEncoder.get_state

    def drifted(encoder):
        state = real_state(encoder)
        return {**state, "transforms.2.scale_": state["transforms.2.scale_"] * 1.001}

    monkeypatch.setattr(isotrope.encoder.ShapedEncoder, "get_state", drifted)
    with pytest.raises(EncoderFormatError):
        ShapedEncoder.load(copy, device="cpu")
    assert len(hashed) == 3


def test_files_unchanged_since_a_checked_load_are_not_hashed_again(copy, monkeypatch):
    """A load records the stats of the files it checked; the next load of the same files skips hashing them. A
    change, even one that keeps the file's size and modification time, changes its ctime: hashed and refused."""
    time.sleep(0.05)  # a record is trusted only if newer than the files' last change (the clock's tick)
    first = ShapedEncoder.load(copy, device="cpu")
    assert (copy / CHECKED_FILE).is_file()
    hashed = count_hashes(monkeypatch)
    again = ShapedEncoder.load(copy, device="cpu")
    assert hashed == [] and again.fingerprint == first.fingerprint
    np.testing.assert_array_equal(again.encode(TEXTS), first.encode(TEXTS))

    before = (copy / STATE_FILE).stat()
    state = load_file(copy / STATE_FILE)
    state["transforms.2.scale_"][0] *= 1.001
    save_file(state, copy / STATE_FILE)  # rewritten in place: the same size
    os.utime(copy / STATE_FILE, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (copy / STATE_FILE).stat().st_size == before.st_size
    with pytest.raises(EncoderFormatError, match="do not match the saved fingerprint"):
        ShapedEncoder.load(copy, device="cpu")
    assert len(hashed) == 1


def test_a_record_no_newer_than_the_files_is_not_trusted(copy, monkeypatch):
    """A file changed in the clock tick of the record could keep every stat: such a record is not trusted."""
    ShapedEncoder.load(copy, device="cpu")
    changed = max((copy / name).stat().st_ctime_ns for name in (SPEC_FILE, STATE_FILE))
    os.utime(copy / CHECKED_FILE, ns=(changed, changed))
    hashed = count_hashes(monkeypatch)
    ShapedEncoder.load(copy, device="cpu")
    assert len(hashed) == 1


def test_a_folder_where_the_record_cannot_be_written_loads(copy, monkeypatch):
    (copy / CHECKED_FILE).unlink(missing_ok=True)
    (copy / CHECKED_FILE).mkdir()  # replacing it fails
    hashed = count_hashes(monkeypatch)
    for _ in range(2):
        ShapedEncoder.load(copy, device="cpu")
    assert len(hashed) == 2
    assert sorted(p.name for p in copy.iterdir()) == sorted([CHECKED_FILE, SPEC_FILE, STATE_FILE])


# -- damaged folders ---------------------------------------------------------------------------------
def test_missing_folder_or_spec(tmp_path, copy):
    with pytest.raises(EncoderFormatError, match=r"isotrope\.json not found: .* is not a saved isotrope encoder"):
        ShapedEncoder.load(tmp_path / "nothing-here")
    (copy / SPEC_FILE).unlink()
    with pytest.raises(EncoderFormatError, match=r"isotrope\.json not found"):
        ShapedEncoder.load(copy)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "isotrope.json is corrupt"),
        ("[1, 2]", "corrupt: expected a JSON object"),
        (b"\xff\xfe\x00", "isotrope.json is corrupt"),
    ],
)
def test_corrupt_spec(copy, content, message):
    if isinstance(content, bytes):
        (copy / SPEC_FILE).write_bytes(content)
    else:
        (copy / SPEC_FILE).write_text(content)
    with pytest.raises(EncoderFormatError, match=message):
        ShapedEncoder.load(copy)


@pytest.mark.parametrize("version", [FORMAT_VERSION + 1, 0, "1", None])
def test_wrong_format_version(copy, version):
    edit_spec(copy, lambda d: d.update(format_version=version))
    message = f"format_version {version!r}; this isotrope .* reads versions 1, {FORMAT_VERSION}"
    with pytest.raises(EncoderFormatError, match=message):
        ShapedEncoder.load(copy)


def test_missing_spec_key(copy):
    edit_spec(copy, lambda d: (d.pop("pooling"), d.pop("fingerprint")))
    with pytest.raises(EncoderFormatError, match="corrupt: missing fingerprint, pooling"):
        ShapedEncoder.load(copy)


def test_missing_state_file(copy):
    (copy / STATE_FILE).unlink()
    with pytest.raises(EncoderFormatError, match=r"state\.safetensors not found: the encoder's arrays are missing"):
        ShapedEncoder.load(copy)


def test_corrupt_state_file(copy):
    (copy / STATE_FILE).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00garbage")
    with pytest.raises(EncoderFormatError, match=r"state\.safetensors is corrupt"):
        ShapedEncoder.load(copy)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("transforms.1.components_", "abtt transform state is missing arrays: components_"),
        ("weighting.weights_", "weighting state is missing the array 'weights_'"),
    ],
)
def test_missing_array(copy, name, message):
    state = load_file(copy / STATE_FILE)
    del state[name]
    save_file(state, copy / STATE_FILE)
    with pytest.raises(EncoderFormatError, match=f"cannot rebuild the encoder: {message}"):
        ShapedEncoder.load(copy)


def test_array_of_the_wrong_shape(copy):
    state = load_file(copy / STATE_FILE)
    state["transforms.1.components_"] = state["transforms.1.components_"][:1]
    save_file(state, copy / STATE_FILE)
    with pytest.raises(EncoderFormatError, match=r"cannot rebuild the encoder: .*components_"):
        ShapedEncoder.load(copy)


def test_unknown_transform_kind(copy):
    edit_spec(copy, lambda d: d["transforms"][1].update(kind="blur"))
    with pytest.raises(EncoderFormatError, match=r"transforms\[1\] has unknown kind 'blur'"):
        ShapedEncoder.load(copy)


def test_bad_transform_config(copy):
    edit_spec(copy, lambda d: d["transforms"][2]["config"].update(strength=2))
    with pytest.raises(EncoderFormatError, match=r"cannot rebuild the encoder: .*strength"):
        ShapedEncoder.load(copy)


@pytest.mark.parametrize(
    ("pooling", "message"), [({"mode": "median"}, "unknown pooling 'median'"), ("mean", "string indices"), ({}, "'mode'")]
)
def test_bad_pooling(copy, pooling, message):
    edit_spec(copy, lambda d: d.update(pooling=pooling))
    with pytest.raises(EncoderFormatError, match=f"cannot rebuild the encoder: .*{message}"):
        ShapedEncoder.load(copy)


def test_unknown_backbone_type(copy):
    # an edited backbone config is refused by the fingerprint before any backbone is built
    edit_spec(copy, lambda d: d["backbone"].update(type="onnx"))
    with pytest.raises(EncoderFormatError, match="do not match the saved fingerprint"):
        ShapedEncoder.load(copy)
