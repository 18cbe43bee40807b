"""Ray Tune runs the trials; the Optuna study in the database decides what each one does.

``StudyDriver`` is the bridge, living in the driver process. Tune asks its searcher for the next
trial's config (an Optuna ``ask`` plus the search space, define-by-run) and tells its callback when
a trial ends (an Optuna ``tell``, then the frontier table). Tune calls the searcher before the
callbacks, and only the callback sees a failed trial's error, so every ``tell`` happens there.

Nothing here is pickled with a database URL in it: Tune pickles its searcher and callbacks into
the experiment folder, and both drop the driver when pickled.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import optuna
import ray
from optuna.trial import FrozenTrial
from ray import tune
from ray.tune import Callback
from ray.tune.schedulers import TrialScheduler
from ray.tune.search import Searcher
from ray.tune.stopper import Stopper

from orchestrator.artifacts import ModelRef, fetch, is_remote, join, keep_in_cache, publish, staging_for
from orchestrator.early_stopping import RUNG_KEY
from orchestrator.front_gaps import distinct, gap_fill_point
from orchestrator.progress import say
from orchestrator.recent_tpe import RecentTPE
from orchestrator.records import OBJECTIVES, result_attrs
from orchestrator.search_space import Range, SearchSpace
from orchestrator.study_trials import StudyTrials
from orchestrator.warm_start import parent_for
from trainers.export import WEIGHTS, CorruptModel, read_config
from trainers.hparams import TrialHParams
from trainers.pruning.registry import removes_heads
from trainers.trial import (
    AFTER_PRUNE,
    TRANSIENT_ERRORS,
    RungPlan,
    RungReport,
    TransientTrialError,
    TrialIO,
    TrialSetup,
    run_trial,
)

RESULT_KEY = "trial_result"  # the whole TrialResult, as JSON, beside the two objectives
ERROR_KEY = "trial_error"  # a deterministic failure, reported as a result so Tune does not retry it
CONTROL_NOTE = "nothing sampled: values the study file fixes as set, searched ones at their defaults"


def rung_result(report: RungReport) -> dict[str, Any]:
    """A rung report as Tune's result: what the scheduler and ``StudyDriver.note_rung`` read."""
    return {
        "val_perplexity": report.val_perplexity,
        "n_params": report.n_params,
        RUNG_KEY: report.rung,
        "finetune_step": report.step,
        "finetune_steps": report.steps,
        "cpu_seconds": report.cpu_seconds,
        "rung_tokens": report.tokens,
    }


class RungReporter:
    """Passes rung results to Tune, and remembers whether Tune raised from one (a scheduler
    stopping the trial): that exception is Tune's to handle, not a failure of the trial."""

    def __init__(self) -> None:
        self.tune_raised = False

    def __call__(self, report: RungReport) -> None:
        try:
            tune.report(rung_result(report))
        except BaseException:
            self.tune_raised = True
            raise


