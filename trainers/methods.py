"""Pruning methods: each takes the dense model and returns the heads to keep per layer.

Gate methods (``l0_target``, ``l0_penalty``, ``topk``) train gates and weights together, so the
model leaves the pruning phase adapted to its mask, or, with ``freeze_weights``, train the gates
alone on the dense model. Methods that train no weights while choosing (``importance``, ``random``,
frozen gates) give the pruning phase's steps to the fine-tuning: equal weight-training budgets.
Section numbers refer to ``methods.md``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from trainers.data import random_batch
from trainers.gates import HardConcreteGates, Lagrangian, heads_to_keep, select_heads
from trainers.hparams import TrialHParams
from trainers.model import LanguageModel
from trainers.schedules import ramp
from trainers.training import Progress, cosine_lr

# loss(model, inputs, targets, head_gates) -> scalar
LossFn = Callable[[LanguageModel, torch.Tensor, torch.Tensor, list[torch.Tensor] | None], torch.Tensor]


def plain_loss(model: LanguageModel, x: torch.Tensor, y: torch.Tensor, gates=None) -> torch.Tensor:
    return model.loss(x, y, gates)


class PeerDistillation:
    """Section 7: a frozen dense teacher; each layer's attention output (after W_O) is pulled
    toward the teacher's, and the logits toward its softened distribution (KL at T = 2, as CoFi)."""

    def __init__(
        self, teacher: LanguageModel, alpha_layer: float, alpha_logit: float, temperature: float = 2.0
    ):
        self.teacher = copy.deepcopy(teacher).eval().requires_grad_(False)
        self.alpha_layer, self.alpha_logit, self.temperature = alpha_layer, alpha_logit, temperature

    def extra(self, x: torch.Tensor, logits: torch.Tensor, attn: list[torch.Tensor]) -> torch.Tensor:
        """The distillation terms alone: zero when the student computes what the teacher does."""
        with torch.no_grad():
            t_logits, t_attn = self.teacher(x, return_attn=True)
        layer = sum(F.mse_loss(s, t) for s, t in zip(attn, t_attn, strict=True))
        T = self.temperature
        kl = F.kl_div(
            F.log_softmax(logits.flatten(0, 1) / T, dim=-1),
            F.log_softmax(t_logits.flatten(0, 1) / T, dim=-1),
            log_target=True,
            reduction="batchmean",
        )
        return self.alpha_layer * layer + self.alpha_logit * T * T * kl

    def __call__(self, model: LanguageModel, x: torch.Tensor, y: torch.Tensor, gates=None) -> torch.Tensor:
        logits, attn = model(x, gates, return_attn=True)
        return F.cross_entropy(logits.flatten(0, 1), y.flatten()) + self.extra(x, logits, attn)


@dataclass
class PruneOutcome:
    keep: list[list[int]]  # head indices kept per layer
    head_scale: list[float] | None  # attention output scaling to fold into W_O, or None
    trained_steps: int  # weight-training steps spent while pruning


# --- Gate parametrisations ------------------------------------------------------------------


class HardConcreteGater(nn.Module):
    """Sections 3-4: hard-concrete gates with a Lagrangian toward the target (``l0_target``) or a
    warmed-up lambda * L0 penalty and no target (``l0_penalty``)."""

    def __init__(self, heads: list[int], hp: TrialHParams) -> None:
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


class SoftTopKGater(nn.Module):
    """Section 4, DSP: Gumbel soft top-k over per-head logits, an exact head count; the count
    falls along the gate schedule and the temperature anneals exponentially T0 -> T1."""

    def __init__(self, heads: list[int], hp: TrialHParams) -> None:
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


