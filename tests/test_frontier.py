import random

import pytest

from orchestrator.frontier import hypervolume, pareto_front


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


def grid_hypervolume(points, reference, n=400):
    """Brute force: the share of a fine grid over the reference box that some point dominates."""
    (rx, ry) = reference
    lo_x = min([p[0] for p in points] + [rx]) - 1e-9
    lo_y = min([p[1] for p in points] + [ry]) - 1e-9
    dx, dy = (rx - lo_x) / n, (ry - lo_y) / n
    count = 0
    for i in range(n):
        for j in range(n):
            x, y = lo_x + (i + 0.5) * dx, lo_y + (j + 0.5) * dy
            count += any(p[0] <= x and p[1] <= y for p in points)
    return count * dx * dy


@pytest.mark.parametrize("seed", range(5))
def test_hypervolume_matches_a_grid_estimate(seed):
    rng = random.Random(seed)
    points = [(rng.uniform(1, 3), rng.uniform(0, 1)) for _ in range(8)] + [(5.0, 0.1)]  # one outside
    exact = hypervolume(points, (4.0, 1.0))
    assert exact == pytest.approx(grid_hypervolume(points, (4.0, 1.0)), rel=0.02)


def test_hypervolume_of_one_point_is_its_box():
    assert hypervolume([(1.0, 0.25)], (2.0, 1.0)) == pytest.approx(0.75)
