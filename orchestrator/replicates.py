"""``launch-study replicate``: the front's points trained again with other seeds.

Every trial of a study draws the same batches (``TrialSetup.seed``), so that trials differ by
their hyperparameters only, and each point of the front is one draw. On the default study one
point's perplexity moves by 0.3-5% from one seed to another, about as much as the methods differ
at a size (BENCHMARKS.md, seed noise): a front of one seed per point is partly luck. This trains
each point of the frontier table again at the study's seed + 1, ..., + K, on Ray Tune like the
study's trials, records each result in ``trial_replicates`` as it finishes (a run that is stopped
resumes where it was), and rewrites the Pareto CSV, which then gives each point's mean and range
over its seeds and whether it stays on the front by its mean (``export.seed_columns``).

Replicates are not trials: the study's trials, its sampler and the frontier table are left as
they were; the study gains its ``setup`` digest where an earlier version stored none, and the
dashboard's note the seeds.
"""

from __future__ import annotations

import json
import math
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna_dashboard import save_note
from ray.tune import Callback

from orchestrator.artifacts import ModelRef, exists, is_remote
from orchestrator.config import (
    StudyConfig,
)
from orchestrator.errors import UserError
from orchestrator.execution import ERROR_KEY, RESULT_KEY, error_line, train_on_worker
from orchestrator.export import replicated
from orchestrator.interrupts import Interrupted
from orchestrator.on_tune import dense_ref, fit_on_tune, ray_session
from orchestrator.progress import say
from orchestrator.records import TrialRecord, dense_control, measured_elsewhere
from orchestrator.report import study_front_note
from orchestrator.session import RunOptions, StudySession
from orchestrator.storage import (
    ReplicateResult,
    StudyStore,
    front_rows,
    read_replicates,
    record_replicate,
    redact_command,
    upgrade_schema,
)
from trainers.export import CONFIG
from trainers.trial import TrialSetup

MAX_SEEDS = 100  # more would be a typing mistake: each seed retrains the whole front


@dataclass(frozen=True)
class Job:
    """One replicate: a front point's hyperparameters at another seed."""

    trial_number: int
    seed: int
    hparams: dict[str, Any]
    study_perplexity: float  # the point's own, at the study's seed
    n_params: int  # the point's own
    # A warm-started point's parent (orchestrator/warm_start.py): its replicates start from the
    # same model, so they measure the point's own trial at another seed, not its whole lineage.
    parent_dir: str = ""
    parent_sha256: str = ""  # its weights' digest ("" for a study of an earlier version)


def replicate_seeds(study_seed: int, n_seeds: int) -> list[int]:
    """The ``n_seeds`` seeds after the study's own, in order: a rerun with a larger ``--seeds``
    extends the seeds already run rather than drawing others."""
    return [study_seed + k for k in range(1, n_seeds + 1)]


def plan(
    points: list[dict], done: dict[int, dict], seeds: list[int], *, study_seed: int, elsewhere: set[int]
) -> list[Job]:
    """The replicates still to run: each point (a frontier row) at each seed it has no result
    for yet, seed by seed (a run stopped half-way has whole seeds of the front); a point measured
    under another setup (``elsewhere``, ``records.measured_elsewhere``) at the study's seed too."""
    return [
        Job(
            row["trial_number"],
            seed,
            json.loads(row["params"]),
            row["val_perplexity"],
            row["n_params"],
            row.get("parent_dir", ""),
            row.get("parent_sha256", ""),
        )
        for seed in [study_seed, *seeds]
        for row in points
        if (seed != study_seed or row["trial_number"] in elsewhere)
        and seed not in done.get(row["trial_number"], {})
    ]


def points_to_replicate(study: optuna.Study, front: list[dict]) -> list[dict]:
    """The front's rows, and the dense control's where it is not on the front: every ratio to
    dense is read at the same seed (the same batches), so the reference is replicated too. Each
    row names the model a warm-started point started from (``parent_dir``, and its digest
    ``parent_sha256``; "" for none)."""
    trials = study.get_trials(deepcopy=False)
    control = dense_control(trials)
    rows = front
    if control is not None and control.number not in {row["trial_number"] for row in front}:
        rows = [*front, TrialRecord.from_trial(control).row()]
    by_number = {t.number: t for t in trials}

    def parent(row: dict) -> dict:
        trial = by_number.get(row["trial_number"])
        folder = trial.user_attrs.get("parent_dir", "") if trial else ""
        parent = by_number.get(trial.user_attrs.get("warm_start_from", -1)) if folder else None
        digest = (parent.user_attrs.get("model_sha256") if parent else None) or ""
        return {"parent_dir": folder, "parent_sha256": digest}

    return [{**row, **parent(row)} for row in rows]


