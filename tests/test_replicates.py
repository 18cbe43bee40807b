"""``launch-study replicate``: the front's points trained again at other seeds, recorded in the
``trial_replicates`` table and shown in the Pareto CSV as each point's mean and range."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import tempfile
import uuid
from pathlib import Path

import optuna
import pandas as pd
import pytest
from helpers import (
    LAUNCH_STUDY,
    SMOKE,
    cli_in_process,
    drop_study,
    launch,
    leftover_ray_processes,
    ray_processes,
    server_url,
    start_own_session,
)
from test_cli_errors import assert_user_error, study_file

from orchestrator.errors import UserError
from orchestrator.execution import ERROR_KEY, RESULT_KEY
from orchestrator.export import Replicated, seed_columns
from orchestrator.replicates import (
    ReplicateRun,
    check_parents,
    plan,
    points_to_replicate,
    replicate_seeds,
)
from orchestrator.session import check_same_setup
from orchestrator.storage import (
    ReplicateResult,
    open_store,
    read_frontier,
    read_replicates,
    record_replicate,
)


def front_row(number: int, **params) -> dict:
    return {
        "trial_number": number,
        "val_perplexity": 5.0,
        "n_params": 1000,
        "params": json.dumps({"method": "importance", **params}),
    }


def add_complete(study: optuna.Study, ppl: float, params: int, *, control: bool = False, **attrs) -> None:
    """A COMPLETE trial as a run records it: the dense control, or an importance point."""
    method = "dense" if control else "importance"
    trial = study.ask()
    recorded = {
        "n_params_nonembed": params - 10,
        "sparsity": 0.0 if control else 1 - params / 100,
        "heads_per_layer": [2, 2],
        "method": method,
        "hparams": {"method": method},
        "dense_control": control,
    }
    for key, value in {**recorded, **attrs}.items():
        trial.set_user_attr(key, value)
    study.tell(trial, [ppl, params])


def test_the_plan_runs_each_front_point_at_each_seed_it_has_no_result_for():
    front = [front_row(0), front_row(3, sparsity=0.5)]
    done = {3: {1: 5.0}, 7: {1: 6.0, 2: 6.1}}  # trial 7 left the front: not run again
    jobs = plan(front, done, replicate_seeds(0, 2), study_seed=0, elsewhere=set())
    assert [(j.trial_number, j.seed) for j in jobs] == [(0, 1), (0, 2), (3, 2)]
    assert jobs[-1].hparams == {"method": "importance", "sparsity": 0.5}
    assert replicate_seeds(5, 3) == [6, 7, 8]
    assert (
        plan(front, {0: {1: 1.0, 2: 1.0}, 3: {1: 1.0, 2: 1.0}}, [1, 2], study_seed=0, elsewhere=set()) == []
    )


def test_a_warm_started_point_is_replicated_from_the_same_parent():
    """Its replicates start from the model it started from (``parent_dir``), not from dense."""
    study = optuna.create_study(directions=["minimize", "minimize"])
    add_complete(study, 5.0, 100, control=True)
    add_complete(study, 5.1, 60)
    add_complete(study, 5.4, 40, warm_start_from=1, parent_dir="/artifacts/trials/s/1")
    front = [
        {"trial_number": n, "val_perplexity": v, "n_params": p, "params": json.dumps({"method": m})}
        for n, v, p, m in ((0, 5.0, 100, "dense"), (1, 5.1, 60, "importance"), (2, 5.4, 40, "importance"))
    ]
    points = points_to_replicate(study, front)
    jobs = plan(points, {}, [1], study_seed=0, elsewhere=set())
    assert [(j.trial_number, j.parent_dir) for j in jobs] == [(0, ""), (1, ""), (2, "/artifacts/trials/s/1")]
    # the parent's folder is not on this machine: refused before anything runs, naming it
    with pytest.raises(UserError, match="trial 2 started from the model in /artifacts/trials/s/1, which"):
        check_parents(jobs)
    check_parents(plan(points, {2: {1: 5.5}}, [1], study_seed=0, elsewhere=set()))  # its replicate is done


def test_a_study_file_that_trains_or_scores_otherwise_is_refused_by_its_resolved_values(tmp_path):
    from orchestrator.config import load_study_config

    path = study_file(tmp_path)
    stored = load_study_config(path).raw  # what the study ran with (smoke: finetune_steps 10)

    def given(*overrides: str):
        return load_study_config(path, list(overrides))

    # the same values written out, and how a trial runs (threads, device), are the same setup
    for same in (
        ["study.seed=0"],
        ["model.dropout=0.0"],
        ["corpus.tokenizer=char"],
        ["trial.threads=2", "trial.device=cpu"],
        ["study.n_trials=40"],
    ):
        check_same_setup(stored, given(*same), "s")
    for overrides, fragment in (
        (["trial.finetune_steps=20"], "[trial] finetune_steps is 20 here but 10"),
        (["trial.eval_tokens=4096"], "[trial] eval_tokens is 4096 here but 2048"),
        (["study.seed=1"], "[study] seed is 1 here but 0"),
        (["model.n_layer=3"], "[model] n_layer is 3 here but 2"),
        (["pretrain.steps=61"], "[pretrain] steps is 61 here but 60"),
    ):
        with pytest.raises(UserError, match="replicate with the study file") as err:
            check_same_setup(stored, given(*overrides), "s")
        assert fragment in str(err.value)


def test_a_point_measured_under_an_earlier_setup_is_measured_again_at_the_studys_seed():
    """A study resumed with other trial settings: trial 3's own value is of the old setup."""
    points = [front_row(3), front_row(5)]
    jobs = plan(points, {}, [1, 2], study_seed=0, elsewhere={3})
    assert [(j.trial_number, j.seed) for j in jobs] == [(3, 0), (3, 1), (5, 1), (3, 2), (5, 2)]
    frame = pd.DataFrame({"trial_number": [3, 5], "val_perplexity": [9.0, 5.0], "n_params": [1000, 900]})
    again = {
        3: {0: ReplicateResult(6.0, 1000), 1: ReplicateResult(6.2, 1000)},
        5: {1: ReplicateResult(5.2, 900)},
    }
    columns = seed_columns(frame, Replicated(again, {3}))
    assert list(columns["seeds"]) == [2, 2]  # trial 3: its two replicates, not the old 9.0
    assert list(columns["val_perplexity_mean"]) == pytest.approx([6.1, 5.1])
    columns = seed_columns(frame, Replicated({}, {3}))  # nothing measured again yet: its own value
    assert list(columns["val_perplexity_mean"]) == [9.0, 5.0]


