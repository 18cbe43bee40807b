"""Crashes: the driver SIGKILLed at several points, a worker killed, two drivers on one study.

Each scenario runs the real CLI on the smoke study (budgets raised a little so there is time to
kill it where we want), then the same command again, and checks the invariants of
architecture.md on SQLite and on the real PostgreSQL server.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import optuna
import pytest
from helpers import (
    LAUNCH_STUDY,
    SMOKE,
    busy_trial_worker,
    drop_study,
    expected_front,
    frontier_triples,
    kill_new_ray_processes,
    leftover_ray_processes,
    ray_processes,
    run_smoke_study,
    server_url,
    start_own_session,
    wait_until,
)
from optuna.trial import TrialState

from orchestrator.storage import open_store, read_frontier

pytestmark = pytest.mark.slow

N_TRIALS = 3
# A short lease so that a restarted driver may take over 2 s after the killed one's last beat.
SLOWER = [
    "--set",
    "study.lease_seconds=2",
    "--set",
    "trial.finetune_steps=80",
    "--set",
    "pretrain.steps=250",
    "--n-trials",
    str(N_TRIALS),
]


@pytest.fixture
def study_db(backend, tmp_path):
    name = f"crash-{uuid.uuid4().hex[:8]}"
    url = f"sqlite:///{tmp_path}/runs/crash.db" if backend == "sqlite" else server_url(backend)
    yield url, name
    if backend == "postgresql":
        drop_study(url, name)


def start(url: str, name: str, cwd: Path, *extra: str) -> tuple[subprocess.Popen, Path]:
    log = cwd / f"driver-{uuid.uuid4().hex[:6]}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as stderr:  # the child keeps its own descriptor
        proc = start_own_session(
            [str(LAUNCH_STUDY), "run", str(SMOKE), "--storage", url, "--study-name", name, *SLOWER, *extra],
            cwd=cwd,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    return proc, log


def stop(proc: subprocess.Popen, before: set[int]) -> None:
    """The driver killed if it still runs, and the Ray processes it started stopped."""
    if proc.poll() is None:
        proc.kill()
    kill_new_ray_processes(before)


def wait_for(log: Path, pattern: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if re.search(pattern, log.read_text()):
            return
        if proc.poll() is not None:
            raise AssertionError(f"driver ended before {pattern!r}:\n{log.read_text()[-2000:]}")
        time.sleep(0.1)
    raise AssertionError(f"no {pattern!r} within {timeout}s:\n{log.read_text()[-2000:]}")


def heartbeat_age(url: str, name: str) -> float:
    """Seconds since the study's lease holder last renewed it (0 while there is no lease)."""
    from datetime import UTC, datetime

    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            beat = connection.execute(
                sa.text("SELECT heartbeat_at FROM study_lease WHERE study_name = :n"), {"n": name}
            ).scalar()
    finally:
        engine.dispose()
    if beat is None:
        return 0.0
    beat = datetime.fromisoformat(beat) if isinstance(beat, str) else beat
    return (datetime.now(UTC) - (beat if beat.tzinfo else beat.replace(tzinfo=UTC))).total_seconds()


def check_invariants(url: str, name: str, before_kill: dict[int, list[float]]) -> optuna.Study:
    store = open_store(url)
    study = optuna.load_study(study_name=name, storage=store.storage)
    trials = study.get_trials()
    assert not [t.number for t in trials if t.state == TrialState.RUNNING]
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) == N_TRIALS
    # Nothing completed before the kill is lost or changed...
    for number, values in before_kill.items():
        assert trials[number].state == TrialState.COMPLETE and trials[number].values == values
    # ...nor counted twice: a retry only ever follows a trial that did not complete.
    for t in trials:
        if "retry_of" in t.user_attrs:
            assert trials[t.user_attrs["retry_of"]].state == TrialState.FAIL
    # Optuna's values are what the trial itself wrote next to its model.
    for t in complete:
        saved = json.loads((Path(t.user_attrs["model_dir"]) / "config.json").read_text())
        assert saved["val_perplexity"] == t.values[0]
    assert frontier_triples(read_frontier(store, name)) == expected_front(study)
    return study


def completed(url: str, name: str) -> dict[int, list[float]]:
    try:
        study = optuna.load_study(study_name=name, storage=open_store(url).storage)
    except KeyError:
        return {}
    return {t.number: t.values for t in study.get_trials(states=(TrialState.COMPLETE,))}


KILL_POINTS = {
    "during pretraining": r"pretrain: step 1/",
    "during a trial": r"trial 0: started",
    "between trials": r"trial 1: COMPLETE",
}


# Every point on SQLite; on PostgreSQL the one that leaves a trial RUNNING in the database (the
# others exercise the same code over the same SQLAlchemy session, and each run costs ~40 s).
CRASHES = [(point, "sqlite") for point in KILL_POINTS] + [("during a trial", "postgresql")]