def check_parents(jobs: list[Job]) -> None:
    """A warm-started point's replicates start from its parent's saved model: a replicate still to
    run whose parent's folder is not there (on the object store it was uploaded to, or on this
    machine's disk: another machine, a folder cleaned away) is refused, naming it, before
    anything runs."""
    for job in jobs:
        if not job.parent_dir:
            continue
        try:
            there = (
                exists(job.parent_dir)
                if is_remote(job.parent_dir)
                else (Path(job.parent_dir) / CONFIG).is_file()
            )
        except OSError as err:  # the store stopped answering after the pre-flight check
            raise UserError(f"trial {job.trial_number}'s parent {job.parent_dir}: {err}") from None
        if not there:
            raise UserError(
                f"trial {job.trial_number} started from the model in {job.parent_dir}, which is not "
                "there: replicate with the --artifacts folder the study ran with"
            )


class ReplicateRun:
    """The replicates of one ``launch-study replicate``: records each as it finishes, and is
    the driver ``RunStopper`` asks whether to stop (a signal, or the study's lease lost)."""

    def __init__(self, store: StudyStore, study_name: str, setup: str, jobs: list[Job], still_leased) -> None:
        self.store, self.study_name, self.setup, self.jobs = store, study_name, setup, jobs
        self.still_leased = still_leased
        self.interrupted_by: int | None = None
        self.recorded = 0
        self.failed: list[str] = []

    def interrupt(self, signum: int) -> None:
        self.interrupted_by = signum

    def finish(self, config: dict, result: dict | None, error: str | None) -> None:
        """Record a finished replicate; a failed one (or one whose perplexity is not finite: a
        run that diverged) is counted and not recorded, so that a rerun tries it again. A driver
        that lost the study's lease records nothing (the holder may be writing)."""
        if not self.still_leased():
            return
        job = config["job"]
        where = f"trial {job['trial_number']} at seed {job['seed']}"
        outcome = json.loads(result[RESULT_KEY]) if result and RESULT_KEY in result else None
        if outcome and math.isfinite(outcome["val_perplexity"]):
            replicate = ReplicateResult(outcome["val_perplexity"], int(outcome["n_params"]))
            record_replicate(
                self.store,
                self.study_name,
                job["trial_number"],
                job["seed"],
                replicate,
                outcome["cpu_seconds"],
                self.setup,
            )
            self.recorded += 1
            other_size = (
                f"; kept {replicate.n_params:,} parameters where the point has {job['n_params']:,}: another "
                "model, not counted in its mean"
                if replicate.n_params != job["n_params"]
                else ""
            )
            say(
                f"replicate {self.recorded}/{len(self.jobs)}: {where}: ppl {replicate.val_perplexity:.3f} "
                f"(at the study's seed: {job['study_perplexity']:.3f}){other_size}"
            )
        elif self.interrupted_by is None:
            why = (
                f"perplexity {outcome['val_perplexity']}"
                if outcome
                else (result or {}).get(ERROR_KEY) or error
            )
            self.failed.append(f"{where}: {why or 'stopped'}")
            say(f"replicate FAILED: {self.failed[-1]}")


def replicate_on_worker(config: dict, setup: TrialSetup, dense: ModelRef | None = None) -> None:
    """The Tune trainable: one front point's trial at another seed (``train_on_worker``), no
    rungs, no model saved (the replicate measures the point; its model is not exported)."""
    job = config["job"]
    parent = {"parent_dir": job["parent_dir"], "parent_sha256": job.get("parent_sha256", "")}
    train_on_worker({"hparams": job["hparams"], "seed": job["seed"], **parent}, setup, dense=dense)


@dataclass
class ReplicateSummary:
    csv: Path
    failed: list[str]  # "trial N at seed S: why", of this run


