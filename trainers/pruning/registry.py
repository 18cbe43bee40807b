"""The registry of pruning methods: one entry per method, each declared in its own module.

A method is a function from a ``PruneContext`` (the dense model, the training tokens, the
trial's hyperparameters and budget) to a ``PruneOutcome`` (the heads to keep per layer), plus
what the rest of the project reads: whether it removes exactly the target sparsity, and its
knobs (dataclass fields made with ``trainers.knobs.bounded`` / ``choice``), which the search
space and ``trainers.hparams.TrialHParams`` are assembled from. A new method is one module in
``trainers/pruning/`` (or a module of your own named in ``HEADPRUNE_PLUGINS``: trainers/plugins.py)
that calls ``register``, plus its test.

Modules in this package must not import ``trainers.hparams``: it is assembled from this
registry. The hyperparameters arrive as an object with one attribute per knob.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import Field, dataclass, field
from typing import Any

import torch

from trainers.plugins import import_plugins
from trainers.training import Progress, plain_loss

# loss(model, inputs, targets, head_gates) -> scalar
LossFn = Callable[[Any, torch.Tensor, torch.Tensor, "list[torch.Tensor] | None"], torch.Tensor]


@dataclass
class PruneContext:
    """What a method may use to choose heads."""

    model: Any  # the dense model (any family's PrunableModel), trained in place by gate methods
    tokens: torch.Tensor  # the training split's token ids
    hp: Any  # trainers.hparams.TrialHParams: the shared hyperparameters and every method's knobs
    steps: int  # the pruning phase's budget of steps
    batch_size: int
    generator: torch.Generator  # every trial draws the same batches
    loss_fn: LossFn = plain_loss  # cross-entropy, or with peer distillation
    progress: Progress | None = None

    @property
    def heads(self) -> list[int]:
        return list(self.model.cfg.layer_heads)


@dataclass
class PruneOutcome:
    keep: list[list[int]]  # head indices kept per layer
    head_scale: list[float] | None  # attention output scaling to fold into W_O, or None
    trained_steps: int  # weight-training steps spent while pruning


@dataclass(frozen=True)
class Method:
    name: str
    choose: Callable[[PruneContext], PruneOutcome]
    removes_target: bool  # keeps exactly round((1 - sparsity) x heads): `sparsity` is searched for it
    removes_heads: bool = True  # False: nothing removed (``dense``, the study's control: no rungs)
    # name -> field (trainers.knobs.bounded / choice): searched, fixed or left at its default for
    # this method's trials only. Methods may share knobs (the gate methods' schedule): the same
    # name must then be the same field.
    knobs: dict[str, Field] = field(default_factory=dict)
    doc: str = ""


_REGISTRY: dict[str, Method] = {}
_discovered = False  # every module of this package imported (a method may be registered before)
_ORDER = ("l0_target", "l0_penalty", "topk", "importance", "random", "dense")  # how they are listed


def register(method: Method) -> Method:
    if method.name in _REGISTRY:
        raise ValueError(f"pruning method {method.name!r} is registered twice")
    _REGISTRY[method.name] = method
    return method


def _discover() -> None:
    """Import every module of this package once: each registers its methods."""
    global _discovered
    if _discovered:
        return
    _discovered = True  # before the imports: a module being imported may ask for the methods
    try:
        package = importlib.import_module("trainers.pruning")
        for module in pkgutil.iter_modules(package.__path__):
            if module.name != "registry":
                importlib.import_module(f"trainers.pruning.{module.name}")
        import_plugins()
    except BaseException:
        _discovered = False  # asked again, the imports are tried again
        raise


def methods() -> dict[str, Method]:
    """Every registered method, the built-in ones first in their usual order."""
    _discover()
    known = [name for name in _ORDER if name in _REGISTRY]
    return {name: _REGISTRY[name] for name in [*known, *sorted(set(_REGISTRY) - set(known))]}


def method(name: str) -> Method:
    found = methods().get(name)
    if found is None:
        raise ValueError(f"unknown pruning method {name!r}; choose one of {tuple(methods())}")
    return found


def removes_heads(name: str) -> bool:
    """Whether the method ``name`` removes any head (the dense control's does not: it is never
    judged at rungs, and its sparsity is 0)."""
    return method(name).removes_heads


def prune(context: PruneContext) -> PruneOutcome:
    """The heads ``context.hp.method`` keeps."""
    return method(context.hp.method).choose(context)