def describe_error(error: BaseException) -> str:
    """``Type: message``, the message's last line (a driver's or Tune's may span many)."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[-1] if lines else ''}".rstrip(": ")


@contextlib.contextmanager
def _reaching_store() -> Iterator[None]:
    """An object store that does not answer, or a network that drops, may not the next time:
    its ``OSError`` is a ``TransientTrialError``, which Tune retries (a deterministic failure,
    a model that fails its checksums, is not)."""
    try:
        yield
    except OSError as error:
        raise TransientTrialError(describe_error(error)) from None


def _resumable(location: str) -> Path | None:
    """A local folder holding the after-pruning checkpoint a retry may continue from, of the
    trial whose model goes to ``location``; None when there is none (never saved, cut short).
    From an object store it is a download, which ``train_on_worker`` removes when done."""
    if not is_remote(location):
        return Path(location)
    try:
        checkpoint = fetch(join(location, AFTER_PRUNE))
    except CorruptModel:
        return None
    folder = checkpoint.with_name(checkpoint.name + "-resume")
    folder.mkdir()
    checkpoint.rename(folder / AFTER_PRUNE)
    return folder


def train_on_worker(
    config: dict[str, Any],
    setup: TrialSetup,
    rungs: tuple[float, ...] = (),
    rung_eval_tokens: int = 0,
    dense: ModelRef | None = None,
) -> None:
    """The Tune trainable: runs on a Ray worker, knows nothing of the database. A deterministic
    failure is reported as a result (type and message), so that Tune does not run it again; a
    transient one (``TRANSIENT_ERRORS``) is raised, and Tune retries it like a dead worker. The
    dense control reports no rungs: early stopping never stops it, so scoring it there would be
    compute spent for nothing. ``config["parent_dir"]``, where given, is the model a
    warm-started trial starts from (orchestrator/warm_start.py), ``config["parent_sha256"]`` its
    weights' digest. ``config["seed"]``, where given, replaces the study's (a replicate: the same
    trial on other batches); without ``config["model_dir"]`` nothing is saved. Every model
    folder is a location of ``orchestrator/artifacts.py``: on an object store, this node reads
    the dense model (``dense``) and the parent through its cache, and uploads what it saves; a
    failure to reach the store is transient (Tune runs the trial again)."""
    import torch

    threads = setup.budget.threads or max(
        1, int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1))
    )
    torch.set_num_threads(threads)
    reporter = RungReporter()
    hparams = TrialHParams(**config["hparams"])
    if "seed" in config:
        setup = replace(setup, seed=int(config["seed"]))
    location = config.get("model_dir") or ""
    save_dir = staging_for(location) if location else None

    def upload(folder: Path) -> None:
        with _reaching_store():
            publish(folder, location if folder == save_dir else join(location, folder.name))

    downloads: list[Path] = []  # what this trial fetched for itself only, removed when it ends
    try:
        with _reaching_store():
            if dense is not None:
                setup = replace(setup, dense=replace(setup.dense, path=dense.local()))
            parent = None
            if config.get("parent_dir"):
                parent = ModelRef(config["parent_dir"], config.get("parent_sha256") or None).local()
            resume = [folder for loc in config.get("resume_dirs", []) if (folder := _resumable(loc))]
        if is_remote(location):
            downloads += [*resume, save_dir]  # save_dir: staged here, kept in the cache once stored
        result = run_trial(
            setup,
            hparams,
            TrialIO(save_dir=save_dir, resume_dirs=resume, parent=parent, on_checkpoint=upload),
            RungPlan(
                fractions=rungs if removes_heads(hparams.method) else (),
                report=reporter,
                eval_tokens=rung_eval_tokens,
            ),
        )
        digest = None
        if save_dir is not None:  # COMPLETE only once the model is stored whole (publish checks)
            digest = read_config(save_dir, verify=False)["sha256"][WEIGHTS]
            upload(save_dir)
            if is_remote(location):  # this node's copy: a warm start from it here downloads nothing
                shutil.rmtree(save_dir / AFTER_PRUNE, ignore_errors=True)
                keep_in_cache(save_dir, digest)
    except TRANSIENT_ERRORS:
        raise
    except Exception as error:
        if reporter.tune_raised:
            raise
        tune.report({ERROR_KEY: describe_error(error)[-2000:]})
        return
    finally:  # stopped at a rung, failed or done: nothing of this trial's stays in the cache's tmp
        for folder in downloads:
            shutil.rmtree(folder, ignore_errors=True)
    tune.report(
        {
            "val_perplexity": result.val_perplexity,
            "n_params": result.n_params,
            RESULT_KEY: json.dumps(result.to_dict() | {"model_sha256": digest}),
            "node_id": ray.get_runtime_context().get_node_id(),  # where it ran, for cluster checks
        }
    )


def error_line(error: Exception | None) -> str:
    """What Tune's error of a trial says: its type and last line, not Tune's traceback."""
    return describe_error(error) if error else "the trial's worker failed"


@dataclass(frozen=True)
class DriverPlan:
    """What a run asks of its driver: how many trials, how many may fail, where their models go,
    and how the trials after the dense control are chosen."""

    n_trials: int  # COMPLETE and PRUNED: what --n-trials counts, as Optuna's optimize
    max_failed: int
    models_dir: str  # <artifacts>/trials/<storage.models_folder>: a folder per trial
    spread_trials: int = 0  # the first trials after the dense control spread sparsity
    gap_fill_every: int = 0  # then every N-th fills the front's widest gap
    warm_start: bool = False  # a trial starts from the front's next larger model (warm_start.py)
    proposer: Proposer | None = None  # the others, if given, take its point ([study] sampler gp, nsga2)
    recent_tpe: RecentTPE | None = None  # or, past its window, TPE's on the recent trials (recent_tpe.py)
    # With a budget of trial CPU seconds (benchmarks at equal compute), no trial starts once the
    # finished ones' CPU time adds up to it.
    trial_cpu_seconds_budget: float | None = None


@dataclass
class DriverHooks:
    """What the driver calls out to: its caller's bookkeeping after each trial, the lease, the
    dashboard's copy of a model, and the clocks it reads."""

    # Told a finished trial and, when it joined the front, the numbers it pushed off (else None).
    on_finished: Callable[[FrozenTrial, list[int] | None], None]
    # Once another driver holds the study, this one neither asks nor tells (its running trials
    # are the new holder's to resume): see storage.lease.HeldLease.
    still_leased: Callable[[], bool] = lambda: True
    # Given a COMPLETE trial on an object store before it is told (Optuna attaches artifacts to
    # running trials only), with its model's location and digest (artifacts.attach_model).
    attach_model: Callable[[optuna.Trial, str, str], None] | None = None
    clock: Callable[[], float] = time.time  # wall seconds of a trial (the executor's: use_clock)
    timings: DriverTimings = field(default_factory=lambda: DriverTimings())


