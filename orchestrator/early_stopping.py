"""Pareto-aware early stopping: asynchronous successive halving on both objectives, in Ray Tune.

Neither Optuna (its pruners rank one objective; ``trial.report`` raises in a multi-objective
study) nor Ray Tune (ASHA ranks one metric) stops trials of a multi-objective search, and ranking
perplexity alone would stop every small model, the cheap end of the front. This is MO-ASHA
(Schmucker et al. 2021, asynchronous successive halving with multi-objective ranks), adapted:

- A trial reports the validation perplexity of its pruned model at *rungs*, fractions of the
  fine-tuning budget (``min_fraction``, x ``reduction_factor``, ... below 1: 1/9 and 1/3 by
  default) counted in weight updates since the trial began (``trainers.trial.run_trial``), so
  every method has trained its weights as long at a rung. Its parameter count is fixed once its
  heads are removed.
- At a rung, its point (perplexity there, parameters) joins those of every trial that reached
  the rung before (stopping-based, as Tune's ASHA: no trial waits for others), and the points are
  ordered by non-dominated rank, then, within a rank, by the hypervolume that point alone adds
  (its exclusive contribution: a point that barely improves on its neighbours ranks low, and the
  ends of each front rank first, so what goes on stays spread). The trial goes on when it is
  among the top ceil(n / reduction_factor) of that order, or when it is on the rung's front
  (rank 0; with ``margin`` above 0, also when no point at least as small beats its perplexity
  by more than that fraction). The second rule departs from MO-ASHA, which stops front points
  too when the front is larger than the top 1/eta: here a point's parameter count is set by its
  sparsity target, so a front point is the best seen at its size, and stopping it leaves a hole
  that only a new trial of that size could fill. What is stopped is what is dominated: some
  trial at least as small is already better. The cheap end of the front is never starved (it is
  always rank 0).
- The dense control is not a candidate: it is never stopped and not in the pools.
- A trial whose perplexity at a rung is not finite (it diverged) is stopped, and its point is
  not pooled. A trial that ends failed (an error, a non-finite final score) leaves the pools: its
  points would go on stopping others. A trial decided at a rung once is not judged there again
  (a worker Tune restarts reports its rungs anew), as in Tune's own ASHA.

``ParetoHalving`` is the decision alone (plain data, tested on synthetic curves);
``ParetoHalvingScheduler`` is the Tune scheduler around it.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from orchestrator.frontier import dominates

RUNG_KEY = "rung"  # in a trial's intermediate results: the index of the rung it reached

Point = tuple[float, float]  # (perplexity at the rung, parameters): both minimised


def nondominated_ranks(points: Sequence[Point]) -> list[int]:
    """Rank 0 for the non-dominated points, 1 for those dominated only by rank 0, and so on."""
    ranks = [-1] * len(points)
    left = set(range(len(points)))
    rank = 0
    while left:
        front = {i for i in left if not any(dominates(points[j], points[i]) for j in left if j != i)}
        for i in front:
            ranks[i] = rank
        left -= front
        rank += 1
    return ranks


def exclusive_contributions(points: Sequence[Point]) -> list[float]:
    """Hypervolume each point of one front (mutually non-dominated) alone adds: with the front
    sorted by parameters, (next one's params - its params) x (previous one's ppl - its ppl).
    The two ends get infinity: no reference point needed, and the ends are always kept."""
    order = sorted(range(len(points)), key=lambda i: (points[i][1], -points[i][0]))
    contribution = [math.inf] * len(points)
    for position in range(1, len(order) - 1):
        before, here, after = (points[order[position + k]] for k in (-1, 0, 1))
        contribution[order[position]] = (after[1] - here[1]) * (before[0] - here[0])
    return contribution


def pareto_order(points: Sequence[Point]) -> list[int]:
    """Indices from best to worst: by non-dominated rank, then by exclusive contribution (larger
    first), then fewer parameters (ties between the two ends go to the cheap one)."""
    ranks = nondominated_ranks(points)
    contribution = [0.0] * len(points)
    for rank in set(ranks):
        members = [i for i in range(len(points)) if ranks[i] == rank]
        for i, value in zip(members, exclusive_contributions([points[i] for i in members])):
            contribution[i] = value
    return sorted(range(len(points)), key=lambda i: (ranks[i], -contribution[i], points[i][1]))


class ParetoHalving:
    """The points each trial reached at each rung, and the decision when one arrives."""

    def __init__(self, n_rungs: int, reduction_factor: float, margin: float = 0.0) -> None:
        self.reduction_factor = reduction_factor
        self.margin = margin
        self.pools: list[dict[Hashable, Point]] = [{} for _ in range(n_rungs)]
        self.passed: list[set[Hashable]] = [set() for _ in range(n_rungs)]

    def record(self, rung: int, key: Hashable, point: Point) -> None:
        """A point measured earlier (a resumed study's finished trials), without a decision; a
        diverged one (not finite) is not pooled."""
        if math.isfinite(point[0]):
            self.pools[rung][key] = (float(point[0]), float(point[1]))

    def forget(self, key: Hashable) -> None:
        """A trial that failed: its points no longer count (its retry reports its own)."""
        for pool, passed in zip(self.pools, self.passed, strict=True):
            pool.pop(key, None)
            passed.discard(key)

    def decide(self, rung: int, key: Hashable, point: Point) -> bool:
        """Record ``key``'s point at ``rung``; True when the trial goes on, False to stop it."""
        if not math.isfinite(point[0]):
            return False  # diverged: nothing dominates NaN, and it would rank on the front
        self.record(rung, key, point)
        if key in self.passed[rung]:
            return True  # a restarted worker reporting a rung it passed: decided already
        if self._goes_on(rung, key):
            self.passed[rung].add(key)
            return True
        return False

    def _goes_on(self, rung: int, key: Hashable) -> bool:
        keys = list(self.pools[rung])
        points = [self.pools[rung][k] for k in keys]
        mine = keys.index(key)
        if not self.dominated_beyond_margin(points[mine], [p for k, p in zip(keys, points) if k != key]):
            return True  # the best seen at its size, or within the margin of it: no hole in the front
        keep = math.ceil(len(points) / self.reduction_factor)
        return pareto_order(points).index(mine) < keep

    def dominated_beyond_margin(self, point: Point, others: Sequence[Point]) -> bool:
        """Some other point is at least as small and better, with its perplexity raised by the
        margin (relative) first. Margin 0: plain dominance, so only the rung's front is safe.
        A margin above 0 keeps a trial whose rung perplexity is within the rung's own noise of a
        point at least as small (``[early_stopping] margin``, README)."""
        return any(dominates((ppl * (1 + self.margin), params), point) for ppl, params in others)


class ParetoHalvingScheduler(FIFOScheduler):
    """Ray Tune's side: a result carrying ``RUNG_KEY`` is a rung report; the trial continues or
    stops on ``ParetoHalving``'s word. Trials are keyed by their Optuna trial number."""

    def __init__(self, halving: ParetoHalving) -> None:
        super().__init__()
        self.halving = halving

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        rung = result.get(RUNG_KEY)
        if rung is None or trial.config["hparams"]["method"] == "dense":
            return TrialScheduler.CONTINUE
        point = (result["val_perplexity"], result["n_params"])
        keep = self.halving.decide(int(rung), trial.config["optuna_trial"], point)
        return TrialScheduler.CONTINUE if keep else TrialScheduler.STOP

    def on_trial_complete(self, tune_controller, trial, result: dict) -> None:
        """A trial that ended without a score it stands by (a reported error, or a non-finite
        final perplexity or size: the driver tells it FAIL) leaves the pools, as a resumed run
        would not pool it. One stopped at a rung (PRUNED) keeps its finite rung points, as a
        resumed run pools them."""
        final = result or {}
        if RUNG_KEY in final:
            return
        if not all(math.isfinite(final.get(k, math.nan)) for k in ("val_perplexity", "n_params")):
            self.halving.forget(trial.config.get("optuna_trial"))

    def on_trial_error(self, tune_controller, trial) -> None:
        self.halving.forget(trial.config.get("optuna_trial"))
