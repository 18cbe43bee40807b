"""What the driver derives from the study's trials, kept up to date one trial at a time, so
that a finished trial costs it about the same at 10,000 trials as at 100.

The trials themselves are in memory in ``storage.driver.DriverStorage``. Beside them this keeps
what the driver used to recompute from every trial after each one: the front (and so the
frontier table's change, ``frontier.IncrementalFront``), the parameters already tried (gap
fills), how many searched trials were asked for (the start-up's index), the COMPLETE and
PRUNED counts, the dense control, the WAITING retries. The driver calls ``update`` after each
trial it asks for or tells.
"""

from __future__ import annotations

from typing import Any

from optuna.trial import FrozenTrial, TrialState

from orchestrator.front_gaps import tried_key
from orchestrator.frontier import IncrementalFront
from orchestrator.records import TrialRecord
from orchestrator.storage.driver import DriverStorage

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


class StudyTrials:
    """The trials of one study, by number, and what the driver derives from them."""

    def __init__(self, storage: DriverStorage, study_name: str) -> None:
        self.storage = storage
        self.study_id = storage.get_study_id_from_name(study_name)
        self.states: dict[int, TrialState] = {}  # as last seen: a change of state is counted once
        self.front: IncrementalFront[int] = IncrementalFront()
        self.tried: set[frozenset] = set()
        self.searched = 0  # trials asked for but the dense control and retries: the start-up's index
        self.waiting: set[int] = set()  # retries asked for, not yet handed out
        self.complete = self.pruned = 0
        self.finished: list[int] = []  # COMPLETE and PRUNED trials, in the order they finished
        self.control: FrozenTrial | None = None  # the COMPLETE dense control
        for trial in sorted(
            self.all(), key=lambda t: (t.datetime_complete is None, t.datetime_complete or 0, t.number)
        ):
            self._take(trial)  # finished ones in the order they finished

    def all(self) -> list[FrozenTrial]:
        """Every trial, by number (what a proposer models: it reads them all anyway)."""
        return self.storage.get_all_trials(self.study_id, deepcopy=False)

    def trial(self, number: int) -> FrozenTrial:
        """One trial as the storage holds it (not a copy: read it, do not change it)."""
        return self.storage.trial(self.study_id, number)

    def front_trials(self) -> list[FrozenTrial]:
        """The COMPLETE trials on the front, by parameters (``frontier.pareto_front``'s order)."""
        return [self.trial(n) for n in self.front.items()]

    def update(self, number: int) -> tuple[FrozenTrial, list[int] | None]:
        """After a trial was asked for or told: it, and when it has just become COMPLETE, the
        front trials it pushed off (None: it did not join the front)."""
        trial = self.trial(number)
        return trial, self._take(trial)

    def set_attrs(self, number: int, attrs: dict[str, Any]) -> None:
        """A running trial's user attributes, written together (one transaction on a database)."""
        trial_id = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)
        self.storage.set_trial_user_attrs(trial_id, attrs)

    def row(self, number: int) -> dict[str, Any]:
        """A COMPLETE trial's row of the frontier table."""
        return TrialRecord.from_trial(self.trial(number)).row()

    def _take(self, trial: FrozenTrial) -> list[int] | None:
        before = self.states.get(trial.number)
        self.states[trial.number] = trial.state
        attrs = trial.user_attrs
        if before is None and not attrs.get("dense_control") and "retry_of" not in attrs:
            self.searched += 1
        if trial.state == TrialState.WAITING:
            self.waiting.add(trial.number)
        else:
            self.waiting.discard(trial.number)
        if before == trial.state or trial.state not in FINISHED:
            return None
        self.tried.add(tried_key(trial.params))
        self.finished.append(trial.number)
        if trial.state == TrialState.PRUNED:
            self.pruned += 1
            return None
        if trial.values is None or len(trial.values) != 2:
            return None
        self.complete += 1
        if attrs.get("dense_control"):
            self.control = trial
        return self.front.add(trial.number, (trial.values[0], trial.values[1]))
