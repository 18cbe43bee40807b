"""bench.against_sweep: every finished trial of other runs against the sweep's trial of its size and seed."""

from __future__ import annotations

import pytest

from bench.against_sweep import against_sweep, band_of, sweep_points

HEADS = 8


def point(method: str, sparsity: float, ppl: float, distill: bool = False) -> dict:
    """A saved point as bench.frontier writes it: the sparsity as run, the settings asked for."""
    hparams = {"method": method, "sparsity": 0.0 if method == "l0_penalty" else sparsity, "distill": distill}
    return {"method": method, "sparsity": sparsity, "ppl": ppl, "hparams": hparams}


def run(seed: int, arm: str, points: list[dict], dense: float = 4.0) -> dict:
    return {
        "seeds": [
            {"seed": seed, "dense": {"ppl": dense}, "arms": {arm: [point("dense", 0.0, dense), *points]}}
        ]
    }


SWEEP = [run(0, "importance:distilled", [point("importance", 0.5, 5.0), point("importance", 0.75, 6.0)])]


def test_trials_pair_with_the_sweeps_trial_of_their_size_and_seed():
    sweep = sweep_points(SWEEP, None, HEADS)
    assert sweep == {0: {"dense": 4.0, 4: 5.0, 2: 6.0}}
    others = {
        "topk": run(0, "topk:distilled", [point("topk", 0.5, 4.9, True), point("topk", 0.75, 6.3, True)]),
        # l0_penalty asks for no sparsity: it pairs by the heads it kept
        "l0": run(0, "l0_penalty", [point("l0_penalty", 0.5, 5.1)]),
    }
    ratios, skipped = against_sweep(sweep, others, HEADS)
    assert skipped == []
    assert ratios[("topk", True, "4-10")] == [pytest.approx(-2.0)]  # 4.9 / 5.0 - 1
    assert ratios[("topk", True, "2")] == [pytest.approx(5.0)]
    assert ratios[("l0_penalty", False, "4-10")] == [pytest.approx(2.0)]


def test_searched_arms_other_seeds_and_other_checkpoints_are_left_out():
    sweep = sweep_points(SWEEP, None, HEADS)
    others = {
        "searched": run(0, "searched:halfstart", [point("topk", 0.5, 4.0, True)]),  # early stopping selects
        "seed 1": run(1, "topk:distilled", [point("topk", 0.5, 4.0, True)]),  # no sweep at that seed
        "other dense": run(0, "topk:distilled", [point("topk", 0.5, 4.0, True)], dense=4.5),
    }
    ratios, skipped = against_sweep(sweep, others, HEADS)
    assert ratios == {}
    assert skipped == ["seed 1 (seed 1)", "other dense (seed 0)"]


def test_bands_are_the_seed_noise_reports():
    assert [band_of(k) for k in (4, 10, 11, 15, 16, 31, 2)] == [
        "4-10",
        "4-10",
        "11-15",
        "11-15",
        "16-31",
        "16-31",
        "2",
    ]
