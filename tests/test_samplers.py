"""Every sampler a study may choose works on a space shaped like ours: two minimised
objectives, and knobs that exist only for some methods (define-by-run)."""

from __future__ import annotations

import optuna
import pytest

from orchestrator.config import SAMPLERS, load_study_config
from orchestrator.runner import make_sampler

optuna.logging.set_verbosity(optuna.logging.WARNING)


def objective(trial: optuna.Trial) -> tuple[float, float]:
    method = trial.suggest_categorical("method", ["l0_target", "importance"])
    sparsity = trial.suggest_float("sparsity", 0.05, 0.875)
    lr = trial.suggest_float("lr", 1e-4, 1e-3, log=True)
    penalty = (
        trial.suggest_float("gate_lr_mult", 10.0, 200.0, log=True) / 1e3 if method == "l0_target" else 0.0
    )
    return 1.0 + sparsity**2 + abs(lr - 3e-4) * 100 + penalty, 1.0 - sparsity


def study_with_a_dense_control(kind: str) -> optuna.Study:
    """A study as ours: trial 0 a complete trial with no parameters (the dense control)."""
    study = optuna.create_study(
        directions=["minimize", "minimize"], sampler=make_sampler(kind, seed=0, startup=4)
    )
    study.add_trial(optuna.trial.create_trial(values=[1.0, 1.0], params={}, distributions={}))
    return study


@pytest.mark.parametrize("kind", SAMPLERS)
def test_each_sampler_models_a_conditional_two_objective_space(kind):
    study = study_with_a_dense_control(kind)
    study.optimize(objective, n_trials=10)
    assert len(study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))) == 11
    # After the start-up the sampler chose, and not always the same point.
    assert len({t.params["sparsity"] for t in study.trials[5:]}) > 1


def test_the_joint_model_is_not_emptied_by_the_dense_controls_missing_parameters():
    """Samplers that model the parameters every complete trial shares (Optuna's GP and NSGA-II)
    would model nothing here and sample at random; grouped multivariate TPE models each branch."""
    study = study_with_a_dense_control("tpe_multivariate")
    study.optimize(objective, n_trials=6)
    modelled = study.sampler.infer_relative_search_space(study, study.ask())
    assert {"method", "sparsity", "lr", "gate_lr_mult"} <= set(modelled)


def test_the_study_file_names_the_sampler(tmp_path):
    from helpers import SMOKE

    from orchestrator.errors import UserError

    assert load_study_config(SMOKE).study.sampler == "tpe"
    assert load_study_config(SMOKE, ["study.sampler=tpe_multivariate"]).study.sampler == "tpe_multivariate"
    with pytest.raises(UserError, match="gp"):
        load_study_config(SMOKE, ["study.sampler=gp"])