def test_ray_stopping_the_process_while_it_starts_is_an_interrupt(monkeypatch, tmp_path):
    """ray.init installs its own SIGTERM handler while it starts (sys.exit(15)): that exit
    becomes the interrupt every command reports (143, its line), with Ray shut down."""
    from orchestrator import on_tune
    from orchestrator.interrupts import Interrupted
    from orchestrator.session import RunOptions

    def killed_while_starting(opts, local):
        raise SystemExit(signal.SIGTERM)

    import ray

    shutdowns = []
    monkeypatch.setattr(ray, "shutdown", lambda: shutdowns.append(1))
    monkeypatch.setattr(on_tune, "_init_ray", killed_while_starting)
    opts = RunOptions("sqlite://", "s", 1, 1, tmp_path, tmp_path / "x.csv")
    with pytest.raises(Interrupted) as stop, on_tune.ray_session(opts, 1):
        pass
    assert stop.value.exit_code == 143 and shutdowns == [1]

    def failed_while_starting(opts, local):
        raise SystemExit(3)

    monkeypatch.setattr(on_tune, "_init_ray", failed_while_starting)
    with pytest.raises(SystemExit) as other, on_tune.ray_session(opts, 1):
        pass
    assert other.value.code == 3 and shutdowns == [1, 1]  # not an interrupt, but Ray is shut down


