"""bench.seed_noise: the spread of a method difference between seeds against its spread between sizes."""

from __future__ import annotations

import math

import pytest

from bench.seed_noise import f_ratio, log_ratios, noise_only_share, pooled_sd


def test_pooled_sd_removes_each_groups_own_mean():
    assert pooled_sd([[1.0, 3.0], [10.0, 12.0]]) == pytest.approx(math.sqrt(2.0))
    assert pooled_sd([[5.0, 5.0, 5.0], [1.0, 2.0, 3.0]]) == pytest.approx(math.sqrt(0.5))


def test_f_ratio_is_large_only_where_the_groups_means_differ_beyond_their_noise():
    apart = [[0.0, 1.0, 2.0], [10.0, 11.0, 12.0], [20.0, 21.0, 22.0]]
    together = [[0.0, 1.0, 2.0], [1.0, 2.0, 0.0], [2.0, 0.0, 1.0]]
    assert f_ratio(apart) == pytest.approx(300.0)  # means 1, 11, 21: variance 100 against 1 / 3
    assert f_ratio(together) == pytest.approx(0.0)
    shares = [noise_only_share(26, 3, f, draws=4000) for f in (1.0, 1.5, 2.0, 3.0)]
    assert 0.3 < shares[0] < 0.7  # F near 1 is what noise gives
    assert shares == sorted(shares, reverse=True) and shares[-1] < 0.01  # larger F, rarer from noise


def test_log_ratios_pair_points_by_head_count_and_seed_taking_each_sizes_first():
    def point(ppl, sparsity):
        return {"ppl": ppl, "hparams": {"sparsity": sparsity}}

    per_seed = [
        {
            "seed": 3,
            "dense": {"ppl": 4.0},
            "arms": {
                "a": [{"ppl": 4.0}, point(4.4, 0.5), point(4.2, 0.49), {"method": "pruned"}, point(5.0, 0.75)]
            },
        }
    ]
    found = log_ratios(per_seed, "a", total_heads=8)
    assert found == {4: {3: pytest.approx(math.log(1.1))}, 2: {3: pytest.approx(math.log(1.25))}}
