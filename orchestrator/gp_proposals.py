"""Gaussian-process proposals: ``[study] sampler = "gp"``.

Optuna's ``GPSampler`` fits a Gaussian process to each objective and, for two objectives, picks
the point of largest expected hypervolume improvement: it aims at the figure a front is judged
by. It runs on the study's searched trials, without the dense control (``proposals``): the
COMPLETE ones, which the process is fitted to, the stopped ones at their rung
(``proposals.as_modelled``), and the RUNNING ones, which the acquisition spreads away from.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from orchestrator.proposals import (
    as_running,
    inside,
    modelled_trials,
    quiet_optuna,
    searched_trials,
    shared_space,
)

# Fewer modelled trials than this and the study's own sampler chooses: a process fitted
# to one point says nothing about where to go.
MIN_MODELLED = 2


class GPProposer:
    """Proposes the next trial's shared parameters from the trials so far (one per run: the
    sampler's random state and its fitted kernels carry over from one proposal to the next)."""

    name = "gp"  # what a trial it proposed records as ``proposed_by`` (the sampler's name)

    def __init__(self, seed: int) -> None:
        # n_startup_trials=0: the study's start-up sweep is the GP's initial design.
        # Trials are noisy (one seed's batches; BENCHMARKS.md, seed noise): the GP fits the noise.
        self.sampler = optuna.samplers.GPSampler(seed=seed, n_startup_trials=0)

    def __call__(self, trials: Iterable[FrozenTrial]) -> dict[str, Any] | None:
        """The parameters for the next trial, or None (too few trials to model, or nothing
        they share to search): the study's sampler then chooses all of them."""
        searched = searched_trials(trials)
        modelled = modelled_trials(searched)
        if len(modelled) < MIN_MODELLED:
            return None
        running = [t for t in searched if t.state == TrialState.RUNNING and t.params]
        with quiet_optuna():
            shadow = optuna.create_study(directions=["minimize", "minimize"], sampler=self.sampler)
            shadow.add_trials(modelled)
            shared = shared_space(modelled)
            if not shared:
                return None
            for trial in running:  # after the intersection, which counts finished trials only
                if shared.keys() <= trial.params.keys():
                    shadow.add_trial(as_running(trial))
            proposed = shadow.ask(fixed_distributions=shared).params
        return inside(proposed, shared)
