import math

import pytest
import torch

from trainers.gates import (
    BETA,
    GAMMA,
    ZETA,
    HardConcreteGates,
    Lagrangian,
    check_reachable,
    heads_to_keep,
    select_heads,
)


def test_eval_gate_is_open_iff_log_alpha_nonnegative():
    gates = HardConcreteGates([3], init=0.0)
    gates.log_alpha.data = torch.tensor([-0.01, 0.0, 0.5])
    gates.eval()
    assert gates().tolist() == [0.0, 1.0, 1.0]


def test_soft_eval_gate_matches_stretched_sigmoid():
    gates = HardConcreteGates([2], hard=False)
    gates.log_alpha.data = torch.tensor([0.3, -4.0])
    gates.eval()
    expected = [min(1.0, max(0.0, 1 / (1 + math.exp(-a)) * (ZETA - GAMMA) + GAMMA)) for a in (0.3, -4.0)]
    assert gates().tolist() == pytest.approx(expected, abs=1e-6)


def test_training_gate_follows_the_formula_for_a_given_noise(monkeypatch):
    gates = HardConcreteGates([4], init=1.0, hard=False)
    u = torch.tensor([0.1, 0.4, 0.6, 0.9])
    monkeypatch.setattr(torch, "rand_like", lambda t: u.clone())
    s = torch.sigmoid((u.log() - (1 - u).log() + 1.0) / BETA)
    expected = (s * (ZETA - GAMMA) + GAMMA).clamp(0, 1)
    assert torch.allclose(gates(), expected)


def test_hard_gate_is_binary_with_straight_through_gradient():
    gates = HardConcreteGates([16], init=0.5)
    z = gates()
    assert set(z.tolist()) <= {0.0, 1.0}
    z.sum().backward()
    assert gates.log_alpha.grad is not None and gates.log_alpha.grad.abs().sum() > 0


def test_l0_term_matches_the_formula_and_is_normalised():
    gates = HardConcreteGates([2, 3], init=0.0)
    gates.log_alpha.data = torch.tensor([2.0, -1.0, 0.0, 0.5, 3.0])
    p = [1 / (1 + math.exp(-(a - BETA * math.log(-GAMMA / ZETA)))) for a in gates.log_alpha.tolist()]
    assert gates.p_open().tolist() == pytest.approx(p, abs=1e-6)
    assert gates.l0().item() == pytest.approx(sum(p) / 5, abs=1e-6)
    assert gates.expected_sparsity().item() == pytest.approx(1 - sum(p) / 5, abs=1e-6)


def test_default_init_opens_each_sampled_hard_gate_with_probability_about_088():
    gates = HardConcreteGates([20000], init=2.0)  # P(z = 1) = sigmoid(log_alpha) = 0.881
    assert gates().mean().item() == pytest.approx(1 / (1 + math.exp(-2.0)), abs=0.01)


def test_lagrangian_multipliers_rise_while_sparsity_is_below_target():
    lag = Lagrangian()
    opt = lag.optimizer(0.1)
    for _ in range(5):
        opt.zero_grad()
        lag(torch.tensor(0.1), 0.5).backward()
        opt.step()
    # d/d lambda1 = (s - t) < 0: ascent drives lambda1 negative, which pushes s up in descent.
    assert lag.lambda1.item() < 0
    assert lag.lambda2.item() > 0


@pytest.mark.parametrize("sparsity", [0.0, 0.1, 0.25, 0.5, 0.6, 0.75, 0.87])
def test_select_heads_keeps_exactly_the_budget_with_floor(sparsity):
    heads = [8, 8, 8, 8]
    scores = torch.randn(32)
    keep = select_heads(scores, heads, sparsity, min_heads_per_layer=1)
    assert sum(map(len, keep)) == heads_to_keep(32, sparsity)
    assert all(len(k) >= 1 for k in keep)


def test_select_heads_takes_highest_scores_beyond_the_floor():
    scores = torch.tensor([9.0, 8.0, 7.0, 6.0, -1.0, -2.0, -3.0, -4.0])
    keep = select_heads(scores, [4, 4], 0.5, min_heads_per_layer=1)
    assert keep == [[0, 1, 2], [0]]  # the floor keeps layer 1's best head, the rest go to layer 0


@pytest.mark.parametrize("sparsity", [1.0, 1.5, -0.1])
def test_unreachable_or_invalid_target_is_refused(sparsity):
    with pytest.raises(ValueError, match="sparsity"):
        check_reachable([8, 8], sparsity, 1)


def test_target_below_one_head_per_layer_is_refused():
    with pytest.raises(ValueError, match="min_heads_per_layer"):
        check_reachable([4, 4, 4, 4], 0.9, 1)  # keeps 2 heads of 16, 4 layers need 4
