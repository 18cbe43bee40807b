"""What a trial can be told: budgets fixed per study, hyperparameters chosen per trial.

Field metadata carries the bounds and choices that study files are validated against, so the
orchestrator can check a study without knowing what the numbers mean.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from trainers.schedules import SHAPES

METHODS = ("l0_target",)


def bounded(default, low=None, high=None, *, high_open=False, kind=None, doc=""):
    """A dataclass field with the numeric bounds a config value is checked against."""
    meta = {"low": low, "high": high, "high_open": high_open, "doc": doc}
    return field(default=default, metadata={**meta, "type": kind or type(default)})


def choice(default, choices, doc=""):
    """A dataclass field whose value must be one of ``choices``."""
    return field(default=default, metadata={"choices": tuple(choices), "type": str, "doc": doc})


@dataclass(frozen=True)
class PretrainConfig:
    """Dense pretraining; the checkpoint is cached per (corpus, model, this config)."""

    steps: int = bounded(2000, 1, doc="optimizer steps")
    batch_size: int = bounded(32, 1)
    lr: float = bounded(1e-3, 0.0, doc="peak learning rate (cosine decay)")
    warmup_steps: int = bounded(100, 0)
    weight_decay: float = bounded(0.01, 0.0)
    seed: int = bounded(0, 0)


@dataclass(frozen=True)
class TrialBudget:
    """Per-trial budgets, the same for every trial of a study."""

    prune_steps: int = bounded(300, 1, doc="steps while gates close")
    finetune_steps: int = bounded(200, 0, doc="steps with the mask fixed, heads removed")
    batch_size: int = bounded(32, 1)
    eval_tokens: int = bounded(32768, 1, doc="validation tokens scored (a fixed slice)")
    threads: int = bounded(0, 0, doc="torch threads per trial; 0 = the CPUs the trial holds")
    device: str = choice("auto", ("auto", "cpu", "cuda"))


@dataclass(frozen=True)
class TrialHParams:
    """One trial's hyperparameters: what the search chooses (or a study fixes)."""

    method: str = choice("l0_target", METHODS)
    sparsity: float = bounded(0.5, 0.0, 1.0, high_open=True, doc="fraction of heads removed")
    lr: float = bounded(1e-3, 0.0, doc="weights' learning rate while pruning and fine-tuning")
    gate_lr_mult: float = bounded(10.0, 0.0, doc="gates' learning rate / weights' (Shim: 10)")
    gate_init: float = bounded(2.0, doc="initial log_alpha (Shim: 2.0)")
    beta: float = bounded(1.0 / 3.0, 0.0, doc="hard-concrete temperature")
    schedule_start: float = bounded(0.0, 0.0, 1.0, doc="fraction of the phase before any pressure")
    schedule_warmup: float = bounded(0.5, 0.0, 1.0, doc="fraction over which the target rises")
    schedule_shape: str = choice("linear", SHAPES)
    lagrangian_lr: float = bounded(0.05, 0.0, doc="ascent rate of the Lagrange multipliers")
    min_heads_per_layer: int = bounded(1, 0)

    def to_dict(self) -> dict:
        return asdict(self)


def field_specs(cls) -> dict[str, dict]:
    """{name: {type, default, low, high, choices, ...}} for validating a config table."""
    return {f.name: {"default": f.default, **dict(f.metadata)} for f in fields(cls)}
