"""The Pareto front of (val_perplexity, n_params), both minimised."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from itertools import groupby
from typing import Generic, TypeVar

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


class IncrementalFront(Generic[T]):
    """The front of points that arrive one at a time: after each ``add``, ``items()`` holds what
    ``pareto_front`` of every point so far returns (equal points all kept), at a cost of
    O(log n) plus the points pushed off, where ``pareto_front`` sorts everything again. A driver
    ten thousand trials into a study keeps its front this way, and writes only the change.

    Kept as a staircase sorted by (parameters, arrival): parameters ascending, perplexity
    descending, equal points side by side."""

    def __init__(self) -> None:
        self._keys: list[tuple[float, int]] = []  # (params, arrival), for bisection
        self._perplexity: list[float] = []
        self._items: list[T] = []
        self._arrivals = 0

    def __len__(self) -> int:
        return len(self._items)

    def items(self) -> list[T]:
        """The front, by parameters (ascending), equal points in the order they arrived."""
        return list(self._items)

    def add(self, item: T, point: tuple[float, float]) -> list[T] | None:
        """Add ``item`` at ``point`` (perplexity, parameters). Returns None when a point of the
        front dominates it (nothing changes), else the items it pushed off the front."""
        ppl, params = point
        below = bisect.bisect_right(self._keys, (params, float("inf")))
        if below:  # the front point with the most parameters not above this one's: the best such
            best_params, best_ppl = self._keys[below - 1][0], self._perplexity[below - 1]
            if best_ppl < ppl or (best_ppl == ppl and best_params < params):
                return None
        start = bisect.bisect_left(self._keys, (params, -1))
        end = start  # what it dominates: as many parameters or more, and no lower perplexity
        while end < len(self._items) and self._perplexity[end] >= ppl:
            if self._keys[end][0] == params and self._perplexity[end] == ppl:
                break  # an equal point: kept, and so is everything after it
            end += 1
        removed = self._items[start:end]
        del self._keys[start:end], self._perplexity[start:end], self._items[start:end]
        at = bisect.bisect_right(self._keys, (params, self._arrivals))  # after equal points
        self._keys.insert(at, (params, self._arrivals))
        self._perplexity.insert(at, ppl)
        self._items.insert(at, item)
        self._arrivals += 1
        return removed


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
