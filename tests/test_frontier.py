import random

import pytest

from orchestrator.frontier import pareto_front


def brute_force(points):
    def dominated(p):
        return any(q[0] <= p[0] and q[1] <= p[1] and q != p for q in points)

    return sorted((p for p in points if not dominated(p)), key=lambda p: (p[1], p[0]))


@pytest.mark.parametrize("seed", range(30))
def test_front_equals_brute_force_with_ties(seed):
    rng = random.Random(seed)
    # Few distinct values so ties in either objective (and duplicates) are common.
    points = [(rng.choice([4.0, 4.5, 5.0, 5.5, 6.0]), rng.choice([100, 200, 300, 400])) for _ in range(25)]
    assert pareto_front(points) == brute_force(points)


def test_front_of_points_on_a_curve_is_all_of_them():
    points = [(5.0 + i, 1000 - 100 * i) for i in range(6)]
    assert sorted(pareto_front(points)) == sorted(points)


def test_empty():
    assert pareto_front([]) == []
