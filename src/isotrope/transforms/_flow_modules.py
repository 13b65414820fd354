"""Glow-style invertible blocks for the BERT-flow transform.

Kingma & Dhariwal 2018 (Glow) as used by Li et al. 2020 (BERT-flow) on vectors instead of images:
each block is actnorm → invertible linear mixing (LU-parametrised) → coupling. Every module maps
``x`` to ``(y, log_det)`` where ``log_det`` holds ``log |det ∂y/∂x|`` per row, and has an exact
``inverse``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

#: bound on the per-feature log scale of an affine coupling: log s = B · tanh(raw / B)
LOG_SCALE_BOUND = 2.0
_ACTNORM_EPS = 1e-6


class ActNorm(nn.Module):
    """Per-feature affine map ``y = (x + bias) · exp(log_scale)`` with data-dependent initialisation."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(dim))
        self.log_scale = nn.Parameter(torch.zeros(dim))

    @torch.no_grad()
    def initialize(self, x: torch.Tensor) -> None:
        """Set the parameters so that ``x`` comes out with zero mean and unit variance per feature."""
        self.bias.copy_(-x.mean(dim=0))
        self.log_scale.copy_(-torch.log(x.std(dim=0, unbiased=False) + _ACTNORM_EPS))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = (x + self.bias) * torch.exp(self.log_scale)
        return y, self.log_scale.sum().expand(x.shape[0])

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        return y * torch.exp(-self.log_scale) - self.bias


class InvertibleLinear(nn.Module):
    """Invertible mixing ``y = x W`` with ``W = P L (U + diag(sign · exp(log_diag)))`` (Glow's LU form).

    ``P`` is a fixed permutation (stored as the row order it applies), ``L`` is unit lower
    triangular, ``U`` strictly upper triangular; the log-determinant is ``sum(log_diag)``.
    Initialised from a random orthogonal matrix drawn from the global torch generator.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        q, _ = torch.linalg.qr(torch.randn(dim, dim, dtype=torch.float64))
        permutation, lower, upper = torch.linalg.lu(q)
        diag = torch.diagonal(upper)
        # (P M)[i] = M[k] where P[i, k] = 1
        self.register_buffer("row_order", torch.argmax(permutation, dim=1))
        self.register_buffer("sign_diag", torch.sign(diag).float())
        self.lower = nn.Parameter(torch.tril(lower, diagonal=-1).float())
        self.upper = nn.Parameter(torch.triu(upper, diagonal=1).float())
        self.log_diag = nn.Parameter(torch.log(diag.abs()).float())

    def weight(self) -> torch.Tensor:
        eye = torch.eye(self.log_diag.shape[0], dtype=self.lower.dtype, device=self.lower.device)
        lower = torch.tril(self.lower, diagonal=-1) + eye
        upper = torch.triu(self.upper, diagonal=1) + torch.diag(self.sign_diag * torch.exp(self.log_diag))
        return (lower @ upper)[self.row_order]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x @ self.weight(), self.log_diag.sum().expand(x.shape[0])

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        return torch.linalg.solve(self.weight(), y, left=False)


class Coupling(nn.Module):
    """RealNVP/Glow coupling: the first ``dim // 2`` features pass through and condition the rest.

    Affine: ``y_b = x_b · exp(log_s) + t`` with a tanh-bounded ``log_s``; additive: ``y_b = x_b + t``.
    The MLP's last layer starts at zero, so a new coupling is the identity.
    """

    def __init__(self, dim: int, hidden: int, affine: bool) -> None:
        super().__init__()
        self.split = dim // 2
        self.affine = affine
        out = (dim - self.split) * (2 if affine else 1)
        self.net = nn.Sequential(
            nn.Linear(self.split, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, out),
        )
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)

    def _shift_and_log_scale(self, x_a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        h = self.net(x_a)
        if not self.affine:
            return h, None
        shift, raw = h.chunk(2, dim=1)
        return shift, LOG_SCALE_BOUND * torch.tanh(raw / LOG_SCALE_BOUND)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x_a, x_b = x[:, : self.split], x[:, self.split :]
        shift, log_scale = self._shift_and_log_scale(x_a)
        if log_scale is None:
            return torch.cat([x_a, x_b + shift], dim=1), x.new_zeros(x.shape[0])
        y_b = x_b * torch.exp(log_scale) + shift
        return torch.cat([x_a, y_b], dim=1), log_scale.sum(dim=1)

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        y_a, y_b = y[:, : self.split], y[:, self.split :]
        shift, log_scale = self._shift_and_log_scale(y_a)
        x_b = y_b - shift
        if log_scale is not None:
            x_b = x_b * torch.exp(-log_scale)
        return torch.cat([y_a, x_b], dim=1)


class FlowBlock(nn.Module):
    """One Glow step: actnorm → invertible mixing → coupling."""

    def __init__(self, dim: int, hidden: int, affine: bool) -> None:
        super().__init__()
        self.actnorm = ActNorm(dim)
        self.mixing = InvertibleLinear(dim)
        self.coupling = Coupling(dim, hidden, affine)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        log_det = x.new_zeros(x.shape[0])
        for layer in (self.actnorm, self.mixing, self.coupling):
            x, layer_log_det = layer(x)
            log_det = log_det + layer_log_det
        return x, log_det

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        for layer in (self.coupling, self.mixing, self.actnorm):
            y = layer.inverse(y)
        return y


class Flow(nn.Module):
    """A stack of :class:`FlowBlock` with a standard-normal prior on the output."""

    def __init__(self, dim: int, n_blocks: int, hidden: int, affine: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(FlowBlock(dim, hidden, affine) for _ in range(n_blocks))

    @torch.no_grad()
    def initialize(self, x: torch.Tensor) -> None:
        """Data-dependent actnorm initialisation, block by block, on a sample ``x``."""
        for block in self.blocks:
            block.actnorm.initialize(x)
            x, _ = block(x)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        log_det = x.new_zeros(x.shape[0])
        for block in self.blocks:
            x, block_log_det = block(x)
            log_det = log_det + block_log_det
        return x, log_det

    def inverse(self, z: torch.Tensor) -> torch.Tensor:
        for block in reversed(self.blocks):
            z = block.inverse(z)
        return z

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """Per-row log density of ``x`` under the flow with a standard-normal prior."""
        z, log_det = self(x)
        log_prior = -0.5 * (z.square().sum(dim=1) + z.shape[1] * math.log(2.0 * math.pi))
        return log_prior + log_det
