"""``bench.frontier``'s account of an arm as its budget is spent: the hypervolume of the trials
that ran within a part of the budget, in the order they ran, stopped trials' CPU included."""

from __future__ import annotations

import pytest

from bench.frontier import hypervolume_within, merge_seeds, summarise
from orchestrator.report import normalised_hypervolume

DENSE = {"method": "dense", "sparsity": 0.0, "ppl": 4.0, "params": 1000, "seconds": 40.0}


def trial(ppl: float, params: int, seconds: float) -> dict:
    return {
        "method": "importance",
        "sparsity": 1 - params / 1000,
        "ppl": ppl,
        "params": params,
        "seconds": seconds,
    }


STOPPED = {"method": "pruned", "seconds": 10.0}  # stopped early: compute spent, no point
ARM = [DENSE, trial(5.0, 500, 40.0), STOPPED, trial(4.4, 700, 40.0), trial(4.2, 800, 40.0)]


def hypervolume_of(*points: dict) -> float:
    return normalised_hypervolume([(p["ppl"], p["params"]) for p in points], (DENSE["ppl"], DENSE["params"]))


def test_only_the_trials_that_ran_within_the_seconds_count() -> None:
    assert hypervolume_within(ARM, DENSE, 40.0) == pytest.approx(hypervolume_of(DENSE))
    assert hypervolume_within(ARM, DENSE, 80.0) == pytest.approx(hypervolume_of(DENSE, ARM[1]))
    # The stopped trial's 10 s push the third point past 120 s: it is not in yet at 120 s.
    assert hypervolume_within(ARM, DENSE, 120.0) == pytest.approx(hypervolume_of(DENSE, ARM[1]))
    assert hypervolume_within(ARM, DENSE, 130.0) == pytest.approx(hypervolume_of(DENSE, ARM[1], ARM[3]))


def test_the_whole_run_is_the_arms_summary() -> None:
    whole = hypervolume_within(ARM, DENSE, float("inf"))
    assert whole == pytest.approx(summarise(ARM, DENSE)["hypervolume"])
    assert hypervolume_within(ARM, DENSE, 80.0) < hypervolume_within(ARM, DENSE, 130.0) < whole


def saved_run(budget_minutes: float, dense_seconds: float, arm: str, points: list[dict]) -> dict:
    """A saved ``bench.frontier`` run of seed 0 with one arm, its dense control timed as given."""
    dense = {**DENSE, "seconds": dense_seconds}
    return {
        "budget_minutes": budget_minutes,
        "cpus_per_trial": 1.0,
        "seeds": [{"seed": 0, "dense": dense, "arms": {arm: [dense, *points]}}],
    }


def test_a_run_from_a_slower_machine_merges_in_units_of_the_dense_control() -> None:
    here = saved_run(28.0, 40.0, "searched", [trial(4.4, 700, 40.0)])
    slower = saved_run(28.0 * 1.6, 64.0, "random", [trial(4.6, 700, 64.0), STOPPED])
    (seed,) = merge_seeds([here, slower])
    assert seed["dense"]["seconds"] == 40.0
    assert [p["seconds"] for p in seed["arms"]["searched"]] == [40.0, 40.0]
    # The slower machine's seconds, in this machine's: 64 s of the dense control are 40 s here.
    assert [p["seconds"] for p in seed["arms"]["random"]] == pytest.approx([40.0, 40.0, 6.25])


def test_runs_of_one_machine_are_not_rescaled_for_its_noise() -> None:
    here = saved_run(28.0, 40.0, "searched", [trial(4.4, 700, 40.0)])
    again = saved_run(28.0, 40.4, "random", [trial(4.6, 700, 41.0)])
    (seed,) = merge_seeds([here, again])
    assert [p["seconds"] for p in seed["arms"]["random"]] == [40.4, 41.0]


def test_budgets_of_different_numbers_of_dense_trials_do_not_merge() -> None:
    here = saved_run(28.0, 40.0, "searched", [])
    same_minutes_slower_machine = saved_run(28.0, 64.0, "random", [])
    with pytest.raises(SystemExit, match="different budgets"):
        merge_seeds([here, same_minutes_slower_machine])
