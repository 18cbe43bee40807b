"""What a trial can be told: budgets fixed per study, hyperparameters chosen per trial.

Field metadata carries the bounds and choices that study files are validated against, so the
orchestrator can check a study without knowing what the numbers mean.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from trainers.pruning.registry import methods
from trainers.schedules import SHAPES

# Derived from the registry of pruning methods (trainers/pruning/): a new method is one module
# there. "dense" removes nothing: the study's dense control, and a baseline a study may choose.
METHODS = tuple(methods())
TARGET_METHODS = tuple(name for name, m in methods().items() if m.removes_target)  # remove exactly `sparsity`
GATE_METHODS = tuple(name for name, m in methods().items() if m.trains_gates)  # train gates while pruning
HARD_CONCRETE = tuple(name for name, m in methods().items() if m.hard_concrete)


def bounded(
    default, low=None, high=None, *, low_open=False, high_open=False, kind=None, methods=None, doc=""
):
    """A dataclass field with the numeric bounds a config value is checked against (``low_open``:
    the low bound itself refused, as for a value something is divided by); ``methods`` names the
    pruning methods it applies to (None: all), so a search suggests it only for them."""
    bounds = {"low": low, "high": high, "low_open": low_open, "high_open": high_open}
    meta = {**bounds, "methods": methods, "doc": doc, "type": kind or type(default)}
    return field(default=default, metadata=meta)


def choice(default, choices, *, methods=None, doc=""):
    """A dataclass field whose value must be one of ``choices``."""
    meta = {"choices": tuple(choices), "type": type(default), "methods": methods, "doc": doc}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class PretrainConfig:
    """Dense pretraining; the checkpoint is cached per (corpus, model, this config).

    ``until_converged = false``: ``steps`` steps, warm-up and cosine decay. ``true``: warm-up, a
    constant rate until the validation loss improves by less than ``converge_tolerance``
    (relative) over the last ``converge_window`` steps (checked every ``eval_every`` steps), or
    until ``steps``, then a linear cool-down to zero over ``cooldown`` x the steps so far
    (warmup-stable-decay: the plateau is found without knowing the length in advance)."""

    steps: int = bounded(2000, 1, doc="optimizer steps (with until_converged: the most before cool-down)")
    batch_size: int = bounded(32, 1, doc="windows of block_size tokens per step")
    lr: float = bounded(1e-3, 0.0, doc="peak learning rate")
    warmup_steps: int = bounded(100, 0, doc="steps of linear warm-up to lr")
    weight_decay: float = bounded(0.01, 0.0, doc="AdamW weight decay of the weight matrices")
    seed: int = bounded(0, 0, doc="the initial weights' and the batches' seed")
    until_converged: bool = bounded(False, doc="train until the validation loss plateaus")
    converge_window: int = bounded(1000, 1, doc="steps over which the improvement is measured")
    converge_tolerance: float = bounded(0.005, 0.0, 1.0, doc="relative improvement that counts as none")
    eval_every: int = bounded(250, 1, doc="steps between validation evaluations")
    cooldown: float = bounded(0.2, 0.0, 1.0, doc="cool-down steps / steps before it")


@dataclass(frozen=True)
class TrialBudget:
    """Per-trial budgets, the same for every trial of a study."""

    prune_steps: int = bounded(300, 1, doc="steps while gates close")
    finetune_steps: int = bounded(200, 0, doc="steps with the mask fixed, heads removed")
    batch_size: int = bounded(32, 1, doc="windows of block_size tokens per step")
    eval_tokens: int = bounded(32768, 1, doc="validation tokens scored (a fixed slice)")
    threads: int = bounded(0, 0, doc="torch threads per trial; 0 = the CPUs the trial holds")
    device: str = choice("auto", ("auto", "cpu", "cuda"), doc="auto: a GPU where there is one, else the CPU")


@dataclass(frozen=True)
class TrialHParams:
    """One trial's hyperparameters: what the search chooses (or a study fixes). methods.md
    sections 3-7 give each one's meaning and the papers' values."""

    method: str = choice("l0_target", METHODS, doc="how heads are chosen")
    sparsity: float = bounded(
        0.5, 0.0, 1.0, high_open=True, methods=TARGET_METHODS, doc="fraction of heads to remove"
    )
    # 3e-4: on the converged checkpoint the dense control at 1e-3 moved its perplexity by 1.06%,
    # at 3e-4 by 0.59% (BENCHMARKS.md): a larger rate undoes part of the pretraining's cool-down.
    lr: float = bounded(3e-4, 0.0, doc="weights' learning rate while pruning and fine-tuning")
    min_heads_per_layer: int = bounded(1, 0, doc="heads every layer keeps at least")
    # Gate training (methods.md 3-5).
    # Shim et al. used 10 with their weights' rate; 30 x the default 3e-4 keeps the gates' rate
    # near 1e-2, where they close within the 100-step gate phase.
    gate_lr_mult: float = bounded(30.0, 0.0, methods=GATE_METHODS, doc="gates' lr / weights' (Shim: 10)")
    gate_init: float = bounded(2.0, methods=HARD_CONCRETE, doc="initial log_alpha (Shim: 2.0)")
    beta: float = bounded(
        1.0 / 3.0, 0.0, low_open=True, methods=HARD_CONCRETE, doc="hard-concrete temperature"
    )
    hard_gates: bool = bounded(True, methods=HARD_CONCRETE, doc="straight-through 0/1 gates (Shim)")
    freeze_weights: bool = bounded(
        False, methods=GATE_METHODS, doc="gates choose with weights frozen; fine-tuning gets every step"
    )
    output_scaling: bool = bounded(False, methods=GATE_METHODS, doc="rescale surviving heads (Shim)")
    schedule_start: float = bounded(0.0, 0.0, 1.0, methods=GATE_METHODS, doc="phase before any pressure")
    schedule_warmup: float = bounded(0.5, 0.0, 1.0, methods=GATE_METHODS, doc="phase over which it rises")
    schedule_shape: str = choice("linear", SHAPES, methods=GATE_METHODS, doc="how the pressure rises")
    lagrangian_lr: float = bounded(0.05, 0.0, methods=("l0_target",), doc="multipliers' ascent rate")
    l0_lambda: float = bounded(1.0, 0.0, methods=("l0_penalty",), doc="weight of the mean L0 term")
    topk_t0: float = bounded(10.0, 0.0, low_open=True, methods=("topk",), doc="soft top-k start temperature")
    topk_t1: float = bounded(0.01, 0.0, low_open=True, methods=("topk",), doc="soft top-k end temperature")
    # Michel et al. (methods.md 6).
    importance_step: float = bounded(0.1, 0.0, 1.0, methods=("importance",), doc="heads removed per round")
    importance_batches: int = bounded(4, 1, methods=("importance",), doc="batches per importance estimate")
    # Peer distillation (methods.md 7): a switch on every method.
    distill: bool = bounded(False, doc="distil the frozen dense model into the pruned one")
    distill_layer: float = bounded(1.0, 0.0, doc="weight of the layer-output MSE")
    distill_logit: float = bounded(1.0, 0.0, doc="weight of the logit KL at T = 2")

    def to_dict(self) -> dict:
        return asdict(self)


def field_specs(cls) -> dict[str, dict]:
    """{name: {type, default, low, high, choices, ...}} for validating a config table."""
    return {f.name: {"default": f.default, **dict(f.metadata)} for f in fields(cls)}
