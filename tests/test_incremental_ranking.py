"""The driver's incremental front and rung rankings against their batch versions, after every
step of random insertion orders, ties and duplicates included (issue 45)."""

from __future__ import annotations

import random

import pytest

from orchestrator.early_stopping import ParetoHalving, goes_on_batch, pareto_order
from orchestrator.frontier import IncrementalFront, pareto_front


def random_points(rng: random.Random, n: int) -> list[tuple[float, float]]:
    """Points on a coarse grid, so that equal perplexities, equal sizes and equal points recur."""
    return [(float(rng.randint(1, 12)), float(rng.randint(1, 12) * 1000)) for _ in range(n)]


@pytest.mark.parametrize("seed", range(10))
def test_incremental_front_equals_the_batch_front_after_every_step(seed):
    rng = random.Random(seed)
    points = random_points(rng, 120)
    front: IncrementalFront[int] = IncrementalFront()
    for n, point in enumerate(points):
        before = set(front.items())
        removed = front.add(n, point)
        expected = pareto_front(list(range(n + 1)), key=lambda i: points[i])
        assert front.items() == expected  # the same items in the same order
        if removed is None:
            assert set(front.items()) == before
        else:
            assert set(removed) == before - set(front.items())


@pytest.mark.parametrize("margin", [0.0, 0.1])
@pytest.mark.parametrize("seed", range(6))
def test_rung_decisions_and_order_equal_the_batch_ones_after_every_step(seed, margin):
    rng = random.Random(seed)
    halving = ParetoHalving(n_rungs=1, reduction_factor=3, margin=margin)
    pool: dict[int, tuple[float, float]] = {}
    for _ in range(150):
        action = rng.random()
        if action < 0.08 and pool:  # a failed trial leaves the pools
            key = rng.choice(list(pool))
            halving.forget(key)
            del pool[key]
        elif action < 0.15 and pool:  # a restarted worker reports its rung again, another point
            key, point = rng.choice(list(pool)), random_points(rng, 1)[0]
            halving.record(0, key, point)
            pool[key] = point
        else:
            key, point = rng.randrange(10_000), random_points(rng, 1)[0]
            if key in pool:
                continue
            pool[key] = point
            keys, points = list(pool), list(pool.values())
            expected = goes_on_batch(points, keys.index(key), 3, margin)
            assert halving.decide(0, key, point) == expected
        keys, points = list(pool), list(pool.values())
        ranking = halving.rankings[0]
        assert halving.pools[0] == pool
        order = pareto_order(points)
        assert [ranking.position(k) for k in keys] == [order.index(i) for i in range(len(keys))]
