"""``random`` (methods.md section 8): heads kept at random, the exact budget and the per-layer
floor respected. The floor every method must beat."""

from __future__ import annotations

import torch

from trainers.gates import select_heads
from trainers.pruning.registry import Method, PruneContext, PruneOutcome, register


def choose(context: PruneContext) -> PruneOutcome:
    heads = context.heads
    scores = torch.rand(sum(heads), generator=context.generator)
    keep = select_heads(scores, heads, context.hp.sparsity, context.hp.min_heads_per_layer)
    return PruneOutcome(keep, None, trained_steps=0)


register(Method("random", choose, removes_target=True, doc="random heads: the floor"))