def replicate_front(cfg: StudyConfig, opts: RunOptions, n_seeds: int) -> ReplicateSummary:
    """Train each point of the study's front, and its dense control, at ``n_seeds`` more seeds
    (those it has no result for yet) and write the Pareto CSV with the points' perplexity over
    their seeds (what was recorded, also when some replicates failed).

    Every check comes before the database is written: the study file against the study's, the
    front, then, holding the study's lease as ``run`` does (released on the way out), the corpus
    and the dense checkpoint, which must be the one the study pruned; only the corpus's caches
    and a checkpoint to rebuild are written before that, as ``run`` writes them."""
    if not 1 <= n_seeds <= MAX_SEEDS:
        raise UserError(f"--seeds must be 1 to {MAX_SEEDS}, got {n_seeds}")
    session = StudySession.to_revisit(cfg, opts)
    store, study, stored, setup = session.store, session.study, session.stored, session.setup
    seeds = replicate_seeds(cfg.study.seed, n_seeds)

    def front_now() -> list[dict]:
        front = front_rows(study)
        if not front:
            raise UserError(f"study {opts.study_name!r} has no front to replicate (no complete trial)")
        return front

    def jobs_now() -> tuple[list[dict], list[Job]]:
        front = front_now()
        done = read_replicates(store, opts.study_name, setup)
        elsewhere = measured_elsewhere(study.get_trials(deepcopy=False), setup)
        return front, plan(
            points_to_replicate(study, front), done, seeds, study_seed=cfg.study.seed, elsewhere=elsewhere
        )

    # A study without a front, or a replicate whose parent is gone, is refused before anything is written.
    check_parents(jobs_now()[1])
    session.inputs()  # checked as run does
    upgrade_schema(store)  # the replicates' table; a database of an earlier version is migrated
    with session.leased() as lease:
        if study.user_attrs.get("config") != stored or study.user_attrs.get("setup", setup) != setup:
            raise UserError(  # a run on other settings held the study between the check and the lease
                f"study {opts.study_name!r} was run again with other settings meanwhile: run replicate again"
            )
        front, jobs = jobs_now()  # the front as it is now that no run can change it
        trial_setup = session.revisited_setup() if jobs else None
        if study.user_attrs.get("setup") is None:  # so that exports read these replicates back
            study.set_user_attr("setup", setup)
        on_front = {row["trial_number"] for row in front}
        control = " and the dense control" if any(j.trial_number not in on_front for j in jobs) else ""
        say(
            f"study {opts.study_name!r} in {store.safe_url}: {len(front)} points on the front{control}, "
            f"seeds {seeds[0]}-{seeds[-1]}: {len(jobs)} replicates to run"
        )
        run = None
        if jobs:
            run = ReplicateRun(store, opts.study_name, setup, jobs, still_leased=lease.held)
            _run_jobs(cfg, opts, trial_setup, run)
        lease.check("the replicates still running (a rerun runs them)")
        save_note(study, study_front_note(study, replicated(store, study)))  # the dashboard's, with the seeds
    csv = session.write_front(study)
    say(f"Pareto front with each point's perplexity over every seed recorded for it -> {csv}")
    return ReplicateSummary(csv, run.failed if run else [])


def _run_jobs(cfg: StudyConfig, opts: RunOptions, setup: TrialSetup, run: ReplicateRun) -> None:
    from ray import tune

    with ray_session(opts, cfg.study.cpus_per_trial):
        fit_on_tune(
            cfg,
            opts,
            tune.with_parameters(replicate_on_worker, setup=setup, dense=dense_ref(opts, setup.dense)),
            tune.TuneConfig(max_concurrent_trials=opts.max_concurrent, reuse_actors=True),
            name=f"{opts.study_name}-replicates",
            callback=ReplicateCallback(run),
            driver=run,
            param_space={"job": tune.grid_search([vars(job) for job in run.jobs])},
        )
    if run.interrupted_by is not None:
        raise Interrupted(
            run.interrupted_by,
            f"interrupted ({signal.Signals(run.interrupted_by).name}) with {run.recorded} of {len(run.jobs)} "
            f"replicates recorded; resume with: {redact_command(['launch-study', *sys.argv[1:]])}",
        )


class ReplicateCallback(Callback):
    """Tune's callback: each finished replicate to ``ReplicateRun.finish``. Dropped when
    pickled (Tune saves its callbacks into the experiment folder), as the study's is."""

    def __init__(self, run: ReplicateRun) -> None:
        self.run: ReplicateRun | None = run

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.run.finish(trial.config, trial.last_result, None)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.run.finish(trial.config, None, error_line(trial.get_error()))

    def __getstate__(self) -> dict:
        return {"run": None}