def test_seed_columns_give_mean_range_and_whether_a_point_holds_on_its_mean():
    frame = pd.DataFrame(
        {"trial_number": [0, 4, 9], "val_perplexity": [5.0, 5.2, 5.6], "n_params": [100, 80, 60]}
    )

    def replicates(**by_trial: list[float]) -> dict:
        sizes = {"t0": 100, "t4": 80, "t9": 60}
        return {
            int(t[1:]): {seed: ReplicateResult(v, sizes[t]) for seed, v in enumerate(values, start=1)}
            for t, values in by_trial.items()
        }

    # trial 4 was lucky: at its other seeds it is worse, but still better than trial 9, which is smaller
    columns = seed_columns(frame, Replicated(replicates(t0=[5.1, 4.9], t4=[5.3, 5.7], t9=[5.5, 5.7]), set()))
    assert list(columns["seeds"]) == [3, 3, 3]
    assert list(columns["val_perplexity_mean"]) == pytest.approx([5.0, 5.4, 5.6])
    assert list(columns["val_perplexity_min"]) == [4.9, 5.2, 5.5]
    assert list(columns["val_perplexity_max"]) == [5.1, 5.7, 5.7]
    assert list(columns["on_front_by_mean"]) == [True, True, True]
    columns = seed_columns(
        frame, Replicated(replicates(t0=[5.1, 4.9], t4=[6.3, 6.7], t9=[5.5, 5.7]), set())
    )  # 6.07 > 5.6
    assert list(columns["on_front_by_mean"]) == [True, False, True]
    # points at different numbers of seeds: a mean against one draw is not compared
    columns = seed_columns(frame, Replicated(replicates(t0=[5.1, 4.9], t4=[6.3, 6.7]), set()))
    assert list(columns["seeds"]) == [3, 3, 1]
    assert columns["on_front_by_mean"].isna().all()


def test_a_replicate_that_kept_another_size_is_not_counted_in_the_points_mean():
    """l0_penalty's size depends on its batches: at another seed it may keep other heads."""
    frame = pd.DataFrame({"trial_number": [2], "val_perplexity": [5.0], "n_params": [100]})
    columns = seed_columns(
        frame, Replicated({2: {1: ReplicateResult(5.2, 100), 2: ReplicateResult(4.0, 120)}}, set())
    )
    assert list(columns["seeds"]) == [2]
    assert list(columns["val_perplexity_mean"]) == pytest.approx([5.1])


@pytest.mark.parametrize("kind", ["sqlite", "postgresql", "mysql"])
def test_replicates_are_kept_per_study_trial_seed_and_setup(kind, tmp_path):
    url = f"sqlite:///{tmp_path}/r.db" if kind == "sqlite" else server_url(kind)
    store = open_store(url)
    name, other = f"rep-{uuid.uuid4().hex[:8]}", f"rep-{uuid.uuid4().hex[:8]}"
    try:
        record_replicate(store, name, 3, 1, ReplicateResult(5.25, 1000), 12.0, "a")
        record_replicate(store, name, 3, 2, ReplicateResult(5.5, 1000), 12.5, "a")
        record_replicate(store, name, 3, 1, ReplicateResult(5.125, 990), 13.0, "a")  # again: replaces
        record_replicate(store, name, 4, 1, ReplicateResult(7.0, 900), 13.0, "b")  # another setup
        record_replicate(store, other, 3, 1, ReplicateResult(9.0, 1000), 1.0, "a")
        assert read_replicates(store, name, "a") == {3: {1: (5.125, 990), 2: (5.5, 1000)}}
        assert read_replicates(store, name, "b") == {4: {1: (7.0, 900)}}
        assert read_replicates(store, "no-such-study", "a") == {}
    finally:
        for study_name in (name, other):
            drop_study(url, study_name)


def finished(trial_number: int, seed: int, ppl: float, n_params: int = 1000) -> tuple:
    """A Tune trial's config and last result as ``ReplicateCallback`` passes them on."""
    job = {"trial_number": trial_number, "seed": seed, "study_perplexity": 5.0, "n_params": 1000}
    outcome = {"val_perplexity": ppl, "n_params": n_params, "cpu_seconds": 3.0}
    return {"job": job}, {RESULT_KEY: json.dumps(outcome)}, None


