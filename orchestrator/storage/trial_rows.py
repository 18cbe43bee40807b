"""Rows of Optuna's own tables that its storage API writes or reads one call at a time, written
or read here at once, in its schema (what optuna-dashboard and every Optuna version read). Only
``driver.DriverStorage`` uses these."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from optuna.distributions import BaseDistribution, distribution_to_json

from orchestrator.storage.store import reading, transaction


def write_trial_rows(
    engine: sa.Engine,
    trial_id: int,
    attrs: dict[str, Any],
    params: list[tuple[str, float, BaseDistribution]] = (),
) -> None:
    """A running trial's user attributes and parameters (name, internal value, distribution) in
    one transaction. Optuna's storage commits each ``set_user_attr`` and each parameter on its
    own, a transaction of three statements per key (a finished trial had 40 statements), and
    has no call that writes several; this writes the same rows of its schema
    (``trial_user_attributes``: one JSON value per key; ``trial_params``: the internal value and
    the distribution's JSON; what optuna-dashboard and every Optuna version read) at once. The
    caller (``driver.DriverStorage``) has checked the trial runs and each distribution
    agrees with the study's, as Optuna does."""
    tables = _optuna_tables(engine)
    user_attrs, trial_params = tables["trial_user_attributes"], tables["trial_params"]
    with transaction(engine) as session:
        if attrs:
            session.execute(
                sa.delete(user_attrs).where(
                    user_attrs.c.trial_id == trial_id, user_attrs.c.key.in_(list(attrs))
                )
            )
            session.execute(
                sa.insert(user_attrs),
                [{"trial_id": trial_id, "key": k, "value_json": json.dumps(v)} for k, v in attrs.items()],
            )
        if params:
            session.execute(
                sa.insert(trial_params),
                [
                    {
                        "trial_id": trial_id,
                        "param_name": name,
                        "param_value": value,
                        "distribution_json": distribution_to_json(distribution),
                    }
                    for name, value, distribution in params
                ],
            )


def trial_times(engine: sa.Engine, trial_id: int) -> tuple[int, datetime | None, datetime | None]:
    """A trial's number and the start and end times the storage set (one row, one query)."""
    trials = _optuna_tables(engine)["trials"]
    query = sa.select(trials.c.number, trials.c.datetime_start, trials.c.datetime_complete).where(
        trials.c.trial_id == trial_id
    )
    with reading(engine) as session:
        return tuple(session.execute(query).one())


def trial_ids(engine: sa.Engine, study_id: int) -> dict[int, int]:
    """Trial number -> trial id of every trial of a study, in one query (Optuna's storage has
    a call per trial)."""
    trials = _optuna_tables(engine)["trials"]
    query = sa.select(trials.c.number, trials.c.trial_id).where(trials.c.study_id == study_id)
    with reading(engine) as session:
        return {number: trial_id for number, trial_id in session.execute(query)}


_OPTUNA_TABLES: dict[str, dict[str, sa.Table]] = {}


def _optuna_tables(engine: sa.Engine) -> dict[str, sa.Table]:
    """Optuna's ``trials``, ``trial_user_attributes`` and ``trial_params`` tables, read from the
    database once per engine (their columns are Optuna's schema, whose version ``RDBStorage``
    checks when it opens the database)."""
    key = str(engine.url)
    if key not in _OPTUNA_TABLES:
        metadata = sa.MetaData()
        names = ("trials", "trial_user_attributes", "trial_params")
        _OPTUNA_TABLES[key] = {name: sa.Table(name, metadata, autoload_with=engine) for name in names}
    return _OPTUNA_TABLES[key]
