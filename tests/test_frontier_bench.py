"""``bench.frontier``'s account of an arm as its budget is spent: the hypervolume of the trials
that ran within a part of the budget, in the order they ran, stopped trials' CPU included."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench.frontier import (
    STUDY,
    hypervolume_within,
    l0_penalty_at,
    labelled,
    merge_seeds,
    paired,
    report,
    summarise,
    sweep_arm,
)
from orchestrator.config import load_study_config
from orchestrator.report import normalised_hypervolume
from trainers.gates import heads_to_keep
from trainers.hparams import TrialHParams

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
    (seed,), budget_minutes = merge_seeds([here, slower])
    assert budget_minutes == pytest.approx(28.0)
    assert seed["dense"]["seconds"] == 40.0
    assert [p["seconds"] for p in seed["arms"]["searched"]] == [40.0, 40.0]
    # The slower machine's seconds, in this machine's: 64 s of the dense control are 40 s here.
    assert [p["seconds"] for p in seed["arms"]["random"]] == pytest.approx([40.0, 40.0, 6.25])


def test_runs_of_one_machine_are_not_rescaled_for_its_noise() -> None:
    here = saved_run(28.0, 40.0, "searched", [trial(4.4, 700, 40.0)])
    again = saved_run(28.0, 40.4, "random", [trial(4.6, 700, 41.0)])
    (seed,), budget_minutes = merge_seeds([here, again])
    assert budget_minutes == 28.0
    assert [p["seconds"] for p in seed["arms"]["random"]] == [40.4, 41.0]


def test_runs_said_to_share_a_machine_are_compared_as_measured() -> None:
    # One machine under other load: the dense control took 20% longer in the second run.
    here = saved_run(28.0, 40.0, "searched", [trial(4.4, 700, 40.0)])
    loaded = saved_run(28.0, 48.0, "random", [trial(4.6, 700, 41.0)])
    (seed,), budget_minutes = merge_seeds([here, loaded], same_machine=True)
    assert budget_minutes == 28.0
    assert [p["seconds"] for p in seed["arms"]["random"]] == [48.0, 41.0]
    (seed,), _ = merge_seeds([here, loaded])  # without it: read as a slower machine, rescaled
    assert [p["seconds"] for p in seed["arms"]["random"]] == pytest.approx([40.0, 41.0 / 1.2])


def test_arms_are_cut_to_the_smallest_budget_as_a_run_would_end() -> None:
    # 3 minutes here against 2 minutes' worth (in dense trials) from a machine twice as slow.
    here = saved_run(
        3.0, 40.0, "searched", [trial(4.4, 700, 40.0), STOPPED, trial(4.2, 800, 40.0), trial(5.0, 500, 40.0)]
    )
    slower = saved_run(4.0, 80.0, "random", [trial(4.6, 700, 80.0)])
    (seed,), budget_minutes = merge_seeds([here, slower])
    assert budget_minutes == pytest.approx(2.0)
    # Spent before each trial: 0, 40, 80, 90, 130: the trial started at 90 s (< 120) is kept, the next is not.
    assert seed["arms"]["searched"] == here["seeds"][0]["arms"]["searched"][:4]
    assert len(seed["arms"]["random"]) == 2


def test_a_merge_cuts_every_arm_to_a_budget_given_below_the_runs() -> None:
    """``--merge ... --budget-minutes 1.5``: a subset of the runs at a larger merge's budget."""
    here = saved_run(
        3.0, 40.0, "searched", [trial(4.4, 700, 40.0), trial(4.2, 800, 40.0), trial(5.0, 500, 40.0)]
    )
    (seed,), budget_minutes = merge_seeds([here], budget_minutes=1.5)
    assert budget_minutes == 1.5
    # Spent before each: 0, 40, 80: the trial started at 80 s (< 90) is kept, the one at 120 s is not.
    assert seed["arms"]["searched"] == here["seeds"][0]["arms"]["searched"][:3]
    ((seed,), budget_minutes) = merge_seeds([here], budget_minutes=10.0)  # above the runs': theirs
    assert budget_minutes == 3.0 and len(seed["arms"]["searched"]) == 4


