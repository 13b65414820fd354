"""Fold an encoder over a static token table into one ``vocab x d`` table.

A static encoder computes ``y = L2(f(sum_t w_t T[t] / sum_t w_t))``: gather the rows ``T[t]`` of
the text's tokens, weighted mean with per-token weights ``w``, a chain ``f`` of fitted steps,
L2. When every step of ``f`` is affine (center, zscore, abtt, sif_removal, whiten, pca) it
commutes with a mean whose weights sum to one::

    f(sum_t w_t T[t] / W) = sum_t w_t f(T[t]) / W          (W = sum_t w_t)

so ``F = f(T)`` row by row gives the same vectors with no chain at all (exact, up to float
rounding). Concatenated tables are already one table in the backbone. When the chain ends in
``l2`` the positive factor ``1 / W`` does not change the output either, so each weight folds
into its row, ``G[v] = w_v F[v]``, and encoding becomes tokenize -> gather -> sum (or mean) ->
L2: equal up to scale before the L2, exactly equal after it. The one difference: a text whose
tokens all weigh 0 (only special tokens, say) encodes to the zero vector, where the unfolded
encoder falls back to the plain mean of its tokens. A chain that does not end in ``l2`` keeps
its weights beside the table (``G = F``), exact including scale.

What cannot fold raises :class:`FoldError` naming the step: a transformer backbone (its token
states depend on context), pooling other than mean, a non-linear step (quantile, flow), an
``l2`` before the last step.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol, TypeVar

import numpy as np

from isotrope.backbones.folded import DTYPES, FoldedBackbone, quantize
from isotrope.errors import FoldError
from isotrope.transforms.l2 import L2
from isotrope.weighting import TokenWeighting

logger = logging.getLogger(__name__)


class Foldable(Protocol):
    """What folding reads of an encoder (a :class:`isotrope.encoder.ShapedEncoder`); folding sits below
    the encoder, which folds itself when fitted with ``--model fast``."""

    backbone: Any
    pooling: str
    weighting: TokenWeighting
    transforms: list[Any]
    batch_size: int
    metadata: dict[str, Any]
    #: how queries also go through a fast table's teacher (kept by the folded encoder)
    query_teacher: Any

    def __init__(
        self,
        backbone: Any,
        pooling: str,
        weighting: TokenWeighting,
        transforms: list[Any],
        *,
        batch_size: int,
        metadata: dict[str, Any],
        query_teacher: Any,
    ) -> None: ...

    @property
    def shape(self) -> str:
        """The transform chain as a spec string."""

    @property
    def fingerprint(self) -> str:
        """The encoder's fingerprint."""

    def check_is_fitted(self) -> None:
        """Raise unless the encoder is fitted."""


EncoderT = TypeVar("EncoderT", bound=Foldable)

#: transforms that are affine maps ``(x - mean) M`` (or ``x M``): they commute with a normalised mean
LINEAR_KINDS = ("center", "zscore", "abtt", "sif_removal", "whiten", "pca")
#: transforms whose output columns are principal directions in order of variance (``dims`` keeps the first)
ORDERED_KINDS = ("whiten", "pca")
#: table rows sent through the chain at once
FOLD_ROWS = 4096


def check_foldable(encoder: Foldable) -> None:
    """Raise :class:`FoldError` naming the first part of ``encoder`` that does not fold."""
    backbone = encoder.backbone
    if getattr(backbone, "table", None) is None or not hasattr(backbone, "tokenizer"):
        name = backbone.get_config().get("model") or type(backbone).__name__
        raise FoldError(
            f"backbone {name!r} is a transformer: its token states depend on context and do not fold "
            "into a table (use a static: table, or a context: table fitted on a corpus)"
        )
    if encoder.pooling != "mean":
        raise FoldError(f"pooling {encoder.pooling!r} does not fold: only mean pooling commutes with the linear steps")
    steps = encoder.transforms
    for index, step in enumerate(steps):
        if step.kind == "l2" and index < len(steps) - 1:
            raise FoldError(f"step {index} (l2) is not the last step: a normalisation inside the chain does not fold")
        if step.kind != "l2" and step.kind not in LINEAR_KINDS:
            raise FoldError(
                f"step {index} ({step.kind}) is not linear and does not fold into a table; "
                f"foldable steps: {', '.join(LINEAR_KINDS)}, and l2 last"
            )


