"""``dense``: nothing removed. The study's dense control runs it (its fine-tuning measures what
the same training does without pruning), and a study may choose it as a baseline."""

from __future__ import annotations

from trainers.pruning.registry import Method, PruneContext, PruneOutcome, register


def choose(context: PruneContext) -> PruneOutcome:
    return PruneOutcome([list(range(n)) for n in context.heads], None, trained_steps=0)


register(
    Method(
        "dense", choose, removes_target=False, removes_heads=False, doc="nothing removed: the dense control"
    )
)
