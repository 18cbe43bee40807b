"""bench.trial_length: runs of two trial lengths compared at equal compute."""

from __future__ import annotations

import pytest

from bench.trial_length import best_ratio, gather, hypervolume_at, same_size_gains

HEADS = 8
PARAMS = 1000


def point(sparsity: float, ppl: float, seconds: float, method: str = "importance") -> dict:
    return {
        "method": method,
        "sparsity": sparsity,
        "ppl": ppl,
        "params": round(PARAMS * (1 - sparsity / 2)),
        "seconds": seconds,
        "hparams": {"method": method},
    }


def run(arm: str, dense_seconds: float, points: list[dict], budget_minutes: float, dense_ppl=4.0) -> dict:
    dense = point(0.0, dense_ppl, dense_seconds, "dense")
    return {
        "budget_minutes": budget_minutes,
        "seeds": [{"seed": 0, "dense": dense, "arms": {arm: [dense, *points]}}],
    }


# The short run: a dense control of 10 CPU-s, trials of 10 CPU-s, 60 CPU-s of budget.
SHORT = run("importance", 10.0, [point(0.5, 5.0, 10.0), point(0.25, 4.4, 10.0), point(0.75, 6.0, 10.0)], 1.0)
# The long run on a machine twice as slow, trials 2.5x as long: its dense control took 50 CPU-s,
# so with a cost ratio of 2.5 its yardstick (a short dense control there) is 20 CPU-s.
LONG = run("importance:len", 50.0, [point(0.5, 4.5, 50.0), point(0.75, 5.2, 50.0)], 2.0)


def test_cpu_time_is_counted_in_short_dense_controls_of_each_machine():
    seeds, budget = gather([SHORT], [LONG], cost_ratio=2.5)
    assert budget == pytest.approx(min(60 / 10, 120 / 20))  # both 6 short dense controls
    long_points, long_dense = seeds[0]["arms"]["importance:len"]
    assert [p["units"] for p in long_points] == pytest.approx([2.5, 2.5, 2.5])
    assert long_dense["ppl"] == 4.0
    short_points, _ = seeds[0]["arms"]["importance"]
    assert [p["units"] for p in short_points] == pytest.approx([1.0, 1.0, 1.0, 1.0])


def test_an_arm_is_cut_at_the_budget_by_the_trials_that_end_within_it():
    seeds, _ = gather([SHORT], [LONG], cost_ratio=2.5)
    points, dense = seeds[0]["arms"]["importance:len"]
    # 5 units: the dense control and the 50% point end within it, the 75% point (7.5) does not
    assert best_ratio(points, dense, 5.0, 0.5) == pytest.approx(4.5 / 4.0)
    assert best_ratio(points, dense, 5.0, 0.75) is None
    assert hypervolume_at(points, dense, 5.0) < hypervolume_at(points, dense, 7.5)
    # the short arm at 2 units holds only its first trial
    short_points, short_dense = seeds[0]["arms"]["importance"]
    assert best_ratio(short_points, short_dense, 2.0, 0.25) == pytest.approx(5.0 / 4.0)


def test_a_seed_without_every_arm_is_left_out_and_no_seed_at_all_is_an_error():
    other_seed = run("importance:len", 50.0, [point(0.5, 4.5, 50.0)], 2.0)
    other_seed["seeds"][0]["seed"] = 1
    seeds, _ = gather([SHORT], [LONG, other_seed], cost_ratio=2.5)
    assert list(seeds) == [0]
    with pytest.raises(SystemExit):
        gather([SHORT], [other_seed], cost_ratio=2.5)


def test_same_size_gains_pair_the_long_sweeps_point_with_the_short_ones_of_its_head_count():
    seeds, _ = gather([SHORT], [LONG], cost_ratio=2.5)
    gains = same_size_gains(seeds, "importance", "importance:len", HEADS)
    # 50% removed keeps 4 of 8 heads, 75% keeps 2 (band "2"); the 25% point has no long twin
    assert gains["4-10"] == [pytest.approx(100 * (4.5 / 5.0 - 1))]
    assert gains["2"] == [pytest.approx(100 * (5.2 / 6.0 - 1))]
