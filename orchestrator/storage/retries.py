"""The retry policy: an unfinished trial whose worker or driver is gone is told FAIL and asked
for again with the same hyperparameters, once."""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial, TrialState

from orchestrator.storage.store import StudyStore


def fail_and_ask_again(store: StudyStore, study: optuna.Study, trials: list[FrozenTrial], why: str) -> None:
    """Mark these unfinished trials FAIL, saying ``why``, and ask for each again (the same
    hyperparameters, linked by ``retry_of``: the retry resumes from its after-pruning checkpoint).
    The dense control is not enqueued: the driver asks for it anew while the study has none.

    The retry is asked for before the trial is told FAIL, and only once: a driver killed between
    the two leaves the trial RUNNING beside its retry, and the next driver fails it without asking
    again (told first, a kill in between would lose the retry: only RUNNING trials are orphans)."""
    study_id = store.storage.get_study_id_from_name(study.study_name)
    asked_again = {
        t.user_attrs["retry_of"] for t in study.get_trials(deepcopy=False) if "retry_of" in t.user_attrs
    }
    for trial in trials:
        trial_id = store.storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
        if store.storage.get_trial(trial_id).state.is_finished():
            continue  # told meanwhile (by its worker's last report): nothing to ask again
        store.storage.set_trial_user_attr(trial_id, "error", why)
        if not trial.user_attrs.get("dense_control") and trial.number not in asked_again:
            study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
        study.tell(trial.number, state=TrialState.FAIL)


def fail_orphaned_trials(store: StudyStore, study: optuna.Study) -> list[FrozenTrial]:
    """Every RUNNING trial, failed and asked for again. Called by the driver holding the lease
    before it asks for trials, so these can only be left over from a driver that died."""
    orphans = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    fail_and_ask_again(store, study, orphans, "its driver stopped while it ran")
    return orphans