def output_scale(z: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Section 3, Shim's third method: H / (H - n_closed), clamped to [1, H], a constant."""
    open_heads = z.detach().sum().clamp_min(1e-6)
    return (n_heads / open_heads).clamp(1.0, float(n_heads))


def train_gates(
    model: LanguageModel,
    gater: HardConcreteGater | SoftTopKGater,
    tokens: torch.Tensor,
    hp: TrialHParams,
    *,
    steps: int,
    batch_size: int,
    generator: torch.Generator,
    loss_fn: LossFn,
    progress: Progress | None,
) -> None:
    """Gates and weights trained together (Shim et al.), or gates alone with ``freeze_weights``;
    pressure follows the gate schedule (section 5)."""
    device = next(model.parameters()).device
    heads = list(model.cfg.layer_heads)
    gater.to(device).train()
    # Gates: a larger learning rate and no weight decay (Shim et al.).
    optimizers = [torch.optim.Adam(gater.gate_parameters(), lr=hp.lr * hp.gate_lr_mult)]
    optimizers += gater.extra_optimizers()
    opt_weights = None
    if hp.freeze_weights:
        model.eval().requires_grad_(False)  # the gates judge the model as it is
    else:
        model.train()
        opt_weights = torch.optim.AdamW(model.parameters(), lr=hp.lr, betas=(0.9, 0.99), weight_decay=0.01)
        optimizers.append(opt_weights)
    for step in range(steps):
        if opt_weights is not None:
            for group in opt_weights.param_groups:
                group["lr"] = cosine_lr(step, steps, hp.lr, warmup=0)
        pressure = ramp(
            step / steps, start=hp.schedule_start, warmup=hp.schedule_warmup, shape=hp.schedule_shape
        )
        gates = list(torch.split(gater(pressure, step / steps), heads))
        if hp.output_scaling:
            gates = [g * output_scale(g, n) for g, n in zip(gates, heads)]
        x, y = random_batch(tokens, batch_size, model.cfg.block_size, generator)
        task = loss_fn(model, x.to(device), y.to(device), gates)
        loss = task + gater.penalty(pressure)
        if not loss.requires_grad:  # weights frozen and every gate held open: nothing to learn yet
            continue
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        loss.backward()
        if opt_weights is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for opt in optimizers:
            opt.step()
        if progress and (step % 50 == 0 or step == steps - 1):
            progress("prune", step + 1, steps, task.item())
    model.requires_grad_(True).train()


# --- Choosing without training: Michel et al. and the random floor ---------------------------


def mask_gradients(
    model: LanguageModel, x: torch.Tensor, y: torch.Tensor, mask: list[torch.Tensor]
) -> torch.Tensor:
    """dLoss/dxi for every head (flat), at the mask values given."""
    xi = [m.detach().clone().requires_grad_(True) for m in mask]
    grads = torch.autograd.grad(model.loss(x, y, xi), xi)
    return torch.cat(grads)


def head_importance(
    model: LanguageModel,
    tokens: torch.Tensor,
    mask: list[torch.Tensor],
    *,
    batches: int,
    batch_size: int,
    generator: torch.Generator,
) -> torch.Tensor:
    """Section 6: I_h = E|dL/dxi_h| over batches per token, each layer normalised by its L2 norm."""
    device = next(model.parameters()).device
    model.eval()  # no dropout: the estimate is of the model as it will run
    total = torch.zeros(sum(m.numel() for m in mask), device=device)
    n_tokens = 0
    for _ in range(batches):
        x, y = random_batch(tokens, batch_size, model.cfg.block_size, generator)
        total += mask_gradients(model, x.to(device), y.to(device), mask).abs()
        n_tokens += y.numel()
    scores = total / n_tokens
    layers = torch.split(scores, [m.numel() for m in mask])
    return torch.cat([s / (s.norm() + 1e-20) for s in layers])


def prune_by_importance(
    model: LanguageModel,
    tokens: torch.Tensor,
    hp: TrialHParams,
    *,
    batch_size: int,
    generator: torch.Generator,
) -> list[list[int]]:
    """Remove ``importance_step`` of all heads per round, the least important first, recomputing
    importance under the new mask, until the target; at least ``min_heads_per_layer`` per layer."""
    device = next(model.parameters()).device
    heads = list(model.cfg.layer_heads)
    target = heads_to_keep(sum(heads), hp.sparsity)
    per_round = max(1, round(hp.importance_step * sum(heads)))
    mask = [torch.ones(n, device=device) for n in heads]
    while sum(int(m.sum()) for m in mask) > target:
        scores = head_importance(
            model, tokens, mask, batches=hp.importance_batches, batch_size=batch_size, generator=generator
        )
        layer_of = [layer for layer, n in enumerate(heads) for _ in range(n)]
        offsets = [sum(heads[:layer]) for layer in range(len(heads))]
        alive = [int(m.sum()) for m in mask]
        to_remove = min(per_round, sum(alive) - target)
        for flat in torch.argsort(scores).tolist():
            layer, head = layer_of[flat], flat - offsets[layer_of[flat]]
            if to_remove == 0:
                break
            if mask[layer][head] == 1 and alive[layer] > hp.min_heads_per_layer:
                mask[layer][head] = 0.0
                alive[layer] -= 1
                to_remove -= 1
    return [torch.nonzero(m).flatten().tolist() for m in mask]


# --- Dispatch -------------------------------------------------------------------------------


def prune(
    model: LanguageModel,
    tokens: torch.Tensor,
    hp: TrialHParams,
    *,
    steps: int,
    batch_size: int,
    generator: torch.Generator,
    loss_fn: LossFn = plain_loss,
    progress: Progress | None = None,
) -> PruneOutcome:
    heads = list(model.cfg.layer_heads)
    if hp.method == "dense":
        return PruneOutcome([list(range(n)) for n in heads], None, trained_steps=0)
    if hp.method == "random":  # section 8: the floor every method must beat
        scores = torch.rand(sum(heads), generator=generator)
        return PruneOutcome(select_heads(scores, heads, hp.sparsity, hp.min_heads_per_layer), None, 0)
    if hp.method == "importance":
        keep = prune_by_importance(model, tokens, hp, batch_size=batch_size, generator=generator)
        return PruneOutcome(keep, None, trained_steps=0)
    gater = SoftTopKGater(heads, hp) if hp.method == "topk" else HardConcreteGater(heads, hp)
    train_gates(
        model,
        gater,
        tokens,
        hp,
        steps=steps,
        batch_size=batch_size,
        generator=generator,
        loss_fn=loss_fn,
        progress=progress,
    )
    keep = select_heads(gater.scores(), heads, gater.final_sparsity(), hp.min_heads_per_layer)
    scale = None
    if hp.output_scaling:
        scale = [min(float(n), n / max(1, len(k))) for k, n in zip(keep, heads)]
    return PruneOutcome(keep, scale, trained_steps=0 if hp.freeze_weights else steps)
