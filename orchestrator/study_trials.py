"""The study's trials as its driver knows them, kept in memory so that a finished trial costs the
driver about the same at 10,000 trials as at 100.

Asking Optuna for the study's trials reads the running ones again from the database with all
their attributes (256 of them on a large cluster) and sorts every trial; the driver used to do
that several times per finished trial, and to recompute the front from every COMPLETE trial.
Here the study is read once, when the driver starts, and then one trial at a time: after the
driver asks for it and after it is told. That is exact because the driver is the study's only
writer while it holds the lease (``storage.HeldLease``); ``launch-study replicate`` writes its
own table, and the dashboard only the study's note.

What the driver derives from the trials is kept incrementally beside them: the front
(``frontier.IncrementalFront``, and so the frontier table's change), the parameters already
tried, how many searched trials were asked for, the dense control, the WAITING retries.
"""

from __future__ import annotations

from typing import Any

import optuna
import sqlalchemy as sa
from optuna.trial import FrozenTrial, TrialState

from orchestrator.front_gaps import tried_key
from orchestrator.frontier import IncrementalFront
from orchestrator.records import TrialRecord
from orchestrator.storage import write_trial_user_attrs

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


class StudyTrials:
    """The trials of one study, by number, and what the driver derives from them."""

    def __init__(
        self, storage: optuna.storages.BaseStorage, study_name: str, engine: sa.Engine | None = None
    ) -> None:
        """``storage`` is the study's (Optuna's public storage API: RDB, or in memory in the
        tests); ``engine``, on an RDB storage, writes a trial's attributes in one transaction
        (``storage.write_trial_user_attrs``)."""
        self.storage, self.engine = storage, engine
        self.study_id = storage.get_study_id_from_name(study_name)
        self.by_number: dict[int, FrozenTrial] = {}
        self.front: IncrementalFront[int] = IncrementalFront()
        self.tried: set[frozenset] = set()
        self.searched = 0  # trials asked for but the dense control and retries: the start-up's index
        self.waiting: set[int] = set()  # retries asked for, not yet handed out
        self.complete = self.pruned = 0
        self.control: FrozenTrial | None = None  # the COMPLETE dense control
        for trial in storage.get_all_trials(self.study_id, deepcopy=False):
            self._take(trial)

    def all(self) -> list[FrozenTrial]:
        """Every trial, by number (what a proposer models: it reads them all anyway)."""
        return [self.by_number[n] for n in sorted(self.by_number)]

    def front_trials(self) -> list[FrozenTrial]:
        """The COMPLETE trials on the front, by parameters (``frontier.pareto_front``'s order)."""
        return [self.by_number[n] for n in self.front.items()]

    def read(self, number: int) -> tuple[FrozenTrial, list[int] | None]:
        """Read one trial again (after it was asked for, or told). Returns it and, when it has
        just become COMPLETE, the front trials it pushed off (None: it did not join the front)."""
        trial_id = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)
        return self._take(self.storage.get_trial(trial_id))

    def set_attrs(self, number: int, attrs: dict[str, Any]) -> None:
        """A running trial's user attributes, written together (one transaction on a
        database) and kept here (a trial just asked for is read after, ``read``)."""
        if self.engine is not None:
            write_trial_user_attrs(self.engine, self.study_id, number, attrs)
        else:
            trial_id = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)
            for key, value in attrs.items():
                self.storage.set_trial_user_attr(trial_id, key, value)
        if number in self.by_number:
            self.by_number[number].user_attrs.update(attrs)

    def row(self, number: int) -> dict[str, Any]:
        """A COMPLETE trial's row of the frontier table."""
        return TrialRecord.from_trial(self.by_number[number]).row()

    def _take(self, trial: FrozenTrial) -> tuple[FrozenTrial, list[int] | None]:
        before = self.by_number.get(trial.number)
        self.by_number[trial.number] = trial
        attrs = trial.user_attrs
        if before is None and not attrs.get("dense_control") and "retry_of" not in attrs:
            self.searched += 1
        if trial.state == TrialState.WAITING:
            self.waiting.add(trial.number)
        else:
            self.waiting.discard(trial.number)
        pushed_off = None
        newly = before is None or before.state != trial.state
        if newly and trial.state in FINISHED:
            self.tried.add(tried_key(trial.params))
            if trial.state == TrialState.PRUNED:
                self.pruned += 1
            elif trial.values is not None and len(trial.values) == 2:
                self.complete += 1
                if attrs.get("dense_control"):
                    self.control = trial
                pushed_off = self.front.add(trial.number, (trial.values[0], trial.values[1]))
        return trial, pushed_off