def test_a_replicate_that_diverged_or_failed_is_not_recorded_and_runs_again(tmp_path):
    store = open_store(f"sqlite:///{tmp_path}/r.db")
    run = ReplicateRun(store, "s", "key", jobs=[], still_leased=lambda: True)
    run.finish(*finished(1, 1, 5.5))
    run.finish(*finished(2, 1, math.inf))
    run.finish(*finished(3, 1, math.nan))
    run.finish({"job": {"trial_number": 4, "seed": 1}}, {ERROR_KEY: "ValueError: no"}, None)
    run.finish({"job": {"trial_number": 5, "seed": 1}}, None, "RayTaskError: worker died")
    assert read_replicates(store, "s", "key") == {1: {1: (5.5, 1000)}}
    assert run.recorded == 1
    assert [f.split(":")[0] for f in run.failed] == [f"trial {n} at seed 1" for n in (2, 3, 4, 5)]
    assert "perplexity inf" in run.failed[0] and "worker died" in run.failed[-1]
    front = [front_row(n) for n in (1, 2, 3, 4, 5)]
    again = plan(front, read_replicates(store, "s", "key"), [1], study_seed=0, elsewhere=set())
    assert [j.trial_number for j in again] == [2, 3, 4, 5]


def test_a_driver_that_lost_the_lease_records_nothing(tmp_path):
    store = open_store(f"sqlite:///{tmp_path}/r.db")
    run = ReplicateRun(store, "s", "key", jobs=[], still_leased=lambda: False)
    run.finish(*finished(1, 1, 5.5))
    assert read_replicates(store, "s", "key") == {} and run.recorded == 0 and run.failed == []


def test_a_mismatched_study_file_a_held_lease_or_another_dense_model_writes_nothing(tmp_path):
    """A study in the database (its stored configuration, a finished dense control, no
    replicates table yet): refused with one line, and the database is as it was."""
    import sqlalchemy as sa

    from orchestrator.config import load_study_config
    from orchestrator.storage import acquire_lease, create_or_load_study, refresh_frontier, release_lease

    path = study_file(tmp_path)
    url = f"sqlite:///{tmp_path}/runs/smoke.db"
    store = open_store(url)
    with store.engine.begin() as conn:  # as a database of the version before replicates (and migrations)
        conn.exec_driver_sql("DROP TABLE trial_replicates")
        conn.exec_driver_sql("DROP TABLE headprune_alembic_version")
    study = create_or_load_study(store, "smoke", optuna.samplers.RandomSampler(seed=0))
    study.set_user_attr("config", load_study_config(path, []).raw)
    before = sorted(p.name for p in (tmp_path / "runs").iterdir())

    def tables() -> set[str]:
        return set(sa.inspect(open_store(url, create=False).engine).get_table_names())

    def replicate_rows() -> int:
        with open_store(url, create=False).engine.connect() as conn:
            return conn.exec_driver_sql("SELECT COUNT(*) FROM trial_replicates").scalar()

    empty = cli_in_process("replicate", str(path), cwd=tmp_path)
    assert_user_error(empty, "study 'smoke' has no front to replicate")
    add_complete(study, 30.0, 100, control=True, heads_per_layer=[4, 4])
    refresh_frontier(store, study)
    other = cli_in_process("replicate", str(path), "--set", "trial.finetune_steps=11", cwd=tmp_path)
    assert_user_error(other, "[trial] finetune_steps is 11 here but 10", "replicate with the study file")
    seed = cli_in_process("replicate", str(path), "--set", "study.seed=4", cwd=tmp_path)
    assert_user_error(seed, "[study] seed is 4 here but 0")
    assert "trial_replicates" not in tables()
    with open_store(url, create=False).engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT COUNT(*) FROM study_lease").scalar() == 0
    acquire_lease(store, "smoke", "elsewhere:1", ttl_seconds=600)  # a run on another machine
    held = cli_in_process("replicate", str(path), cwd=tmp_path)
    assert_user_error(held, "study 'smoke' is being run by another driver (elsewhere:1")
    assert replicate_rows() == 0  # its table may be made once the study file is known good; no row
    release_lease(store, "smoke", "elsewhere:1")
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == before  # no cache, no CSV
    # the dense checkpoint is built (its caches written, as a run does) and compared
    study.set_user_attr("dense_val_perplexity", 99.0)  # pruned from another checkpoint than this one
    other_dense = cli_in_process("replicate", str(path), cwd=tmp_path)
    assert_user_error(other_dense, "the one study 'smoke' pruned 99.000000", "would not measure its points")
    assert replicate_rows() == 0
    with open_store(url, create=False).engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT COUNT(*) FROM study_lease").scalar() == 0  # released


