"""The storage layer on SQLite and on the real PostgreSQL server."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import optuna
import pytest
import sqlalchemy as sa
from helpers import (
    drop_study,
    expected_front,
    frontier_triples,
    leftover_ray_processes,
    ray_processes,
    run_smoke_study,
    server_url,
)
from sqlalchemy.orm import Session

from orchestrator.errors import LeaseLost, UserError
from orchestrator.storage import (
    HeldLease,
    StudyLease,
    Takeover,
    acquire_lease,
    create_or_load_study,
    fail_orphaned_trials,
    hold_lease,
    models_folder,
    open_store,
    read_frontier,
    redact,
    refresh_frontier,
    release_lease,
    renew_lease,
)
from orchestrator.storage.lease import _pid_namespace


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def store(request, tmp_path):
    return open_store(
        f"sqlite:///{tmp_path}/s.db" if request.param == "sqlite" else server_url(request.param)
    )


@pytest.fixture
def study(store):
    name = f"test-{uuid.uuid4().hex[:10]}"
    study = create_or_load_study(store, name, optuna.samplers.RandomSampler(seed=0))
    yield study
    drop_study(store.url, name)


def add_complete(study: optuna.Study, ppl: float, n_params: int) -> None:
    trial = study.ask()
    for key, value in {
        "n_params_nonembed": n_params - 100,
        "sparsity": 0.5,
        "heads_per_layer": [1, 2],
        "method": "l0_target",
        "hparams": {"sparsity": 0.5},
    }.items():
        trial.set_user_attr(key, value)
    study.tell(trial, [ppl, n_params])


def test_frontier_table_tracks_the_front(store, study):
    for ppl, n in [(5.0, 1000), (6.0, 800), (5.5, 1200), (7.0, 800), (4.9, 1500), (6.0, 800)]:
        add_complete(study, ppl, n)
        refresh_frontier(store, study)
        assert frontier_triples(read_frontier(store, study.study_name)) == expected_front(study)
    assert [r["n_params"] for r in read_frontier(store, study.study_name)] == [800, 800, 1000, 1500]


def test_the_front_exported_is_the_trials_even_when_the_table_lags_them(store, study):
    """The table is refreshed after each tell: a driver killed (or a database call failed) between
    the two leaves it stale, and export and replicate used to read it as the front."""
    from orchestrator.export import study_table

    add_complete(study, 5.0, 1000)
    refresh_frontier(store, study)
    add_complete(study, 4.0, 900)  # told; the driver died before its refresh
    assert [r["trial_number"] for r in read_frontier(store, study.study_name)] == [0]  # stale
    assert list(study_table(store, study)["trial_number"]) == [1]


def test_study_records_two_minimised_objectives_by_name(study):
    assert study.metric_names == ["val_perplexity", "n_params"]
    assert all(d == optuna.study.StudyDirection.MINIMIZE for d in study.directions)


def test_orphaned_running_trials_are_failed(store, study):
    study.ask()
    add_complete(study, 5.0, 1000)
    assert [t.number for t in fail_orphaned_trials(store, study)] == [0]
    states = [t.state for t in study.get_trials()]
    assert states == [
        optuna.trial.TrialState.FAIL,
        optuna.trial.TrialState.COMPLETE,
        optuna.trial.TrialState.WAITING,
    ]
    assert study.get_trials()[2].user_attrs == {"retry_of": 0}


@pytest.mark.parametrize("killed_in", ["enqueue_trial", "tell"])
def test_a_driver_killed_while_failing_an_orphan_loses_no_retry_and_adds_none(
    store, study, monkeypatch, killed_in
):
    """Failing an orphan is two writes (ask again, tell FAIL): a driver killed between them
    (a second Ctrl-C, a SIGKILL) must leave the next driver one retry to run, not none or two."""
    study.ask()
    real = getattr(optuna.Study, killed_in)

    def killed_once(self, *args, **kwargs):
        monkeypatch.setattr(optuna.Study, killed_in, real)
        raise KeyboardInterrupt

    monkeypatch.setattr(optuna.Study, killed_in, killed_once)
    with pytest.raises(KeyboardInterrupt):
        fail_orphaned_trials(store, study)
    fail_orphaned_trials(store, study)  # the next driver
    trials = study.get_trials()
    assert [t.state for t in trials] == [optuna.trial.TrialState.FAIL, optuna.trial.TrialState.WAITING]
    assert trials[1].user_attrs == {"retry_of": 0}


def test_studies_of_one_name_in_two_databases_keep_their_models_apart(store, study, tmp_path):
    other = open_store(f"sqlite:///{tmp_path}/other.db")
    namesake = create_or_load_study(other, study.study_name, optuna.samplers.RandomSampler(seed=0))
    ours = models_folder(study)
    assert ours.startswith(f"{study.study_name}-") and models_folder(namesake) != ours
    # decided when the study was made: loading it again (a resumed run) finds the same folder
    again = create_or_load_study(store, study.study_name, optuna.samplers.RandomSampler(seed=1))
    assert models_folder(again) == ours


def test_a_study_made_before_the_folder_suffix_keeps_its_folder(tmp_path):
    url = f"sqlite:///{tmp_path}/old.db"
    old = optuna.create_study(study_name="old", storage=url, directions=["minimize", "minimize"])
    old.tell(old.ask(), [5.0, 100])  # its trials' models are in trials/old already
    loaded = create_or_load_study(open_store(url), "old", optuna.samplers.RandomSampler(seed=0))
    assert models_folder(loaded) == "old"
    # one made but stopped before it drew its suffix, and before any trial: drawn on loading
    optuna.create_study(study_name="new", storage=url, directions=["minimize", "minimize"])
    loaded = create_or_load_study(open_store(url), "new", optuna.samplers.RandomSampler(seed=0))
    assert models_folder(loaded).startswith("new-")


def test_tables_are_created_idempotently(store):
    again = open_store(store.url)
    assert sa.inspect(again.engine).has_table("pareto_frontier")


def test_redact_hides_the_password():
    assert redact("postgresql+psycopg://u:hunter2@h:5432/db") == "postgresql+psycopg://u:***@h:5432/db"
    assert "hunter2" not in redact("mysql+pymysql://root:hunter2@localhost/test")


def test_unreachable_server_is_a_user_error_without_the_password():
    with pytest.raises(UserError, match="cannot connect") as err:
        open_store("postgresql+psycopg://u:hunter2@127.0.0.1:1/db")
    assert "hunter2" not in str(err.value)


@pytest.mark.slow
def test_smoke_study_on_postgresql_keeps_the_password_out_of_files_and_logs(tmp_path):
    """The real CLI against the real server, with a password in the URL (trust auth ignores it)."""
    secret = f"pw{uuid.uuid4().hex[:12]}"
    name = f"smoke-{uuid.uuid4().hex[:8]}"
    server = server_url("postgresql")
    url = server.replace("postgres@", f"postgres:{secret}@")
    before = ray_processes()
    # Ray's files of this run alone (under /tmp/ray, "session_latest" may be another test's run):
    # a short folder, since Ray's socket paths must fit in 107 characters.
    ray_tmp = Path(tempfile.mkdtemp(prefix="hp-ray-", dir="/tmp"))
    try:
        run = run_smoke_study(url, name, cwd=tmp_path, env={"RAY_TMPDIR": str(ray_tmp)})
        assert run.returncode == 0, run.stderr[-3000:]
        assert leftover_ray_processes(before) == {}
        store = open_store(server)
        study = optuna.load_study(study_name=name, storage=store.storage)
        assert len(study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))) == 3
        assert frontier_triples(read_frontier(store, name)) == expected_front(study)
        assert secret not in run.stdout + run.stderr
        ray_files = [p for p in ray_tmp.rglob("*") if p.is_file() and not p.is_socket()]
        assert any(p.suffix in (".log", ".out", ".err") for p in ray_files)  # Ray's logs were written here
        for path in [*tmp_path.rglob("*"), *ray_files]:
            if path.is_file() and not path.is_socket():
                assert secret.encode() not in path.read_bytes(), path
    finally:
        drop_study(server, name)
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_a_second_driver_is_refused_while_the_lease_is_fresh(store):
    name = f"lease-{uuid.uuid4().hex[:8]}"
    assert acquire_lease(store, name, "driver-a", ttl_seconds=60) is None
    with pytest.raises(UserError, match="another driver.*driver-a"):
        acquire_lease(store, name, "driver-b", ttl_seconds=60)
    release_lease(store, name, "driver-a")
    assert acquire_lease(store, name, "driver-b", ttl_seconds=60) is None
    release_lease(store, name, "driver-b")


def test_a_fresh_lease_is_judged_by_its_holders_ttl_not_the_newcomers(store):
    """The race of issue 13: a second run with lease_seconds=1 took a live driver's study."""
    name = f"lease-{uuid.uuid4().hex[:8]}"
    start = datetime.now(UTC)
    acquire_lease(store, name, "driver-a", ttl_seconds=60, now=start)
    with pytest.raises(UserError, match="driver-a.*60s after"):
        acquire_lease(store, name, "driver-b", ttl_seconds=1, now=start + timedelta(seconds=5))
    takeover = acquire_lease(store, name, "driver-b", ttl_seconds=1, now=start + timedelta(seconds=61))
    assert takeover == Takeover("driver-a", "expired")
    assert "whose lease had expired" in takeover.describe()
    assert renew_lease(store, name, "driver-a") is False
    assert renew_lease(store, name, "driver-b") is True
    release_lease(store, name, "driver-b")


