"""What a proposer (``[study] sampler = "gp"`` or ``"nsga2"``) sees of a study: its searched trials.

Optuna's GP and NSGA-II samplers model only the parameters that every COMPLETE trial of a
study shares (Optuna's intersection search space), and the dense control (trial 0) has none, so
inside the study they would sample every trial at random. A proposer therefore works in a
throwaway in-memory study that holds the study's trials but the dense control, and the study
enqueues its proposal for the next trial; the study's own sampler (TPE, per parameter) chooses
what the proposal leaves out, the knobs of one method only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, FloatDistribution
from optuna.search_space import intersection_search_space
from optuna.trial import FrozenTrial, TrialState


@contextmanager
def quiet_optuna() -> Iterator[None]:
    """A throwaway study would log "A new study created in memory" at every proposal."""
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(verbosity)


def searched_trials(trials: Iterable[FrozenTrial]) -> list[FrozenTrial]:
    """Every trial but the dense control, in the order they were asked."""
    return sorted((t for t in trials if not t.user_attrs.get("dense_control")), key=lambda t: t.number)


def modelled_trials(searched: list[FrozenTrial]) -> list[FrozenTrial]:
    """The trials a proposer learns from, COMPLETE, in the order they were asked: the finished
    ones, and the ones stopped at a rung as ``as_modelled`` puts them."""

    def finished(trial: FrozenTrial) -> bool:
        return trial.state == TrialState.COMPLETE and trial.values is not None

    worst = max((t.values[0] for t in searched if finished(t)), default=None)
    modelled = [t if finished(t) else as_modelled(t, worst) for t in searched]
    return [t for t in modelled if t is not None]


def as_modelled(trial: FrozenTrial, worst: float | None) -> FrozenTrial | None:
    """A trial stopped at a rung as a proposer sees it: COMPLETE at the rung's perplexity and
    its size (``StudyDriver.note_rung`` records both), but no worse than the worst COMPLETE
    trial's (``worst``). The scheduler stopped it because trials as small did better at that
    rung, and a proposer that never saw it would propose the same losing region again (Optuna's
    TPE, likewise, ranks a stopped trial below every COMPLETE one). The cap: a rung's perplexity,
    part-way through fine-tuning, can be far above any final one and would move the
    hypervolume's reference point out with it (on a synthetic front the GP then proposed the
    smallest model again and again). None for a trial not stopped, or stopped before a rung was
    recorded."""
    rung_ppl, n_params = trial.user_attrs.get("rung_val_perplexity"), trial.user_attrs.get("n_params")
    if trial.state != TrialState.PRUNED or rung_ppl is None or n_params is None or worst is None:
        return None
    return optuna.trial.create_trial(
        values=[min(rung_ppl, worst), n_params], params=trial.params, distributions=trial.distributions
    )


def shared_space(modelled: list[FrozenTrial]) -> dict[str, BaseDistribution]:
    """The parameters every modelled trial has, with more than one value possible: what a
    proposal chooses (the default study: method, sparsity, lr, distill)."""
    return {
        name: distribution
        for name, distribution in intersection_search_space(modelled).items()
        if not distribution.single()
    }


def inside(params: dict[str, Any], space: dict[str, BaseDistribution]) -> dict[str, Any]:
    """Floats a sampler put a rounding error outside their range (exp(log(1e-3)) can be
    1.0000000000000002e-3) back on their bound: an enqueued value outside its range warns."""
    return {name: _clamped(value, space[name]) for name, value in params.items()}


def _clamped(value: Any, distribution: BaseDistribution) -> Any:
    if isinstance(distribution, FloatDistribution):
        return min(max(value, distribution.low), distribution.high)
    return value


def as_running(trial: FrozenTrial) -> FrozenTrial:
    """A copy of a running trial that an in-memory study accepts (its params and their
    distributions; nothing the samplers read besides)."""
    return optuna.trial.create_trial(
        state=TrialState.RUNNING, params=trial.params, distributions=trial.distributions
    )