def smoke_setup(store) -> str:
    """The digest the smoke study's run stored (config.setup_digest)."""
    return optuna.load_study(study_name="smoke", storage=store.storage).user_attrs["setup"]


@pytest.mark.slow
def test_replicate_trains_the_front_again_resumes_and_leaves_the_study_alone(tmp_path):
    """The smoke study, then its front at 1 more seed, then at 2 (only the new seed runs)."""
    before = ray_processes()
    run = launch("run", str(SMOKE), cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    store = open_store(f"sqlite:///{tmp_path}/runs/smoke.db", create=False)
    trials_before = [
        (t.number, t.state, t.values)
        for t in optuna.load_study(study_name="smoke", storage=store.storage).trials
    ]
    front = read_frontier(store, "smoke")
    study = optuna.load_study(study_name="smoke", storage=store.storage)
    points = points_to_replicate(study, front)
    # each trial records the setup it was measured under: its replicates must match it
    assert {t.user_attrs["setup"] for t in study.trials if t.state.is_finished() and t.values} == {
        smoke_setup(store)
    }

    first = launch("replicate", str(SMOKE), "--seeds", "1", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert f"{len(points)} replicates to run" in first.stderr
    replicates = read_replicates(store, "smoke", smoke_setup(store))
    assert sorted(replicates) == sorted(r["trial_number"] for r in points)
    assert all(list(seeds) == [1] for seeds in replicates.values())
    # another seed draws other batches: no point scores exactly as it did at the study's seed
    by_number = {r["trial_number"]: r["val_perplexity"] for r in points}
    assert all(replicates[n][1].val_perplexity != by_number[n] for n in replicates)

    second = launch("replicate", str(SMOKE), "--seeds", "2", cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"{len(points)} replicates to run" in second.stderr  # seed 2 only; seed 1 is kept
    again = read_replicates(store, "smoke", smoke_setup(store))
    assert all(again[n][1] == replicates[n][1] and set(again[n]) == {1, 2} for n in again)

    csv = pd.read_csv(tmp_path / "runs" / "smoke_pareto.csv")
    assert list(csv["trial_number"]) == [r["trial_number"] for r in front]
    assert list(csv["seeds"]) == [3] * len(front)
    for row in csv.itertuples():
        seen = [row.val_perplexity, *(r.val_perplexity for r in again[row.trial_number].values())]
        assert row.val_perplexity_mean == pytest.approx(sum(seen) / 3)
        assert (row.val_perplexity_min, row.val_perplexity_max) == (min(seen), max(seen))

    study = optuna.load_study(study_name="smoke", storage=store.storage)
    assert [(t.number, t.state, t.values) for t in study.trials] == trials_before  # no trial added or told
    status = launch("status", "--study-name", "smoke", cwd=tmp_path)
    assert f"replicated: {len(front)} of the front's points, 3 seeds each" in status.stdout
    assert "spread over seeds" in status.stdout and "dense control over 3 seeds" in status.stdout
    assert not leftover_ray_processes(before)


@pytest.mark.slow  # a process of its own (seconds of interpreter start)
def test_replicate_refuses_bad_input_before_writing(tmp_path):
    path = study_file(tmp_path)
    missing = launch("replicate", str(path), cwd=tmp_path)
    assert_user_error(missing, "no database at runs/smoke.db")
    assert not (tmp_path / "runs").exists()
    for seeds in ("0", "1000000000000"):  # a typo's seeds are refused before any list is built
        too_many = cli_in_process("replicate", str(path), "--seeds", seeds, cwd=tmp_path)
        assert_user_error(too_many, f"--seeds must be 1 to 100, got {seeds}")
    assert not (tmp_path / "runs").exists()


def test_the_dense_control_is_replicated_also_when_the_front_leaves_it_out():
    study = optuna.create_study(directions=["minimize", "minimize"])
    for ppl, params, control in [(5.0, 100, True), (4.9, 100, False), (5.3, 60, False)]:
        add_complete(study, ppl, params, control=control)
    front = [
        {"trial_number": n, "val_perplexity": v, "params": json.dumps({"method": "importance"})}
        for n, v in ((1, 4.9), (2, 5.3))
    ]  # trial 1 (as large, lower perplexity) dominates the control
    points = points_to_replicate(study, front)
    assert [p["trial_number"] for p in points] == [1, 2, 0]
    assert json.loads(points[-1]["params"]) == {"method": "dense"}


@pytest.mark.slow
def test_a_signal_stops_replicates_keeping_those_done_and_the_same_command_finishes(tmp_path):
    from test_resume import stop, wait_for

    slower = ["--set", "trial.finetune_steps=300"]
    before = ray_processes()
    run = launch("run", str(SMOKE), *slower, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    log = tmp_path / "replicate.log"
    with open(log, "w") as stderr:
        proc = start_own_session(
            [str(LAUNCH_STUDY), "replicate", str(SMOKE), "--seeds", "2", *slower],
            cwd=tmp_path,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        wait_for(log, r"replicate 1/", proc)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
        leftover = leftover_ray_processes(before)
    finally:
        stop(proc, before)
    text = log.read_text()
    assert code == 143, text[-3000:]
    last = text.strip().splitlines()[-1]
    assert "interrupted (SIGTERM)" in last and "resume with: launch-study replicate" in last, text[-3000:]
    assert "Traceback" not in text and leftover == {}
    store = open_store(f"sqlite:///{tmp_path}/runs/smoke.db", create=False)
    kept = read_replicates(store, "smoke", smoke_setup(store))
    n_kept = sum(len(seeds) for seeds in kept.values())
    total = 2 * len(
        points_to_replicate(
            optuna.load_study(study_name="smoke", storage=store.storage), read_frontier(store, "smoke")
        )
    )
    assert 1 <= n_kept < total

    again = launch("replicate", str(SMOKE), "--seeds", "2", *slower, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"{total - n_kept} replicates to run" in again.stderr
    done = read_replicates(store, "smoke", smoke_setup(store))
    assert sum(len(seeds) for seeds in done.values()) == total
    assert all(
        done[n][s] == ppl for n, seeds in kept.items() for s, ppl in seeds.items()
    )  # kept as they were
    assert leftover_ray_processes(before) == {}


def test_status_and_the_dashboard_note_name_the_points_off_the_front_by_their_mean():
    from orchestrator.report import format_status, study_front_note, study_status

    study = optuna.create_study(directions=["minimize", "minimize"])
    for ppl, params, control in [(5.0, 100, True), (5.2, 80, False), (5.6, 60, False)]:
        add_complete(study, ppl, params, control=control)
    replicates = {
        0: {1: ReplicateResult(5.1, 100), 2: ReplicateResult(4.9, 100)},
        1: {1: ReplicateResult(6.3, 80), 2: ReplicateResult(6.7, 80)},  # lucky at the study's seed
        2: {1: ReplicateResult(5.5, 60), 2: ReplicateResult(5.7, 60)},
    }
    text = format_status(study_status(study, Replicated(replicates, set())))
    assert "replicated: 3 of the front's points, 3 seeds each" in text
    assert "28.8% at most (trial 1); off the front by their mean: trials [1]" in text  # 6.7 / 5.2
    assert "dense control over 3 seeds: perplexity 5.000 (mean), 4.900-5.100" in text
    assert "replicated" not in format_status(study_status(study, {}))
    note = study_front_note(study, Replicated(replicates, set()))  # the dashboard's
    assert "over seeds: mean [lowest, highest]" in note
    assert (
        "| 1 | importance | 0.200 | 5.200 | 6.067 [5.200, 6.700], 3 seeds (off the front by its mean) |"
        in note
    )
    assert "over seeds" not in study_front_note(study)


def test_the_setup_digest_is_what_a_trial_measures_not_how_the_file_says_it():
    from orchestrator.config import load_study_config, setup_digest

    path = study_file(Path(tempfile.mkdtemp()))
    plain = setup_digest(load_study_config(path), 30.0)
    for same in (["trial.threads=4", "trial.device=cpu"], ["corpus.val_fraction=0.1"], ["study.n_trials=9"]):
        assert setup_digest(load_study_config(path, same), 30.0) == plain
    for other in (["trial.finetune_steps=20"], ["study.seed=1"], ["model.d_model=64"]):
        assert setup_digest(load_study_config(path, other), 30.0) != plain
    assert setup_digest(load_study_config(path), 30.5) != plain  # another dense checkpoint
