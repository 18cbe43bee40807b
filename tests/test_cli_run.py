"""The real ``launch-study`` on the smoke study: database, frontier table, CSV, reuse, processes."""

from __future__ import annotations

import math

import optuna
import pandas as pd
import pytest
from helpers import SMOKE, expected_front, frontier_triples, heads, hparams, launch, ray_processes

from orchestrator.storage import open_store, read_frontier
from trainers.data import CharCorpus
from trainers.gates import heads_to_keep
from trainers.model import LanguageModel, ModelConfig, count_parameters

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """The smoke study run twice: once to 3 trials, then resumed to 4 with the same command."""
    work = tmp_path_factory.mktemp("smoke")
    before = ray_processes()
    first = launch("run", str(SMOKE), cwd=work)
    second = launch("run", str(SMOKE), "--n-trials", "4", cwd=work)
    after = ray_processes()
    store = open_store(f"sqlite:///{work}/runs/smoke.db")
    study = optuna.load_study(study_name="smoke", storage=store.storage)
    vocab = CharCorpus.load(SMOKE.parent / "data" / "tinyshakespeare.txt", block_size=32).vocab_size
    return {
        "work": work,
        "vocab_size": vocab,
        "first": first,
        "second": second,
        "store": store,
        "study": study,
        "leftover": after - before,
    }


def test_both_runs_succeed(smoke):
    for run in (smoke["first"], smoke["second"]):
        assert run.returncode == 0, run.stderr[-3000:]


def test_study_holds_the_asked_complete_trials_with_both_values(smoke):
    trials = smoke["study"].get_trials()
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 4
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    for t in complete:
        assert len(t.values) == 2 and all(math.isfinite(v) for v in t.values)
    assert smoke["study"].metric_names == ["val_perplexity", "n_params"]


def test_frontier_table_equals_front_recomputed_from_optuna(smoke):
    rows = read_frontier(smoke["store"], "smoke")
    assert rows and frontier_triples(rows) == expected_front(smoke["study"])


def test_csv_equals_the_frontier_table(smoke):
    csv = pd.read_csv(smoke["work"] / "runs" / "smoke_pareto.csv")
    rows = read_frontier(smoke["store"], "smoke")
    assert list(csv["trial_number"]) == [r["trial_number"] for r in rows]
    assert list(csv["val_perplexity"]) == pytest.approx([r["val_perplexity"] for r in rows], rel=1e-12)
    assert list(csv["n_params"]) == [r["n_params"] for r in rows]
    assert list(csv["heads_per_layer"]) == [r["heads_per_layer"] for r in rows]
    assert list(csv["n_params"]) == sorted(csv["n_params"])
    for column in ("n_params_nonembed", "sparsity", "method", "params_sparsity", "params_lr"):
        assert column in csv.columns


def test_first_trial_is_the_dense_control(smoke):
    first = smoke["study"].get_trials()[0]
    assert first.user_attrs["dense_control"] is True
    assert hparams(first)["sparsity"] == 0.0
    assert heads(first) == [4, 4]


def test_achieved_sparsity_is_the_target_to_the_nearest_head(smoke):
    for t in smoke["study"].get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
        target = hparams(t)["sparsity"]
        assert sum(heads(t)) == heads_to_keep(8, target)
        assert t.user_attrs["sparsity"] == pytest.approx(1 - sum(heads(t)) / 8)


def test_stored_parameter_count_is_the_pruned_models(smoke):
    for t in smoke["study"].get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
        cfg = ModelConfig(
            vocab_size=smoke["vocab_size"],
            n_layer=2,
            n_head=4,
            d_model=32,
            block_size=32,
            heads_per_layer=tuple(heads(t)),
        )
        total, nonembed = count_parameters(LanguageModel(cfg))
        assert (total, nonembed) == (t.values[1], t.user_attrs["n_params_nonembed"])


def test_second_run_reuses_the_dense_checkpoint(smoke):
    assert "pretrained in" in smoke["first"].stderr
    assert "reused" in smoke["second"].stderr
    assert "pretrain: step" not in smoke["second"].stderr
    assert len(list((smoke["work"] / "runs" / "artifacts" / "dense").iterdir())) == 1


def test_a_finished_study_run_again_does_no_work(smoke):
    third = launch("run", str(SMOKE), "--n-trials", "4", cwd=smoke["work"])
    assert third.returncode == 0
    assert "already holds 4 complete trials" in third.stderr
    assert len(smoke["study"].get_trials()) == 4


def test_export_command_writes_the_same_csv(smoke, tmp_path):
    out = tmp_path / "front.csv"
    url = f"sqlite:///{smoke['work']}/runs/smoke.db"
    run = launch("export", "--storage", url, "--study-name", "smoke", "--output", str(out), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert pd.read_csv(out).equals(pd.read_csv(smoke["work"] / "runs" / "smoke_pareto.csv"))
    everything = launch("export", "--storage", url, "--study-name", "smoke", "--all", cwd=tmp_path)
    assert everything.returncode == 0
    assert len(everything.stdout.strip().splitlines()) == 1 + 4


def test_no_ray_process_is_left_behind(smoke):
    assert smoke["leftover"] == set()
