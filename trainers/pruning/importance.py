"""``importance`` (methods.md section 6, Michel et al. 2019): heads removed a round at a time, the
least important first, importance being the expected |dL/dxi_h| of a gate xi_h on each head,
recomputed under the new mask every round. No weight is trained while choosing."""

from __future__ import annotations

import torch

from trainers.data import random_batch
from trainers.gates import heads_to_keep
from trainers.knobs import bounded
from trainers.pruning.registry import Method, PruneContext, PruneOutcome, register


def mask_gradients(model, x: torch.Tensor, y: torch.Tensor, mask: list[torch.Tensor]) -> torch.Tensor:
    """dLoss/dxi for every head (flat), at the mask values given."""
    xi = [m.detach().clone().requires_grad_(True) for m in mask]
    grads = torch.autograd.grad(model.loss(x, y, xi), xi)
    return torch.cat(grads)


def head_importance(
    model,
    tokens: torch.Tensor,
    mask: list[torch.Tensor],
    *,
    batches: int,
    batch_size: int,
    generator: torch.Generator,
) -> torch.Tensor:
    """I_h = E|dL/dxi_h| over batches per token, each layer normalised by its L2 norm."""
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


def choose(context: PruneContext) -> PruneOutcome:
    """Remove ``importance_step`` of all heads per round until the target; at least
    ``min_heads_per_layer`` per layer."""
    model, hp, heads = context.model, context.hp, context.heads
    device = next(model.parameters()).device
    target = heads_to_keep(sum(heads), hp.sparsity)
    per_round = max(1, round(hp.importance_step * sum(heads)))
    mask = [torch.ones(n, device=device) for n in heads]
    layer_of = [layer for layer, n in enumerate(heads) for _ in range(n)]
    offsets = [sum(heads[:layer]) for layer in range(len(heads))]
    while sum(int(m.sum()) for m in mask) > target:
        scores = head_importance(
            model,
            context.tokens,
            mask,
            batches=hp.importance_batches,
            batch_size=context.batch_size,
            generator=context.generator,
        )
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
    model.train()
    keep = [torch.nonzero(m).flatten().tolist() for m in mask]
    return PruneOutcome(keep, None, trained_steps=0)


register(
    Method(
        "importance",
        choose,
        removes_target=True,
        knobs={
            "importance_step": bounded(0.1, 0.0, 1.0, doc="heads removed per round"),
            "importance_batches": bounded(4, 1, doc="batches per importance estimate"),
        },
        doc="Michel et al.'s iterative importance",
    )
)