class TestDriverKilled:
    """The driver SIGKILLed. Each class runs on one test process (pytest-xdist's loadscope): the
    two classes of this module, the suite's longest tests, run side by side."""

    @pytest.mark.parametrize(("point", "backend"), CRASHES)
    def test_driver_killed_then_the_same_command_again(self, point, backend, study_db, tmp_path):
        url, name = study_db
        before = ray_processes()
        proc, log = start(url, name, tmp_path)
        try:
            wait_for(log, KILL_POINTS[point], proc)
            if point == "during a trial":
                busy_trial_worker(before)  # killed while the dense control trains
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        finally:
            kill_new_ray_processes(before)
        done_before = completed(url, name)
        # No wait for the lease: its holder's process is gone from this machine, which the
        # next driver sees (storage/lease.py), and it takes the study over at once.
        again = run_smoke_study(url, name, *SLOWER, cwd=tmp_path)
        assert again.returncode == 0, again.stderr[-3000:]
        assert "took over the study from" in again.stderr  # the killed driver's lease, said so
        check_invariants(url, name, done_before)
        assert leftover_ray_processes(before) == {}


class TestInterruptsAndRaces:
    """A worker killed, the driver signalled, a second driver on a running study."""

    def test_a_worker_killed_mid_trial_is_retried_and_the_study_completes(self, tmp_path):
        url, name = f"sqlite:///{tmp_path}/runs/w.db", "worker"
        before = ray_processes()
        proc, log = start(url, name, tmp_path, "--set", "trial.finetune_steps=400")
        try:
            wait_for(log, r"trial 0: started", proc)
            victims = busy_trial_worker(before, cpu=1.0)  # mid-trial, not while it starts
            for pid in victims:
                os.kill(pid, signal.SIGKILL)
            assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
        finally:
            stop(proc, before)
        study = optuna.load_study(study_name=name, storage=url)
        complete = study.get_trials(states=(TrialState.COMPLETE,))
        assert len(complete) == N_TRIALS
        assert any(t.user_attrs.get("worker_retries", 0) >= 1 for t in study.get_trials())

    @pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
    def test_a_signal_mid_trial_stops_cleanly_and_the_same_command_finishes(self, signum, tmp_path):
        """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) or SIGTERM (to the
        driver alone, as `kill` or a scheduler sends it) mid-trial: exit 130 / 143 with how to
        resume, nothing left RUNNING, no Ray process left, no CSV; the same command then ends with
        exactly the asked trials (run after SIGINT only: what is left in the database is the same)."""
        url, name = f"sqlite:///{tmp_path}/runs/sig.db", "sig"
        before = ray_processes()
        proc, log = start(url, name, tmp_path, "--set", "trial.finetune_steps=400")
        try:
            wait_for(log, r"trial 1: started", proc)
            busy_trial_worker(before)  # mid-trial
            if signum == signal.SIGINT:
                os.killpg(proc.pid, signum)
            else:
                proc.send_signal(signum)
            code = proc.wait(timeout=120)
            leftover = leftover_ray_processes(before)
        finally:
            stop(proc, before)
        text = log.read_text()
        assert code == 128 + signum, text[-3000:]
        last = text.strip().splitlines()[-1]
        assert last.startswith(f"launch-study: interrupted ({signal.Signals(signum).name})"), text[-3000:]
        assert "resume with: launch-study run" in last and "Traceback" not in text
        assert leftover == {}
        study = optuna.load_study(study_name=name, storage=url)
        states = [t.state for t in study.get_trials()]
        assert TrialState.RUNNING not in states and TrialState.FAIL in states
        assert not (tmp_path / "runs" / f"{name}_pareto.csv").exists()
        if signum == signal.SIGTERM:
            return
        done_before = completed(url, name)
        again = run_smoke_study(url, name, *SLOWER, cwd=tmp_path)
        assert again.returncode == 0, again.stderr[-3000:]
        study = check_invariants(url, name, done_before)
        params = [
            json.dumps(t.params, sort_keys=True) for t in study.get_trials(states=(TrialState.COMPLETE,))
        ]
        assert len(params) == len(set(params))  # no parameter set run twice to completion
        assert leftover_ray_processes(before) == {}

    def test_a_newcomer_with_a_shorter_lease_cannot_take_a_live_drivers_study(self, tmp_path):
        """The race of issue 13: `--set study.lease_seconds=1` judged the first driver's fresh
        lease by its own TTL and took it; both ended 0 with more COMPLETE trials than asked."""
        url, name = f"sqlite:///{tmp_path}/runs/race.db", "race"
        before = ray_processes()
        # Trials long enough (600 steps) that the first is still running when the second arrives.
        first, log = start(
            url, name, tmp_path, "--set", "study.lease_seconds=60", "--set", "trial.finetune_steps=600"
        )
        try:
            wait_for(log, r"trial 0: started", first)
            # The first driver's heartbeat older than the newcomer's TTL (1s), as the newcomer
            # then judged it: a lease it must not take, by the holder's own TTL (60s).
            wait_until(lambda: heartbeat_age(url, name) > 1.5, "a heartbeat older than 1.5s", 30)
            second = run_smoke_study(url, name, *SLOWER, "--set", "study.lease_seconds=1", cwd=tmp_path)
            assert second.returncode == 2 and "being run by another driver" in second.stderr, second.stderr
            assert first.wait(timeout=300) == 0, log.read_text()[-3000:]
        finally:
            stop(first, before)
        study = optuna.load_study(study_name=name, storage=url)
        assert len(study.get_trials(states=(TrialState.COMPLETE,))) == N_TRIALS
        assert [t.state for t in study.get_trials()].count(TrialState.FAIL) == 0
