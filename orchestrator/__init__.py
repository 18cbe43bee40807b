"""Optuna + Ray Tune orchestration of head-pruning studies.

From Python (a notebook, a script), the same run as ``launch-study run``:

    from orchestrator import run_study
    summary = run_study("studies/smoke.toml", n_trials=4, overrides=["trial.finetune_steps=100"])
    print(summary.csv, summary.front_size)

A Ray already initialised (``ray.init(...)`` before) is used as it is and left running.
"""

from __future__ import annotations

from pathlib import Path


def run_study(
    study_file: str | Path,
    *,
    overrides: list[str] = (),
    storage: str | None = None,
    study_name: str | None = None,
    n_trials: int | None = None,
    max_concurrent: int | None = None,
    artifacts: str | Path | None = None,
    output: str | Path | None = None,
    ray_address: str | None = None,
):
    """Run (or resume) the study in ``study_file``; returns ``orchestrator.runner.RunSummary``.
    ``overrides`` are ``--set`` items (``"trial.finetune_steps=100"``). A mistake in the study
    file or the options raises ``orchestrator.errors.UserError`` before anything is written."""
    from orchestrator.config import load_study_config
    from orchestrator.runner import RunOptions
    from orchestrator.runner import run_study as run

    cfg = load_study_config(study_file, list(overrides))
    opts = RunOptions.for_study(
        cfg,
        storage=storage,
        study_name=study_name,
        n_trials=n_trials,
        max_concurrent=max_concurrent,
        artifacts=artifacts,
        output=output,
        ray_address=ray_address,
    )
    return run(cfg, opts)


__all__ = ["run_study"]