class FakeClock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def test_a_holder_whose_lease_was_taken_stops_at_its_next_beat(store):
    name = f"lease-{uuid.uuid4().hex[:8]}"
    clock = FakeClock()
    held = HeldLease(store, name, ttl_seconds=60, clock=clock)
    clock.advance(20)
    held.beat()
    held.check()  # still ours
    acquire_lease(store, name, "driver-b", ttl_seconds=60, now=clock.now + timedelta(seconds=61))
    held.beat()
    assert held.lost.is_set()
    with pytest.raises(LeaseLost, match="another driver took the study's lease"):
        held.check()
    release_lease(store, name, "driver-b")


def test_a_holder_that_cannot_renew_for_a_whole_ttl_stops(store, monkeypatch):
    import orchestrator.storage.lease as storage

    name = f"lease-{uuid.uuid4().hex[:8]}"
    clock = FakeClock()
    held = HeldLease(store, name, ttl_seconds=60, clock=clock)

    def unreachable(*args, **kwargs):
        raise sa.exc.OperationalError("renew", {}, Exception("server closed the connection"))

    monkeypatch.setattr(storage, "renew_lease", unreachable)
    clock.advance(20)
    held.beat()
    assert not held.lost.is_set()  # one missed beat is retried
    clock.advance(20)  # 40 s of 60: given up before anyone may take it
    held.beat()
    with pytest.raises(LeaseLost, match="could not be renewed for 40s of its 60s"):
        held.check()
    monkeypatch.undo()
    release_lease(store, name, held.owner)


