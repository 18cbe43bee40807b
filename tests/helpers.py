"""Running the real CLI, and reading a study back, for the end-to-end tests."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import optuna

from orchestrator.frontier import pareto_front

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "studies" / "smoke.toml"
LAUNCH_STUDY = Path(sys.executable).parent / "launch-study"


def launch(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("HEADPRUNE_STORAGE", None)
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(
        [str(LAUNCH_STUDY), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def ray_processes() -> set[int]:
    """Ray's own processes: the cluster, its agents and workers (named ray::...)."""
    out = subprocess.run(
        ["pgrep", "-f", "raylet|gcs_server|ray::|ray/dashboard|ray/_private"], capture_output=True, text=True
    ).stdout
    return {int(p) for p in out.split()} - {os.getpid()}


def kill_new_ray_processes(before: set[int]) -> None:
    """After a driver was SIGKILLed, Ray's agents outlive it (orphans of PID 1): stop them."""
    import signal
    import time

    for _ in range(20):  # the raylet and GCS exit by themselves within a few seconds
        leftovers = ray_processes() - before
        if not leftovers:
            return
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)


def expected_front(study: optuna.Study) -> list[tuple[int, float, int]]:
    """The non-dominated COMPLETE trials, recomputed from Optuna's own records."""
    done = [t for t in study.get_trials() if t.state == optuna.trial.TrialState.COMPLETE]
    front = pareto_front(done, key=lambda t: (t.values[0], t.values[1]))
    return sorted((t.number, t.values[0], int(t.values[1])) for t in front)


def frontier_triples(rows: list[dict]) -> list[tuple[int, float, int]]:
    return sorted((r["trial_number"], r["val_perplexity"], r["n_params"]) for r in rows)


def hparams(trial: optuna.trial.FrozenTrial) -> dict:
    return trial.user_attrs["hparams"]


def heads(trial: optuna.trial.FrozenTrial) -> list[int]:
    value = trial.user_attrs["heads_per_layer"]
    return json.loads(value) if isinstance(value, str) else value
