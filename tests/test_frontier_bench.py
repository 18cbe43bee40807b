"""``bench.frontier``'s account of an arm as its budget is spent: the hypervolume of the trials
that ran within a part of the budget, in the order they ran, stopped trials' CPU included."""

from __future__ import annotations

import pytest

from bench.frontier import hypervolume_within, summarise
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
