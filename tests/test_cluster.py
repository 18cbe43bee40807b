"""A study on a real two-node Ray cluster on this machine, with token authentication."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import optuna
import pytest
from helpers import (
    LAUNCH_STUDY,
    SMOKE,
    free_port,
    kill_new_ray_processes,
    leftover_ray_processes,
    ray_processes,
    run_own_session,
)
from optuna.trial import TrialState

pytestmark = pytest.mark.slow
RAY = Path(LAUNCH_STUDY).parent / "ray"


def test_trials_land_on_both_nodes_of_an_existing_cluster(tmp_path):
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    env.pop("RAY_ADDRESS", None)
    port = free_port()
    address = f"127.0.0.1:{port}"
    before = ray_processes()
    marker = Path("/tmp/ray/ray_current_cluster")  # `ray start` records its cluster here
    had_marker = marker.exists()
    try:
        head = run_own_session(
            [
                str(RAY),
                "start",
                "--head",
                f"--port={port}",
                "--num-cpus=1",
                "--include-dashboard=false",
                "--node-ip-address=127.0.0.1",
            ],
            timeout=120,
            env=env,
        )
        assert head.returncode == 0, head.stderr[-2000:]
        worker = run_own_session(
            [str(RAY), "start", f"--address={address}", "--num-cpus=1", "--node-ip-address=127.0.0.1"],
            timeout=120,
            env=env,
        )
        assert worker.returncode == 0, worker.stderr[-2000:]
        url = f"sqlite:///{tmp_path}/runs/cluster.db"
        run = run_own_session(
            [
                str(LAUNCH_STUDY),
                "run",
                str(SMOKE),
                "--storage",
                url,
                "--ray-address",
                address,
                "--n-trials",
                "6",
                "--max-concurrent",
                "2",
                "--set",
                "study.cpus_per_trial=1",
                "--set",
                "trial.finetune_steps=300",
            ],
            cwd=tmp_path,
            timeout=300,
            env=env,
        )
        assert run.returncode == 0, run.stderr[-3000:]
    finally:
        kill_new_ray_processes(before)
        if not had_marker:
            marker.unlink(missing_ok=True)
    study = optuna.load_study(study_name="smoke", storage=url)
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(complete) == 6
    assert len({t.user_attrs["node_id"] for t in complete}) == 2
    assert leftover_ray_processes(before) == {}
