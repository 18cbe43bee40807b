"""TPE on the most recent trials, once a study is past a window: an ask that stays cheap at 10,000 trials.

Optuna's TPE rebuilds its two densities from every finished trial at each parameter it
suggests: an ask of the default study's search space cost 18 ms at 100 trials, 53 ms at 1,000
and 158 ms at 3,000 on this machine (``bench.driver`` measures it at 10,000), so in a study of
thousands of trials on a large cluster the sampler, not the workers, would set the pace.

Past ``window`` finished trials the searched trials' points come from a TPE fitted on the most
recent ``window`` of them instead, in an in-memory study kept beside the real one: finished
trials are added to it as they finish, and it is built anew from the last ``window`` once it
holds a quarter more, so an ask costs what it cost at ``window`` to ``1.25 x window`` trials
(a build, 1,000 trials added to a study in memory, comes every ``window / 4`` trials). The
driver enqueues the point whole (every knob of its method), so the study's own sampler samples
nothing. Below the window nothing changes: the study's own TPE, as it always was. Recent trials
rather than a random subset: TPE's densities should follow where the search is now.
"""

from __future__ import annotations

from collections.abc import Callable

import optuna
from optuna.trial import FrozenTrial, TrialState

from orchestrator.proposals import inside, quiet_optuna
from orchestrator.search_space import SearchSpace
from orchestrator.study_trials import StudyTrials


def as_model_trial(trial: FrozenTrial) -> FrozenTrial:
    """A finished trial as the in-memory study holds it: its state, values and parameters."""
    return optuna.trial.create_trial(
        state=trial.state,
        values=trial.values if trial.state == TrialState.COMPLETE else None,
        params=trial.params,
        distributions=trial.distributions,
    )


class RecentTPE:
    """The next searched trial's parameters from TPE on the last ``window`` finished trials, or
    None while the study has no more than ``window`` (its own TPE samples then)."""

    name = "tpe_recent"

    def __init__(
        self, space: SearchSpace, make_sampler: Callable[[int], optuna.samplers.BaseSampler], window: int
    ) -> None:
        self.space, self.make_sampler, self.window = space, make_sampler, window
        self.model: optuna.Study | None = None
        self.added = 0  # finished trials of the study (StudyTrials.finished) in the model so far
        self.held = 0  # trials the model holds, its own asks included
        self.builds = 0

    def __call__(self, trials: StudyTrials) -> dict | None:
        finished = trials.finished
        if len(finished) <= self.window:
            return None
        if self.model is None or self.held >= self.window + self.window // 4:
            self._build(trials, finished[-self.window :])
        else:
            self._add(trials, finished[self.added :])
        self.added = len(finished)
        with quiet_optuna():
            trial = self.model.ask()
            self.space.suggest(trial)
            point = inside(trial.params, trial.distributions)
            self.model.tell(trial, state=TrialState.FAIL)  # its own ask: TPE models no failure
        self.held += 1
        return point

    def _build(self, trials: StudyTrials, numbers: list[int]) -> None:
        with quiet_optuna():
            self.model = optuna.create_study(
                directions=["minimize", "minimize"], sampler=self.make_sampler(self.builds)
            )
        self.builds += 1
        self.held = 0
        self._add(trials, numbers)

    def _add(self, trials: StudyTrials, numbers: list[int]) -> None:
        searched = [t for t in map(trials.trial, numbers) if not t.user_attrs.get("dense_control")]
        self.model.add_trials([as_model_trial(t) for t in searched])
        self.held += len(searched)
