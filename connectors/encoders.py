"""The encoder a framework adapter embeds with: a saved folder, a store's own encoder, or a recipe that
needs no corpus; and fitting one on the texts a framework holds.

Shared by the LangChain embeddings (:mod:`isotrope.connectors.langchain`) and the LanceDB registry
function (:mod:`isotrope.connectors.lancedb_registry`), which both take ``encoder=`` or ``model=``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from isotrope.encoder import ShapedEncoder, default_shape
from isotrope.errors import NotFittedError
from isotrope.persist import SPEC_FILE
from isotrope.stores.layout import ENCODER_DIR


def encoder_folder(encoder: str | os.PathLike[str]) -> Path:
    """The encoder folder of ``encoder``: itself, or the ``encoder/`` folder of a store (``faiss:DIR``, ``DIR``)."""
    text = os.fspath(encoder)
    kind, sep, rest = text.partition(":")
    path = Path(rest if sep and kind in ("faiss", "lancedb") else text).expanduser()
    if (path / SPEC_FILE).is_file():
        return path
    if (path / ENCODER_DIR / SPEC_FILE).is_file():
        return path / ENCODER_DIR
    raise FileNotFoundError(f"{text}: no encoder there (no {SPEC_FILE}, nor a store's {ENCODER_DIR}/{SPEC_FILE})")


def resolve_encoder(
    encoder: str | os.PathLike[str] | None = None, model: str | None = None, *, device: str = "auto", **recipe: Any
) -> ShapedEncoder:
    """A fitted encoder: loaded from ``encoder`` (a folder or a store), or built from the recipe ``model`` +
    ``recipe`` fields (:class:`~isotrope.config.EncoderConfig`), which must need no corpus (e.g. ``shape="l2"``)."""
    if (encoder is None) == (model is None):
        raise ValueError("give either encoder=FOLDER (a fitted encoder or a store) or model=NAME (a recipe needing no fit)")
    if encoder is not None:
        if recipe:
            raise ValueError(
                f"encoder={os.fspath(encoder)} is already fitted; recipe fields {sorted(recipe)} apply to model= only"
            )
        return ShapedEncoder.load(encoder_folder(encoder), device=device)
    built = ShapedEncoder.create(model, device=device, **recipe)
    if not built.is_fitted():
        raise NotFittedError(
            f"model={model} with shape={recipe.get('shape')!r} needs fitting on a corpus: fit it first "
            f"(`isotrope fit`, or fit_encoder(texts, path, model=...)) and pass encoder=FOLDER"
        )
    return built


def fit_encoder(
    texts: Iterable[str], path: str | os.PathLike[str], model: str, shape: str | None = None, **create_options: Any
) -> ShapedEncoder:
    """Fit the recipe ``model`` + ``shape`` (default: the model family's, :func:`default_shape`) on ``texts``
    and save it to ``path``; the fitted encoder."""
    kept = [text for text in texts if text.strip()]
    if not kept:
        raise ValueError("no non-empty text to fit the encoder on")
    encoder = ShapedEncoder.create(model, shape=shape or default_shape(model), **create_options)
    encoder.fit(kept, fitted_on=f"{len(kept)} framework texts")
    encoder.save(os.fspath(path))
    return encoder
