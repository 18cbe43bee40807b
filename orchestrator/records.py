"""A finished trial's record, in one place: what a COMPLETE trial keeps in Optuna (its two
objectives as values, the rest of the worker's ``TrialResult`` as user attributes) and how the
frontier table, the CSV and the reports read it back.

The user attributes are the ``TrialResult`` fields but the objectives, so a field added to the
result is recorded without touching this file; the row is what the frontier table and every
export show.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from trainers.trial import TrialResult

OBJECTIVES = ("val_perplexity", "n_params")
RESULT_ATTRS = tuple(f.name for f in fields(TrialResult) if f.name not in OBJECTIVES)


def result_attrs(outcome: dict[str, Any]) -> dict[str, Any]:
    """What a COMPLETE trial keeps of a worker's result (``TrialResult.to_dict()``) as user
    attributes: all but its objectives (the values it is told)."""
    return {key: outcome[key] for key in RESULT_ATTRS}


@dataclass(frozen=True)
class TrialRecord:
    """A COMPLETE trial as the frontier table and the exports show it."""

    trial_number: int
    # The test split's perplexity, selected on by nothing (trainers/data.py): first, as the figure
    # to report. None: a study whose corpus has no test split, or a trial of an earlier version.
    test_perplexity: float | None
    val_perplexity: float  # what the study selects on
    bits_per_byte: float | None  # None: a trial of an earlier version, which did not measure it
    n_params: int
    n_params_nonembed: int
    sparsity: float
    heads_per_layer: list[int]
    method: str
    lineage_steps: int | None  # weight updates since the dense model, warm-start parents' included
    hparams: dict[str, Any]

    @classmethod
    def from_trial(cls, trial: FrozenTrial) -> TrialRecord:
        attrs = trial.user_attrs
        return cls(
            trial_number=trial.number,
            test_perplexity=attrs.get("test_perplexity"),
            val_perplexity=trial.values[0],
            bits_per_byte=attrs.get("bits_per_byte"),
            n_params=int(trial.values[1]),
            n_params_nonembed=int(attrs["n_params_nonembed"]),
            sparsity=float(attrs["sparsity"]),
            heads_per_layer=list(attrs["heads_per_layer"]),
            method=attrs["method"],
            lineage_steps=attrs.get("lineage_steps"),
            hparams=dict(attrs["hparams"]),
        )

    def row(self) -> dict[str, Any]:
        """The frontier table's columns (lists and the hyperparameters as JSON text)."""
        return {
            "trial_number": self.trial_number,
            "test_perplexity": self.test_perplexity,
            "val_perplexity": self.val_perplexity,
            "bits_per_byte": self.bits_per_byte,
            "n_params": self.n_params,
            "n_params_nonembed": self.n_params_nonembed,
            "sparsity": self.sparsity,
            "heads_per_layer": json.dumps(self.heads_per_layer),
            "method": self.method,
            "lineage_steps": self.lineage_steps,
            "params": json.dumps(self.hparams, sort_keys=True),
        }


def on_one_split(
    test: float | None, val: float, their_test: float | None, their_val: float
) -> tuple[str, float, float]:
    """Two results' perplexities to compare, and the split they are on: the test split where
    both have one (nothing selected on it), else validation (a corpus, or a study made before,
    without a test split); never one split against the other."""
    if test is not None and their_test is not None:
        return "test", test, their_test
    return "validation", val, their_val


def perplexity_ratio(test: float | None, val: float, their_test: float | None, their_val: float) -> float:
    """One result's perplexity over another's, on one split (``on_one_split``)."""
    _, mine, theirs = on_one_split(test, val, their_test, their_val)
    return mine / theirs


# The study's user attribute holding its matched dense references (``launch-study reference``,
# orchestrator/references.py): {"setup": digest, "eval_every": n, "points": {trial number:
# trainers.reference.ReferenceScore.to_dict()}}.
REFERENCES_ATTR = "matched_references"


def references_of(study) -> dict[int, dict]:
    """The matched references recorded for the study's trials under its current setup (those
    recorded before a run with other trial settings measured other points: none)."""
    recorded = study.user_attrs.get(REFERENCES_ATTR) or {}
    if recorded.get("setup") != study.user_attrs.get("setup"):
        return {}
    return {int(number): score for number, score in recorded.get("points", {}).items()}


# What every export shows first, in this order; the hyperparameters follow, one column each.
RESULT_COLUMNS = tuple(f.name for f in fields(TrialRecord) if f.name != "hparams")


def measured_elsewhere(trials: list[FrozenTrial], setup: str) -> set[int]:
    """The trials whose own result was measured under another setup than ``setup``
    (``config.setup_digest``; a study resumed with other trial settings): their own value does
    not average with replicates of this one, so ``replicate`` measures them again at the study's
    seed. A trial of a version before trials recorded their setup counts as this setup's."""
    return {t.number for t in trials if t.user_attrs.get("setup", setup) != setup}


def dense_control(trials: list[FrozenTrial]) -> FrozenTrial | None:
    """The study's COMPLETE dense control (trial 0, nothing sampled): the reference of every ratio."""
    return next(
        (t for t in trials if t.user_attrs.get("dense_control") and t.state == TrialState.COMPLETE), None
    )
