"""The Pareto CSV: the front of the COMPLETE trials (or every one of them), each point's
perplexity over its seeds (``launch-study replicate``), one column per hyperparameter."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import NamedTuple

import optuna
import pandas as pd
from optuna.trial import FrozenTrial

from orchestrator.errors import UserError
from orchestrator.frontier import pareto_front
from orchestrator.records import (
    RESULT_COLUMNS,
    TrialRecord,
    measured_elsewhere,
    perplexity_ratio,
    references_of,
)
from orchestrator.storage import ReplicateResult, StudyStore, complete_trials, front_rows, read_replicates
from trainers.atomic import write_atomically


def study_table(store: StudyStore, study: optuna.Study, everything: bool = False) -> pd.DataFrame:
    """Rows of the front (default) or of all COMPLETE trials, sorted by n_params, with
    their perplexity over seeds (``seed_columns``); the hyperparameters spread into
    ``params_<name>`` columns."""
    if everything:
        rows = [TrialRecord.from_trial(t).row() for t in complete_trials(study)]
    else:
        rows = front_rows(study)  # from the trials: the table lags them after a driver's crash
    if not rows:
        raise UserError(f"study {study.study_name!r} has no complete trial to export")
    frame = pd.DataFrame(rows)
    params = pd.DataFrame([json.loads(p) for p in frame["params"]]).add_prefix("params_")
    seeds = seed_columns(frame, replicated(store, study))
    frame = pd.concat([frame[list(RESULT_COLUMNS)], seeds, reference_columns(frame, study), params], axis=1)
    return frame.sort_values(["n_params", "val_perplexity", "trial_number"], ignore_index=True)


def reference_columns(frame: pd.DataFrame, study: optuna.Study) -> pd.DataFrame:
    """Per row, its matched dense reference (``launch-study reference``) where one is recorded:
    the dense model's best test and validation perplexity within the point's lineage steps, and
    the point's test perplexity over it (validation where the corpus has no test split)."""
    references = references_of(study)
    if not references:
        return pd.DataFrame(index=frame.index)
    found = [references.get(int(n)) for n in frame["trial_number"]]
    rows = zip(found, frame["test_perplexity"], frame["val_perplexity"], strict=True)
    ratios = [
        None
        if r is None
        else perplexity_ratio(None if pd.isna(t) else t, v, r["test_perplexity"], r["val_perplexity"])
        for r, t, v in rows
    ]
    return pd.DataFrame(
        {
            "reference_test_perplexity": pd.array(
                [r and r["test_perplexity"] for r in found], dtype="Float64"
            ),
            "reference_val_perplexity": pd.array([r and r["val_perplexity"] for r in found], dtype="Float64"),
            "reference_ratio": pd.array(ratios, dtype="Float64"),
        },
        index=frame.index,
    )


class Replicated(NamedTuple):
    """A study's replicates under its current setup, and the trials measured under another."""

    results: dict[int, dict[int, ReplicateResult]]  # trial number -> seed -> result
    elsewhere: set[int]  # records.measured_elsewhere

    @classmethod
    def none(cls) -> Replicated:
        return cls({}, set())


def replicated(store: StudyStore, study: optuna.Study, trials: list[FrozenTrial] | None = None) -> Replicated:
    """What ``launch-study replicate`` recorded for the study under the setup its last run
    measured (``[study] setup``, ``config.setup_digest``); none before a run has stored one.
    ``trials``: the COMPLETE trials whose setup to check (the front, for a driver's note),
    else all of them."""
    setup = study.user_attrs.get("setup")
    if setup is None:
        return Replicated.none()
    checked = complete_trials(study) if trials is None else trials
    return Replicated(read_replicates(store, study.study_name, setup), measured_elsewhere(checked, setup))


def seed_columns(frame: pd.DataFrame, replicates: Replicated) -> pd.DataFrame:
    """Per row: how many seeds measured the point (1 until it is replicated), the mean, lowest and
    highest of their perplexities, and whether the point is still non-dominated among the rows
    when each is taken at its mean (a point on the front by its one seed's luck is not): None
    unless every row has as many seeds, since a mean and one draw do not compare. A replicate
    that kept another number of parameters (a method whose size is not fixed) is another model:
    not counted. A trial measured under another setup (``Replicated.elsewhere``) is taken at its
    replicates alone once it has some (``replicate`` runs it again at the study's seed)."""

    def over_seeds(number: int, ppl: float, params: int) -> list[float]:
        again = [
            r.val_perplexity for r in replicates.results.get(number, {}).values() if r.n_params == params
        ]
        return again if number in replicates.elsewhere and again else [ppl, *again]

    values = [
        over_seeds(number, ppl, params)
        for number, ppl, params in zip(
            frame["trial_number"], frame["val_perplexity"], frame["n_params"], strict=True
        )
    ]
    means = [statistics.fmean(v) for v in values]
    counts = [len(v) for v in values]
    on_front: list[bool | None] = [None] * len(values)
    if len(set(counts)) == 1:
        rows = list(zip(frame.index, means, frame["n_params"], strict=True))
        kept = {i for i, _, _ in pareto_front(rows, key=lambda r: (r[1], r[2]))}
        on_front = [i in kept for i in frame.index]
    return pd.DataFrame(
        {
            "seeds": counts,
            "val_perplexity_mean": means,
            "val_perplexity_min": [min(v) for v in values],
            "val_perplexity_max": [max(v) for v in values],
            "on_front_by_mean": pd.array(on_front, dtype="boolean"),
        },
        index=frame.index,
    )


def trials_over_seeds(trials: list[FrozenTrial], replicates: Replicated) -> pd.DataFrame:
    """``seed_columns`` of COMPLETE trials, with their ``trial_number`` (status, the note)."""
    frame = pd.DataFrame(
        {
            "trial_number": [t.number for t in trials],
            "val_perplexity": [t.values[0] for t in trials],
            "n_params": [t.values[1] for t in trials],
        }
    )
    return pd.concat([frame[["trial_number"]], seed_columns(frame, replicates)], axis=1)


def write_table(frame: pd.DataFrame, output: Path, fmt: str = "csv") -> Path:
    """The table at ``output``, written whole or not at all: a run killed while it writes
    leaves the previous export, not a shorter CSV that reads as a smaller front."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "json":
        write_atomically(output, lambda tmp: tmp.write_text(to_json(frame)))
    else:
        write_atomically(output, lambda tmp: frame.to_csv(tmp, index=False))
    return output


def to_json(frame: pd.DataFrame) -> str:
    """Records with every float at full precision (pandas' own to_json rounds to 10 digits),
    missing values as null and ``heads_per_layer`` a list (a JSON text in the CSV's cell)."""
    records = frame.astype(object).where(frame.notna(), None).to_dict(orient="records")
    for record in records:
        if isinstance(record.get("heads_per_layer"), str):
            record["heads_per_layer"] = json.loads(record["heads_per_layer"])
    return json.dumps(records, indent=2)
