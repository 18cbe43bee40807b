"""Warm starts: a trial prunes the front's next larger model instead of the dense checkpoint.

A sweep runs every size from the dense model, each trial's fine-tuning its only chance to
recover. A study holds what its earlier trials learned: with ``[study] warm_start = true`` a
trial whose method takes a sparsity target starts from the smallest model on the study's front
that keeps more heads than its target, removes the difference and fine-tunes for its own budget
(``trainers.trial.run_trial``'s ``parent``). This is iterative pruning (Michel et al. prune in
rounds; docs/methods.md, warm starts): a point at 75% removed inherits the fine-tuning of the
50% point it came from. Every trial still costs its own budget, and the study's compute counts
every trial, parents included, so a comparison at equal compute stays fair.

The parent is read from its folder under ``--artifacts`` (the trial's ``model_dir``), so on a
cluster those folders must be on storage every node sees; a point whose folder the driver cannot
see or use is passed over for the next larger one (``parent_for``).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from optuna.trial import FrozenTrial

from orchestrator.front_gaps import front_of, heads_kept
from trainers.gates import heads_to_keep
from trainers.hparams import TARGET_METHODS
from trainers.trial import check_parent


def parent_for(
    trials: Iterable[FrozenTrial],
    hparams: dict,
    *,
    setup: str | None = None,
    dense_weights: str | None = None,
) -> FrozenTrial | None:
    """The trial a new one with ``hparams`` starts from: the front's smallest model keeping more
    heads than its target (the fewest heads left to remove) that can be one. None for a method
    without a sparsity target, or when no front point is larger (the trial then prunes the dense
    checkpoint; the dense control is never a parent). A point is passed over, and the next larger
    one tried, when it was measured under another setup than ``setup`` (``config.setup_digest``:
    other budgets, another dense model), or its saved model is not one the trial could start
    from (``trainers.trial.check_parent``: not on this machine's disk, cut short, saved by an
    earlier version, pruned from other dense weights than ``dense_weights``)."""
    if hparams.get("method") not in TARGET_METHODS:
        return None
    candidates = []
    for trial in front_of(trials):
        folder = trial.user_attrs.get("model_dir")
        if trial.user_attrs.get("dense_control") or "heads_per_layer" not in trial.user_attrs or not folder:
            continue
        if setup is not None and trial.user_attrs.get("setup") != setup:
            continue
        kept, total = heads_kept(trial)
        if kept > heads_to_keep(total, hparams["sparsity"]):
            candidates.append((kept, trial.number, trial))
    for _, _, trial in sorted(candidates, key=lambda c: c[:2]):
        try:
            check_parent(Path(trial.user_attrs["model_dir"]), dense_weights)
        except ValueError:
            continue
        return trial
    return None