@dataclass(frozen=True)
class Measurement:
    """What this run's trials are measured under, known once the dense checkpoint is."""

    setup: str | None = None  # config.setup_digest: what a trial's replicates must match
    dense_weights: str | None = None  # trainers.trial.dense_weights: what a parent was pruned from
    rung_context: str | None = None  # runner.rung_context: what its rung points compare under


class StudyDriver:
    """Keeps the Optuna study and the running trials in step, and the budget of trials. Whatever
    runs the trials (Ray Tune, or ``simulation.SimulatedExecutor``) calls ``next_config`` for a
    trial to start, ``note_rung`` and ``finish`` as it reports. What it reads of the study comes
    from ``trials`` (``study_trials.StudyTrials``), one trial read per change, and what it
    writes of a trial goes in one batch per event, so that its cost per trial does not grow
    with the study."""

    def __init__(
        self,
        study: optuna.Study,
        space: SearchSpace,
        trials: StudyTrials,
        plan: DriverPlan,
        hooks: DriverHooks,
    ) -> None:
        self.study, self.space, self.trials, self.plan, self.hooks = study, space, trials, plan, hooks
        self.interrupted_by: int | None = None  # the signal that stopped the run (interrupts.py)
        finished = [trials.trial(n) for n in trials.finished]
        self.n_finished = len(finished)  # COMPLETE and PRUNED: what --n-trials counts, as Optuna's optimize
        self.trial_cpu_seconds = sum(t.user_attrs.get("cpu_seconds", 0.0) for t in finished)
        self.n_failed = 0  # in this run
        # (the scheduler never stops the dense control: a finished one is COMPLETE)
        self.dense_control_pending = not any(t.user_attrs.get("dense_control") for t in finished)
        self.measurement = Measurement()
        self.live: dict[str, optuna.Trial] = {}  # Tune trial id -> Optuna trial
        self.started: dict[str, float] = {}
        self.curves: dict[str, list[list[float]]] = {}  # Tune trial id -> rung reports so far
        self._also_on_finished: list[Callable[[FrozenTrial, list[int] | None], None]] = []

    @property
    def n_trials(self) -> int:
        return self.plan.n_trials

    @property
    def timings(self) -> DriverTimings:
        return self.hooks.timings

    def measure_under(self, measurement: Measurement) -> None:
        """What the trials started from now on are measured under (recorded with each)."""
        self.measurement = measurement

    def use_clock(self, clock: Callable[[], float]) -> None:
        """The executor's clock for a trial's wall seconds (a simulation's virtual one)."""
        self.hooks.clock = clock

    def still_leased(self) -> bool:
        return self.hooks.still_leased()

    def also_on_finished(self, callback: Callable[[FrozenTrial, list[int] | None], None]) -> None:
        """Another listener told of each finished trial, after ``hooks.on_finished``."""
        self._also_on_finished.append(callback)

    def interrupt(self, signum: int) -> None:
        """A signal: ask for no more trials; Tune stops the running ones (RunStopper), which
        stay in ``live`` for the runner to fail and ask for again."""
        self.interrupted_by = signum

    def unfinished(self) -> list[int]:
        """Numbers of the trials still running for this driver."""
        return [trial.number for trial in self.live.values()]

    def next_config(self, tune_trial_id: str) -> dict | str | None:
        if not self.hooks.still_leased() or self.interrupted_by is not None:
            return Searcher.FINISHED
        if (
            self.n_finished >= self.plan.n_trials
            or self.n_failed > self.plan.max_failed
            or self._out_of_budget()
        ):
            return Searcher.FINISHED if not self.live else None
        if self.n_finished + len(self.live) >= self.plan.n_trials:
            return None  # enough trials running to reach the budget: wait for them
        # The dense control goes first, unless a retry is waiting (ask() would hand it that one).
        control = self.dense_control_pending and not self.trials.waiting
        with self.timings.measure("ask"):
            if not self.dense_control_pending:
                self._enqueue_spread()
            trial = self.study.ask()
            attrs: dict[str, Any] = {}
            if control:
                # The study's first trial is the dense control: the same budget, nothing removed,
                # nothing sampled (SearchSpace.control_point).
                hparams = self.space.control_point()
                attrs |= {"dense_control": True, "control_hparams": CONTROL_NOTE}
                self.dense_control_pending = False
            else:
                hparams = self.space.suggest(trial)
        with self.timings.measure("bookkeeping"):
            model_dir = join(self.plan.models_dir, str(trial.number))
            attrs |= {"hparams": hparams, "model_dir": model_dir}
            parent, parent_dir, parent_sha256 = None, "", ""
            if self.plan.warm_start:
                parent = parent_for(
                    distinct(self.trials.front_trials()),
                    hparams,
                    setup=self.measurement.setup,
                    dense_weights=self.measurement.dense_weights,
                    remote=is_remote(self.plan.models_dir),
                )
            if parent is not None:
                parent_dir = parent.user_attrs["model_dir"]
                parent_sha256 = parent.user_attrs.get("model_sha256") or ""
                attrs |= {"warm_start_from": parent.number, "parent_dir": parent_dir}
            self.trials.set_attrs(trial.number, attrs)
            frozen, _ = self.trials.update(trial.number)  # a retry's retry_of, counted as asked
        self.live[tune_trial_id] = trial
        self.started[tune_trial_id] = self.hooks.clock()
        target = f" sparsity {hparams['sparsity']:.2f}" if "sparsity" in hparams else ""
        source = f" from trial {parent.number}" if parent is not None else ""
        say(f"trial {trial.number}: started  {hparams['method']}{target}{source}")
        # A retry of a trial whose driver died resumes from that trial's checkpoint, if it left one.
        retry_of = frozen.user_attrs.get("retry_of")
        resume = [model_dir] + ([join(self.plan.models_dir, str(retry_of))] if retry_of is not None else [])
        return {
            "optuna_trial": trial.number,
            "hparams": hparams,
            "model_dir": model_dir,
            "resume_dirs": resume,
            "parent_dir": parent_dir,
            "parent_sha256": parent_sha256,
        }

    def _out_of_budget(self) -> bool:
        budget = self.plan.trial_cpu_seconds_budget
        return budget is not None and self.trial_cpu_seconds >= budget

    def _enqueue_spread(self) -> None:
        """Start-up trials are a sweep of one method (or a few in turn) over an even spread of
        sparsity, settings as ``[startup]`` says or at their defaults (``SearchSpace.start_point``), so a
        short study's front spans the range with settings known to work. After them, every
        ``gap_fill_every``-th trial fills the front's widest gap (``front_gaps``), and the others
        take the ``proposer``'s parameters where there is one (``runner.make_proposer``), or, in a
        study past the window of ``recent_tpe``, TPE's on its recent trials. The study's sampler
        chooses whatever is not enqueued."""
        if self.trials.waiting:
            return  # a retry asked for earlier goes first
        # A retry repeats a trial's point: not a new index, or a failure would skip a sparsity
        # (and, with methods in turn, give the next method's turn to the one after it).
        index = self.trials.searched
        attrs = None
        if index < self.plan.spread_trials:
            point = self.space.start_point(index)
        elif self.plan.gap_fill_every and (index - self.plan.spread_trials) % self.plan.gap_fill_every == 0:
            point = self._gap_fill()
        elif self.plan.proposer is not None:
            point, attrs = self.plan.proposer(self.trials.all()), {"proposed_by": self.plan.proposer.name}
        elif self.plan.recent_tpe is not None and (point := self.plan.recent_tpe(self.trials)) is not None:
            attrs = {"proposed_by": self.plan.recent_tpe.name}
        else:
            point = None
        if point is not None:
            self.study.enqueue_trial(point, user_attrs=attrs)

    def _gap_fill(self) -> dict | None:
        """A trial in the middle of the front's widest step, with the settings of the point at
        its smaller end (``front_gaps``); None, and the sampler chooses, when there is no gap."""
        sparsity = self.space.entries.get("sparsity")
        if not isinstance(sparsity, Range):
            return None
        running = [t.params["sparsity"] for t in self.live.values() if "sparsity" in t.params]
        front = distinct(self.trials.front_trials())
        return gap_fill_point(front, self.trials.tried, running, sparsity.low, sparsity.high)

    def note_retry(self, tune_trial_id: str, error: Exception | None) -> None:
        trial = self.live.get(tune_trial_id)
        if trial is not None and self.hooks.still_leased():
            retries = self.trials.trial(trial.number).user_attrs.get("worker_retries", 0) + 1
            self.trials.set_attrs(
                trial.number, {"worker_retries": retries, "last_worker_error": error_line(error)}
            )

    def note_rung(self, tune_trial_id: str, result: dict) -> None:
        """A rung report: the trial's learning curve so far, kept on the Optuna trial (the
        dashboard shows it; a resumed driver seeds the scheduler's pools with it)."""
        trial = self.live.get(tune_trial_id)
        if trial is not None and RUNG_KEY in result and self.hooks.still_leased():
            with self.timings.measure("bookkeeping"):
                point = [result[RUNG_KEY], result["finetune_step"], result["val_perplexity"]]
                # A worker restarted by Tune reports its rungs again: the new report replaces the old.
                earlier = [p for p in self.curves.get(tune_trial_id, []) if p[0] < point[0]]
                self.curves[tune_trial_id] = [*earlier, point]
                self.trials.set_attrs(
                    trial.number,
                    {
                        "curve": self.curves[tune_trial_id],
                        "n_params": result["n_params"],
                        "rung_tokens": result.get("rung_tokens"),
                        "rung_context": self.measurement.rung_context,
                    },
                )

    def _stopped_early(self, trial: optuna.Trial, result: dict, seconds: float) -> None:
        """The scheduler stopped it at a rung: PRUNED, with the step and what it saved."""
        self.trials.set_attrs(
            trial.number,
            {
                "stopped_at_step": result["finetune_step"],
                "finetune_steps": result["finetune_steps"],
                "saved_steps": result["finetune_steps"] - result["finetune_step"],
                "rung_val_perplexity": result["val_perplexity"],
                "wall_seconds": seconds,
                "cpu_seconds": result.get("cpu_seconds", 0.0),
            },
        )
        self.trial_cpu_seconds += result.get("cpu_seconds", 0.0)
        self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        self.n_finished += 1

    def finish(self, tune_trial_id: str, result: dict | None, error: str | None) -> None:
        if self.interrupted_by is not None and not (result and RESULT_KEY in result):
            return  # stopped by the interrupt, not finished: the runner asks for it again
        trial = self.live.pop(tune_trial_id, None)
        if trial is None or not self.hooks.still_leased():
            return
        with self.timings.measure("bookkeeping"):
            self._finish(trial, self.hooks.clock() - self.started.pop(tune_trial_id), result, error)
            self.curves.pop(tune_trial_id, None)
            told, pushed_off = self.trials.update(trial.number)
        self.hooks.on_finished(told, pushed_off)
        for listener in self._also_on_finished:
            listener(told, pushed_off)

    def _finish(self, trial: optuna.Trial, seconds: float, result: dict | None, error: str | None) -> None:
        """Record and tell one finished trial: stopped at a rung, failed, or COMPLETE."""
        values = None
        if error is None and result and RESULT_KEY not in result and RUNG_KEY in result:
            self._stopped_early(trial, result, seconds)
            return
        if error is None and result and ERROR_KEY in result:
            error = result[ERROR_KEY]
        if error is None and result and RESULT_KEY in result:
            outcome = json.loads(result[RESULT_KEY])
            values = [outcome[name] for name in OBJECTIVES]
            if not all(math.isfinite(v) for v in values):
                error, values = f"non-finite objective values {values}", None
        if values is None:
            self.trials.set_attrs(trial.number, {"error": (error or "trial ended without a result")[-2000:]})
            if self.trials.trial(trial.number).user_attrs.get("dense_control"):
                self.dense_control_pending = True
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            self.n_failed += 1
            return
        attrs = result_attrs(outcome) | {
            # What a warm start needs to choose this model as a parent, without reading it
            # (orchestrator/warm_start.py): its weights' digest, and the dense model it came from.
            "model_sha256": outcome.get("model_sha256"),
            "dense_weights": self.measurement.dense_weights,
            "wall_seconds": seconds,
            "node_id": result.get("node_id", ""),
        }
        if self.measurement.setup is not None:  # what its replicates must match
            attrs["setup"] = self.measurement.setup
        self.trials.set_attrs(trial.number, attrs)
        model_dir = self.trials.trial(trial.number).user_attrs["model_dir"]
        if self.hooks.attach_model is not None and is_remote(model_dir):
            self.hooks.attach_model(trial, model_dir, outcome.get("model_sha256") or "")
        self.trial_cpu_seconds += outcome["cpu_seconds"]
        self.study.tell(trial, values)
        self.n_finished += 1