def test_one_failed_renewal_is_retried_before_the_lease_is_given_up(store, monkeypatch):
    """The heartbeat beats every TTL/6: a failed renewal is retried twice before 2/3 of the TTL,
    where the driver gives the lease up (a beat every TTL/3 left no retry before it)."""
    import orchestrator.storage.lease as storage

    name = f"lease-{uuid.uuid4().hex[:8]}"
    clock = FakeClock()
    held = HeldLease(store, name, ttl_seconds=60, clock=clock)
    renew = storage.renew_lease

    def fails_once(*args, **kwargs):
        monkeypatch.setattr(storage, "renew_lease", renew)
        raise sa.exc.OperationalError("renew", {}, Exception("server closed the connection"))

    monkeypatch.setattr(storage, "renew_lease", fails_once)
    clock.advance(held.beat_every)
    held.beat()  # fails
    clock.advance(held.beat_every)
    assert held.held()  # as the retry starts (at TTL/3 a beat, this was 2/3 of the TTL: given up)
    held.beat()  # the retry succeeds
    clock.advance(held.beat_every)
    assert held.held()
    release_lease(store, name, held.owner)


def test_a_holder_whose_renewal_never_returns_stops_before_its_ttl_runs_out(store):
    """A renewal stuck in a half-dropped connection neither succeeds nor fails: the driver
    judges the silence itself before it asks or tells, since another driver may take the study
    once the TTL has passed."""
    name = f"lease-{uuid.uuid4().hex[:8]}"
    clock = FakeClock()
    held = HeldLease(store, name, ttl_seconds=60, clock=clock)
    clock.advance(20)  # one beat's interval: the heartbeat thread's renewal has not come back
    assert held.held()
    clock.advance(20)  # 40 s of 60 without a renewal
    assert not held.held()
    with pytest.raises(LeaseLost, match="could not be renewed for 40s of its 60s"):
        held.check()
    release_lease(store, name, held.owner)


