"""A failed trial says why; only what may pass by itself is run again (issue 13)."""

from __future__ import annotations

import optuna
import pytest
from helpers import SMOKE

import orchestrator.execution as execution
from orchestrator.config import load_study_config
from orchestrator.execution import ERROR_KEY, DriverHooks, DriverPlan, StudyDriver, train_on_worker
from orchestrator.report import format_status, study_status
from orchestrator.storage import open_store
from orchestrator.storage.driver import DriverStorage
from orchestrator.study_trials import StudyTrials
from trainers.trial import TransientTrialError


def worker_outcome(monkeypatch, error: BaseException) -> list[dict]:
    """Run the Tune trainable in this process, its trial raising ``error``: what it reported."""
    reports: list[dict] = []
    monkeypatch.setattr(execution.tune, "report", reports.append)
    monkeypatch.setattr(execution, "run_trial", lambda *a, **k: (_ for _ in ()).throw(error))
    setup = type("Setup", (), {"budget": type("Budget", (), {"threads": 1})()})()
    train_on_worker({"hparams": {}, "model_dir": "/nonexistent"}, setup)
    return reports


def test_a_deterministic_failure_is_reported_with_its_type_not_raised(monkeypatch):
    reports = worker_outcome(monkeypatch, RuntimeError("Torch not compiled with CUDA enabled"))
    assert reports == [{ERROR_KEY: "RuntimeError: Torch not compiled with CUDA enabled"}]


@pytest.mark.parametrize("error", [TransientTrialError("disk busy"), KeyboardInterrupt()])
def test_a_transient_failure_is_raised_for_tune_to_retry(monkeypatch, error):
    with pytest.raises(type(error)):
        worker_outcome(monkeypatch, error)


def test_an_exception_from_tune_itself_is_tunes(monkeypatch):
    """A scheduler stopping the trial raises out of tune.report at a rung: not a trial failure."""
    reports: list[dict] = []

    class Stop(Exception):
        pass

    def report(metrics):
        reports.append(metrics)
        raise Stop

    def trial_with_a_rung(setup, hp, io, rungs):
        rungs.report(execution.RungReport(0, 10, 100, 5.0, 1000, 1.0))

    monkeypatch.setattr(execution.tune, "report", report)
    monkeypatch.setattr(execution, "run_trial", trial_with_a_rung)
    setup = type("Setup", (), {"budget": type("Budget", (), {"threads": 1})()})()
    with pytest.raises(Stop):
        train_on_worker({"hparams": {}, "model_dir": "/nonexistent"}, setup)
    assert len(reports) == 1 and ERROR_KEY not in reports[0]


def test_the_driver_records_the_cause_and_status_shows_it(tmp_path):
    cfg = load_study_config(SMOKE)
    store = open_store(f"sqlite:///{tmp_path}/f.db")
    storage = DriverStorage(store.storage, store.engine)
    study = optuna.create_study(study_name="f", storage=storage, directions=["minimize", "minimize"])
    plan = DriverPlan(n_trials=3, max_failed=5, models_dir=str(tmp_path))
    hooks = DriverHooks(on_finished=lambda trial, pushed_off: None)
    driver = StudyDriver(study, cfg.search, StudyTrials(storage, "f"), plan, hooks)
    driver.next_config("t0")
    driver.finish("t0", {ERROR_KEY: "RuntimeError: Torch not compiled with CUDA enabled"}, None)
    (trial,) = study.get_trials()
    assert trial.state == optuna.trial.TrialState.FAIL
    assert trial.user_attrs["error"] == "RuntimeError: Torch not compiled with CUDA enabled"
    assert driver.n_failed == 1 and driver.n_finished == 0
    assert "last failure: trial 0: RuntimeError: Torch not compiled with CUDA enabled" in format_status(
        study_status(study)
    )


@pytest.mark.slow
def test_a_failing_trial_in_a_real_run_is_recorded_once_with_its_cause(tmp_path, monkeypatch):
    """Through the real CLI, Ray Tune and its workers: every pruned trial raises (the fault is
    injected with a sitecustomize module, which every Python process of the run imports,
    Ray's workers included). The dense control completes; each failure is FAIL with its type
    and message, none is run again, and the run ends cleanly with the cause in `status`."""
    import os

    from helpers import launch, leftover_ray_processes, ray_processes

    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(
        "import trainers.trial as trial\n"
        "_real = trial.run_trial\n"
        "def run_trial(setup, hp, *args, **kwargs):\n"
        "    if hp.method != 'dense':\n"
        "        raise RuntimeError('injected: Torch not compiled with CUDA enabled')\n"
        "    return _real(setup, hp, *args, **kwargs)\n"
        "trial.run_trial = run_trial\n"
    )
    before = ray_processes()
    path = os.pathsep.join(p for p in (str(inject), os.environ.get("PYTHONPATH", "")) if p)
    monkeypatch.setenv("PYTHONPATH", path)
    run = launch("run", str(SMOKE), "--set", "study.max_failed_trials=1", cwd=tmp_path)
    monkeypatch.undo()
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    study = optuna.load_study(study_name="smoke", storage=f"sqlite:///{tmp_path}/runs/smoke.db")
    failed = study.get_trials(states=(optuna.trial.TrialState.FAIL,))
    assert len(failed) == 2  # more than max_failed_trials = 1: the run stopped asking
    for trial in failed:
        assert trial.user_attrs["error"] == "RuntimeError: injected: Torch not compiled with CUDA enabled"
        assert "worker_retries" not in trial.user_attrs  # deterministic: not run again
    assert [t.state for t in study.get_trials()].count(optuna.trial.TrialState.COMPLETE) == 1
    status = launch("status", "--study-name", "smoke", cwd=tmp_path)
    assert "last failure: trial 2: RuntimeError: injected" in status.stdout
    assert leftover_ray_processes(before) == {}