class DriverTimings:
    """Where the driver's time goes, per kind of work, on ``clock`` (wall seconds by default;
    ``bench.driver`` gives the CPU of its process and of the database): the sampler's ask
    (``ask``) and the rest of its work on a trial (``bookkeeping``); an executor may add its
    own (``simulation.SimulatedExecutor``: the scheduler's rung decisions, itself)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def measure(self, kind: str) -> Iterator[None]:
        start = self.clock()
        try:
            yield
        finally:
            self.seconds[kind] = self.seconds.get(kind, 0.0) + self.clock() - start


class StudySearcher(Searcher):
    def __init__(self, driver: StudyDriver) -> None:
        # No metric: Tune would then demand it in every result, and a failed trial's result
        # (ERROR_KEY) has none; the study's objectives live in Optuna, not in Tune.
        super().__init__(metric=None, mode=None)
        self.driver: StudyDriver | None = driver

    def suggest(self, trial_id: str) -> dict | str | None:
        return self.driver.next_config(trial_id)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        """The callback below tells Optuna: it alone sees the error of a failed trial."""

    def save(self, checkpoint_path: str) -> None:
        """Nothing to save: the database holds the study's state."""

    def restore(self, checkpoint_path: str) -> None:
        """Nothing to restore: a resumed run reads the study from the database."""

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "driver"} | {"driver": None}


