"""The driver at scale (issue 45): its in-memory storage agrees with the database, and a
simulated study (``orchestrator/simulation.py``, through ``bench.driver --quick``) ends with the
invariants of a real one."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from bench import driver as bench_driver
from orchestrator.execution import StudyCallback, StudySearcher
from orchestrator.records import RESULT_ATTRS
from orchestrator.simulation import SimulatedExecutor
from orchestrator.storage import open_store
from orchestrator.storage.driver import DriverStorage

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _fields(trial: optuna.trial.FrozenTrial) -> tuple:
    return (
        trial.number,
        trial.state,
        trial.values,
        trial.params,
        trial.distributions,
        trial.user_attrs,
        trial.system_attrs,
        trial.datetime_start,
        trial.datetime_complete,
    )


def test_the_driver_storage_holds_what_the_database_holds(tmp_path):
    """Asks (sampled and enqueued), attributes one at a time and in batches, system attributes,
    and every way a trial ends, through ``DriverStorage``: a fresh read of the database gives
    the same trials, field by field, and so does a second ``DriverStorage`` loading it."""
    store = open_store(f"sqlite:///{tmp_path}/s.db")
    kept = DriverStorage(store.storage, store.engine)
    study = optuna.create_study(
        study_name="s",
        storage=kept,
        directions=["minimize", "minimize"],
        sampler=optuna.samplers.TPESampler(seed=0),
    )
    study_id = kept.get_study_id_from_name("s")
    for i in range(24):
        if i % 5 == 0:
            study.enqueue_trial({"x": 0.5}, user_attrs={"retry_of": i})
        trial = study.ask()
        x = trial.suggest_float("x", 0.0, 1.0)
        trial.suggest_categorical("kind", ["a", "b"])
        kept.set_trial_user_attrs(
            kept.get_trial_id_from_study_id_trial_number(study_id, trial.number),
            {"a": i, "b": [i, "x"]},
        )
        trial.set_user_attr("single", {"nested": i})
        if i % 4 == 1:
            study.tell(trial, state=TrialState.PRUNED)
        elif i % 7 == 2:
            study.tell(trial, state=TrialState.FAIL)
        elif i % 6 != 3:  # those stay RUNNING
            study.tell(trial, [x, float(i)])
    from_database = store.storage.get_all_trials(study_id)
    assert [_fields(t) for t in kept.get_all_trials(study_id)] == [_fields(t) for t in from_database]
    reloaded = DriverStorage(store.storage, store.engine)
    assert [_fields(t) for t in reloaded.get_all_trials(study_id)] == [_fields(t) for t in from_database]


@pytest.mark.slow  # a simulated study of hundreds of trials: seconds
def test_a_simulated_study_ends_with_the_invariants_of_a_real_one():
    """A few hundred trials, 32 in flight, early stopping and warm starts of the default study,
    on SQLite: exactly the trials asked for, every one told (none left running), the frontier
    table equal to the front recomputed from every trial, trials stopped at rungs and trials
    warm-started."""
    result = bench_driver.main(["--quick"])
    run = result["sqlite"]
    assert result["front_ok"] and run["front_ok"]
    assert run["none_left_running"]
    assert run["finished"] == 200 + 2 * 32  # the largest size, plus the trials still asked for after it
    assert run["stopped_at_rung"] > 0 and run["warm_started"] > 0
    assert run["most_in_flight"] == 32
    for size in ("50", "200"):
        figures = result["sqlite"]["sizes"][size]
        assert figures["trials_per_s"] > 0 and figures["driver_ms_per_trial"] > 0


def test_the_simulator_drives_the_searcher_and_callback_tune_drives(tmp_path, monkeypatch):
    """Ray Tune's path (``runner.TuneExecutor``) hands the driver to ``StudySearcher`` and
    ``StudyCallback``; the simulator must call those same classes, not a copy of the driver's
    logic: counted here, every trial it starts goes through the searcher, every end through the
    callback, and a COMPLETE trial carries what the driver records of a real one."""
    calls = {"suggest": 0, "complete": 0}
    suggest, complete = StudySearcher.suggest, StudyCallback.on_trial_complete

    def counted_suggest(self, trial_id):
        calls["suggest"] += 1
        return suggest(self, trial_id)

    def counted_complete(self, *args, **kwargs):
        calls["complete"] += 1
        return complete(self, *args, **kwargs)

    monkeypatch.setattr(StudySearcher, "suggest", counted_suggest)
    monkeypatch.setattr(StudyCallback, "on_trial_complete", counted_complete)
    executors = []
    monkeypatch.setattr(
        bench_driver,
        "SimulatedExecutor",
        lambda *a, **k: executors.append(SimulatedExecutor(*a, **k)) or executors[-1],
    )
    result = bench_driver.main(["--quick", "--sizes", "20", "40", "--in-flight", "8"])
    stats = executors[0].stats
    assert calls["complete"] == stats.stopped_at_rung + stats.completed == result["sqlite"]["finished"]
    assert calls["suggest"] >= stats.started


def test_a_simulated_trial_records_what_a_real_one_does(tmp_path):
    store = open_store(f"sqlite:///{tmp_path}/r.db")
    run = bench_driver._run(f"sqlite:///{tmp_path}/r.db", [20], 4, seed=1)
    assert run["front_ok"]
    study = optuna.load_study(study_name="driver-bench", storage=store.storage)
    complete = [
        t for t in study.trials if t.state == TrialState.COMPLETE and not t.user_attrs.get("dense_control")
    ]
    stopped = [t for t in study.trials if t.state == TrialState.PRUNED]
    expected = {
        *RESULT_ATTRS,
        "model_sha256",
        "model_dir",
        "hparams",
        "wall_seconds",
        "curve",
        "rung_context",
    }
    assert complete and all(expected <= t.user_attrs.keys() for t in complete)
    assert all({"stopped_at_step", "rung_val_perplexity", "curve"} <= t.user_attrs.keys() for t in stopped)


@pytest.mark.slow  # a simulated study of hundreds of trials: seconds
def test_past_its_window_tpe_proposes_from_the_recent_trials_only(tmp_path, monkeypatch):
    """With a window of 30 finished trials: until then the study's own TPE samples (nothing
    enqueued for it); after it every searched trial not a gap fill takes a whole point (method
    and its knobs) from TPE on the last 30 to 37 finished trials."""
    import orchestrator.runner as runner
    from orchestrator.recent_tpe import RecentTPE

    monkeypatch.setattr(runner, "TPE_WINDOW", 30)
    models = []
    original = RecentTPE._build

    def build(self, trials, numbers):
        original(self, trials, numbers)
        models.append(len(numbers))

    monkeypatch.setattr(RecentTPE, "_build", build)
    store = open_store(f"sqlite:///{tmp_path}/w.db")
    run = bench_driver._run(f"sqlite:///{tmp_path}/w.db", [100], 8, seed=2)
    assert run["front_ok"]
    study = optuna.load_study(study_name="driver-bench", storage=store.storage)
    recent = [t for t in study.trials if t.user_attrs.get("proposed_by") == "tpe_recent"]
    assert recent and min(t.number for t in recent) > 30
    for trial in recent:
        assert {"method", "sparsity", "lr"} <= trial.params.keys()
        assert trial.system_attrs["fixed_params"].keys() == trial.params.keys()  # the study sampled none
    assert models == [30] * len(models) and len(models) >= 3  # built at 30, anew once it held 37
