"""Warm starts: a trial prunes the front's next larger model instead of the dense checkpoint.

A sweep runs every size from the dense model, each trial's fine-tuning its only chance to
recover. A study holds what its earlier trials learned: with ``[study] warm_start = true`` a
trial whose method takes a sparsity target starts from the smallest model on the study's front
that keeps more heads than its target, removes the difference and fine-tunes for its own budget
(``trainers.trial.run_trial``'s ``parent``). This is iterative pruning (Michel et al. prune in
rounds; docs/methods.md, warm starts): a point at 75% removed inherits the fine-tuning of the
50% point it came from. Every trial still costs its own budget, and the study's compute counts
every trial, parents included, so a comparison at equal compute stays fair.

A COMPLETE trial records its saved model's location (``model_dir``, under ``--artifacts``, an
object store on a cluster), its weights' digest (``model_sha256``) and the dense weights it was
pruned from (``dense_weights``). On an object store the parent is chosen from the database alone,
and the worker fetches it by that digest (``orchestrator/artifacts.py``); a folder on the
driver's disk is also checked there, and passed over when it is not there or not usable
(``parent_for``).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from optuna.trial import FrozenTrial

from orchestrator.artifacts import is_remote
from orchestrator.front_gaps import heads_kept
from trainers.gates import heads_to_keep
from trainers.hparams import TARGET_METHODS
from trainers.trial import check_parent


def parent_for(
    front: Iterable[FrozenTrial],
    hparams: dict,
    *,
    setup: str | None = None,
    dense_weights: str | None = None,
    remote: bool = False,
) -> FrozenTrial | None:
    """The trial a new one with ``hparams`` starts from: the front's smallest model keeping more
    heads than its target (the fewest heads left to remove) that can be one. None for a method
    without a sparsity target, or when no front point is larger (the trial then prunes the dense
    checkpoint; the dense control is never a parent). A point is passed over, and the next larger
    one tried, when it was measured under another setup than ``setup`` (``config.setup_digest``:
    other budgets, another dense model), or its saved model is not one the trial could start
    from (``usable_parent``). ``front`` is the study's (``front_gaps.distinct``)."""
    if hparams.get("method") not in TARGET_METHODS:
        return None
    candidates = []
    for trial in front:
        folder = trial.user_attrs.get("model_dir")
        if trial.user_attrs.get("dense_control") or "heads_per_layer" not in trial.user_attrs or not folder:
            continue
        if setup is not None and trial.user_attrs.get("setup") != setup:
            continue
        kept, total = heads_kept(trial)
        if kept > heads_to_keep(total, hparams["sparsity"]):
            candidates.append((kept, trial.number, trial))
    for _, _, trial in sorted(candidates, key=lambda c: c[:2]):
        if usable_parent(trial, dense_weights, remote):
            return trial
    return None


def usable_parent(trial: FrozenTrial, dense_weights: str | None, remote: bool = False) -> bool:
    """Whether a trial's saved model can be a parent: pruned from the dense weights whose digest
    is ``dense_weights``, with its kept heads recorded. On an object store the database says it
    all: a trial that recorded its model's digest was stored whole before it became COMPLETE,
    and the worker checks the digest again when it fetches it. A folder on this machine's disk
    is checked there too (``trainers.trial.check_parent``: still there, not cut short, saved by
    a version that recorded its heads). A run on an object store (``remote``) passes over a
    parent saved on a disk, which its workers may not reach."""
    attrs = trial.user_attrs
    if is_remote(attrs["model_dir"]):
        return bool(attrs.get("model_sha256")) and (
            attrs.get("dense_weights") == dense_weights and isinstance(attrs.get("kept_heads"), list)
        )
    if remote:
        return False
    try:
        check_parent(Path(attrs["model_dir"]), dense_weights)
    except ValueError:
        return False
    return True
