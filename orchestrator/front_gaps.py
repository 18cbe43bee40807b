"""Gap-filling trials: after the start-up, some trials go where the front is thinnest.

A sweep spends its trials on an even spread of sparsity, wherever the front is flat or steep; a
sampler spends them on settings it has not tried. Neither aims at the hypervolume, which grows
most where the staircase of the front has its largest step: two neighbouring front points far
apart in parameters *and* in perplexity. A gap-filling trial goes to the middle of that step
(in heads kept) with the settings of the front point at its smaller end, the configuration known
to work at that size, so it is the front's own best guess run one size over. The sampler's
trials in between keep exploring (``[study] gap_fill_every``; BENCHMARKS.md has the comparison).
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from typing import Any

from optuna.trial import FrozenTrial

from orchestrator.frontier import pareto_front


def front_of(trials: Iterable[FrozenTrial]) -> list[FrozenTrial]:
    """COMPLETE trials no other beats on both objectives (perplexity, parameters), largest first."""
    done = [t for t in trials if t.values is not None and len(t.values) == 2]
    return distinct(pareto_front(done, key=lambda t: t.values))


def distinct(front: Iterable[FrozenTrial]) -> list[FrozenTrial]:
    """The front's trials, one per (perplexity, parameters), the latest (repeats add no area),
    largest first: what a gap fill and a warm start choose from."""
    unique: dict[tuple[float, ...], FrozenTrial] = {}
    for trial in front:
        point = tuple(trial.values)
        if point not in unique or unique[point].number < trial.number:
            unique[point] = trial
    return sorted(unique.values(), key=lambda t: -t.values[1])


def tried_key(params: dict[str, Any]) -> frozenset:
    """A trial's parameters as a set member (``gap_fill_point``'s ``tried``)."""
    return frozenset(params.items())


def heads_kept(trial: FrozenTrial) -> tuple[int, int]:
    """(heads kept, heads in the model) of a COMPLETE trial, from what it recorded."""
    kept = sum(trial.user_attrs["heads_per_layer"])
    return kept, round(kept / (1.0 - trial.user_attrs["sparsity"]))


def gap_fill_point(
    front: list[FrozenTrial],
    tried: Container[frozenset],
    running_sparsities: Iterable[float],
    low: float,
    high: float,
) -> dict[str, Any] | None:
    """The parameters of the next gap-filling trial, or None when no gap has a size between its
    ends (adjacent head counts) that the sparsity range ``[low, high]`` allows.

    The gap is the largest rectangle (parameters x perplexity) between neighbouring front points
    with no running trial's target inside it; the target keeps the mean of the ends' heads; the
    rest is the smaller end's parameters as sampled (its method and its knobs), so the sampler
    models the trial like any other. The dense control has none: a gap next to it only ends there.
    A gap whose fill was already tried (stopped early, or finished off the front) is passed over:
    a trial is deterministic in its parameters, so asking it again would repeat its result.
    ``front`` is ``distinct``'s; ``tried`` holds the finished trials' parameters (``tried_key``).
    """
    front = [t for t in front if "heads_per_layer" in t.user_attrs]
    if len(front) < 2:
        return None
    total = heads_kept(front[0])[1]
    running = [round((1.0 - s) * total) for s in running_sparsities]
    best, best_area = None, 0.0
    for big, small in zip(front, front[1:]):
        (kept_big, _), (kept_small, _) = heads_kept(big), heads_kept(small)
        if "method" not in small.params or kept_big - kept_small < 2:
            continue  # a trial not sampled (the dense control), or no size in between
        if any(kept_small < k < kept_big for k in running):
            continue  # a trial already on its way there
        kept = (kept_big + kept_small + 1) // 2  # the middle, the larger of two
        sparsity = min(high, max(low, 1.0 - kept / total))
        if not kept_small < round((1.0 - sparsity) * total) < kept_big:
            continue  # the range does not reach inside the gap
        point = {**small.params, "sparsity": sparsity}
        if tried_key(point) in tried:
            continue  # this fill ran already and did not close the gap
        area = (big.values[1] - small.values[1]) * (small.values[0] - big.values[0])
        if area > best_area:
            best, best_area = point, area
    return best
