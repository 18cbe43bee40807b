"""Gap-filling trials (``orchestrator/front_gaps.py``): the widest step of the front, halfway in
heads, with the settings of the point at its smaller end; through the real driver too."""

from __future__ import annotations

import optuna
from helpers import HEADS, n_params, per_layer, worker_result
from optuna.distributions import CategoricalDistribution, FloatDistribution

from orchestrator.front_gaps import front_of, gap_fill_point, tried_key

optuna.logging.set_verbosity(optuna.logging.WARNING)

DISTRIBUTIONS = {
    "method": CategoricalDistribution(["importance", "topk"]),
    "sparsity": FloatDistribution(0.05, 0.875),
    "lr": FloatDistribution(1e-3, 6e-3, log=True),
}


def fill(trials, running, low, high):
    """``gap_fill_point`` given what the driver keeps: the front and the parameters tried."""
    tried = {tried_key(t.params) for t in trials if t.state.is_finished() and t.state.name != "FAIL"}
    return gap_fill_point(front_of(trials), tried, running, low, high)


def finished(kept: int, ppl: float, params: dict | None = None) -> optuna.trial.FrozenTrial:
    """A COMPLETE trial as the driver records it: values, what it achieved, what it was given."""
    params = params or {}
    return optuna.trial.create_trial(
        values=[ppl, n_params(kept)],
        params=params,
        distributions={k: DISTRIBUTIONS[k] for k in params},
        user_attrs={"heads_per_layer": per_layer(kept), "sparsity": 1 - kept / HEADS},
    )


DENSE = finished(32, 4.60)
MILD = finished(24, 4.69, {"method": "importance", "sparsity": 0.25, "lr": 3e-3})
TOPK_SMALL = finished(4, 6.27, {"method": "topk", "sparsity": 0.875, "lr": 2e-3})
DOMINATED = finished(16, 7.00, {"method": "importance", "sparsity": 0.5, "lr": 1e-3})


def test_the_front_is_the_non_dominated_trials_largest_first():
    assert [t.values for t in front_of([TOPK_SMALL, DOMINATED, DENSE, MILD])] == [
        DENSE.values,
        MILD.values,
        TOPK_SMALL.values,
    ]


def test_the_widest_step_is_filled_halfway_with_its_smaller_ends_settings():
    # steps: dense -> 24 heads (66k params x 0.09 ppl), 24 -> 4 heads (165k x 1.58): the second
    point = fill([DENSE, MILD, TOPK_SMALL, DOMINATED], [], 0.05, 0.875)
    assert point == {"method": "topk", "sparsity": 1 - 14 / 32, "lr": 2e-3}  # 14 heads: halfway


def test_a_step_a_running_trial_is_on_its_way_to_is_left_to_it():
    point = fill([DENSE, MILD, TOPK_SMALL], [0.5], 0.05, 0.875)  # 16 heads: inside 24 -> 4
    assert point == {"method": "importance", "sparsity": 1 - 28 / 32, "lr": 3e-3}  # dense -> 24 instead


def test_a_fill_already_tried_is_not_asked_again():
    widest_fill = {"method": "topk", "sparsity": 1 - 14 / 32, "lr": 2e-3}
    stopped = optuna.trial.create_trial(
        state=optuna.trial.TrialState.PRUNED, params=widest_fill, distributions=DISTRIBUTIONS
    )
    point = fill([DENSE, MILD, TOPK_SMALL, stopped], [], 0.05, 0.875)
    assert point == {"method": "importance", "sparsity": 1 - 28 / 32, "lr": 3e-3}  # the next widest
    off_the_front = finished(14, 7.5, widest_fill)  # finished, but dominated: the gap stays open
    point = fill([DENSE, MILD, TOPK_SMALL, off_the_front], [], 0.05, 0.875)
    assert point == {"method": "importance", "sparsity": 1 - 28 / 32, "lr": 3e-3}


def test_no_gap_without_a_size_in_between_or_inside_the_range():
    next_to_dense = finished(31, 4.61, {"method": "importance", "sparsity": 0.05, "lr": 3e-3})
    assert fill([DENSE, next_to_dense], [], 0.0, 0.875) is None  # adjacent head counts
    two_heads = finished(2, 9.0, {"method": "topk", "sparsity": 0.875, "lr": 2e-3})
    # 4 -> 2 heads holds 3, but sparsity 0.906 is beyond the range's 0.875
    assert fill([DENSE, TOPK_SMALL, two_heads], [0.5], 0.05, 0.875) is None
    assert fill([DENSE], [], 0.05, 0.875) is None


def test_the_driver_alternates_gap_fills_with_the_samplers_trials(tmp_path):
    """The default study's space, a start-up of 3, a gap fill every 2nd trial after it: the 1st
    and 3rd trials after the start-up fill the widest free step, the 2nd is the sampler's."""
    from helpers import default_study_driver

    driver = default_study_driver(tmp_path, startup=4, spread_trials=3, gap_fill_every=2)

    def ask(name: str) -> dict:
        return driver.next_config(name)["hparams"]

    dense = ask("dense")
    driver.finish("dense", worker_result({**dense, "sparsity": 0.0}, 4.60), None)
    # the start-up: 0.875, 0.4625, 0.66875 -> 4, 17 and 11 heads kept
    for name, ppl in zip(["s0", "s1", "s2"], [6.27, 4.80, 5.00]):
        driver.finish(name, worker_result(ask(name), ppl), None)
    # steps (heads x ppl): 32 -> 17: 15 x 0.20, 17 -> 11: 6 x 0.20, 11 -> 4: 7 x 1.27 (the widest)
    fill = ask("fill")
    assert (fill["method"], fill["sparsity"], fill["lr"]) == ("importance", 1 - 8 / 32, 3e-3)
    sampled = ask("sampled")
    assert sampled["lr"] != 3e-3  # the sampler's: not a copy of a front point
    driver.finish("sampled", worker_result(sampled, 9.0), None)  # dominated: the front is as it was
    second = ask("second fill")  # "fill" still running inside 11 -> 4: the next widest, 32 -> 17
    assert (second["method"], second["sparsity"], second["lr"]) == ("importance", 1 - 25 / 32, 3e-3)
