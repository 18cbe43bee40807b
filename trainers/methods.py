"""Pruning methods: each takes the dense model and returns the heads to keep per layer.

The weights are trained alongside the gates, so a method also leaves the model adapted to its mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainers.data import random_batch
from trainers.gates import HardConcreteGates, Lagrangian, select_heads
from trainers.hparams import TrialHParams
from trainers.model import LanguageModel
from trainers.schedules import ramp
from trainers.training import Progress, cosine_lr


@dataclass
class PruneOutcome:
    keep: list[list[int]]  # head indices kept per layer
    final_expected_sparsity: float  # what the gates alone reached before the exact cut


def prune_l0_target(
    model: LanguageModel,
    tokens: torch.Tensor,
    hp: TrialHParams,
    *,
    steps: int,
    batch_size: int,
    generator: torch.Generator,
    progress: Progress | None = None,
) -> PruneOutcome:
    """Hard-concrete gates pushed to an exact sparsity target by a Lagrangian (methods.md 3-4).

    The target rises from 0 to ``hp.sparsity`` along the gate schedule; at the end the exact
    head budget is cut by log_alpha.
    """
    device = next(model.parameters()).device
    heads = list(model.cfg.layer_heads)
    gates = HardConcreteGates(heads, init=hp.gate_init, beta=hp.beta).to(device)
    lagrangian = Lagrangian().to(device)
    opt_weights = torch.optim.AdamW(model.parameters(), lr=hp.lr, betas=(0.9, 0.99), weight_decay=0.01)
    # Gates: a larger learning rate and no weight decay (Shim et al.).
    opt_gates = torch.optim.Adam(gates.parameters(), lr=hp.lr * hp.gate_lr_mult)
    opt_lambda = lagrangian.optimizer(hp.lagrangian_lr)
    model.train()
    gates.train()
    for step in range(steps):
        for group in opt_weights.param_groups:
            group["lr"] = cosine_lr(step, steps, hp.lr, warmup=0)
        target = hp.sparsity * ramp(
            step / steps, start=hp.schedule_start, warmup=hp.schedule_warmup, shape=hp.schedule_shape
        )
        x, y = random_batch(tokens, batch_size, model.cfg.block_size, generator)
        ce = model.loss(x.to(device), y.to(device), gates.split(gates()))
        loss = ce + lagrangian(gates.expected_sparsity(), target)
        for opt in (opt_weights, opt_gates, opt_lambda):
            opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for opt in (opt_weights, opt_gates, opt_lambda):
            opt.step()
        if progress and (step % 50 == 0 or step == steps - 1):
            progress("prune", step + 1, steps, ce.item())
    keep = select_heads(gates.log_alpha, heads, hp.sparsity, hp.min_heads_per_layer)
    return PruneOutcome(keep, float(gates.expected_sparsity()))