def test_runs_of_different_dense_controls_do_not_merge() -> None:
    here = saved_run(28.0, 40.0, "searched", [])
    other = saved_run(28.0, 40.0, "random", [])
    other["seeds"][0]["dense"]["ppl"] = 4.01
    with pytest.raises(SystemExit, match="different dense controls"):
        merge_seeds([here, other])


def counting_run(vary: bool = False):
    """A stand-in for one trial: its point depends on the heads kept (or, with ``vary``, also on
    how often it ran, as a trial that is not deterministic would); it records each call."""
    calls: list[float] = []

    def run(setup, hp: TrialHParams) -> dict:
        calls.append(hp.sparsity)
        kept = heads_to_keep(32, hp.sparsity)
        ppl = 4.0 + (32 - kept) / 10 + (len(calls) / 1000 if vary else 0.0)
        return {
            "method": hp.method,
            "sparsity": 1 - kept / 32,
            "ppl": ppl,
            "params": 30 * kept,
            "seconds": 10.0,
        }

    return run, calls


SETUP = SimpleNamespace(dense=SimpleNamespace(model_config=SimpleNamespace(layer_heads=(8, 8, 8, 8))))
# 0.5 and 0.51 both keep 16 of 32 heads; 0.25 keeps 24.
SPARSITIES = [0.5, 0.25, 0.51, 0.5001, 0.2501, 0.7]


def sweep_of(method: str):
    return lambda index: TrialHParams(method=method, sparsity=SPARSITIES[index])


def test_a_sweeps_repeats_are_run_once_and_then_charged_without_running() -> None:
    run, calls = counting_run()
    points = sweep_arm(SETUP, sweep_of("importance"), 65.0, {**DENSE, "seconds": 5.0}, run=run)
    # Six trials of 10 s after the dense control's 5: the budget is charged for every one.
    assert len(points) == 7 and sum(p["seconds"] for p in points) == 65.0
    # The first repeat (0.51) ran and matched; the next ones (0.5001 keeps 16, 0.2501 keeps 24) did not run.
    assert calls == [0.5, 0.25, 0.51, 0.7]
    assert points[4]["ppl"] == points[1]["ppl"] and points[5]["ppl"] == points[2]["ppl"]


def test_repeats_that_score_differently_are_all_run() -> None:
    run, calls = counting_run(vary=True)
    sweep_arm(SETUP, sweep_of("importance"), 65.0, {**DENSE, "seconds": 5.0}, run=run)
    assert calls == SPARSITIES


def test_a_method_whose_trial_depends_on_the_exact_sparsity_is_never_reused() -> None:
    run, calls = counting_run()
    sweep_arm(SETUP, sweep_of("l0_target"), 65.0, {**DENSE, "seconds": 5.0}, run=run)
    assert calls == SPARSITIES


def test_a_labelled_run_merges_beside_the_default_run_and_every_searched_arm_is_judged(capsys) -> None:
    runs = []
    for seed in range(3):
        default = saved_run(28.0, 40.0, "searched", [trial(4.6, 700, 40.0)])
        default["seeds"][0]["seed"] = seed
        default["seeds"][0]["arms"]["importance"] = [DENSE, trial(4.4, 700, 40.0)]
        other = {**default, "seeds": labelled(default["seeds"], "distillstart")}
        other["seeds"][0]["arms"]["searched:distillstart"][1] = trial(4.2, 700, 40.0)
        runs += [default, other]
    merged, budget_minutes = merge_seeds(runs)
    assert set(merged[0]["arms"]) == {
        "searched",
        "importance",
        "searched:distillstart",
        "importance:distillstart",
    }
    report(merged, budget_minutes, 1.0)
    out = capsys.readouterr().out
    targets = [line for line in out.splitlines() if line.startswith("targets")]
    # The searched arms are paired with each other too (two samplers side by side: 4.6 - 4.2)...
    pairs = out.split("searched's hypervolume minus each other arm's")[1].split("targets")[0]
    assert "| searched:distillstart |" in pairs and "| importance |" in pairs
    # ... but each is judged against the arms that are not searched: 4.2 beats both sweeps' 4.4, 4.6 does not.
    assert len(targets) == 2
    assert targets[0].startswith("targets: searched hypervolume beats every other arm on the mean: not met")
    assert targets[1].startswith(
        "targets: searched:distillstart hypervolume beats every other arm on the mean: met"
    )


