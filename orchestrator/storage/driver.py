"""The study's storage as its driver uses it: the database underneath, every trial also in memory.

Optuna wraps a database storage in a cache that keeps finished trials but reads every running
trial again, with all its attributes, on each ``get_trials``; its TPE sampler calls that once
per parameter it suggests. With 256 trials in flight an ask read 256 trials six times over, and
cost more than everything else the driver does. This storage reads the study once and then
never again: every write to a trial goes through it (the driver is the study's only writer
while it holds the lease, ``storage.lease.HeldLease``), so it applies each write to its copy as it
passes it to the database. A change of state (asked, told) reads back one row, for the times
the storage set. On a database, a trial's parameters wait in memory for its next write, and
go in that write's transaction (``trial_rows.write_trial_rows``): an ask writes its trial's
parameters and attributes at once, where Optuna commits each on its own.

It is an ``optuna.storages.BaseStorage`` (Optuna's public storage interface): the study, its
sampler, ``optuna.artifacts`` and optuna-dashboard's note go through it unchanged. It adds
``set_trial_user_attrs``, several attributes of a running trial in one transaction
(``trial_rows.write_trial_rows``).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Container, Sequence
from typing import Any

import optuna
import sqlalchemy as sa
from optuna.distributions import BaseDistribution
from optuna.storages import BaseStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from orchestrator.storage.trial_rows import trial_ids, trial_times, write_trial_rows


class DriverStorage(BaseStorage):
    """``backend`` (Optuna's RDB storage, or its in-memory one in the tests) with its trials
    kept here; ``engine``, on a database, for the writes and reads Optuna has no call for."""

    def __init__(self, backend: BaseStorage, engine: sa.Engine | None = None) -> None:
        self.backend, self.engine = backend, engine
        self._lock = threading.RLock()  # the lease's heartbeat and Tune's threads may call in
        self._studies: dict[int, list[FrozenTrial]] = {}  # study id -> its trials, by number
        self._trial: dict[int, FrozenTrial] = {}  # trial id -> trial
        self._ids: dict[int, tuple[int, int]] = {}  # trial id -> (study id, number)
        self._number_ids: dict[tuple[int, int], int] = {}
        self._unwritten: dict[int, list[tuple[str, float, BaseDistribution]]] = {}  # trial id -> params
        self._distributions: dict[tuple[int, str], BaseDistribution] = {}  # (study id, name) -> first seen

    # The study: what Optuna's storage holds, read and written there.

    def create_new_study(self, directions: Sequence[StudyDirection], study_name: str | None = None) -> int:
        return self.backend.create_new_study(directions, study_name)

    def delete_study(self, study_id: int) -> None:
        self.backend.delete_study(study_id)

    def set_study_user_attr(self, study_id: int, key: str, value: Any) -> None:
        self.backend.set_study_user_attr(study_id, key, value)

    def set_study_system_attr(self, study_id: int, key: str, value: Any) -> None:
        self.backend.set_study_system_attr(study_id, key, value)

    def get_study_id_from_name(self, study_name: str) -> int:
        return self.backend.get_study_id_from_name(study_name)

    def get_study_name_from_id(self, study_id: int) -> str:
        return self.backend.get_study_name_from_id(study_id)

    def get_study_directions(self, study_id: int) -> list[StudyDirection]:
        return self.backend.get_study_directions(study_id)

    def get_study_user_attrs(self, study_id: int) -> dict[str, Any]:
        return self.backend.get_study_user_attrs(study_id)

    def get_study_system_attrs(self, study_id: int) -> dict[str, Any]:
        return self.backend.get_study_system_attrs(study_id)

    def get_all_studies(self) -> list[optuna.study.FrozenStudy]:
        return self.backend.get_all_studies()

    # Its trials: written through, read from memory.

    def _load(self, study_id: int) -> list[FrozenTrial]:
        """The study's trials, read from the backend the first time (one query for their ids
        on a database)."""
        if study_id not in self._studies:
            trials = self.backend.get_all_trials(study_id, deepcopy=False)
            if self.engine is not None:
                ids = trial_ids(self.engine, study_id)
            else:
                ids = {
                    t.number: self.backend.get_trial_id_from_study_id_trial_number(study_id, t.number)
                    for t in trials
                }
            self._studies[study_id] = []
            for trial in sorted(trials, key=lambda t: t.number):
                self._keep(study_id, ids[trial.number], trial)
        return self._studies[study_id]

    def _keep(self, study_id: int, trial_id: int, trial: FrozenTrial) -> None:
        trials = self._studies[study_id]
        if trial.number == len(trials):
            trials.append(trial)
        elif trial.number < len(trials):
            trials[trial.number] = trial
        else:  # Optuna numbers a study's trials 0, 1, 2, ... as they are made, all by this driver
            raise RuntimeError(
                f"trial {trial.number} of study {study_id} appeared after trial {len(trials) - 1}: "
                "another process made trials in the study its driver holds"
            )
        self._trial[trial_id] = trial
        self._ids[trial_id] = (study_id, trial.number)
        self._number_ids[(study_id, trial.number)] = trial_id
        for name, distribution in trial.distributions.items():
            self._distributions.setdefault((study_id, name), distribution)

    def _reread(self, trial_id: int, state: TrialState, values: Sequence[float] | None) -> None:
        """After a change of state: on a database one row, for the times it set (the rest is
        what was written); else the whole trial."""
        trial = self._trial[trial_id]
        if self.engine is None:
            trial = self.backend.get_trial(trial_id)
        else:
            _, trial.datetime_start, trial.datetime_complete = trial_times(self.engine, trial_id)
            trial.state = state
            if values is not None:
                trial.values = list(values)
        self._keep(self._ids[trial_id][0], trial_id, trial)

    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        with self._lock:
            self._load(study_id)
            trial_id = self.backend.create_new_trial(study_id, template_trial)
            if self.engine is None:
                self._keep(study_id, trial_id, self.backend.get_trial(trial_id))
                return trial_id
            number, start, complete = trial_times(self.engine, trial_id)
            template = template_trial or optuna.trial.create_trial(state=TrialState.RUNNING)
            # What the storage copied from the template (as Optuna's own storage builds it)
            trial = optuna.trial.FrozenTrial(
                number,
                template.state,
                None,
                start,
                complete,
                copy.deepcopy(template.params),
                copy.deepcopy(template.distributions),
                copy.deepcopy(template.user_attrs),
                copy.deepcopy(template.system_attrs),
                copy.deepcopy(template.intermediate_values),
                trial_id,
                values=template.values,
            )
            self._keep(study_id, trial_id, trial)
            return trial_id

    def _flush(self, trial_id: int, attrs: dict[str, Any] | None = None) -> None:
        """Write a trial's parameters waiting in memory, with ``attrs``, in one transaction."""
        params = self._unwritten.pop(trial_id, [])
        if params or attrs:
            write_trial_rows(self.engine, trial_id, attrs or {}, params)

    def set_trial_param(
        self, trial_id: int, param_name: str, param_value_internal: float, distribution: BaseDistribution
    ) -> None:
        with self._lock:
            trial = self._trial[trial_id]
            study_id = self._ids[trial_id][0]
            self.check_trial_is_updatable(trial_id, trial.state)
            known = self._distributions.setdefault((study_id, param_name), distribution)
            optuna.distributions.check_distribution_compatibility(known, distribution)
            if self.engine is None:
                self.backend.set_trial_param(trial_id, param_name, param_value_internal, distribution)
            else:
                self._unwritten.setdefault(trial_id, []).append(
                    (param_name, param_value_internal, distribution)
                )
            trial.params = {**trial.params, param_name: distribution.to_external_repr(param_value_internal)}
            trial.distributions = {**trial.distributions, param_name: distribution}

    def get_trial_id_from_study_id_trial_number(self, study_id: int, trial_number: int) -> int:
        with self._lock:
            self._load(study_id)
            try:
                return self._number_ids[(study_id, trial_number)]
            except KeyError:
                raise KeyError(f"no trial {trial_number} in study {study_id}") from None

    def set_trial_state_values(
        self, trial_id: int, state: TrialState, values: Sequence[float] | None = None
    ) -> bool:
        with self._lock:
            if self.engine is not None:
                self._flush(trial_id)
            changed = self.backend.set_trial_state_values(trial_id, state, values)
            if changed:
                self._reread(trial_id, state, values)
            else:  # another process changed it (a WAITING trial taken): as the database has it
                self._keep(self._ids[trial_id][0], trial_id, self.backend.get_trial(trial_id))
            return changed

    def set_trial_intermediate_value(self, trial_id: int, step: int, intermediate_value: float) -> None:
        with self._lock:
            if self.engine is not None:
                self._flush(trial_id)
            self.backend.set_trial_intermediate_value(trial_id, step, intermediate_value)
            trial = self._trial[trial_id]
            trial.intermediate_values = {**trial.intermediate_values, step: intermediate_value}

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        self.set_trial_user_attrs(trial_id, {key: value})

    def set_trial_user_attrs(self, trial_id: int, attrs: dict[str, Any]) -> None:
        """Several user attributes of a running trial: one transaction on a database."""
        with self._lock:
            self.check_trial_is_updatable(trial_id, self._trial[trial_id].state)
            if self.engine is not None:
                self._flush(trial_id, attrs)
            else:
                for key, value in attrs.items():
                    self.backend.set_trial_user_attr(trial_id, key, value)
            self._trial[trial_id].user_attrs.update(copy.deepcopy(attrs))

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        with self._lock:
            if self.engine is not None:
                self._flush(trial_id)
            self.backend.set_trial_system_attr(trial_id, key, value)
            self._trial[trial_id].system_attrs[key] = copy.deepcopy(value)

    def get_trial(self, trial_id: int) -> FrozenTrial:
        with self._lock:
            if trial_id not in self._trial:  # of a study this storage has not loaded
                return self.backend.get_trial(trial_id)
            return copy.deepcopy(self._trial[trial_id])

    def trial(self, study_id: int, number: int) -> FrozenTrial:
        """One trial as kept here, not a copy (``study_trials.StudyTrials`` reads it)."""
        with self._lock:
            return self._load(study_id)[number]

    def get_all_trials(
        self, study_id: int, deepcopy: bool = True, states: Container[TrialState] | None = None
    ) -> list[FrozenTrial]:
        with self._lock:
            trials = self._load(study_id)
            found = trials if states is None else [t for t in trials if t.state in states]
            return copy.deepcopy(found) if deepcopy else list(found)
