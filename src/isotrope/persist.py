"""The on-disk format of a fitted encoder: ``isotrope.json`` + ``state.safetensors`` (no pickle)."""

from __future__ import annotations

import json
import logging
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from safetensors.numpy import load_file, save_file

from isotrope import __version__
from isotrope.backbones import make_backbone
from isotrope.backbones.backends import backend_fields, check_backend, recorded_backend
from isotrope.config import EncoderConfig
from isotrope.errors import EncoderFormatError
from isotrope.fingerprint import canonical_json, fingerprint
from isotrope.pooling import POOLING_MODES
from isotrope.teacher_queries import TeacherQueries
from isotrope.transforms import chain_from_state
from isotrope.weighting import TokenWeighting

logger = logging.getLogger(__name__)

#: 2 adds ``config`` (the recipe); folders of version 1 are read, their recipe read back from the spec
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
SPEC_FILE = "isotrope.json"
#: keys of isotrope.json that are not part of the spec the fingerprint covers (the recipe is not: the
#: fingerprint names what the encoder computes, the same however it was asked for)
_NOT_FINGERPRINTED = ("format_version", "isotrope_version", "fingerprint", "config", "metadata")
STATE_FILE = "state.safetensors"
#: the stats of SPEC_FILE and STATE_FILE when their arrays last matched the saved fingerprint
CHECKED_FILE = ".fingerprint-checked.json"


class EncoderParts(NamedTuple):
    """The parts of a saved encoder, rebuilt and checked; ``ShapedEncoder.load`` assembles them."""

    document: dict[str, Any]
    backbone: Any
    pooling: str
    weighting: TokenWeighting
    transforms: list[Any]
    #: the runtime the encoder was saved with (its fingerprint names it)
    saved_backend: str
    #: the recipe it was built from
    config: EncoderConfig
    #: the arrays read, checked against the saved fingerprint
    state: dict[str, np.ndarray]
    #: ``--teacher-queries``: how its queries also go through the teacher (None: the table alone)
    query_teacher: TeacherQueries | None = None


def write_encoder(
    path: str | Path,
    spec: dict[str, Any],
    state: dict[str, np.ndarray],
    metadata: dict[str, Any],
    save_files: Callable[[Path], None] | None = None,
    config: dict[str, Any] | None = None,
) -> Path:
    """Write the encoder folder atomically: a complete new folder replaces the old one.

    ``save_files`` writes files the backbone keeps beside its arrays (a folded table's tokenizer.json);
    ``config`` is the recipe (``EncoderConfig.to_dict()``), kept under ``"config"``.
    """
    path = Path(path)
    document = {
        "format_version": FORMAT_VERSION,
        "isotrope_version": __version__,
        "fingerprint": fingerprint(spec, state),
        **spec,
        **({"config": config} if config is not None else {}),
        "metadata": metadata,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        save_file({name: np.ascontiguousarray(array) for name, array in state.items()}, staging / STATE_FILE)
        if save_files is not None:
            save_files(staging)
        (staging / SPEC_FILE).write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
        if path.exists():
            retired = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:8]}"
            path.rename(retired)
            staging.rename(path)
            shutil.rmtree(retired)
        else:
            staging.rename(path)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return path


def read_spec(path: str | Path) -> dict[str, Any]:
    """The parsed ``isotrope.json`` of an encoder folder, with its format version checked."""
    spec_file = Path(path) / SPEC_FILE
    if not spec_file.is_file():
        raise EncoderFormatError(f"{spec_file} not found: {path} is not a saved isotrope encoder")
    try:
        document = json.loads(spec_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise EncoderFormatError(f"{spec_file} is corrupt: {error}") from None
    if not isinstance(document, dict):
        raise EncoderFormatError(f"{spec_file} is corrupt: expected a JSON object")
    version = document.get("format_version")
    if version not in READABLE_VERSIONS:
        raise EncoderFormatError(
            f"{spec_file} has format_version {version!r}; this isotrope ({__version__}) reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}"
        )
    missing = [key for key in ("fingerprint", "backbone", "weighting", "pooling", "transforms") if key not in document]
    if missing:
        raise EncoderFormatError(f"{spec_file} is corrupt: missing {', '.join(missing)}")
    return document


def _substate(state: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    return {name[len(prefix) :]: array for name, array in state.items() if name.startswith(prefix)}


def read_encoder(path: str | Path, device: str = "auto", backend: str | None = None) -> EncoderParts:
    """Rebuild a saved encoder's parts; spec and arrays must match the saved fingerprint.

    ``backend`` runs a transformer backbone on another runtime than the saved one (the saved
    fingerprint is checked as saved; the loaded encoder's fingerprint names the new backend).
    """
    path = Path(path)
    stats = file_stats(path)
    document = read_spec(path)
    state_file = path / STATE_FILE
    if not state_file.is_file():
        raise EncoderFormatError(f"{state_file} not found: the encoder's arrays are missing")
    try:
        state = load_file(state_file)
    except Exception as error:  # safetensors raises its own error types
        raise EncoderFormatError(f"{state_file} is corrupt: {error}") from None
    try:  # the parts made of arrays and closed tables first: they say precisely what is wrong
        weighting = TokenWeighting.from_state(document["weighting"], _substate(state, "weighting."))
        transforms = chain_from_state(document["transforms"], _substate(state, "transforms."))
        pooling = document["pooling"]["mode"]
        if pooling not in POOLING_MODES:
            raise ValueError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLING_MODES)}")
        config = read_config(document)
        query_teacher = (
            TeacherQueries.from_state(document["query_teacher"], _substate(state, "query_teacher."))
            if "query_teacher" in document
            else None
        )
    except (TypeError, KeyError, ValueError) as error:
        if isinstance(error, EncoderFormatError):
            raise
        raise EncoderFormatError(f"{path}: cannot rebuild the encoder: {error}") from None
    # checked before the backbone is built: a tampered backbone config (its source) is never loaded
    # (the files read are those stat-ed before, unless their stats changed meanwhile)
    read_as = stats if stats is not None and file_stats(path) == stats else None
    if not checked_before(path, document["fingerprint"], read_as):
        if fingerprint(fingerprinted_spec(document), state) != document["fingerprint"]:
            raise EncoderFormatError(
                f"{path}: {SPEC_FILE} and {STATE_FILE} do not match the saved fingerprint "
                f"{document['fingerprint'][:12]}; the folder was modified or is corrupt: nothing was loaded"
            )
        if read_as is not None:
            record_checked(path, document["fingerprint"], read_as)
    try:
        backbone_config = dict(document["backbone"])
        saved_backend = recorded_backend(backbone_config)
        if backbone_config.get("type") == "hf":
            backbone_config["device"] = device
            if backend is not None:
                backbone_config = {key: value for key, value in backbone_config.items() if key not in ("backend", "numeric")}
                backbone_config.update(backend_fields(backend))
        elif backend not in (None, "torch"):
            raise ValueError(f"backend {check_backend(backend)!r} runs transformers; {path} uses a static table")
        backbone = make_backbone(backbone_config, _substate(state, "backbone."), folder=path)
    except (TypeError, KeyError, ValueError) as error:
        raise EncoderFormatError(f"{path}: cannot rebuild the encoder: {error}") from None
    return EncoderParts(document, backbone, pooling, weighting, transforms, saved_backend, config, state, query_teacher)


