"""BERT-flow: a Glow-style normalizing flow to a standard normal (Li et al. 2020).

The input is z-scored with float64 statistics, then mapped by a stack of invertible blocks
(actnorm, LU-parametrised mixing, affine or additive coupling) trained by maximum likelihood
under a standard-normal prior, with early stopping on held-aside vectors. ``transform`` returns
the latent vector; the chain adds L2 normalisation when wanted.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import torch

from isotrope.transforms._flow_modules import Flow
from isotrope.transforms._validation import as_output, check_positive_int, check_state_array
from isotrope.transforms.base import Self, Transform, as_matrix

logger = logging.getLogger(__name__)

_COUPLINGS = ("affine", "additive")
_INIT_ROWS = 4096  # rows used for the data-dependent actnorm initialisation
_EVAL_BATCH = 8192  # rows per batch at evaluation and inference time
_MAX_GRAD_NORM = 10.0


class FlowTransform(Transform):
    """Normalizing flow from corpus vectors to a standard normal, fitted by maximum likelihood.

    Parameters
    ----------
    n_blocks: number of Glow steps (actnorm → invertible mixing → coupling).
    hidden: width of the two hidden layers of each coupling MLP.
    coupling: ``"affine"`` (scale and shift, tanh-bounded log scale) or ``"additive"`` (shift only).
    max_epochs: passes over the training vectors at most.
    max_steps: optimiser steps at most (``None``: no limit; ``0``: initialisation only).
    batch_size: vectors per optimiser step.
    lr: Adam learning rate.
    validation_fraction: share of the vectors held aside for early stopping (``0``: none, keep
        the last weights).
    patience: epochs without a better held-aside NLL before training stops.
    seed: seeds the split, the initialisation and the batch order.
    device: ``"auto"`` (CUDA when available, else CPU), or a torch device string.
    standardize: z-score the input with fitted float64 mean and std before the flow.

    Fitted attributes: ``mean_``, ``scale_`` (float64, the standardisation), ``flow_`` (the torch
    module, float64 for inference), ``history_`` (per-epoch training and held-aside NLL in nats per
    dimension of the standardised vectors; not saved). The state holds ``mean_``, ``scale_`` and
    every flow parameter or buffer stacked over the blocks, e.g. ``actnorm_bias_`` of shape
    ``(n_blocks, d)``; the names do not depend on the configuration.
    """

    kind: ClassVar[str] = "flow"
    state_names: ClassVar[tuple[str, ...]] = (
        "mean_",
        "scale_",
        "actnorm_bias_",
        "actnorm_log_scale_",
        "mixing_row_order_",
        "mixing_sign_diag_",
        "mixing_lower_",
        "mixing_upper_",
        "mixing_log_diag_",
        "coupling_net_0_weight_",
        "coupling_net_0_bias_",
        "coupling_net_2_weight_",
        "coupling_net_2_bias_",
        "coupling_net_4_weight_",
        "coupling_net_4_bias_",
    )

    def __init__(
        self,
        n_blocks: int = 4,
        hidden: int = 256,
        coupling: str = "affine",
        max_epochs: int = 10,
        max_steps: int | None = None,
        batch_size: int = 1024,
        lr: float = 1e-3,
        validation_fraction: float = 0.1,
        patience: int = 2,
        seed: int = 0,
        device: str = "auto",
        standardize: bool = True,
    ) -> None:
        if coupling not in _COUPLINGS:
            raise ValueError(f"flow transform: coupling must be one of {_COUPLINGS}; got {coupling!r}")
        positive = {"n_blocks": n_blocks, "hidden": hidden, "max_epochs": max_epochs, "batch_size": batch_size}
        for name, value in {**positive, "patience": patience}.items():
            check_positive_int(self.kind, name, value)
        if max_steps is not None and not (isinstance(max_steps, int) and max_steps >= 0):
            raise ValueError(f"flow transform: max_steps must be None or an int >= 0; got {max_steps!r}")
        if not 0.0 <= validation_fraction < 1.0:
            raise ValueError(f"flow transform: validation_fraction must be in [0, 1); got {validation_fraction!r}")
        if not lr > 0:
            raise ValueError(f"flow transform: lr must be positive; got {lr!r}")
        self.n_blocks = n_blocks
        self.hidden = hidden
        self.coupling = coupling
        self.max_epochs = max_epochs
        self.max_steps = max_steps
        self.batch_size = batch_size
        self.lr = lr
        self.validation_fraction = validation_fraction
        self.patience = patience
        self.seed = seed
        self.device = device
        self.standardize = standardize

    # -- fitting -------------------------------------------------------------------
    def fit(self, X: Any) -> Self:
        data = as_matrix(X)
        n, dim = data.shape
        if dim < 2:
            raise ValueError(f"flow transform: needs at least 2 features to couple; got shape {data.shape}")
        if self.standardize:
            mean = data.mean(axis=0)
            std = data.std(axis=0)
            scale = np.maximum(std, 1e-12 * max(float(std.max()), 1.0))
        else:
            mean, scale = np.zeros(dim), np.ones(dim)
        standardized = ((data - mean) / scale).astype(np.float32)

        order = np.random.default_rng(self.seed).permutation(n)
        if n < 2:
            raise ValueError(
                f"flow transform: needs at least 2 samples to fit; got {n} (fit a moments shaping such as "
                "center or whiten on so small a corpus)"
            )
        n_val = math.ceil(self.validation_fraction * n)
        if n - n_val < 2:  # actnorm is initialised from the training rows' spread: one row would map to zero
            if n_val:
                logger.warning("flow fitted on %d samples: no vectors held aside for early stopping", n)
            n_val = 0
        device = self._torch_device()
        train = torch.from_numpy(standardized[order[n_val:]]).to(device)
        val = torch.from_numpy(standardized[order[:n_val]]).to(device) if n_val else None

        flow = self._build_flow(dim).to(device)
        flow.initialize(train[:_INIT_ROWS])
        self.history_ = _train(
            flow,
            train,
            val,
            max_epochs=self.max_epochs,
            max_steps=self.max_steps,
            batch_size=self.batch_size,
            lr=self.lr,
            patience=self.patience,
            generator=torch.Generator().manual_seed(self.seed),
        )
        self.mean_ = mean
        self.scale_ = scale
        self.flow_ = _for_inference(flow, device)
        return self

    def _torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def _build_flow(self, dim: int) -> Flow:
        """A new float32 flow on CPU, initialised from ``seed`` without touching the global RNG."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return Flow(dim, self.n_blocks, self.hidden, affine=self.coupling == "affine")

    # -- applying ------------------------------------------------------------------
    def transform(self, X: Any) -> np.ndarray:
        """Map ``X`` to the flow's latent space (float32; not normalised)."""
        standardized = (self._check_input(X) - self.mean_) / self.scale_
        return as_output(self._map(standardized, lambda x: self.flow_(x)[0]))

    def inverse(self, Z: Any) -> np.ndarray:
        """Map latent vectors back to the input space (float32)."""
        self.check_is_fitted()
        latent = as_matrix(Z, "Z")
        if latent.shape[1] != self.n_features_in:
            raise ValueError(f"flow transform has {self.n_features_in} latent features; got {latent.shape[1]}")
        standardized = self._map(latent, self.flow_.inverse)
        return as_output(standardized * self.scale_ + self.mean_)

    def log_prob(self, X: Any) -> np.ndarray:
        """Log density of each row of ``X`` under the fitted model (float64, nats)."""
        standardized = (self._check_input(X) - self.mean_) / self.scale_
        log_prob = self._map(standardized, lambda x: self.flow_.log_prob(x)[:, None])[:, 0]
        return log_prob - np.log(self.scale_).sum()

    def nll(self, X: Any) -> float:
        """Mean negative log-likelihood of the rows of ``X``, in nats per dimension."""
        return float(-self.log_prob(X).mean() / self.n_features_in)

    def _map(self, array: np.ndarray, function: Callable[[torch.Tensor], torch.Tensor]) -> np.ndarray:
        """Apply a torch function to a float64 array in batches on the flow's device."""
        device = next(self.flow_.parameters()).device
        parts = []
        with torch.inference_mode():
            for start in range(0, array.shape[0], _EVAL_BATCH):
                batch = torch.from_numpy(np.ascontiguousarray(array[start : start + _EVAL_BATCH])).to(device)
                parts.append(function(batch).cpu().numpy())
        return np.concatenate(parts)

    # -- configuration and state ---------------------------------------------------
    @property
    def n_features_in(self) -> int | None:
        return int(self.mean_.shape[0]) if hasattr(self, "mean_") else None

    def is_fitted(self) -> bool:
        return hasattr(self, "flow_")

    def get_state(self) -> dict[str, np.ndarray]:
        """``mean_``, ``scale_`` and each flow parameter stacked over the blocks (leading axis ``n_blocks``)."""
        self.check_is_fitted()
        per_block: dict[str, list[np.ndarray]] = {}
        for key, tensor in self.flow_.state_dict().items():
            tensor = tensor.detach().cpu()
            if tensor.is_floating_point():  # trained in float32: the cast back is exact
                tensor = tensor.float()
            per_block.setdefault(_state_name(key), []).append(tensor.numpy())
        state = {name: np.stack(arrays) for name, arrays in per_block.items()}
        return {"mean_": self.mean_, "scale_": self.scale_, **state}

    @classmethod
    def from_state(cls, config: dict[str, Any], state: dict[str, np.ndarray]) -> Self:
        transform = cls(**config)
        missing = [name for name in cls.state_names if name not in state]
        if missing:
            raise ValueError(f"flow transform state is missing arrays: {', '.join(missing)}")
        transform.mean_ = np.asarray(state["mean_"], dtype=np.float64)
        transform.scale_ = np.asarray(state["scale_"], dtype=np.float64)
        check_state_array(cls.kind, "mean_", transform.mean_, (None,))
        check_state_array(cls.kind, "scale_", transform.scale_, transform.mean_.shape)
        if transform.mean_.shape[0] < 2 or not (transform.scale_ > 0).all():
            raise ValueError("flow transform state: mean_ needs at least 2 features and scale_ must be positive")
        flow = transform._build_flow(int(transform.mean_.shape[0]))
        loaded = {}
        for key, tensor in flow.state_dict().items():
            name = _state_name(key)
            array = np.asarray(state[name])
            check_state_array(cls.kind, name, array, (transform.n_blocks, *tensor.shape))
            loaded[key] = torch.from_numpy(np.array(array[_block_index(key)])).to(tensor.dtype)
        flow.load_state_dict(loaded)
        transform.flow_ = _for_inference(flow, transform._torch_device())
        return transform


