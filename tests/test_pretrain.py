"""Dense pretraining until converged (warmup-stable-decay) and the shipped checkpoint."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from trainers.data import Corpus
from trainers.hparams import PretrainConfig
from trainers.model import ModelConfig
from trainers.pretrain import UntilConverged, ensure_dense_checkpoint


def run_schedule(cfg: PretrainConfig, loss_at) -> tuple[UntilConverged, list[float], int]:
    """Drive the schedule as ``fit`` does, with a synthetic validation loss."""
    state = {"step": 0}
    schedule = UntilConverged(cfg, lambda: loss_at(state["step"]))
    rates = []
    for step in range(schedule.max_steps):
        rates.append(schedule.lr_at(step))
        state["step"] = step + 1
        if schedule.after_step(step + 1):
            return schedule, rates, step + 1
    return schedule, rates, schedule.max_steps


def test_plateau_ends_the_constant_phase_then_a_linear_cool_down():
    cfg = PretrainConfig(steps=20000, lr=2e-3, warmup_steps=100, converge_window=1000, eval_every=250)

    def loss(step):
        return 1.5 + math.exp(-step / 400)

    schedule, rates, trained = run_schedule(cfg, loss)
    # The first evaluation where the last 1,000 steps improved the loss by < 0.5%:
    expected = next(s for s in range(1250, 20000, 250) if loss(s - 1000) - loss(s) < 0.005 * loss(s - 1000))
    assert schedule.converged_at == expected
    assert trained == schedule.total == expected + round(0.2 * expected)
    assert rates[0] == pytest.approx(2e-3 / 100)  # warm-up
    assert rates[500] == rates[expected - 1] == 2e-3  # constant until the plateau
    assert rates[expected] == pytest.approx(2e-3)  # then linear to zero
    assert rates[-1] == pytest.approx(2e-3 / (schedule.total - expected))
    assert schedule.curve[-1][0] == trained  # the end is evaluated too


def test_the_step_cap_ends_it_when_no_plateau_comes():
    cfg = PretrainConfig(steps=1000, lr=1e-3, warmup_steps=0, converge_window=500, eval_every=100)
    schedule, _, trained = run_schedule(cfg, lambda step: 10.0 - step / 200)  # always improving
    assert schedule.converged_at == 1000
    assert trained == 1200


def test_a_shipped_checkpoint_is_used_instead_of_training(tmp_path, small_text, monkeypatch):
    corpus = Corpus.load(small_text, block_size=16)
    model = ModelConfig(vocab_size=corpus.vocab_size, block_size=16, n_layer=1, n_head=2, d_model=16)
    pretrain = PretrainConfig(steps=6, batch_size=4, warmup_steps=1, until_converged=True, eval_every=2)
    built = ensure_dense_checkpoint(corpus, model, pretrain, tmp_path / "a", eval_tokens=64)
    assert not built.reused
    monkeypatch.chdir(tmp_path)  # a study file given by a relative path: its checkpoints/ too
    shipped = ensure_dense_checkpoint(
        corpus, model, pretrain, Path("b"), eval_tokens=64, shipped_dir=Path("a/dense")
    )
    # Absolute: trial workers run in folders of Ray's, where a relative path finds nothing.
    assert shipped.reused and shipped.path == built.path and shipped.path.is_absolute()
    assert shipped.val_perplexity == built.val_perplexity
    assert not (tmp_path / "b").exists()  # nothing trained, nothing written
    other = PretrainConfig(steps=7, batch_size=4, warmup_steps=1)  # another key: trained anew
    assert not ensure_dense_checkpoint(
        corpus, model, other, tmp_path / "b", eval_tokens=64, shipped_dir=tmp_path / "a" / "dense"
    ).reused
