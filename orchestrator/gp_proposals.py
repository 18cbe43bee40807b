"""Gaussian-process proposals: ``[study] sampler = "gp"``.

Optuna's ``GPSampler`` fits a Gaussian process to each objective and, for two objectives, picks
the point of largest expected hypervolume improvement: it aims at the figure a front is judged
by. But it models only the parameters that every COMPLETE trial of a study shares (Optuna's
intersection search space), and the dense control (trial 0) has none, so inside the study it
would sample every trial at random.

So the proposal is made in a throwaway in-memory study that holds the study's trials but the
dense control: the COMPLETE ones, which the process is fitted to, and the RUNNING ones, which
the acquisition spreads away from. A trial stopped early (PRUNED) is modelled at the perplexity
it was stopped at, capped at the worst final one: the scheduler stopped it because trials as
small did better at that rung, and a process that never saw it would propose the same losing
region again (Optuna's TPE, likewise, ranks a stopped trial below every COMPLETE one). The
parameters every modelled trial shares (the default study: method, sparsity, lr, distill) come
from the GP; the study enqueues them for its next trial, and its own sampler (TPE, per
parameter) chooses what they leave out, the knobs of one method only (a gate method's gate
learning rate and schedule). Public Optuna API throughout.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, FloatDistribution
from optuna.search_space import IntersectionSearchSpace
from optuna.trial import FrozenTrial, TrialState

# Fewer modelled trials than this and the study's own sampler chooses: a process fitted
# to one point says nothing about where to go.
MIN_MODELLED = 2


@contextmanager
def _quiet_optuna() -> Iterator[None]:
    """The throwaway study would log "A new study created in memory" at every proposal."""
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(verbosity)


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
        searched = [t for t in trials if not t.user_attrs.get("dense_control")]
        complete = [t for t in searched if t.state == TrialState.COMPLETE and t.values is not None]
        worst = max((t.values[0] for t in complete), default=None)
        modelled = complete + [s for s in (as_modelled(t, worst) for t in searched) if s is not None]
        if len(modelled) < MIN_MODELLED:
            return None
        running = [t for t in searched if t.state == TrialState.RUNNING and t.params]
        with _quiet_optuna():
            shadow = optuna.create_study(directions=["minimize", "minimize"], sampler=self.sampler)
            shadow.add_trials(modelled)
            shared = {
                name: distribution
                for name, distribution in IntersectionSearchSpace().calculate(shadow).items()
                if not distribution.single()
            }
            if not shared:
                return None
            for trial in running:  # after the intersection, which counts finished trials only
                if shared.keys() <= trial.params.keys():
                    shadow.add_trial(_as_running(trial))
            proposed = shadow.ask(fixed_distributions=shared).params
        return {name: _inside(value, shared[name]) for name, value in proposed.items()}


def _inside(value: Any, distribution: BaseDistribution) -> Any:
    """A float the process put a rounding error outside its range (exp(log(1e-3)) can be
    1.0000000000000002e-3) back on its bound: an enqueued value outside its range warns."""
    if isinstance(distribution, FloatDistribution):
        return min(max(value, distribution.low), distribution.high)
    return value


def as_modelled(trial: FrozenTrial, worst: float | None) -> FrozenTrial | None:
    """A trial stopped at a rung as the process sees it: COMPLETE at the rung's perplexity and
    its size (``StudyDriver.note_rung`` records both), but no worse than the worst COMPLETE
    trial's (``worst``): a rung's perplexity, part-way through fine-tuning, can be far above
    any final one and would move the hypervolume's reference point out with it (on a synthetic
    front the process then proposed the smallest model again and again). None for a trial not
    stopped, or stopped before a rung was recorded."""
    rung_ppl, n_params = trial.user_attrs.get("rung_val_perplexity"), trial.user_attrs.get("n_params")
    if trial.state != TrialState.PRUNED or rung_ppl is None or n_params is None or worst is None:
        return None
    return optuna.trial.create_trial(
        values=[min(rung_ppl, worst), n_params], params=trial.params, distributions=trial.distributions
    )


def _as_running(trial: FrozenTrial) -> FrozenTrial:
    """A copy of a running trial that an in-memory study accepts (its params and their
    distributions; nothing the sampler does not read)."""
    return optuna.trial.create_trial(
        state=TrialState.RUNNING, params=trial.params, distributions=trial.distributions
    )