def _state_name(key: str) -> str:
    """``blocks.3.coupling.net.0.weight`` -> ``coupling_net_0_weight_`` (stacked over blocks in the state)."""
    return key.split(".", 2)[2].replace(".", "_") + "_"


def _block_index(key: str) -> int:
    return int(key.split(".", 2)[1])


def _nll_per_dim(flow: Flow, x: torch.Tensor) -> torch.Tensor:
    return -flow.log_prob(x).mean() / x.shape[1]


@torch.no_grad()
def _evaluate(flow: Flow, x: torch.Tensor) -> float:
    flow.eval()
    total = sum(float(-flow.log_prob(batch).sum()) for batch in x.split(_EVAL_BATCH))
    return total / (x.shape[0] * x.shape[1])


def _train(
    flow: Flow,
    train: torch.Tensor,
    val: torch.Tensor | None,
    *,
    max_epochs: int,
    max_steps: int | None,
    batch_size: int,
    lr: float,
    patience: int,
    generator: torch.Generator,
) -> list[dict[str, float]]:
    """Adam on the NLL; with ``val``, keep the weights with the best held-aside NLL (the initial ones count)."""
    optimizer = torch.optim.Adam(flow.parameters(), lr=lr)
    best_nll = _evaluate(flow, val) if val is not None else math.inf
    best_state = {name: tensor.clone() for name, tensor in flow.state_dict().items()}
    history = [{"epoch": 0, "steps": 0, "train_nll": math.nan, "val_nll": best_nll}]
    steps, stale = 0, 0
    for epoch in range(1, max_epochs + 1):
        if max_steps is not None and steps >= max_steps:
            break
        flow.train()
        total, rows = 0.0, 0
        diverged = False
        for indices in torch.randperm(train.shape[0], generator=generator).split(batch_size):
            if max_steps is not None and steps >= max_steps:
                break
            batch = train[indices.to(train.device)]
            loss = _nll_per_dim(flow, batch)
            if not torch.isfinite(loss):
                logger.warning("flow training diverged at epoch %d step %d; keeping the best weights", epoch, steps)
                diverged = True
                break
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(flow.parameters(), _MAX_GRAD_NORM)
            optimizer.step()
            steps += 1
            total += loss.item() * batch.shape[0]
            rows += batch.shape[0]
        if diverged:
            break
        val_nll = _evaluate(flow, val) if val is not None else math.nan
        train_nll = total / max(rows, 1)
        history.append({"epoch": epoch, "steps": steps, "train_nll": train_nll, "val_nll": val_nll})
        logger.info("flow epoch %d: train NLL %.4f, held-aside NLL %.4f (nats/dim)", epoch, train_nll, val_nll)
        if val is None or val_nll < best_nll:
            best_nll, stale = val_nll, 0
            best_state = {name: tensor.clone() for name, tensor in flow.state_dict().items()}
        else:
            stale += 1
            if stale >= patience:
                break
    flow.load_state_dict(best_state)
    return history


def _for_inference(flow: Flow, device: torch.device) -> Flow:
    """A frozen float64 copy of the flow in eval mode on ``device``."""
    return flow.to(device=device, dtype=torch.float64).eval().requires_grad_(False)
