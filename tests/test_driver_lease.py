"""A driver that has lost its study's lease (another driver took the study: storage.HeldLease)
neither asks nor tells: its running trials are the new holder's to resume, and anything it
wrote after losing the lease would race with that holder's writes."""

from __future__ import annotations

import optuna
from helpers import default_study_driver, worker_result
from ray.tune.search import Searcher

from orchestrator.early_stopping import RUNG_KEY

RUNNING = optuna.trial.TrialState.RUNNING


def test_a_driver_that_lost_its_lease_records_nothing_more(tmp_path):
    leased = [True]
    driver = default_study_driver(tmp_path, startup=4, spread_trials=3, still_leased=lambda: leased[0])
    dense = driver.next_config("dense")["hparams"]
    driver.finish("dense", worker_result({**dense, "sparsity": 0.0}, 4.60), None)
    first = driver.next_config("a")
    second = driver.next_config("b")
    driver.note_rung("a", {RUNG_KEY: 0, "finetune_step": 11, "val_perplexity": 6.0, "n_params": 1000})
    assert driver.study.trials[first["optuna_trial"]].user_attrs["curve"] == [[0, 11, 6.0]]

    leased[0] = False  # another driver takes the study here
    driver.note_rung("b", {RUNG_KEY: 0, "finetune_step": 11, "val_perplexity": 5.0, "n_params": 1000})
    driver.finish("a", worker_result(first["hparams"], 4.9), None)
    driver.finish("b", None, "worker died")
    assert driver.next_config("c") == Searcher.FINISHED

    trials = driver.study.get_trials(deepcopy=False)
    assert len(trials) == 3  # no trial asked after the lease was lost
    assert [t.state for t in trials[1:]] == [RUNNING, RUNNING]  # the new holder resumes both
    assert "curve" not in trials[second["optuna_trial"]].user_attrs
    assert "error" not in trials[second["optuna_trial"]].user_attrs
    assert driver.n_finished == 1 and driver.n_failed == 0
