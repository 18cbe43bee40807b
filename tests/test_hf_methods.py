"""Every pruning method on the hf family's three architectures, through the real trial: exact
head budgets, the stored parameter count, and the trial's saved model scoring what it recorded."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import CORPUS

from trainers.data import Corpus, eval_windows
from trainers.export import load_model
from trainers.gates import heads_to_keep
from trainers.hf import HFLanguageModel, HFModelConfig, architecture_config
from trainers.hparams import PretrainConfig, TrialBudget, TrialHParams
from trainers.pretrain import ensure_dense_checkpoint, load_dense
from trainers.training import mean_loss
from trainers.trial import TrialIO, TrialSetup, run_trial

ARCHITECTURES = {"gpt2": {}, "gpt_neox": {}, "llama": {"n_kv_head": 2}}  # llama: 4 heads in 2 groups


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def setup(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf")
    text = folder / "text.txt"
    text.write_text(CORPUS.read_text(encoding="utf-8")[:30000], encoding="utf-8")
    corpus = Corpus.load(text, block_size=16, tokenizer="bpe", vocab_size=300, cache_dir=folder / "cache")
    sizes = {"n_layer": 3, "n_head": 4, "d_model": 32, "block_size": 16, **ARCHITECTURES[request.param]}
    cfg = HFModelConfig(
        hf_config=architecture_config(request.param, vocab_size=corpus.vocab_size, **sizes), block_size=16
    )
    dense = ensure_dense_checkpoint(
        corpus, cfg, PretrainConfig(steps=10, batch_size=8, warmup_steps=2), folder, eval_tokens=256
    )
    budget = TrialBudget(prune_steps=6, finetune_steps=3, batch_size=8, eval_tokens=256)
    return TrialSetup(corpus, dense, budget, seed=0)


@pytest.mark.parametrize("method", ["l0_target", "topk", "importance", "random"])
def test_every_method_reaches_its_exact_budget(setup, method, tmp_path):
    hp = TrialHParams(method=method, sparsity=0.5, importance_batches=1, distill=method == "l0_target")
    result = run_trial(setup, hp, TrialIO(save_dir=tmp_path))
    assert sum(result.heads_per_layer) == heads_to_keep(12, 0.5) and min(result.heads_per_layer) >= 1
    model, _ = load_model(tmp_path)
    assert isinstance(model, HFLanguageModel)
    assert list(model.cfg.layer_heads) == result.heads_per_layer
    assert model.count_parameters() == (result.n_params, result.n_params_nonembed)
    windows = eval_windows(setup.corpus.val, 16, 256)
    assert math.exp(mean_loss(model, windows)) == pytest.approx(result.val_perplexity, rel=1e-5)
    assert 0 < result.bits_per_byte < 16


def test_l0_penalty_and_the_dense_control(setup):
    dense = run_trial(setup, TrialHParams(method="dense", sparsity=0.0))
    assert dense.heads_per_layer == [4, 4, 4]
    assert dense.n_params == load_dense(setup.dense, torch.device("cpu")).count_parameters()[0]
    strong = run_trial(
        setup,
        TrialHParams(
            method="l0_penalty", l0_lambda=50.0, lr=1e-3, gate_lr_mult=500.0, schedule_shape="one_shot"
        ),
    )
    assert strong.sparsity > 0.0 and min(strong.heads_per_layer) >= 1


def test_a_warm_start_prunes_a_pruned_model_further(setup, tmp_path):
    """Iterative pruning on every architecture (llama's grouped heads too): the child removes
    heads from its parent's saved model, keeps a subset of them, and its saved model scores
    what it recorded."""
    parent = run_trial(
        setup, TrialHParams(method="importance", sparsity=0.25), TrialIO(save_dir=tmp_path / "p")
    )
    hp = TrialHParams(method="importance", sparsity=0.5, importance_batches=1, distill=True)
    child = run_trial(setup, hp, TrialIO(save_dir=tmp_path / "c", parent=tmp_path / "p"))
    assert sum(parent.heads_per_layer) == heads_to_keep(12, 0.25) and sum(child.heads_per_layer) == 6
    assert all(set(c) <= set(p) for c, p in zip(child.kept_heads, parent.kept_heads, strict=True))
    model, _ = load_model(tmp_path / "c")
    assert list(model.cfg.layer_heads) == child.heads_per_layer
    windows = eval_windows(setup.corpus.val, 16, 256)
    assert math.exp(mean_loss(model, windows)) == pytest.approx(child.val_perplexity, rel=1e-5)
