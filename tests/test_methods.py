"""Every pruning method on a tiny model: exact budgets, Michel's gradient, distillation, errors."""

from __future__ import annotations

import pytest
import torch

from trainers.data import Corpus
from trainers.distillation import PeerDistillation
from trainers.gates import heads_to_keep, mask_from_keep
from trainers.hparams import PretrainConfig, TrialBudget, TrialHParams
from trainers.model import LanguageModel, ModelConfig
from trainers.pretrain import ensure_dense_checkpoint, load_dense
from trainers.pruning import PruneContext, prune
from trainers.pruning.importance import head_importance, mask_gradients
from trainers.trial import RungPlan, TrialIO, TrialSetup, run_trial

FAMILIES = ["gpt", "all_attention"]


@pytest.fixture(scope="module", params=FAMILIES)
def setup(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("dense")
    text = folder / "text.txt"
    from helpers import CORPUS

    text.write_text(CORPUS.read_text(encoding="utf-8")[:30000], encoding="utf-8")
    corpus = Corpus.load(text, block_size=16)
    cfg = ModelConfig(
        vocab_size=corpus.vocab_size,
        block_size=16,
        n_layer=3,
        n_head=4,
        d_model=32,
        family=request.param,
        n_persistent=8,
    )
    dense = ensure_dense_checkpoint(
        corpus, cfg, PretrainConfig(steps=20, batch_size=8, warmup_steps=2), folder, eval_tokens=512
    )
    budget = TrialBudget(prune_steps=12, finetune_steps=4, batch_size=8, eval_tokens=512)
    return TrialSetup(corpus, dense, budget, seed=0)


@pytest.mark.parametrize("method", ["l0_target", "topk", "importance", "random"])
@pytest.mark.parametrize("sparsity", [0.25, 0.5, 0.75])
def test_target_methods_end_at_exactly_the_target(setup, method, sparsity):
    hp = TrialHParams(method=method, sparsity=sparsity, min_heads_per_layer=1, importance_batches=1)
    result = run_trial(setup, hp)
    assert sum(result.heads_per_layer) == heads_to_keep(12, sparsity)
    assert min(result.heads_per_layer) >= 1
    assert result.sparsity == pytest.approx(1 - heads_to_keep(12, sparsity) / 12)
    total, nonembed = LanguageModel(
        ModelConfig(
            **{**setup.dense.model_config.to_dict(), "heads_per_layer": tuple(result.heads_per_layer)}
        )
    ).count_parameters()
    assert (result.n_params, result.n_params_nonembed) == (total, nonembed)


def test_min_heads_per_layer_is_respected_when_the_budget_allows(setup):
    result = run_trial(setup, TrialHParams(method="random", sparsity=0.5, min_heads_per_layer=2))
    assert result.heads_per_layer == [2, 2, 2]


def test_l0_penalty_sparsity_follows_lambda(setup):
    none = run_trial(setup, TrialHParams(method="l0_penalty", l0_lambda=0.0))
    assert none.sparsity == 0.0  # log_alpha starts at 2: without pressure every gate stays open
    strong = run_trial(
        setup,
        TrialHParams(
            method="l0_penalty", l0_lambda=50.0, lr=1e-3, gate_lr_mult=500.0, schedule_shape="one_shot"
        ),
    )
    assert strong.sparsity > 0.0
    assert min(strong.heads_per_layer) >= 1


@pytest.mark.parametrize("method", ["l0_target", "topk"])
def test_frozen_weights_leave_the_model_alone_and_give_fine_tuning_every_step(setup, method):
    model = load_dense(setup.dense, torch.device("cpu"))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    hp = TrialHParams(method=method, sparsity=0.5, freeze_weights=True, gate_lr_mult=100.0)
    outcome = prune(
        PruneContext(
            model, setup.corpus.train, hp, steps=12, batch_size=8, generator=torch.Generator().manual_seed(0)
        )
    )
    assert outcome.trained_steps == 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.requires_grad for p in model.parameters())  # fine-tuning can train it again
    assert sum(len(k) for k in outcome.keep) == 6
    joint = prune(
        PruneContext(
            model,
            setup.corpus.train,
            TrialHParams(method=method, sparsity=0.5),
            steps=12,
            batch_size=8,
            generator=torch.Generator().manual_seed(0),
        )
    )
    assert joint.trained_steps == 12
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_dense_method_removes_nothing(setup):
    result = run_trial(setup, TrialHParams(method="dense", sparsity=0.0))
    assert result.heads_per_layer == [4, 4, 4] and result.sparsity == 0.0


def test_output_scaling_and_distillation_run_end_to_end(setup):
    hp = TrialHParams(method="l0_target", sparsity=0.5, output_scaling=True, distill=True)
    result = run_trial(setup, hp)
    assert sum(result.heads_per_layer) == 6
    assert result.val_perplexity < setup.corpus.vocab_size  # better than uniform guessing


@pytest.mark.parametrize("sparsity", [0.95, 0.8])
def test_unreachable_target_fails_before_training(setup, sparsity):
    calls = []
    hp = TrialHParams(method="l0_target", sparsity=sparsity, min_heads_per_layer=1)
    with pytest.raises(ValueError, match="min_heads_per_layer"):
        run_trial(setup, hp, TrialIO(progress=lambda *a: calls.append(a)))
    assert calls == []