class Executor(Protocol):
    """What runs a study's trials for its driver: Ray Tune (``runner.TuneExecutor``), or a
    simulation on a virtual clock (``simulation.SimulatedExecutor``). Either asks
    ``StudySearcher`` for each trial to start, passes rung reports to the early-stopping
    ``scheduler`` and ``StudyCallback``, ends each trial through ``StudyCallback``, and stops
    asking once ``RunStopper`` says so: the driver's code is the same whichever runs."""

    def run(self, driver: StudyDriver, scheduler: TrialScheduler) -> None: ...


class Proposer(Protocol):
    """Chooses the next trial's parameters from the study's trials, or None to leave them to the
    study's sampler (``gp_proposals.GPProposer``, ``nsga2_proposals.NSGA2Proposer``); a trial
    it chose records ``name`` as its ``proposed_by`` user attribute."""

    name: str

    def __call__(self, trials: list[optuna.trial.FrozenTrial]) -> dict | None: ...


class Stoppable(Protocol):
    """What ``RunStopper`` asks: a study's driver, or ``replicates.ReplicateRun``."""

    interrupted_by: int | None

    def still_leased(self) -> bool: ...


class RunStopper(Stopper):
    """Stops the whole Tune run once the driver has lost its study's lease or was interrupted."""

    def __init__(self, driver: Stoppable) -> None:
        self.driver: Stoppable | None = driver

    def __call__(self, trial_id: str, result: dict) -> bool:
        return False

    def stop_all(self) -> bool:
        driver = self.driver
        return driver is not None and (driver.interrupted_by is not None or not driver.still_leased())

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "driver"} | {"driver": None}


class StudyCallback(Callback):
    def __init__(self, driver: StudyDriver) -> None:
        self.driver: StudyDriver | None = driver

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.driver.finish(trial.trial_id, trial.last_result, None)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        self.driver.note_rung(trial.trial_id, result)

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """Tune restarts a trial whose worker died (up to ``max_retries``): count it on the trial."""
        self.driver.note_retry(trial.trial_id, trial.get_error())

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.driver.finish(trial.trial_id, None, error_line(trial.get_error()))

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "driver"} | {"driver": None}
