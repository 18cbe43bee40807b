"""The ``trial_replicates`` table: points of the front trained again with other seeds
(``launch-study replicate``), each kept with the setup it was measured under."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import NamedTuple

import sqlalchemy as sa

from orchestrator.storage.schema import Replicate
from orchestrator.storage.store import StudyStore, reading, transaction


class ReplicateResult(NamedTuple):
    val_perplexity: float
    n_params: int  # of the pruned model: a method whose size is not fixed may keep other heads


def record_replicate(
    store: StudyStore,
    study_name: str,
    trial_number: int,
    seed: int,
    result: ReplicateResult,
    cpu_seconds: float,
    setup: str,
) -> None:
    """Keep one replicate's result (one measured again, under another setup, replaces its row)."""
    row = Replicate(
        study_name=study_name,
        trial_number=trial_number,
        seed=seed,
        val_perplexity=result.val_perplexity,
        n_params=result.n_params,
        cpu_seconds=cpu_seconds,
        setup=setup,
        recorded_at=datetime.now(UTC),
    )
    with transaction(store.engine) as session:
        session.merge(row)


def read_replicates(store: StudyStore, study_name: str, setup: str) -> dict[int, dict[int, ReplicateResult]]:
    """trial number -> seed -> result, of the study's replicates measured under ``setup`` (none in
    a database of an earlier version, which has no such table)."""
    if not sa.inspect(store.engine).has_table(Replicate.__tablename__):
        return {}
    found: dict[int, dict[int, ReplicateResult]] = {}
    query = sa.select(Replicate).where(Replicate.study_name == study_name, Replicate.setup == setup)
    with reading(store.engine) as session:
        for row in session.scalars(query):
            found.setdefault(row.trial_number, {})[row.seed] = ReplicateResult(
                row.val_perplexity, row.n_params
            )
    return found
