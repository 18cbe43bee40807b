"""A study in its database: made or found, checked to be this project's (two minimised
objectives, perplexity and parameters), and the folder its trials' models go to."""

from __future__ import annotations

import uuid
import warnings
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from orchestrator.errors import UserError
from orchestrator.records import OBJECTIVES
from orchestrator.storage.store import (
    StudyStore,
    close_store,
    optuna_storage,
    probe_database,
    unconnected_engine,
)
from orchestrator.storage.urls import sqlite_database

DIRECTIONS = (optuna.study.StudyDirection.MINIMIZE, optuna.study.StudyDirection.MINIMIZE)
MODELS_FOLDER_KEY = "models_folder"  # the study user attribute that names it (models_folder below)


def study_exists(store: StudyStore, name: str) -> bool:
    try:
        store.storage.get_study_id_from_name(name)
    except KeyError:
        return False
    return True


def check_objectives(store: StudyStore, name: str, *, to_run: bool = True) -> None:
    """An existing study of this name must have our two objectives, both minimised: a run must
    not add trials to another tool's study, and status or export cannot read one."""
    study_id = store.storage.get_study_id_from_name(name)
    directions = tuple(store.storage.get_study_directions(study_id))
    names = optuna.load_study(study_name=name, storage=store.storage).metric_names
    if directions != DIRECTIONS or (names is not None and tuple(names) != OBJECTIVES):
        shown = ", ".join(names or [d.name.lower() for d in directions])
        what = "already exists" if to_run else "is not headprune's"
        raise UserError(
            f"study {name!r} {what} in {store.safe_url}, with other objectives ({shown}); "
            f"expected {', '.join(OBJECTIVES)} (both minimised)"
            + (": choose another --study-name" if to_run else "")
        )


def create_or_load_study(store: StudyStore, name: str, sampler: optuna.samplers.BaseSampler) -> optuna.Study:
    if study_exists(store, name):
        check_objectives(store, name)
        study = optuna.load_study(study_name=name, storage=store.storage, sampler=sampler)
        if MODELS_FOLDER_KEY not in study.user_attrs and not study.get_trials(deepcopy=False):
            _draw_models_folder(study)  # made by a run stopped before it drew one
        return study
    study = optuna.create_study(
        storage=store.storage, study_name=name, directions=["minimize", "minimize"], sampler=sampler
    )
    with warnings.catch_warnings():  # set_metric_names is "experimental" since Optuna 3.2
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(list(OBJECTIVES))
    _draw_models_folder(study)
    return study


def _draw_models_folder(study: optuna.Study) -> None:
    study.set_user_attr(MODELS_FOLDER_KEY, f"{study.study_name}-{uuid.uuid4().hex[:8]}")


def models_folder(study: optuna.Study) -> str:
    """The folder under ``<artifacts>/trials`` that holds this study's trial models, one
    subfolder per trial number. Its name is the study's with a suffix drawn when the study was
    created: a study of the same name in another database, run with the same ``--artifacts``,
    would otherwise write its trial N over this one's. A study created before December 2026 has
    no suffix and keeps the folder its trials already use."""
    return study.user_attrs.get(MODELS_FOLDER_KEY, study.study_name)


def load_existing_study(store: StudyStore, name: str) -> optuna.Study:
    if not study_exists(store, name):
        raise UserError(f"no study named {name!r} in {store.safe_url}")
    check_objectives(store, name, to_run=False)
    return optuna.load_study(study_name=name, storage=store.storage)


def complete_trials(study: optuna.Study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def check_store(url: str, study_name: str) -> None:
    """What a run checks of its database before it writes anything anywhere (the corpus's
    caches, a new database's tables, WAL mode): the URL parses, the database answers, and a
    study of this name there has this project's objectives. Reads only; an SQLite file that is
    not there yet is left to ``open_store`` to make."""
    database = sqlite_database(url)
    if database and not Path(database).exists():
        unconnected_engine(url, sqlite=True)[0].dispose()  # its options, read without making the file
        return
    engine_kwargs, has_optuna_tables = probe_database(url, create=False)
    if not has_optuna_tables:
        return
    store = StudyStore(url, optuna_storage(url, engine_kwargs, create=False))
    try:
        if study_exists(store, study_name):
            check_objectives(store, study_name)
    finally:  # no connection kept open on a server while the corpus is prepared
        close_store(store)