def test_michel_importance_is_the_mask_gradient(setup):
    model = load_dense(setup.dense, torch.device("cpu")).double().eval()
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, setup.corpus.vocab_size, (4, 16), generator=g)
    y = torch.randint(0, setup.corpus.vocab_size, (4, 16), generator=g)
    mask = [torch.ones(4, dtype=torch.float64) for _ in range(3)]
    grads = mask_gradients(model, x, y, mask)
    eps = 1e-5
    for flat in range(12):
        layer, head = divmod(flat, 4)
        plus = [m.clone() for m in mask]
        minus = [m.clone() for m in mask]
        plus[layer][head] += eps
        minus[layer][head] -= eps
        finite = (model.loss(x, y, plus) - model.loss(x, y, minus)).item() / (2 * eps)
        assert grads[flat].item() == pytest.approx(finite, rel=1e-4, abs=1e-8)


def test_importance_scores_are_normalised_per_layer(setup):
    model = load_dense(setup.dense, torch.device("cpu"))
    mask = [torch.ones(4) for _ in range(3)]
    scores = head_importance(
        model, setup.corpus.train, mask, batches=2, batch_size=4, generator=torch.Generator().manual_seed(0)
    )
    assert torch.allclose(torch.stack([s.norm() for s in scores.split(4)]), torch.ones(3))
    assert (scores >= 0).all()


def test_iterative_importance_pruning_removes_the_least_important_first(setup):
    model = load_dense(setup.dense, torch.device("cpu"))
    hp = TrialHParams(method="importance", sparsity=1 / 12, importance_batches=2)  # one round, one head
    g = torch.Generator().manual_seed(5)
    keep = prune(PruneContext(model, setup.corpus.train, hp, steps=0, batch_size=4, generator=g)).keep
    scores = head_importance(
        model,
        setup.corpus.train,
        [torch.ones(4) for _ in range(3)],
        batches=2,
        batch_size=4,
        generator=torch.Generator().manual_seed(5),
    )
    removed = [layer * 4 + h for layer in range(3) for h in range(4) if h not in keep[layer]]
    assert removed == [int(torch.argmin(scores))]


def test_peer_distillation_is_zero_for_the_teacher_and_positive_otherwise(setup):
    teacher = load_dense(setup.dense, torch.device("cpu")).eval()
    distill = PeerDistillation(teacher, alpha_layer=1.0, alpha_logit=1.0)
    x = setup.corpus.train[:64].view(4, 16)
    logits, attn = teacher(x, return_attn=True)
    assert distill.extra(x, logits, attn).item() == pytest.approx(0.0, abs=1e-6)
    gates = mask_from_keep([[0, 1], [2], [0, 3]], [4, 4, 4])
    logits, attn = teacher(x, gates, return_attn=True)
    assert distill.extra(x, logits, attn).item() > 1e-4


class Crash(RuntimeError):
    pass


def crash_in_finetune(phase, step, total, loss):
    if phase == "finetune":
        raise Crash


def test_a_retry_resumes_after_pruning_and_matches_an_uninterrupted_trial(setup, tmp_path):
    hp = TrialHParams(method="l0_target", sparsity=0.5)
    whole = run_trial(setup, hp, TrialIO(save_dir=tmp_path / "whole"))
    with pytest.raises(Crash):
        run_trial(setup, hp, TrialIO(progress=crash_in_finetune, save_dir=tmp_path / "first"))
    phases = []
    retried = run_trial(
        setup,
        hp,
        TrialIO(
            progress=lambda p, *a: phases.append(p),
            save_dir=tmp_path / "retry",
            resume_dirs=[tmp_path / "retry", tmp_path / "first"],
        ),
    )
    assert "prune" not in phases and "finetune" in phases  # the pruning phase was not redone
    assert retried.phase_seconds["prune_resumed"] == 1.0
    assert retried.kept_heads == whole.kept_heads
    assert retried.val_perplexity == pytest.approx(whole.val_perplexity, rel=1e-6)


def test_a_checkpoint_of_other_hyperparameters_is_not_resumed(setup, tmp_path):
    with pytest.raises(Crash):
        run_trial(
            setup,
            TrialHParams(method="random", sparsity=0.5),
            TrialIO(progress=crash_in_finetune, save_dir=tmp_path / "first"),
        )
    phases = []
    run_trial(
        setup,
        TrialHParams(method="l0_target", sparsity=0.5),
        TrialIO(progress=lambda p, *a: phases.append(p), resume_dirs=[tmp_path / "first"]),
    )
    assert "prune" in phases


def test_rung_reports_come_at_fractions_of_the_fine_tuning(setup):
    """Early stopping's input: the pruned model scored at 1/4 and 1/2 of the fine-tuning budget,
    counted in weight updates since the trial began (12 + 1 and 12 + 2: random trains nothing
    while choosing, so it fine-tunes for all 12 + 4 steps), recorded as the trial's curve."""
    reports = []
    result = run_trial(
        setup,
        TrialHParams(method="random", sparsity=0.5),
        rungs=RungPlan(fractions=[0.25, 0.5], report=reports.append),
    )
    assert [(r.rung, r.step, r.steps) for r in reports] == [(0, 13, 16), (1, 14, 16)]
    assert all(r.n_params == result.n_params for r in reports)
    assert result.curve == [[r.rung, r.step, r.val_perplexity] for r in reports]
    assert len({r.val_perplexity for r in reports} | {result.val_perplexity}) == 3  # it trained on
