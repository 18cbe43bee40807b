"""What the gate methods share (methods.md sections 3-5): a gate parametrisation is trained on
the dense model through the one training loop, the gates' pressure following the schedule, then
the highest-scoring heads are kept."""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from trainers.gates import select_heads
from trainers.knobs import bounded, choice
from trainers.pruning.registry import PruneContext, PruneOutcome
from trainers.schedules import SHAPES, ramp
from trainers.training import Learner, Schedule, fit

# The knobs every gate method has (methods.md sections 3-5). Shim et al. used a gates' rate 10x
# their weights'; 30 x the default 3e-4 keeps the gates' rate near 1e-2, where they close within
# the 100-step gate phase.
GATE_KNOBS = {
    "gate_lr_mult": bounded(30.0, 0.0, doc="gates' lr / weights' (Shim: 10)"),
    "freeze_weights": bounded(False, doc="gates choose with weights frozen; fine-tuning gets every step"),
    "output_scaling": bounded(False, doc="rescale surviving heads (Shim)"),
    "schedule_start": bounded(0.0, 0.0, 1.0, doc="phase before any pressure"),
    "schedule_warmup": bounded(0.5, 0.0, 1.0, doc="phase over which it rises"),
    "schedule_shape": choice("linear", SHAPES, doc="how the gates' pressure rises"),
}


class Gater(Protocol):
    """A gate parametrisation: gate values per head at a given pressure, its penalty, and the
    scores that decide which heads stay."""

    def __call__(self, pressure: float, progress: float) -> torch.Tensor: ...
    def penalty(self, pressure: float) -> torch.Tensor: ...
    def gate_parameters(self) -> list[nn.Parameter]: ...
    def extra_optimizers(self) -> list[torch.optim.Optimizer]: ...
    def scores(self) -> torch.Tensor: ...
    def final_sparsity(self) -> float: ...
    def to(self, device) -> Gater: ...
    def train(self, mode: bool = True) -> Gater: ...


def output_scale(z: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Section 3, Shim's third method: H / (H - n_closed), clamped to [1, H], a constant."""
    open_heads = z.detach().sum().clamp_min(1e-6)
    return (n_heads / open_heads).clamp(1.0, float(n_heads))


def train_gates(context: PruneContext, gater: Gater) -> None:
    """Gates and weights trained together (Shim et al.), or gates alone with ``freeze_weights``;
    pressure follows the gate schedule (section 5)."""
    model, hp, steps, heads = context.model, context.hp, context.steps, context.heads
    gater.to(next(model.parameters()).device).train()
    # Gates: a larger learning rate and no weight decay (Shim et al.).
    optimizers = [torch.optim.Adam(gater.gate_parameters(), lr=hp.lr * hp.gate_lr_mult)]
    optimizers += gater.extra_optimizers()

    def objective(step: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        pressure = ramp(
            step / steps, start=hp.schedule_start, warmup=hp.schedule_warmup, shape=hp.schedule_shape
        )
        gates = list(torch.split(gater(pressure, step / steps), heads))
        if hp.output_scaling:
            gates = [g * output_scale(g, n) for g, n in zip(gates, heads)]
        return context.loss_fn(model, x, y, gates) + gater.penalty(pressure)

    fit(
        model,
        context.tokens,
        context.generator,
        Schedule(steps, context.batch_size, hp.lr, phase="prune"),
        Learner(objective=objective, train_weights=not hp.freeze_weights, extra_optimizers=optimizers),
        progress=context.progress,
    )


def prune_with_gates(context: PruneContext, gater: Gater) -> PruneOutcome:
    """Train ``gater``, keep the heads it scores highest (as many as its final sparsity allows)."""
    hp, heads = context.hp, context.heads
    train_gates(context, gater)
    keep = select_heads(gater.scores(), heads, gater.final_sparsity(), hp.min_heads_per_layer)
    scale = None
    if hp.output_scaling:
        scale = [min(float(n), n / max(1, len(k))) for k, n in zip(keep, heads)]
    return PruneOutcome(keep, scale, trained_steps=0 if hp.freeze_weights else context.steps)