def _tokenizer_copy(backbone: Any) -> Any:
    """An independent ``tokenizers.Tokenizer`` equal to the backbone's."""
    from tokenizers import Tokenizer

    if isinstance(backbone, FoldedBackbone):
        return Tokenizer.from_str(backbone.tokenizer_json())
    tokenizer = backbone.tokenizer
    core = getattr(tokenizer, "backend_tokenizer", tokenizer)
    if not isinstance(core, Tokenizer):
        raise FoldError(f"the backbone's tokenizer ({type(tokenizer).__name__}) is not a fast (tokenizers) tokenizer")
    return Tokenizer.from_str(core.to_str())


def fold_encoder(encoder: EncoderT, *, dtype: str = "float32", dims: int | None = None) -> EncoderT:
    """One folded encoder equal to ``encoder`` (see the module docstring for what holds exactly).

    ``dtype``: float32, float16, or int8 with one scale per row. ``dims`` keeps the leading
    ``dims`` output components; they are the directions of largest variance only when the
    chain's last linear step is whiten or pca (else a FoldError).
    """
    if dtype not in DTYPES:
        raise FoldError(f"unknown table dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    encoder.check_is_fitted()
    check_foldable(encoder)
    backbone = encoder.backbone
    normalised = bool(encoder.transforms) and encoder.transforms[-1].kind == "l2"
    linear = encoder.transforms[:-1] if normalised else list(encoder.transforms)
    source = np.asarray(backbone.table, dtype=np.float32)
    blocks = []
    for begin in range(0, source.shape[0], FOLD_ROWS):
        block = source[begin : begin + FOLD_ROWS]
        for step in linear:
            block = step.transform(block)
        blocks.append(np.asarray(block, dtype=np.float32))
    table = np.concatenate(blocks)
    ordered = linear[-1].kind in ORDERED_KINDS if linear else bool(getattr(backbone, "ordered_by_variance", False))
    if dims is not None:
        if not ordered:
            raise FoldError(
                "dims keeps the leading whitened components: the chain's last linear step must be "
                f"whiten or pca (chain: {encoder.shape})"
            )
        if not 1 <= dims <= table.shape[1]:
            raise FoldError(f"dims must be between 1 and {table.shape[1]}; got {dims}")
        table = np.ascontiguousarray(table[:, :dims])
    weights = encoder.weighting.weights_
    if normalised:  # the weights go into the rows; the output's L2 removes the mean's 1 / W
        table *= weights[:, None]
        weighting = TokenWeighting()
        weighting.weights_ = np.ones(table.shape[0], dtype=np.float32)
    else:
        weighting = TokenWeighting.from_state(encoder.weighting.get_config(), encoder.weighting.get_state())
    stored, row_scale = quantize(table, dtype)
    config = backbone.get_config()
    folded_backbone = FoldedBackbone(
        _tokenizer_copy(backbone),
        stored,
        row_scale,
        special_ids=backbone.special_ids(),
        max_length=getattr(backbone, "max_length", 8192),
        ordered_by_variance=ordered,
        folded_from=str(config.get("folded_from") or config.get("source") or config.get("model")),
        pairs=None if getattr(backbone, "pairs", None) is None else backbone.pairs.codes,
    )
    metadata = dict(encoder.metadata)
    metadata["folded"] = {
        "from_fingerprint": encoder.fingerprint,
        "from_shape": encoder.shape,
        "dtype": dtype,
        "dims": int(table.shape[1]),
        "weights_in_rows": normalised,
    }
    logger.info(
        "folded %s (%s) into one %d x %d %s table",
        folded_backbone.folded_from,
        encoder.shape,
        table.shape[0],
        table.shape[1],
        dtype,
    )
    return type(encoder)(
        folded_backbone,
        "mean",
        weighting,
        [L2()] if normalised else [],
        batch_size=encoder.batch_size,
        metadata=metadata,
        query_teacher=encoder.query_teacher,
    )
