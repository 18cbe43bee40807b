"""bench.trial_length: runs of two trial lengths compared at equal compute."""

from __future__ import annotations

import argparse
import re

import pytest

from bench.trial_length import best_ratio, cut, gather, same_size_gains, sweep_pairs, trial_steps

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


def run(arm, dense_seconds, points, budget_minutes, dense_ppl=4.0, seed=0) -> dict:
    dense = point(0.0, dense_ppl, dense_seconds, "dense")
    return {
        "budget_minutes": budget_minutes,
        "cpus_per_trial": 1,
        "seeds": [{"seed": seed, "dense": dense, "arms": {arm: [dense, *points]}}],
    }


# The short run: a dense control of 10 CPU-s, trials of 10 CPU-s, 60 CPU-s of budget.
SHORT = run(
    "importance:distilled", 10.0, [point(0.5, 5.0, 10.0), point(0.25, 4.4, 10.0), point(0.75, 6.0, 10.0)], 1.0
)
# The long run on a machine twice as slow, trials 2.5x as long: its dense control took 50 CPU-s,
# so with a cost ratio of 2.5 its yardstick (a short dense control there) is 20 CPU-s. Its
# dense control ends a little worse (4.1): the longer trial drifts from the checkpoint.
LONG = run("importance:len400", 50.0, [point(0.5, 4.5, 50.0), point(0.75, 5.2, 50.0)], 3.0, dense_ppl=4.1)


def test_cpu_time_is_counted_in_short_dense_controls_of_each_machine():
    seeds, budget = gather([SHORT], [LONG], cost_ratio=2.5)
    assert budget == pytest.approx(60 / 10)  # the long run's 180 CPU-s are 9 units: the short's 6 is smaller
    long_points, long_dense = seeds[0]["arms"]["importance:len400"]
    assert [p["seconds"] for p in long_points] == pytest.approx([2.5, 2.5, 2.5])
    assert long_dense["ppl"] == 4.1  # its own
    assert seeds[0]["short_dense"]["ppl"] == 4.0
    short_points, _ = seeds[0]["arms"]["importance:distilled"]
    assert [p["seconds"] for p in short_points] == pytest.approx([1.0, 1.0, 1.0, 1.0])


def test_a_cost_ratio_of_one_still_tells_short_runs_from_long():
    seeds, _ = gather([SHORT], [LONG], cost_ratio=1.0)
    assert seeds[0]["short_dense"]["ppl"] == 4.0


def test_the_yardstick_is_the_median_dense_control_of_one_length_and_machines_are_not_mixed():
    other_seed = run("importance:distilled", 11.0, [point(0.5, 5.1, 11.0)], 1.0, seed=1)
    seeds, _ = gather([SHORT, other_seed, run("importance:distilled", 12.0, [], 1.0, seed=2)], [], 2.5)
    # median 11 CPU-s: seed 0's 10-second trials are 10/11 of a unit, not one
    assert seeds[0]["arms"]["importance:distilled"][0][1]["seconds"] == pytest.approx(10 / 11)
    slower = run("importance:distilled", 16.0, [], 1.0, seed=1)
    with pytest.raises(SystemExit, match="different speeds"):
        gather([SHORT, slower], [], 2.5)


def test_budget_is_the_smallest_among_the_seeds_compared_and_a_seed_lacking_an_arm_is_left_out():
    tiny = run("importance:len400", 50.0, [point(0.5, 4.5, 50.0)], 0.1, seed=1)  # no short run at seed 1
    seeds, budget = gather([SHORT], [LONG, tiny], cost_ratio=2.5)
    assert list(seeds) == [0]
    assert budget == pytest.approx(6.0)  # seed 1's 0.3 units do not cut seed 0
    with pytest.raises(SystemExit, match="no seed"):
        gather([SHORT], [tiny], cost_ratio=2.5)


def test_an_arm_is_cut_by_trials_started_or_ended_within_the_budget():
    seeds, _ = gather([SHORT], [LONG], cost_ratio=2.5)
    points, dense = seeds[0]["arms"]["importance:len400"]
    # at 6 units: the dense control ends at 2.5, the 50% point at 5.0, the 75% point at 7.5
    started, ended = cut(points, 6.0, "started"), cut(points, 6.0, "ended")
    assert len(started) == 3 and len(ended) == 2
    assert best_ratio(ended, dense, 0.75) is None
    assert best_ratio(started, dense, 0.75) == pytest.approx(5.2 / 4.1)


def test_best_ratio_passes_over_trials_stopped_early():
    stopped = {"method": "pruned", "seconds": 1.0}
    assert best_ratio([stopped, point(0.5, 5.0, 1.0)], {"ppl": 4.0}, 0.5) == pytest.approx(1.25)
    assert best_ratio([stopped], {"ppl": 4.0}, 0.5) is None


def test_only_the_same_sweep_pairs_across_lengths():
    short = ["importance:distilled", "random", "searched:halfstart"]
    long = ["importance:len400", "searched:len400", "topk:len400"]
    assert sweep_pairs(short, long) == [("importance:distilled", "importance:len400")]


def test_same_size_gains_pair_the_long_sweeps_point_with_the_short_ones_of_its_head_count():
    seeds, _ = gather([SHORT], [LONG], cost_ratio=2.5)
    gains = same_size_gains(seeds, "importance:distilled", "importance:len400", HEADS)
    # 50% removed keeps 4 of 8 heads, 75% keeps 2 (band "2"); the 25% point has no long twin;
    # the perplexities as measured (the same tokens), not over their dense controls
    assert gains["4-10"] == [pytest.approx(100 * (4.5 / 5.0 - 1))]
    assert gains["2"] == [pytest.approx(100 * (5.2 / 6.0 - 1))]


def test_a_trial_length_is_read_as_gate_plus_fine_tuning_steps():
    assert trial_steps("100+700") == (100, 700)
    assert trial_steps("0+150") == (0, 150)
    for bad in ("100", "100+", "a+b", "100+0", "-1+300"):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(repr(bad))):
            trial_steps(bad)
