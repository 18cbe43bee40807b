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

import bisect
import math
from collections.abc import Hashable, Sequence

from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from orchestrator.frontier import dominates
from trainers.pruning.registry import removes_heads

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


def goes_on_batch(points: Sequence[Point], mine: int, reduction_factor: float, margin: float) -> bool:
    """The decision for ``points[mine]`` from the whole rung, written plainly (quadratic): it goes
    on when no other point at least as small beats it with its perplexity raised by ``margin``
    first, or when it is among the top ceil(n / reduction_factor) of ``pareto_order``. With
    margin 0 the first is plain dominance, so the rung's front is safe; above 0 a trial within
    the rung's own noise of a point at least as small is kept too (``[early_stopping] margin``).
    ``ParetoHalving`` decides the same from ``RungRanking`` (the tests hold it to this)."""
    others = [p for i, p in enumerate(points) if i != mine]
    if not any(dominates((ppl * (1 + margin), params), points[mine]) for ppl, params in others):
        return True
    return pareto_order(points).index(mine) < math.ceil(len(points) / reduction_factor)


class RungRanking:
    """The points of one rung, kept in non-dominated ranks as they arrive, so that a decision
    costs about the same with 10,000 points as with 100 (``pareto_order`` sorts them all anew:
    quadratic in the rank count). It answers what ``pareto_order`` would, exactly: a trial's
    position in that order, and whether a point at least as small beats it by a margin.

    Each rank is a staircase (parameters ascending, perplexity descending) of entries
    ``(params, -ppl, seq, key)``; ``seq`` is the order keys first arrived, which breaks ties as
    ``pareto_order``'s stable sort does. Ranks nest: whatever dominates a point in rank k+1 has a
    dominator in rank k, so a new point's rank is found by bisection over the ranks. A new point
    at rank r pushes the points it dominates there down one rank, and those push the points they
    dominate further, the only ranks that change (2-D dynamic non-dominated sorting). A point
    replaced or forgotten (rare: a restarted worker, a failed trial) rebuilds the rung."""

    def __init__(self) -> None:
        self.ranks: list[list[tuple[float, float, int, Hashable]]] = []
        self.where: dict[Hashable, int] = {}  # key -> its rank
        self.points: dict[Hashable, Point] = {}  # in the order keys first arrived
        self.seq: dict[Hashable, int] = {}

    def __len__(self) -> int:
        return len(self.points)

    def add(self, key: Hashable, point: Point) -> None:
        if key in self.points:
            self.points[key] = point  # keeps its place in the arrival order, as a dict does
            self._rebuild()
            return
        self.seq[key] = len(self.seq)
        self.points[key] = point
        self._insert([self._entry(key)], self._rank_for(point))

    def remove(self, key: Hashable) -> None:
        if self.points.pop(key, None) is not None:
            self._rebuild()

    def _entry(self, key: Hashable) -> tuple[float, float, int, Hashable]:
        ppl, params = self.points[key]
        return (params, -ppl, self.seq[key], key)

    def _rebuild(self) -> None:
        """Every point again, by parameters then perplexity: none dominates one placed before it,
        so nothing is pushed down."""
        self.ranks, self.where = [], {}
        for key in sorted(self.points, key=lambda k: (self.points[k][1], self.points[k][0])):
            self._insert([self._entry(key)], self._rank_for(self.points[key]))

    @staticmethod
    def _dominated_by(staircase: list, point: Point, margin: float = 0.0) -> bool:
        """Some entry of a staircase dominates ``point``, its perplexity raised by ``margin``
        (relative) first: the one with the most parameters not above the point's has the lowest
        perplexity of those that could."""
        i = bisect.bisect_right(staircase, (point[1], math.inf))
        if not i:
            return False
        best_params, best_ppl = staircase[i - 1][0], -staircase[i - 1][1]
        return dominates((best_ppl * (1 + margin), best_params), point)

    def _rank_for(self, point: Point) -> int:
        low, high = 0, len(self.ranks)  # the first rank that does not dominate the point
        while low < high:
            middle = (low + high) // 2
            if self._dominated_by(self.ranks[middle], point):
                low = middle + 1
            else:
                high = middle
        return low

    def _insert(self, arriving: list, rank: int) -> None:
        while arriving:
            if rank == len(self.ranks):
                self.ranks.append([])
            staircase = self.ranks[rank]
            arriving.sort()
            pushed = [e for e in staircase if self._dominated_by(arriving, (-e[1], e[0]))]
            if pushed:
                gone = {e[3] for e in pushed}
                staircase[:] = [e for e in staircase if e[3] not in gone]
            for entry in arriving:
                bisect.insort(staircase, entry)
                self.where[entry[3]] = rank
            arriving, rank = pushed, rank + 1

    def position(self, key: Hashable) -> int:
        """Where ``pareto_order`` of the rung's points puts ``key`` (0: first)."""
        rank = self.where[key]
        ahead = sum(len(self.ranks[r]) for r in range(rank))
        staircase = self.ranks[rank]
        contribution = [math.inf] * len(staircase)
        for i in range(1, len(staircase) - 1):
            before, here, after = staircase[i - 1], staircase[i], staircase[i + 1]
            contribution[i] = (after[0] - here[0]) * (-before[1] - -here[1])
        order = [(-contribution[i], e[0], e[2]) for i, e in enumerate(staircase)]
        mine = order[next(i for i, e in enumerate(staircase) if e[3] == key)]
        return ahead + sum(o < mine for o in order)

    def beaten_by_margin(self, key: Hashable, margin: float) -> bool:
        """Another point at least as small is better, its perplexity raised by ``margin``
        (relative) first (``goes_on_batch``, the rule written plainly). Only the rung's front
        can: whatever beats the point, a front point at least as good in both does too."""
        others = [e for e in self.ranks[0] if e[3] != key]
        return self._dominated_by(others, self.points[key], margin)


