"""``topk`` (methods.md section 4, DSP): Gumbel soft top-k over per-head logits, an exact head
count; the count falls along the gate schedule and the temperature anneals T0 -> T1."""

from __future__ import annotations

import torch
from torch import nn

from trainers.gates import heads_to_keep
from trainers.knobs import bounded
from trainers.pruning.gating import GATE_KNOBS, prune_with_gates
from trainers.pruning.registry import Method, PruneContext, PruneOutcome, register


class SoftTopKGater(nn.Module):
    def __init__(self, heads: list[int], hp) -> None:
        super().__init__()
        self.hp = hp
        self.total = sum(heads)
        self.k_final = heads_to_keep(self.total, hp.sparsity)
        self.logits = nn.Parameter(torch.zeros(self.total))

    def forward(self, pressure: float, progress: float) -> torch.Tensor:
        k = self.total - round(pressure * (self.total - self.k_final))
        if k >= self.total:
            return torch.ones_like(self.logits)
        temperature = self.hp.topk_t0 * (self.hp.topk_t1 / self.hp.topk_t0) ** progress
        r = self.logits
        if self.training:
            u = torch.rand_like(r).clamp(1e-9, 1.0 - 1e-9)
            r = r - torch.log(-torch.log(u))
        mask = torch.zeros_like(r)
        for _ in range(k):
            p = torch.softmax(r / temperature, dim=0)
            mask = mask + p
            r = r + torch.log((1.0 - p).clamp_min(1e-9))
        return mask.clamp(max=1.0)

    def penalty(self, pressure: float) -> torch.Tensor:
        return self.logits.new_zeros(())

    def gate_parameters(self) -> list[nn.Parameter]:
        return [self.logits]

    def extra_optimizers(self) -> list[torch.optim.Optimizer]:
        return []

    def scores(self) -> torch.Tensor:
        return self.logits.detach()

    def final_sparsity(self) -> float:
        return self.hp.sparsity


def choose(context: PruneContext) -> PruneOutcome:
    return prune_with_gates(context, SoftTopKGater(context.heads, context.hp))


register(
    Method(
        "topk",
        choose,
        removes_target=True,
        knobs={
            **GATE_KNOBS,
            "topk_t0": bounded(10.0, 0.0, low_open=True, doc="soft top-k start temperature"),
            "topk_t1": bounded(0.01, 0.0, low_open=True, doc="soft top-k end temperature"),
        },
        doc="Gumbel soft top-k (DSP)",
    )
)
