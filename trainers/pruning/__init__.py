"""Pruning methods (methods.md sections 3-8): each module here registers one or more methods
with ``registry.register``; ``prune`` runs the one a trial's hyperparameters name.

Gate methods (``l0_target``, ``l0_penalty``, ``topk``) train gates and weights together, so the
model leaves the pruning phase adapted to its mask, or, with ``freeze_weights``, train the gates
alone on the dense model. Methods that train no weights while choosing (``importance``,
``random``, frozen gates) give the pruning phase's steps to the fine-tuning: equal weight-training
budgets.
"""

from trainers.pruning.registry import (
    LossFn,
    Method,
    PruneContext,
    PruneOutcome,
    method,
    methods,
    plain_loss,
    prune,
    register,
)

__all__ = [
    "LossFn",
    "Method",
    "PruneContext",
    "PruneOutcome",
    "method",
    "methods",
    "plain_loss",
    "prune",
    "register",
]