def test_the_l0_penalty_sweep_spreads_log_lambda_over_the_range_it_is_given() -> None:
    """High end first, then the middle and the quarters of log(lambda) (``--l0-lambda``)."""
    space = load_study_config(STUDY).search
    lambdas = [l0_penalty_at(space, i, lambda_range=(1.0, 30.0)).l0_lambda for i in range(4)]
    assert lambdas == pytest.approx([30.0, 30.0**0.5, 30.0**0.75, 30.0**0.25])
    assert [l0_penalty_at(space, i).l0_lambda for i in range(2)] == pytest.approx([150.0, 1500.0**0.5])


def test_a_seed_won_by_float_noise_is_a_tie_not_a_win(capsys) -> None:
    """Seeds 0 and 1: the searched front is the sweep's but for a billionth of perplexity (as two
    runs of the same trials differ); seed 2: clearly ahead. One win, two ties: not met."""
    runs = []
    for seed, searched_ppl in enumerate((4.4 - 1e-9, 4.4 - 1e-9, 4.2)):
        run = saved_run(28.0, 40.0, "searched", [trial(searched_ppl, 700, 40.0)])
        run["seeds"][0]["seed"] = seed
        run["seeds"][0]["arms"]["importance"] = [DENSE, trial(4.4, 700, 40.0)]
        runs.append(run)
    merged, budget_minutes = merge_seeds(runs)
    report(merged, budget_minutes, 1.0)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("targets: searched"))
    assert (
        "on >= 2/3 of the seeds: not met (wins {'importance': 1}, ties within 0.0001 {'importance': 2})"
        in line
    )


def test_a_searched_arm_reported_alone_is_not_said_to_beat_the_other_arms(capsys) -> None:
    """A run of the searched arm only (``--arms searched``, or its saved runs merged alone) has
    nothing to beat: the report says so instead of "met" over an empty set of arms."""
    merged, budget_minutes = merge_seeds([saved_run(28.0, 40.0, "searched", [trial(4.2, 700, 40.0)])])
    report(merged, budget_minutes, 1.0)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("targets: searched"))
    assert "hypervolume: no arm but searched ones here to compare with" in line
    assert "met;" not in line.split("50% removed")[0]


def test_paired_differences_come_with_a_t_interval_that_holds_zero_when_the_seeds_disagree() -> None:
    assert paired([0.27, 0.26, 0.28], [0.26, 0.25, 0.27]) == [
        "+0.0100 / +0.0100 / +0.0100",
        "+0.0100",
        "[+0.0100, +0.0100]",
    ]
    by_seed, mean, interval = paired([0.2658, 0.2650, 0.2690], [0.2658, 0.2630, 0.2692])
    assert (by_seed, mean) == ("+0.0000 / +0.0020 / -0.0002", "+0.0006")
    low, high = (float(x) for x in interval.strip("[]").split(", "))
    assert low < 0 < high  # sd 0.0012 over 3 seeds: t(2) 4.303 x 0.0007 = 0.0030 each side
    assert high - low == pytest.approx(2 * 4.303 * 0.0012166 / 3**0.5, abs=2e-4)  # printed to 4 places
    assert paired([0.3], [0.2])[2] == "-"


def test_seeds_first_run_on_a_slower_machine_are_cut_at_the_same_compute() -> None:
    """Seeds 0 and 1 from different machines (seed 1 added later, 1.5x slower): seed 1's times
    read in seed 0's seconds, so that one budget is the same number of dense trials for both."""
    fast = saved_run(
        2.0, 40.0, "searched", [trial(4.4, 700, 40.0), trial(4.2, 800, 40.0), trial(5.0, 500, 40.0)]
    )
    slow = saved_run(
        3.0, 60.0, "searched", [trial(4.4, 700, 60.0), trial(4.2, 800, 60.0), trial(5.0, 500, 60.0)]
    )
    slow["seeds"][0]["seed"] = 1
    (zero, one), budget_minutes = merge_seeds([fast, slow])
    assert budget_minutes == pytest.approx(2.0)  # both 3 dense trials' worth
    assert one["dense"]["seconds"] == pytest.approx(40.0)
    # the dense control, then trials started at 40 and 80 s (< 120): the same in both seeds
    assert [p["seconds"] for p in one["arms"]["searched"]] == pytest.approx([40.0] * 3)
    assert len(zero["arms"]["searched"]) == 3