class ParetoHalving:
    """The points each trial reached at each rung, and the decision when one arrives."""

    def __init__(self, n_rungs: int, reduction_factor: float, margin: float = 0.0) -> None:
        if margin < 0:
            raise ValueError(f"margin must be at least 0, got {margin}")
        self.reduction_factor = reduction_factor
        self.margin = margin
        self.rankings = [RungRanking() for _ in range(n_rungs)]
        self.passed: list[set[Hashable]] = [set() for _ in range(n_rungs)]

    @property
    def pools(self) -> list[dict[Hashable, Point]]:
        """Each rung's points by trial key."""
        return [dict(ranking.points) for ranking in self.rankings]

    def record(self, rung: int, key: Hashable, point: Point) -> None:
        """A point measured earlier (a resumed study's finished trials), without a decision; a
        diverged one (not finite) is not pooled."""
        if math.isfinite(point[0]):
            self.rankings[rung].add(key, (float(point[0]), float(point[1])))

    def forget(self, key: Hashable) -> None:
        """A trial that failed: its points no longer count (its retry reports its own)."""
        for ranking, passed in zip(self.rankings, self.passed, strict=True):
            ranking.remove(key)
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
        ranking = self.rankings[rung]
        if not ranking.beaten_by_margin(key, self.margin):
            return True  # the best seen at its size, or within the margin of it: no hole in the front
        keep = math.ceil(len(ranking) / self.reduction_factor)
        return ranking.position(key) < keep


class ParetoHalvingScheduler(FIFOScheduler):
    """Ray Tune's side: a result carrying ``RUNG_KEY`` is a rung report; the trial continues or
    stops on ``ParetoHalving``'s word. Trials are keyed by their Optuna trial number."""

    def __init__(self, halving: ParetoHalving) -> None:
        super().__init__()
        self.halving = halving

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        rung = result.get(RUNG_KEY)
        if rung is None or not removes_heads(trial.config["hparams"]["method"]):
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
