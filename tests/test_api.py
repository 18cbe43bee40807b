"""``from orchestrator import run_study``: the CLI's run from Python, in a process whose Ray is
already initialised (a notebook's), which it uses and leaves running."""

from __future__ import annotations

import optuna
import pandas as pd
import pytest
from helpers import SMOKE

from orchestrator import run_study
from orchestrator.errors import UserError

pytestmark = pytest.mark.slow


def test_run_study_uses_the_callers_ray_and_leaves_it_running(tmp_path, monkeypatch):
    import ray

    monkeypatch.chdir(tmp_path)
    # "local": a Ray of its own even while another test runs a cluster `ray start` recorded
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        summary = run_study(
            SMOKE,
            n_trials=2,
            storage=f"sqlite:///{tmp_path}/api.db",
            artifacts=tmp_path / "artifacts",
            overrides=["trial.finetune_steps=5"],
        )
        assert ray.is_initialized()  # the caller's, still there for its next study
    finally:
        ray.shutdown()
    study = optuna.load_study(study_name="smoke", storage=f"sqlite:///{tmp_path}/api.db")
    assert len(study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))) == 2
    assert summary.n_finished == 2 and summary.csv.is_file()
    assert len(pd.read_csv(summary.csv)) == summary.front_size


def test_a_mistake_is_a_user_error_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="unknown key .nope."):
        run_study(SMOKE, overrides=["trial.nope=1"], storage=f"sqlite:///{tmp_path}/api.db")
    assert not (tmp_path / "api.db").exists() and not (tmp_path / "runs").exists()
