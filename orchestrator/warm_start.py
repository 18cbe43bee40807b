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
cluster those folders must be on storage every node sees; a parent whose folder the driver
cannot see is passed over, and the trial starts from the dense model.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from optuna.trial import FrozenTrial

from orchestrator.front_gaps import front_of, heads_kept
from trainers.export import CONFIG
from trainers.gates import heads_to_keep
from trainers.hparams import TARGET_METHODS


def parent_for(trials: Iterable[FrozenTrial], hparams: dict) -> FrozenTrial | None:
    """The trial a new one with ``hparams`` starts from: the front's smallest model keeping more
    heads than its target (the fewest heads left to remove), whose saved model is on disk. None
    for a method without a sparsity target, or when no front point is larger (the trial then
    prunes the dense checkpoint; the dense control is never a parent)."""
    if hparams.get("method") not in TARGET_METHODS:
        return None
    candidates = []
    for trial in front_of(trials):
        folder = trial.user_attrs.get("model_dir")
        if trial.user_attrs.get("dense_control") or "heads_per_layer" not in trial.user_attrs or not folder:
            continue
        kept, total = heads_kept(trial)
        if kept > heads_to_keep(total, hparams["sparsity"]) and (Path(folder) / CONFIG).is_file():
            candidates.append((kept, trial.number, trial))
    return min(candidates, key=lambda c: c[:2])[2] if candidates else None
