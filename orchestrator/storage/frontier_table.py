"""The ``pareto_frontier`` table: kept equal to the non-dominated set of a study's COMPLETE
trials, for those who read the front with SQL rather than through Optuna."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import optuna
import sqlalchemy as sa

from orchestrator.frontier import pareto_front
from orchestrator.records import RESULT_COLUMNS, TrialRecord
from orchestrator.storage.schema import ParetoPoint
from orchestrator.storage.store import StudyStore, reading, transaction
from orchestrator.storage.studies import complete_trials

FRONTIER_COLUMNS = (*RESULT_COLUMNS, "params", "updated_at")


def front_rows(study: optuna.Study) -> list[dict[str, Any]]:
    """The front of the study's COMPLETE trials, as rows of the frontier table. What reads the
    front (export, replicate) computes it here rather than reading the table, which lags the
    trials when a driver was killed, or a database call failed, between a tell and the refresh."""
    return pareto_front(
        [TrialRecord.from_trial(t).row() for t in complete_trials(study)],
        key=lambda r: (r["val_perplexity"], r["n_params"]),
    )


def refresh_frontier(store: StudyStore, study: optuna.Study) -> list[dict[str, Any]]:
    """Replace the study's frontier rows by the front recomputed from all COMPLETE trials."""
    rows = front_rows(study)
    now = datetime.now(UTC)
    with transaction(store.engine) as session:
        session.execute(sa.delete(ParetoPoint).where(ParetoPoint.study_name == study.study_name))
        session.add_all(ParetoPoint(study_name=study.study_name, updated_at=now, **r) for r in rows)
    return rows


def change_frontier(
    store: StudyStore, study_name: str, added: list[dict[str, Any]], removed: list[int]
) -> None:
    """The frontier table as a change: a trial that joined the front (its row) and the ones it
    pushed off (their numbers), in one transaction; what ``refresh_frontier`` would leave, at a
    cost that does not grow with the study (``study_trials.StudyTrials`` keeps the front)."""
    now = datetime.now(UTC)
    with transaction(store.engine) as session:
        if removed:
            session.execute(
                sa.delete(ParetoPoint).where(
                    ParetoPoint.study_name == study_name, ParetoPoint.trial_number.in_(removed)
                )
            )
        session.add_all(ParetoPoint(study_name=study_name, updated_at=now, **r) for r in added)


def read_frontier(store: StudyStore, study_name: str) -> list[dict[str, Any]]:
    """The study's rows of the frontier table (none in a database no run has written)."""
    if not sa.inspect(store.engine).has_table(ParetoPoint.__tablename__):
        return []
    with reading(store.engine) as session:
        points = session.scalars(
            sa.select(ParetoPoint)
            .where(ParetoPoint.study_name == study_name)
            .order_by(ParetoPoint.n_params, ParetoPoint.val_perplexity, ParetoPoint.trial_number)
        ).all()
        return [{c: getattr(p, c) for c in FRONTIER_COLUMNS} for p in points]
