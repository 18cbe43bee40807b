"""Optuna + Ray Tune orchestration of head-pruning studies, as a library: what every
``launch-study`` command does, from Python (a notebook, a script). The CLI (orchestrator/cli.py)
is a thin adapter over these functions.

    from orchestrator import run_study, open_study, export_study
    summary = run_study("studies/smoke.toml", n_trials=4, overrides=["trial.finetune_steps=100"])
    print(summary.csv, summary.front_size)
    store, study = open_study("smoke", storage="sqlite:///runs/smoke.db")
    export_study(store, study, output=Path("front.json"), fmt="json")

A Ray already initialised (``ray.init(...)`` before) is used as it is and left running. A mistake
in a study file or an option raises ``orchestrator.errors.UserError`` before anything is written.
"""

from __future__ import annotations

from pathlib import Path


def _study_and_options(study_file: str | Path, overrides, **options):
    from orchestrator.config import load_study_config
    from orchestrator.session import RunOptions

    cfg = load_study_config(study_file, list(overrides))
    return cfg, RunOptions.for_study(cfg, **options)


def run_study(study_file: str | Path, *, overrides: list[str] = (), **options):
    """Run (or resume) the study in ``study_file`` (``launch-study run``); returns
    ``orchestrator.runner.RunSummary``. ``overrides`` are ``--set`` items
    (``"trial.finetune_steps=100"``); ``options`` are ``session.RunOptions.for_study``'s
    (``storage``, ``study_name``, ``n_trials``, ``max_concurrent``, ``artifacts``, ``output``,
    ``ray_address``), each left out taking the study file's value or the CLI's default."""
    from orchestrator.runner import run_study as run

    cfg, opts = _study_and_options(study_file, overrides, **options)
    return run(cfg, opts)


def replicate_study(study_file: str | Path, seeds: int = 2, *, overrides: list[str] = (), **options):
    """Train the front of the study that ran from ``study_file`` again at ``seeds`` more seeds
    (``launch-study replicate``); ``options`` as ``run_study``'s. Returns
    ``orchestrator.replicates.ReplicateSummary``."""
    from orchestrator.replicates import replicate_front

    cfg, opts = _study_and_options(study_file, overrides, **options)
    return replicate_front(cfg, opts, seeds)


def reference_study(study_file: str | Path, eval_every: int = 50, *, overrides: list[str] = (), **options):
    """The matched dense reference of each front point (``launch-study reference``); returns
    ``orchestrator.references.ReferenceSummary``."""
    from orchestrator.references import matched_references

    cfg, opts = _study_and_options(study_file, overrides, **options)
    return matched_references(cfg, opts, eval_every)


def open_study(study_name: str, storage: str | None = None):
    """(store, study) of a study that exists, read only (``status``, ``export``)."""
    from orchestrator.storage import load_existing_study, open_store, resolve_url

    store = open_store(resolve_url(storage, study_name), create=False)
    return store, load_existing_study(store, study_name)


def study_status(store, study) -> str:
    """What ``launch-study status`` prints."""
    from orchestrator.export import replicated
    from orchestrator.report import format_status
    from orchestrator.report import study_status as status

    return format_status(status(study, replicated(store, study)))


def export_study(store, study, **options) -> None:
    """``launch-study export``: see ``orchestrator.front_export.export_study``."""
    from orchestrator.front_export import export_study as export

    export(store, study, **options)


def export_trial_model(store, study, trial_number: int, output: str | Path, force: bool = False) -> Path:
    """``launch-study export-model``: see ``orchestrator.model_export.export_trial_model``."""
    from orchestrator.model_export import export_trial_model as export

    return export(store, study, trial_number, Path(output), force=force)


__all__ = [
    "export_study",
    "export_trial_model",
    "open_study",
    "reference_study",
    "replicate_study",
    "run_study",
    "study_status",
]
