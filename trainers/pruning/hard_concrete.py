"""``l0_target`` and ``l0_penalty`` (methods.md sections 3-4): hard-concrete gates with a
Lagrangian toward the target sparsity (CoFi), or Shim et al.'s warmed-up lambda x L0 penalty and
no target: the sparsity is what lambda gives."""

from __future__ import annotations

import torch
from torch import nn

from trainers.gates import HardConcreteGates, Lagrangian
from trainers.knobs import bounded
from trainers.pruning.gating import GATE_KNOBS, prune_with_gates
from trainers.pruning.registry import Method, PruneContext, PruneOutcome, register

# The hard-concrete gates' knobs (methods.md section 3), both methods'.
HARD_CONCRETE_KNOBS = {
    **GATE_KNOBS,
    "gate_init": bounded(2.0, doc="initial log_alpha (Shim: 2.0)"),
    "beta": bounded(1.0 / 3.0, 0.0, low_open=True, doc="hard-concrete temperature"),
    "hard_gates": bounded(True, doc="straight-through 0/1 gates (Shim)"),
}


class HardConcreteGater(nn.Module):
    def __init__(self, heads: list[int], hp) -> None:
        super().__init__()
        self.hp = hp
        self.gates = HardConcreteGates(heads, init=hp.gate_init, beta=hp.beta, hard=hp.hard_gates)
        self.lagrangian = Lagrangian() if hp.method == "l0_target" else None

    def forward(self, pressure: float, progress: float) -> torch.Tensor:
        return self.gates()

    def penalty(self, pressure: float) -> torch.Tensor:
        if self.lagrangian is not None:
            return self.lagrangian(self.gates.expected_sparsity(), self.hp.sparsity * pressure)
        return self.hp.l0_lambda * pressure * self.gates.l0()

    def gate_parameters(self) -> list[nn.Parameter]:
        return list(self.gates.parameters())

    def extra_optimizers(self) -> list[torch.optim.Optimizer]:
        return [] if self.lagrangian is None else [self.lagrangian.optimizer(self.hp.lagrangian_lr)]

    def scores(self) -> torch.Tensor:
        return self.gates.log_alpha.detach()

    def final_sparsity(self) -> float:
        """l0_target: the target. l0_penalty: what the gates chose (log_alpha >= 0 is open)."""
        if self.lagrangian is not None:
            return self.hp.sparsity
        heads = self.gates.heads_per_layer
        floor = max(1, sum(min(self.hp.min_heads_per_layer, n) for n in heads))
        kept = max(floor, int((self.gates.log_alpha >= 0).sum()))
        return 1.0 - kept / sum(heads)


def choose(context: PruneContext) -> PruneOutcome:
    return prune_with_gates(context, HardConcreteGater(context.heads, context.hp))


register(
    Method(
        "l0_target",
        choose,
        removes_target=True,
        knobs={
            **HARD_CONCRETE_KNOBS,
            "lagrangian_lr": bounded(0.05, 0.0, doc="multipliers' ascent rate"),
        },
        doc="hard-concrete gates, a Lagrangian toward the target (CoFi)",
    )
)
register(
    Method(
        "l0_penalty",
        choose,
        removes_target=False,
        knobs={**HARD_CONCRETE_KNOBS, "l0_lambda": bounded(1.0, 0.0, doc="weight of the mean L0 term")},
        doc="hard-concrete gates, lambda x L0 (Shim et al.): the sparsity is what lambda gives",
    )
)