def test_two_drivers_taking_over_one_expired_lease_at_once_do_not_both_get_it(tmp_path, monkeypatch):
    """SQLite ignores SELECT ... FOR UPDATE: a second driver restarted at the same moment reads
    the dead owner too, and used to overwrite the first one's takeover (both ran the study)."""
    import orchestrator.storage.lease as storage

    url = f"sqlite:///{tmp_path}/s.db"
    first, second = open_store(url), open_store(url)
    name = "lease-race"
    acquire_lease(first, name, "driver-dead", ttl_seconds=60, now=datetime(2020, 1, 1, tzinfo=UTC))
    died_here = storage._died_here
    raced: list[Takeover | None] = []

    def the_first_driver_takes_over_meanwhile(owner: str) -> bool:
        monkeypatch.setattr(storage, "_died_here", died_here)  # once
        # the second driver has read the row: the first takes it now
        raced.append(acquire_lease(first, name, "driver-a", ttl_seconds=60))
        return died_here(owner)

    monkeypatch.setattr(storage, "_died_here", the_first_driver_takes_over_meanwhile)
    with pytest.raises(UserError, match="being started by another driver"):
        acquire_lease(second, name, "driver-b", ttl_seconds=60)
    assert raced == [Takeover("driver-dead", "expired")]
    assert renew_lease(first, name, "driver-a") is True  # the lease is the first driver's alone


def test_a_driver_in_another_pid_namespace_of_this_host_is_not_judged_dead(store):
    """A container sharing the host's name (``--network host``) counts its own pids: a live
    driver of the host looks gone from inside it, so its lease must be waited out."""
    name = f"lease-{uuid.uuid4().hex[:8]}"
    finished = subprocess.Popen(["true"])
    finished.wait()
    elsewhere = f"{socket.gethostname()}:{finished.pid}:x:another-namespace"
    acquire_lease(store, name, elsewhere, ttl_seconds=600)
    with pytest.raises(UserError, match="another driver"):
        acquire_lease(store, name, "driver-b", ttl_seconds=600)
    release_lease(store, name, elsewhere)


def test_hold_lease_renews_from_a_thread_and_releases(store):
    name = f"lease-{uuid.uuid4().hex[:8]}"

    def heartbeat():
        with Session(store.engine) as session:
            return session.get(StudyLease, name).heartbeat_at

    with hold_lease(store, name, ttl_seconds=0.3) as held:
        first = heartbeat()
        deadline = time.monotonic() + 30
        while heartbeat() == first and time.monotonic() < deadline:
            time.sleep(0.05)
        assert heartbeat() > first and not held.lost.is_set()
        with pytest.raises(UserError):
            acquire_lease(store, name, "intruder", ttl_seconds=0.3, now=heartbeat().replace(tzinfo=UTC))
    with Session(store.engine) as session:
        assert session.get(StudyLease, name) is None


# A driver's owner string names its pid namespace last; an older version's named none.
@pytest.mark.parametrize("namespace", [f":{_pid_namespace()}", ""], ids=["owner", "owner-of-0.1"])
def test_the_lease_of_a_dead_driver_on_this_machine_is_taken_over_at_once(store, namespace):
    name = f"lease-{uuid.uuid4().hex[:8]}"
    finished = subprocess.Popen(["true"])
    finished.wait()  # reaped: its process id is no longer alive
    dead = f"{socket.gethostname()}:{finished.pid}:x{namespace}"
    acquire_lease(store, name, dead, ttl_seconds=600)
    takeover = acquire_lease(store, name, "driver-b", ttl_seconds=600)
    assert takeover == Takeover(dead, "died")
    assert "whose process on this machine is gone" in takeover.describe()
    release_lease(store, name, "driver-b")


def test_a_lease_table_of_an_earlier_version_gains_its_ttl_column(tmp_path):
    url = f"sqlite:///{tmp_path}/old.db"
    engine = sa.create_engine(url)
    with engine.begin() as conn:  # the 0.1 schema: no ttl_seconds
        conn.exec_driver_sql(
            "CREATE TABLE study_lease (study_name VARCHAR(512) PRIMARY KEY, owner VARCHAR(256), "
            "heartbeat_at DATETIME)"
        )
        conn.exec_driver_sql("INSERT INTO study_lease VALUES ('old', 'driver-a', '2020-01-01 00:00:00')")
    store = open_store(url)
    assert acquire_lease(store, "old", "driver-b", ttl_seconds=60) == Takeover("driver-a", "expired")


def test_the_lease_of_a_live_driver_on_this_machine_is_respected(store):
    name = f"lease-{uuid.uuid4().hex[:8]}"
    alive = f"{socket.gethostname()}:{os.getpid()}:x"
    acquire_lease(store, name, alive, ttl_seconds=600)
    with pytest.raises(UserError, match="another driver"):
        acquire_lease(store, name, "driver-b", ttl_seconds=600)
    release_lease(store, name, alive)
