"""The Pareto CSV: the frontier table (or every COMPLETE trial), one column per hyperparameter."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pandas as pd

from orchestrator.errors import UserError
from orchestrator.records import RESULT_COLUMNS, TrialRecord
from orchestrator.storage import StudyStore, complete_trials, read_frontier


def study_table(store: StudyStore, study: optuna.Study, everything: bool = False) -> pd.DataFrame:
    """Rows of the frontier table (default) or of all COMPLETE trials, sorted by n_params; the
    hyperparameters spread into ``params_<name>`` columns."""
    if everything:
        rows = [TrialRecord.from_trial(t).row() for t in complete_trials(study)]
    else:
        rows = read_frontier(store, study.study_name)
    if not rows:
        raise UserError(f"study {study.study_name!r} has no complete trial to export")
    frame = pd.DataFrame(rows)
    params = pd.DataFrame([json.loads(p) for p in frame["params"]]).add_prefix("params_")
    frame = pd.concat([frame[list(RESULT_COLUMNS)], params], axis=1)
    return frame.sort_values(["n_params", "val_perplexity", "trial_number"], ignore_index=True)


def write_table(frame: pd.DataFrame, output: Path, fmt: str = "csv") -> Path:
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "json":
        output.write_text(to_json(frame))
    else:
        frame.to_csv(output, index=False)
    return output


def to_json(frame: pd.DataFrame) -> str:
    """Records with every float at full precision (pandas' own to_json rounds to 10 digits),
    missing values as null and ``heads_per_layer`` a list (a JSON text in the CSV's cell)."""
    records = frame.astype(object).where(frame.notna(), None).to_dict(orient="records")
    for record in records:
        if isinstance(record.get("heads_per_layer"), str):
            record["heads_per_layer"] = json.loads(record["heads_per_layer"])
    return json.dumps(records, indent=2)