def file_stats(path: Path) -> dict[str, list[int]] | None:
    """What changes when a file of the folder is written, replaced or touched: size, device, inode, mtime and
    ctime of SPEC_FILE and STATE_FILE (None: not readable)."""
    try:
        stats = {name: (path / name).stat() for name in (SPEC_FILE, STATE_FILE)}
    except OSError:
        return None
    return {name: [st.st_size, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns] for name, st in stats.items()}


def checked_before(path: Path, saved: str, stats: dict[str, list[int]] | None) -> bool:
    """Whether files with these ``stats`` matched the ``saved`` fingerprint at an earlier load
    (:data:`CHECKED_FILE`): a cold load then skips hashing the arrays again (a 47 MB table: 26 ms), as git's
    index trusts file stats. A record no newer than a file's last change (the same clock tick) is not trusted."""
    if stats is None:
        return False
    try:
        record = json.loads((path / CHECKED_FILE).read_text())
        recorded_at = (path / CHECKED_FILE).stat().st_mtime_ns
    except (OSError, ValueError):
        return False
    return record == {"fingerprint": saved, "files": stats} and recorded_at > max(values[4] for values in stats.values())


def record_checked(path: Path, saved: str, stats: dict[str, list[int]]) -> None:
    """Record that the files with these ``stats`` matched the ``saved`` fingerprint (atomically; a folder that
    cannot be written is hashed at every load)."""
    staging = path / f"{CHECKED_FILE}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        staging.write_text(json.dumps({"fingerprint": saved, "files": stats}))
        staging.replace(path / CHECKED_FILE)
    except OSError as error:
        logger.debug("%s: cannot record the fingerprint check (%s)", path, error)
        staging.unlink(missing_ok=True)


def fingerprinted_spec(document: dict[str, Any]) -> dict[str, Any]:
    """The part of a parsed ``isotrope.json`` its fingerprint covers."""
    return {key: value for key, value in document.items() if key not in _NOT_FINGERPRINTED}


def rebuilt_as_read(spec: dict[str, Any], state: dict[str, np.ndarray], parts: EncoderParts) -> bool:
    """Whether an encoder rebuilt from ``parts`` (its ``spec`` as its saved backend reads it, and ``state``) is
    what :func:`read_encoder` checked: the same spec and the very arrays read, so the same fingerprint without
    hashing the arrays a second time (a 140 MB table: 78 ms of a cold search)."""
    return (
        canonical_json(spec) == canonical_json(fingerprinted_spec(parts.document))
        and state.keys() == parts.state.keys()
        and all(array is parts.state[name] for name, array in state.items())
    )


def read_config(document: dict[str, Any]) -> EncoderConfig:
    """The recipe of a parsed ``isotrope.json``; a folder of format version 1 has none stored, and
    gets the one its spec describes."""
    if "config" not in document:
        return EncoderConfig.from_spec(document)
    return EncoderConfig.from_dict(document["config"])


def check_fingerprint(path: str | Path, document: dict[str, Any], actual: str) -> None:
    """Raise when the rebuilt encoder's fingerprint is not the saved one."""
    if actual != document["fingerprint"]:
        raise EncoderFormatError(
            f"{path}: arrays do not match the saved fingerprint (saved {document['fingerprint'][:12]}, "
            f"computed {actual[:12]}); the folder was modified or is corrupt"
        )
