"""The Pareto front of (val_perplexity, n_params), both minimised."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby
from typing import TypeVar

T = TypeVar("T")


def dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """``a`` is no worse than ``b`` in both objectives and better in one (both minimised)."""
    return a[0] <= b[0] and a[1] <= b[1] and (a[0] < b[0] or a[1] < b[1])


def pareto_front(points: Sequence[T], key=lambda p: p) -> list[T]:
    """The non-dominated points, sorted by (n_params, perplexity).

    ``key(point)`` gives (perplexity, n_params). A point is dominated when another is no worse in
    both and better in one; equal points are all kept. One sort and one sweep: O(n log n).
    """
    ordered = sorted(points, key=lambda p: (key(p)[1], key(p)[0]))
    front: list[T] = []
    best_smaller = float("inf")  # lowest perplexity among strictly fewer parameters
    for _, group in groupby(ordered, key=lambda p: key(p)[1]):
        group = list(group)
        lowest = key(group[0])[0]
        if lowest < best_smaller:
            front.extend(p for p in group if key(p)[0] == lowest)
        best_smaller = min(best_smaller, lowest)
    return front


def hypervolume(points: Sequence[tuple[float, float]], reference: tuple[float, float]) -> float:
    """Area dominated by ``points`` (perplexity, params), both minimised, bounded by ``reference``.

    Points outside the reference box add nothing. A sweep over the front sorted by params.
    """
    inside = [p for p in points if p[0] < reference[0] and p[1] < reference[1]]
    area, ceiling = 0.0, reference[0]
    for ppl, params in sorted(pareto_front(inside), key=lambda p: (p[1], p[0])):
        if ppl < ceiling:
            area += (ceiling - ppl) * (reference[1] - params)
            ceiling = ppl
    return area
