"""Head gates and the exact head budget (methods.md sections 3 and 4)."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

# Hard-concrete constants of Voita et al. 2019 and Shim et al. 2021 (methods.md section 3).
BETA, GAMMA, ZETA, EPS = 1.0 / 3.0, -0.1, 1.1, 1e-6


class HardConcreteGates(nn.Module):
    """One hard-concrete (L0) gate per head; ``log_alpha`` is the only learnt parameter."""

    def __init__(
        self, heads_per_layer: list[int], *, init: float = 2.0, beta: float = BETA, hard: bool = True
    ) -> None:
        super().__init__()
        self.heads_per_layer = list(heads_per_layer)
        self.log_alpha = nn.Parameter(torch.full((sum(heads_per_layer),), float(init)))
        self.beta, self.hard = beta, hard

    def forward(self) -> torch.Tensor:
        """Flat gate values z: sampled while training, deterministic at evaluation."""
        if self.training:
            u = torch.rand_like(self.log_alpha).clamp(EPS, 1.0 - EPS)
            s = torch.sigmoid((u.log() - (1.0 - u).log() + self.log_alpha) / self.beta)
        else:
            s = torch.sigmoid(self.log_alpha)  # Shim et al.'s code: no division by beta
        s_bar = (s * (ZETA - GAMMA) + GAMMA).clamp(0.0, 1.0)
        if not self.hard:
            return s_bar
        z = (s_bar >= 0.5).to(s_bar.dtype)
        return s_bar + (z - s_bar).detach()  # straight-through

    def p_open(self) -> torch.Tensor:
        """Probability that each gate is non-zero."""
        return torch.sigmoid(self.log_alpha - self.beta * math.log(-GAMMA / ZETA))

    def l0(self) -> torch.Tensor:
        """Expected number of open gates, divided by the gate count so lambda means the same at
        every model size (methods.md section 3)."""
        return self.p_open().mean()

    def expected_sparsity(self) -> torch.Tensor:
        return 1.0 - self.p_open().mean()

    def split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        return list(torch.split(flat, self.heads_per_layer))


class Lagrangian(nn.Module):
    """lambda1 (s - t) + lambda2 (s - t)^2, with the multipliers raised by gradient ascent (CoFi)."""

    def __init__(self) -> None:
        super().__init__()
        self.lambda1 = nn.Parameter(torch.zeros(()))
        self.lambda2 = nn.Parameter(torch.zeros(()))

    def forward(self, expected_sparsity: torch.Tensor, target: float) -> torch.Tensor:
        gap = expected_sparsity - target
        return self.lambda1 * gap + self.lambda2 * gap * gap

    def optimizer(self, lr: float = 0.01) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=lr, maximize=True)


def heads_to_keep(total_heads: int, sparsity: float) -> int:
    """The exact head budget: round((1 - t) * total)."""
    return int(round((1.0 - sparsity) * total_heads))


def check_reachable(heads_per_layer: list[int], sparsity: float, min_heads_per_layer: int) -> None:
    """Fail before any training when a target cannot be met (methods.md section 4)."""
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"sparsity target {sparsity} is outside [0, 1)")
    total = sum(heads_per_layer)
    keep = heads_to_keep(total, sparsity)
    floor = sum(min(min_heads_per_layer, h) for h in heads_per_layer)
    if keep < max(1, floor):
        raise ValueError(
            f"sparsity target {sparsity} keeps {keep} of {total} heads, fewer than "
            f"min_heads_per_layer={min_heads_per_layer} in each of {len(heads_per_layer)} layers allows"
        )


def select_heads(
    scores: torch.Tensor, heads_per_layer: list[int], sparsity: float, min_heads_per_layer: int = 1
) -> list[list[int]]:
    """Indices of the heads to keep per layer: exactly round((1 - t) * total) heads, the
    highest-scoring ones, with at least ``min_heads_per_layer`` in every layer."""
    check_reachable(heads_per_layer, sparsity, min_heads_per_layer)
    budget = heads_to_keep(sum(heads_per_layer), sparsity)
    per_layer = torch.split(scores.detach().float().cpu(), heads_per_layer)
    kept: list[set[int]] = []
    rest: list[tuple[float, int, int]] = []
    for layer, layer_scores in enumerate(per_layer):
        order = torch.argsort(layer_scores, descending=True, stable=True).tolist()
        floor = min(min_heads_per_layer, len(order))
        kept.append(set(order[:floor]))
        rest.extend((float(layer_scores[h]), layer, h) for h in order[floor:])
    rest.sort(key=lambda item: -item[0])
    for _, layer, head in rest[: budget - sum(len(k) for k in kept)]:
        kept[layer].add(head)
    return [sorted(k) for k in kept]


def mask_from_keep(keep: list[list[int]], heads_per_layer: list[int]) -> list[torch.Tensor]:
    """0/1 gate vectors per layer for a set of kept heads."""
    masks = []
    for heads, n in zip(keep, heads_per_layer):
        m = torch.zeros(n)
        m[heads] = 1.0
        masks.append(m)
    return masks
