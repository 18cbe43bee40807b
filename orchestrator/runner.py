"""One ``launch-study run``: validate, open the study, pretrain once, search on Ray Tune, export."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import signal
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import optuna
from optuna_dashboard import save_note

from orchestrator.artifacts import (
    ModelRef,
    attach_model,
    join,
)
from orchestrator.config import StudyConfig, setup_digest
from orchestrator.early_stopping import ParetoHalving, ParetoHalvingScheduler
from orchestrator.errors import UserError
from orchestrator.execution import (
    DriverHooks,
    DriverPlan,
    DriverTimings,
    Measurement,
    Proposer,
    StudyCallback,
    StudyDriver,
    StudySearcher,
    describe_error,
    train_on_worker,
)
from orchestrator.export import replicated
from orchestrator.gp_proposals import GPProposer
from orchestrator.inputs import study_dense_checkpoint
from orchestrator.interrupts import Interrupted
from orchestrator.nsga2_proposals import NSGA2Proposer
from orchestrator.on_tune import dense_ref, fit_on_tune, ray_session
from orchestrator.progress import PhaseProgress, say
from orchestrator.recent_tpe import RecentTPE
from orchestrator.report import front_note, last_failure, study_front_note
from orchestrator.search_space import SearchSpace
from orchestrator.session import RunOptions, StudySession
from orchestrator.storage import (
    HeldLease,
    StudyStore,
    change_frontier,
    create_or_load_study,
    fail_and_ask_again,
    fail_orphaned_trials,
    models_folder,
    redact_command,
    refresh_frontier,
    study_exists,
)
from orchestrator.storage.driver import DriverStorage
from orchestrator.study_trials import FINISHED, StudyTrials
from trainers.data import rung_windows
from trainers.pretrain import DenseCheckpoint
from trainers.trial import TrialSetup, dense_weights, evaluation_windows


@dataclass
class RunSummary:
    study_name: str
    n_finished: int  # COMPLETE and PRUNED
    n_failed_this_run: int
    front_size: int
    dense: DenseCheckpoint | None
    csv: Path


def _search_seed(cfg: StudyConfig, store: StudyStore, study_name: str) -> int:
    """The seed of this run's sampler and proposer: the study's plus the trials already asked,
    so a resumed study does not replay its start points."""
    if not study_exists(store, study_name):
        return cfg.study.seed
    study_id = store.storage.get_study_id_from_name(study_name)
    return cfg.study.seed + len(store.storage.get_all_trials(study_id, deepcopy=False))


# Finished trials past which TPE samples from the most recent ones only (recent_tpe.py): its ask
# costs 53 ms at 1,000 trials and grows linearly (bench.driver, docs/results.md).
TPE_WINDOW = 1000


def make_sampler(kind: str, *, seed: int, startup: int) -> optuna.samplers.BaseSampler:
    """``[study] sampler``. The start-up is enqueued trials, the same for every sampler;
    ``startup`` tells the sampler how many to see before it models the results. TPE with
    ``group=True`` models each define-by-run branch (a method's knobs) on the trials that have
    it, so the dense control, which has no parameters, does not empty its joint model. With
    ``gp`` and ``nsga2`` the study's own sampler is per-parameter TPE, for the knobs their
    proposals leave out (``make_proposer``)."""
    multivariate = kind == "tpe_multivariate"
    return optuna.samplers.TPESampler(
        seed=seed, n_startup_trials=startup, multivariate=multivariate, group=multivariate
    )


def make_proposer(
    kind: str, *, seed: int, study_seed: int, startup: int, space: SearchSpace
) -> Proposer | None:
    """``[study] sampler = "gp"`` or ``"nsga2"``: what proposes the searched trials' shared
    parameters after the start-up (``gp_proposals``, ``nsga2_proposals``); None for TPE, which
    samples in the study itself. The GP keeps its state from one proposal to the next and takes
    the run's ``seed``; NSGA-II replays the study at each proposal, so it takes the study's own
    (a resumed run then proposes what the first would have), and its generations are as large
    as the start-up, its first."""
    if kind == "gp":
        return GPProposer(seed)
    if kind == "nsga2":
        return NSGA2Proposer(study_seed, population_size=startup, total_heads=space.total_heads)
    return None


def startup_trials(cfg: StudyConfig, n_trials: int, space: SearchSpace) -> int:
    """The start-up, a sweep over sparsity (``SearchSpace.start_point``), before the sampler
    models the results: ``[study] startup_trials``, else half the run's ``n_trials``
    (``--n-trials`` when given, else the study file's), at most one per size the spread
    reaches (``space`` for the model, ``SearchSpace.for_model``: 27 on the default study),
    else at most 10. Until December 2026 it was at most 10 whatever the run: at 36-41 trials
    of the benchmark, 19 measured ahead of 10 on 3 of 3 seeds (BENCHMARKS.md, the start-up's
    size); the default study's 18 trials still take 10."""
    return cfg.study.startup_trials or min(space.start_sizes() or 10, n_trials // 2 + 1)


def run_study(cfg: StudyConfig, opts: RunOptions) -> RunSummary:
    """Start or resume the study: every check before anything is written, then, holding its
    lease, the dense checkpoint, the trials on Ray Tune and the Pareto CSV."""
    session = StudySession.to_run(cfg, opts)
    with session.leased() as lease:
        return _run_leased(session, lease)


def open_driver(
    cfg: StudyConfig,
    opts: RunOptions,
    store: StudyStore,
    lease: HeldLease,
    layer_heads: list[int],
    *,
    attach_models: bool = True,
    timings: DriverTimings | None = None,
) -> StudyDriver:
    """The study, opened or created with its sampler, orphans of a dead driver failed and asked
    for again, and its driver: what ``launch-study run`` does before any trial, and what
    ``bench.driver`` drives with a simulated executor (which has no models to attach to the
    dashboard, and times the driver on its own clock)."""
    space = cfg.search.for_model(layer_heads)  # the start-up: one new head count per trial
    startup = startup_trials(cfg, opts.n_trials, space)
    seed = _search_seed(cfg, store, opts.study_name)
    sampler = make_sampler(cfg.study.sampler, seed=seed, startup=startup)
    study = create_or_load_study(store, opts.study_name, sampler)
    say(f"study {opts.study_name!r} in {store.safe_url}")
    orphans = fail_orphaned_trials(store, study)
    if orphans:
        say(
            f"marked FAIL the trials {[t.number for t in orphans]} left RUNNING by a driver that "
            "stopped, and asked for them again"
        )
    refresh_frontier(store, study)  # a driver killed between tell and refresh left it stale
    study.set_user_attr("n_trials_target", opts.n_trials)
    study.set_user_attr("max_concurrent", opts.max_concurrent)
    study.set_user_attr("versions", package_versions())
    # From here on the driver reads the study from memory and writes through (storage/driver.py)
    kept = DriverStorage(store.storage, store.engine)
    study = optuna.load_study(study_name=study.study_name, storage=kept, sampler=sampler)
    after_trial = AfterTrial(store, study)
    plan = DriverPlan(
        n_trials=opts.n_trials,
        max_failed=cfg.study.max_failed_trials,
        models_dir=join(opts.artifacts, "trials", models_folder(study)),
        spread_trials=startup,
        gap_fill_every=cfg.study.gap_fill_every,
        warm_start=cfg.study.warm_start,
        proposer=make_proposer(
            cfg.study.sampler, seed=seed, study_seed=cfg.study.seed, startup=startup, space=space
        ),
        recent_tpe=RecentTPE(
            space,
            lambda build: make_sampler(cfg.study.sampler, seed=seed + build, startup=startup),
            TPE_WINDOW,
        )
        if cfg.study.sampler.startswith("tpe")
        else None,
        trial_cpu_seconds_budget=opts.trial_cpu_seconds_budget,
    )
    hooks = DriverHooks(
        on_finished=lambda trial, pushed_off: after_trial(driver, trial, pushed_off),
        still_leased=lease.held,
        attach_model=(
            (lambda trial, model_dir, digest: _attach_model(trial, opts.artifacts, model_dir, digest))
            if attach_models
            else None
        ),
        timings=timings or DriverTimings(),
    )
    driver = StudyDriver(study, space, StudyTrials(kept, study.study_name), plan, hooks)
    return driver


def _run_leased(session: StudySession, lease: HeldLease) -> RunSummary:
    cfg, opts, store = session.cfg, session.opts, session.store
    corpus, model_cfg = session.inputs()
    driver = open_driver(cfg, opts, store, lease, model_cfg.layer_heads)
    study = driver.study
    dense = None
    if driver.n_finished < opts.n_trials:
        dense = study_dense_checkpoint(cfg, corpus, model_cfg, opts.artifacts, progress=PhaseProgress())
        say(
            f"dense model: val perplexity {dense.val_perplexity:.3f} "
            f"({'reused ' + str(dense.path) if dense.reused else f'pretrained in {dense.seconds:.0f}s'})"
        )
        # What the trials of this run are measured under, stored together (a run that trains
        # nothing changes none of them): the configuration, the dense checkpoint, their digest.
        setup = setup_digest(cfg, dense.val_perplexity)
        trial_setup = TrialSetup(corpus, dense, cfg.budget, cfg.study.seed)
        driver.measure_under(
            Measurement(setup, dense_weights(dense), rung_context(setup, *rung_plan(cfg, trial_setup)))
        )
        study.set_user_attr("config", cfg.raw)
        study.set_user_attr("dense_val_perplexity", dense.val_perplexity)
        study.set_user_attr("setup", setup)
        if dense.bits_per_byte is not None:
            study.set_user_attr("dense_bits_per_byte", dense.bits_per_byte)
        _search(cfg, opts, driver, trial_setup, dense_ref(opts, dense))
        lease.check()  # a driver that lost the study writes no front: the holder does
        save_note(study, study_front_note(study, replicated(store, study)))  # its counts, current
        if driver.interrupted_by is not None:
            _wind_down(store, study, driver)
    else:
        say(f"study already holds {driver.n_finished} finished trials (asked for {opts.n_trials})")

    rows = refresh_frontier(store, study)
    if not rows:
        failure = last_failure(study.get_trials(deepcopy=False))
        cause = f"; the last failure: trial {failure[0]}: {failure[1]}" if failure else ""
        raise UserError(f"study {opts.study_name!r} has no complete trial to export{cause}")
    csv = session.write_front(study)
    say(f"Pareto front: {len(rows)} trials -> {csv}")
    if not replicated(store, study).results:
        say(
            "each point is one draw of its trial's batches: `launch-study replicate` with this study "
            "file trains the front again at other seeds (docs/howto/held-out-and-references.md)"
        )
    return RunSummary(opts.study_name, driver.n_finished, driver.n_failed, len(rows), dense, csv)


def _attach_model(trial: optuna.Trial, artifacts: str, model_dir: str, digest: str) -> None:
    """A COMPLETE trial's model, as an artifact the dashboard serves (``artifacts.attach_model``).
    A store that fails here costs the dashboard's copy only: the trial, its model and the study
    go on, with one line saying so."""
    try:
        attach_model(trial, artifacts, model_dir, digest)
    except Exception as err:  # the dashboard's copy only: never worth the study
        say(f"trial {trial.number}: its model is not in the dashboard's artifacts ({describe_error(err)})")


def _wind_down(store: StudyStore, study: optuna.Study, driver: StudyDriver) -> None:
    """After an interrupt: the trials that were running are failed and asked for again (a
    resumed run continues them), the frontier table is brought up to date, and the run ends
    with how to resume it; no CSV is written for a study that did not finish."""
    import sys

    name = signal.Signals(driver.interrupted_by).name
    numbers = set(driver.unfinished())
    running = [t for t in study.get_trials(deepcopy=False) if t.number in numbers]
    fail_and_ask_again(store, study, running, f"interrupted ({name}) while it ran")
    refresh_frontier(store, study)
    again = f" (trials {sorted(numbers)} will run again)" if numbers else ""
    command = redact_command(["launch-study", *sys.argv[1:]])
    raise Interrupted(
        driver.interrupted_by,
        f"interrupted ({name}) with {driver.n_finished} of {driver.n_trials} trials finished{again}; "
        f"resume with: {command}",
    )


def package_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("headprune", "torch", "optuna", "ray", "sqlalchemy", "optuna-dashboard"):
        with contextlib.suppress(PackageNotFoundError):
            found[name] = version(name)
    return found


class AfterTrial:
    """After every finished trial: the frontier table's change, the dashboard's note, one
    progress line. The note is written again when the front changed or, for its counts, once
    ``NOTE_SECONDS`` have passed since it was written, so that a long study does not rewrite it
    after every trial; the run writes it once more at its end."""

    NOTE_SECONDS = 30.0

    def __init__(self, store: StudyStore, study: optuna.Study) -> None:
        self.store, self.study = store, study
        self.note_written = -math.inf

    def __call__(
        self, driver: StudyDriver, trial: optuna.trial.FrozenTrial, pushed_off: list[int] | None
    ) -> None:
        kept = driver.trials
        if pushed_off is not None:
            change_frontier(self.store, self.study.study_name, [kept.row(trial.number)], pushed_off)
        front = kept.front_trials()
        if pushed_off is not None or time.monotonic() - self.note_written > self.NOTE_SECONDS:
            replicates = replicated(self.store, self.study, front)
            save_note(self.study, front_note(front, kept.complete, kept.pruned, kept.control, replicates))
            self.note_written = time.monotonic()
        if trial.values and trial.user_attrs.get("dense_control"):
            self.study.set_user_attr("dense_control_perplexity", trial.values[0])
        say(
            f"trial {trial.number}: {_outcome(trial)}  | {_counts(driver)}{_best_so_far(kept.control, front)}"
        )


def _outcome(trial: optuna.trial.FrozenTrial) -> str:
    attrs = trial.user_attrs
    if trial.values:
        return (
            f"COMPLETE  sparsity {attrs['sparsity']:.2f}  "
            f"ppl {trial.values[0]:.3f}  params {int(trial.values[1]):,}"
        )
    if trial.state == optuna.trial.TrialState.PRUNED:
        return (
            f"STOPPED at fine-tuning step {attrs['stopped_at_step']}/{attrs['finetune_steps']}  "
            f"ppl {attrs['rung_val_perplexity']:.3f}  params {attrs['n_params']:,}"
        )
    return f"FAIL  {attrs.get('error', '')}"


def _counts(driver: StudyDriver) -> str:
    return (
        f"finished {driver.n_finished}/{driver.n_trials}, running {len(driver.live)}, "
        f"failed {driver.n_failed}, front {len(driver.trials.front)}"
    )


def _best_so_far(control: optuna.trial.FrozenTrial | None, front: list[optuna.trial.FrozenTrial]) -> str:
    """The smallest model on the front within 2% of the dense control's perplexity."""
    if control is None:
        return ""
    close = [t for t in front if t.values[0] <= 1.02 * control.values[0]]
    if not close:
        return ""
    best = min(close, key=lambda t: t.values[1])
    return f", smallest within 2% of dense: {int(best.values[1]):,} params (trial {best.number})"


def rung_plan(cfg: StudyConfig, setup: TrialSetup) -> tuple[tuple[float, ...], int]:
    """The rungs (fractions of the fine-tuning budget) and the validation tokens each scores."""
    rungs = tuple(cfg.early_stopping.rungs())
    return rungs, rung_windows(evaluation_windows(setup), cfg.early_stopping.eval_tokens)[1].numel()


def rung_context(setup: str | None, rungs: tuple[float, ...], rung_tokens: int) -> str:
    """What a rung's point was measured under: the trial setup (``config.setup_digest``), the
    rungs' fractions and the tokens they score. Points under another (a study resumed with
    other ``[early_stopping]``, ``[trial]`` or ``eval_tokens``, where a rung is another moment of
    training or another subset of the text, which differ by about 1%, BENCHMARKS.md) do not
    compare. Its first field names the rule that places rungs (v2: at equal weight updates)."""
    measured = json.dumps([setup, list(rungs), rung_tokens])
    return "v2:" + hashlib.sha256(measured.encode()).hexdigest()[:16]


def make_scheduler(cfg: StudyConfig, study: optuna.Study, n_rungs: int, context: str):
    """Pareto-aware early stopping when the study asks for it (else Tune's FIFO, no stopping).
    A resumed study's pools start with the rung points of its finished trials measured under
    the same ``rung_context`` (none from before trials recorded one)."""
    from ray.tune.schedulers import FIFOScheduler

    if not n_rungs:
        return FIFOScheduler()
    halving = ParetoHalving(n_rungs, cfg.early_stopping.reduction_factor, cfg.early_stopping.margin)
    for trial in study.get_trials(deepcopy=False, states=FINISHED):
        if trial.user_attrs.get("dense_control") or trial.user_attrs.get("rung_context") != context:
            continue
        params = trial.values[1] if trial.values else trial.user_attrs.get("n_params")
        for rung, _step, ppl in trial.user_attrs.get("curve", []):
            if int(rung) < n_rungs:
                halving.record(int(rung), trial.number, (ppl, params))
    return ParetoHalvingScheduler(halving)


def _search(
    cfg: StudyConfig, opts: RunOptions, driver: StudyDriver, setup: TrialSetup, dense: ModelRef | None
) -> None:
    """The study's trials on Ray Tune, each rung scored on the same windows of the text."""
    rungs = tuple(cfg.early_stopping.rungs())
    scheduler = make_scheduler(cfg, driver.study, len(rungs), driver.measurement.rung_context)
    trainable = partial(
        train_on_worker,
        setup=setup,
        rungs=rungs,
        rung_eval_tokens=cfg.early_stopping.eval_tokens,
        dense=dense,
    )
    TuneExecutor(cfg, opts, trainable).run(driver, scheduler)


class TuneExecutor:
    """Runs a study's trials on Ray Tune (``execution.Executor``): ``trainable`` on each worker
    (``train_on_worker`` with its arguments; ``simulation.replay_on_worker`` to measure Tune),
    the driver behind Tune's searcher and callback, the scheduler deciding at rungs."""

    def __init__(self, cfg: StudyConfig, opts: RunOptions, trainable: partial) -> None:
        self.cfg, self.opts, self.trainable = cfg, opts, trainable

    def run(self, driver: StudyDriver, scheduler) -> None:
        from ray import tune

        cfg, opts = self.cfg, self.opts
        with ray_session(opts, cfg.study.cpus_per_trial):
            # put in Ray's object store once, not pickled with every trial
            trainable = tune.with_parameters(self.trainable.func, **self.trainable.keywords)
            tune_config = tune.TuneConfig(
                search_alg=StudySearcher(driver),
                scheduler=scheduler,
                num_samples=-1,  # the searcher says when the study is done
                max_concurrent_trials=opts.max_concurrent,
                reuse_actors=True,
            )
            fit_on_tune(
                cfg,
                opts,
                trainable,
                tune_config,
                name=opts.study_name,
                callback=StudyCallback(driver),
                driver=driver,
            )
