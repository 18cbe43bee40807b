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


# Expected values below are worked out by hand from docs/methods.md section 3 (Louizos et al.'s
# stretch gamma = -0.1, zeta = 1.1; this project's temperature beta = 1/3), not by the code under
# test; the constants themselves are checked first.
def test_the_constants_are_the_documented_ones():
    assert (-0.1, 1.1, pytest.approx(1 / 3)) == (GAMMA, ZETA, BETA)


def test_soft_eval_gate_is_the_stretched_sigmoid_clamped():
    gates = HardConcreteGates([4], hard=False)
    gates.log_alpha.data = torch.tensor([0.0, 0.3, -4.0, 3.0])
    gates.eval()
    # sigmoid(0) x 1.2 - 0.1 = 0.5; sigmoid(0.3) = 0.574443 -> 0.589331; sigmoid(-4) x 1.2 - 0.1 < 0
    # -> 0; sigmoid(3) x 1.2 - 0.1 = 1.043 -> 1.
    assert gates().tolist() == pytest.approx([0.5, 0.589331, 0.0, 1.0], abs=1e-6)


def test_training_gate_for_a_given_noise(monkeypatch):
    gates = HardConcreteGates([4], init=0.0, hard=False)
    u = torch.tensor([0.3, 0.5, 0.6, 0.7])
    monkeypatch.setattr(torch, "rand_like", lambda t: u.clone())
    # s = sigmoid(logit(u) / (1/3)): u = 0.5 gives s = 0.5 -> 0.5; u = 0.6: logit = 0.405465, x 3 =
    # 1.216395, s = 0.771428 -> 0.825714; u = 0.3 (s = 0.0716 -> below 0) and u = 0.7 (above 1) clamp.
    assert gates().tolist() == pytest.approx([0.0, 0.5, 0.825714, 1.0], abs=1e-6)


def test_l0_term_is_the_mean_probability_of_a_gate_being_open():
    gates = HardConcreteGates([2, 3], init=0.0)
    gates.log_alpha.data = torch.tensor([2.0, -1.0, 0.0, 0.5, 3.0])
    # p = sigmoid(log_alpha - (1/3) log(0.1 / 1.1)) = sigmoid(log_alpha + 0.799296)
    p = [0.942638, 0.449992, 0.689824, 0.785717, 0.978104]
    assert gates.p_open().tolist() == pytest.approx(p, abs=1e-6)
    assert gates.l0().item() == pytest.approx(0.769255, abs=1e-6)
    assert gates.expected_sparsity().item() == pytest.approx(1 - 0.769255, abs=1e-6)


def test_hard_gate_is_binary_with_straight_through_gradient():
    gates = HardConcreteGates([16], init=0.5)
    z = gates()
    assert set(z.tolist()) <= {0.0, 1.0}
    z.sum().backward()
    assert gates.log_alpha.grad is not None and gates.log_alpha.grad.abs().sum() > 0


def test_default_init_opens_each_sampled_hard_gate_with_probability_about_088():
    gates = HardConcreteGates([20000], init=2.0)  # P(z = 1) = sigmoid(log_alpha) = 0.881
    assert gates().mean().item() == pytest.approx(0.881, abs=0.01)


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
