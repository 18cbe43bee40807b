"""What a trial can be told: budgets fixed per study, hyperparameters chosen per trial.

Field metadata carries the bounds and choices that study files are validated against, so the
orchestrator can check a study without knowing what the numbers mean. A trial's hyperparameters
(``TrialHParams``) are the ones every method shares, declared here, and each method's knobs,
declared beside its code and gathered from the registry (trainers/pruning/).
"""

from __future__ import annotations

from dataclasses import Field, asdict, dataclass, field, make_dataclass

from trainers.knobs import bounded, choice
from trainers.pruning.registry import methods

# Derived from the registry of pruning methods (trainers/pruning/): a new method is one module
# there. "dense" removes nothing: the study's dense control, and a baseline a study may choose.
METHODS = tuple(methods())
TARGET_METHODS = tuple(name for name, m in methods().items() if m.removes_target)  # remove exactly `sparsity`


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


# The hyperparameters every method has, before and after the methods' own knobs.
SHARED_FIRST = {
    "method": choice("l0_target", METHODS, doc="how heads are chosen"),
    "sparsity": bounded(
        0.5, 0.0, 1.0, high_open=True, methods=TARGET_METHODS, doc="fraction of heads to remove"
    ),
    # 3e-4: on the converged checkpoint the dense control at 1e-3 moved its perplexity by 1.06%,
    # at 3e-4 by 0.59% (docs/results.md): a larger rate undoes part of the pretraining's cool-down.
    "lr": bounded(3e-4, 0.0, doc="weights' learning rate while pruning and fine-tuning"),
    "min_heads_per_layer": bounded(1, 0, doc="heads every layer keeps at least"),
}
SHARED_LAST = {  # peer distillation (methods.md 7): a switch on every method
    "distill": bounded(False, doc="distil the frozen dense model into the pruned one"),
    "distill_layer": bounded(1.0, 0.0, doc="weight of the layer-output MSE"),
    "distill_logit": bounded(1.0, 0.0, doc="weight of the logit KL at T = 2"),
}


def _methods_knobs() -> dict[str, Field]:
    """Every registered method's knobs, each marked with the methods that have it (in the
    registry's order, a knob where it is first declared)."""
    knobs: dict[str, Field] = {}
    owners: dict[str, list[str]] = {}
    for name, method in methods().items():
        for knob, declared in method.knobs.items():
            if knob in SHARED_FIRST or knob in SHARED_LAST:
                raise ValueError(f"pruning method {name!r}: knob {knob!r} is a shared hyperparameter")
            if knob in knobs and knobs[knob] is not declared:
                raise ValueError(f"pruning method {name!r}: knob {knob!r} is declared by another method")
            knobs[knob] = declared
            owners.setdefault(knob, []).append(name)
    return {
        knob: field(default=f.default, metadata={**f.metadata, "methods": tuple(owners[knob])})
        for knob, f in knobs.items()
    }


def _to_dict(self) -> dict:
    return asdict(self)


# One trial's hyperparameters: what the search chooses (or a study fixes); a frozen dataclass
# with one field per hyperparameter, its metadata the bounds (methods.md sections 3-7 give each
# one's meaning and the papers' values). Assembled here because its fields come from the methods.
TrialHParams = make_dataclass(
    "TrialHParams",
    [
        (name, declared.metadata["type"], declared)
        for name, declared in {**SHARED_FIRST, **_methods_knobs(), **SHARED_LAST}.items()
    ],
    frozen=True,
    namespace={"to_dict": _to_dict},
)
TrialHParams.__module__ = __name__  # found by pickle (Ray sends a trial's hyperparameters) here
TrialHParams.__doc__ = """One trial's hyperparameters: what the search chooses (or a study fixes).
The shared ones are declared in trainers/hparams.py, each method's knobs beside its code in
trainers/pruning/; docs/methods.md sections 3-7 give each one's meaning and the papers' values."""
