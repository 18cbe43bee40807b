"""One ``launch-study run``: validate, open the study, pretrain once, search on Ray Tune, export."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import optuna
from optuna_dashboard import save_note

from orchestrator.artifacts import (
    ModelRef,
    attach_model,
    check_root,
    credentials_hidden,
    fetch,
    is_remote,
    join,
    local_cache,
    parse_root,
    publish,
    stored_digest,
)
from orchestrator.config import CORPUS_FILES, StudyConfig, setup_digest, user_model
from orchestrator.early_stopping import ParetoHalving, ParetoHalvingScheduler
from orchestrator.errors import UserError
from orchestrator.execution import (
    DriverHooks,
    DriverPlan,
    DriverTimings,
    Measurement,
    Proposer,
    RunStopper,
    Stoppable,
    StudyCallback,
    StudyDriver,
    StudySearcher,
    describe_error,
    train_on_worker,
)
from orchestrator.export import replicated, study_table, write_table
from orchestrator.gp_proposals import GPProposer
from orchestrator.interrupts import Interrupted, keep_sigterm_handler, wind_down
from orchestrator.nsga2_proposals import NSGA2Proposer
from orchestrator.preflight import (
    check_devices,
    check_not_an_input,
    check_ray_address,
    check_sqlite_path,
    check_study_name,
    check_writable_file,
    check_writable_folder,
)
from orchestrator.progress import PhaseProgress, say
from orchestrator.recent_tpe import RecentTPE
from orchestrator.report import front_note, last_failure, study_front_note
from orchestrator.search_space import SearchSpace
from orchestrator.storage import (
    HeldLease,
    StudyStore,
    change_frontier,
    check_objectives,
    check_store,
    create_or_load_study,
    fail_and_ask_again,
    fail_orphaned_trials,
    hold_lease,
    models_folder,
    open_store,
    redact_command,
    refresh_frontier,
    resolve_url,
    sqlite_database,
    study_exists,
)
from orchestrator.storage.driver import DriverStorage
from orchestrator.study_trials import FINISHED, StudyTrials
from trainers.data import Corpus, CorpusError, rung_windows
from trainers.export import WEIGHTS, CorruptModel, read_config
from trainers.families import FamilyConfig, family
from trainers.pretrain import DenseCheckpoint, checkpoint_key, ensure_dense_checkpoint
from trainers.trial import TrialSetup, dense_weights, evaluation_windows


@dataclass
class RunOptions:
    storage_url: str
    study_name: str
    n_trials: int
    max_concurrent: int
    artifacts: str  # an absolute path, or an object store's URI (orchestrator/artifacts.py)
    output_csv: Path
    ray_address: str | None = None
    trial_cpu_seconds_budget: float | None = None  # stop asking once trials used this much CPU time

    @classmethod
    def for_study(
        cls,
        cfg: StudyConfig,
        *,
        storage: str | None = None,
        study_name: str | None = None,
        n_trials: int | None = None,
        max_concurrent: int | None = None,
        artifacts: str | Path | None = None,
        output: str | Path | None = None,
        ray_address: str | None = None,
    ) -> RunOptions:
        """The options ``launch-study run`` uses, each left out taking the study file's value or
        the CLI's default (storage: --storage, $HEADPRUNE_STORAGE, runs/<study>.db; artifacts:
        --artifacts, [study] artifacts, runs/artifacts)."""
        for flag, value in (("n_trials", n_trials), ("max_concurrent", max_concurrent)):
            if value is not None and value < 1:
                raise UserError(f"{flag} must be at least 1, got {value}")
        name = study_name or cfg.study.name
        return cls(
            storage_url=resolve_url(storage, name),
            study_name=name,
            n_trials=n_trials if n_trials is not None else cfg.study.n_trials,
            max_concurrent=max_concurrent if max_concurrent is not None else cfg.study.max_concurrent,
            artifacts=parse_root(
                artifacts or cfg.study.artifacts or "runs/artifacts"
            ),  # a path made absolute: Ray workers run in other folders
            output_csv=Path(output) if output else Path("runs") / f"{name}_pareto.csv",
            ray_address=ray_address or os.environ.get("RAY_ADDRESS"),
        )


@dataclass
class RunSummary:
    study_name: str
    n_finished: int  # COMPLETE and PRUNED
    n_failed_this_run: int
    front_size: int
    dense: DenseCheckpoint | None
    csv: Path


def prepare_inputs(cfg: StudyConfig, cache_dir: Path | None = None) -> tuple[Corpus, FamilyConfig]:
    """Everything that can be checked before the database is touched: the corpus tokenized (ids
    and a trained BPE cached under ``cache_dir``) and the model's config (a user's model's
    config read, not its weights), each by the model's family."""
    where = f"{cfg.source}: [model]"
    model_family = family(cfg.model["family"])
    starts_from = user_model(cfg)
    if starts_from:  # read and checked before anything is tokenized
        try:
            model_family.check_user_model(starts_from, cfg.model["block_size"])
        except ValueError as err:
            raise UserError(f"{where} {err}") from None
    try:
        corpus = Corpus.load(
            **cfg.corpus.load_kwargs(cfg.source.parent),
            block_size=cfg.model["block_size"],
            model_path=starts_from,
            cache_dir=cache_dir,
        )
    except CorpusError as err:
        raise UserError(f"{cfg.source}: [corpus] {err}") from None
    except OSError as err:  # the cache folder (the pre-flight checks --artifacts before this)
        raise UserError(f"{cfg.source}: [corpus] cannot write its cache under {cache_dir}: {err}") from None
    try:
        model_cfg = model_family.model_config(cfg.model, corpus.vocab_size, starts_from)
    except ValueError as err:
        raise UserError(f"{where} {err}") from None
    if model_cfg.vocab_size < corpus.vocab_size:
        hint = (
            "the tokenizer beside the model does not belong to it"
            if cfg.corpus.tokenizer == "model"
            else "use [corpus] tokenizer = 'model', the model's own"
        )
        raise UserError(
            f"{where} the model's vocabulary ({model_cfg.vocab_size}) is smaller than the tokenizer's "
            f"({corpus.vocab_size}): {hint}"
        )
    cfg.search.check_reachable(f"{cfg.source}: [search]", list(model_cfg.layer_heads))
    floor = model_family.min_heads_per_layer
    if min(cfg.search.entries["min_heads_per_layer"].values()) < floor:
        raise UserError(
            f"{cfg.source}: [search] min_heads_per_layer: the {model_family.name} family keeps at least "
            f"{floor} head a layer"
        )
    return corpus, model_cfg


def corpus_cache(artifacts: str) -> Path:
    """Where the corpus's trained BPE and token ids are cached: under a local ``--artifacts``,
    in this machine's cache for an object store (they are made again from the corpus at will)."""
    return local_cache() / "corpus" if is_remote(artifacts) else Path(artifacts) / "cache"


def dense_location(artifacts: str, dense: DenseCheckpoint) -> str:
    """Where the dense checkpoint is stored: ``<artifacts>/dense/<key>`` (its folder's name is
    its key wherever it was found)."""
    return join(artifacts, "dense", dense.path.name)


def _pull_dense(location: str, folder: Path) -> bool:
    """The store's dense checkpoint for this key into this machine's cache (``folder``, where
    ``ensure_dense_checkpoint`` finds it), unless a sound copy of the same weights is there.
    The store's copy wins over another one cached here (made for another store, say). Returns
    whether the store holds a sound copy: False for none, or one that fails its checksums,
    which the caller then replaces."""
    digest = stored_digest(location)
    if digest is None:
        return False
    with contextlib.suppress(CorruptModel, KeyError):
        if read_config(folder)["sha256"][WEIGHTS] == digest:
            return True
    try:
        downloaded = fetch(location)
    except CorruptModel as err:
        say(f"dense checkpoint on the store not used: {err}")
        return False
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    downloaded.rename(folder)
    return True


def study_dense_checkpoint(
    cfg: StudyConfig, corpus: Corpus, model_cfg: FamilyConfig, artifacts: str | Path, progress=None
) -> DenseCheckpoint:
    """The study's dense checkpoint: cached under ``artifacts``, shipped in ``checkpoints/``
    beside the study file, pretrained now, or a user's model (``[model] path``) scored and
    copied into the cache (pretrained further only if ``[pretrain] steps`` says so). With an
    object store, it is read from there through this machine's cache, or uploaded there once
    made (``dense/<key>``); the workers fetch it by its weights' digest."""
    artifacts = str(artifacts)
    initial, source = None, ""
    starts_from = user_model(cfg)
    if starts_from:
        model_family = family(model_cfg.family)
        source = model_family.user_model_digest(starts_from)

        def initial():
            try:
                return model_family.load_user_model(starts_from, model_cfg.block_size)
            except ValueError as err:
                raise UserError(f"{cfg.source}: [model] {err}") from None

    local, stored = Path(artifacts), True
    if is_remote(artifacts):
        local = local_cache()
        key = checkpoint_key(corpus.digest, model_cfg, cfg.pretrain, source)
        stored = _reaching(
            artifacts, lambda: _pull_dense(join(artifacts, "dense", key), local / "dense" / key)
        )
    dense = ensure_dense_checkpoint(
        corpus,
        model_cfg,
        cfg.pretrain,
        local,
        eval_tokens=cfg.budget.eval_tokens,
        device=cfg.budget.device,
        progress=progress,
        shipped_dir=cfg.source.parent / "checkpoints",
        notice=say,
        initial=initial,
        source=source,
    )
    if not stored:  # made here, or found cached or shipped: uploaded once, for every node
        _reaching(artifacts, lambda: publish(dense.path, dense_location(artifacts, dense)))
    return dense


def _reaching(artifacts: str, work):
    """``work()``, an object store's failure (it answered the pre-flight check, and stopped) a
    ``UserError`` of one line rather than a traceback."""
    try:
        return work()
    except OSError as err:
        raise UserError(f"--artifacts {artifacts}: {err}") from None


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


def preflight(cfg: StudyConfig, opts: RunOptions) -> None:
    """Everything about the run (not the study file) that can be checked before anything is
    written: a mistake found later would leave a study, a checkpoint or a CSV behind."""
    check_study_name(opts.study_name)
    if is_remote(opts.artifacts):
        check_root(opts.artifacts)
    else:
        check_writable_folder("--artifacts", Path(opts.artifacts))
    check_writable_file("--output", opts.output_csv)
    database = sqlite_database(opts.storage_url)
    corpus = cfg.corpus.load_kwargs(cfg.source.parent)
    inputs = {"study file": cfg.source, "SQLite database": database}
    inputs |= {f"corpus file ([corpus] {key})": corpus.get(key) for key in CORPUS_FILES}
    if starts_from := user_model(cfg):
        inputs["your model's folder ([model])"] = Path(starts_from)
    check_not_an_input("--output", opts.output_csv, inputs)
    check_sqlite_path(database)
    check_devices(cfg.budget.device, cfg.study.gpus_per_trial, joining_cluster=bool(opts.ray_address))
    check_ray_address(opts.ray_address)


def run_study(cfg: StudyConfig, opts: RunOptions) -> RunSummary:
    preflight(cfg, opts)  # first: the corpus's caches are written under --artifacts
    check_store(opts.storage_url, opts.study_name)  # reads only: a mistake there writes nothing
    corpus, model_cfg = prepare_inputs(cfg, cache_dir=corpus_cache(opts.artifacts))
    store = open_store(opts.storage_url)
    if study_exists(store, opts.study_name):
        check_objectives(store, opts.study_name)  # again: another driver may have made it since
    with hold_lease(store, opts.study_name, cfg.study.lease_seconds) as lease:
        if lease.takeover:
            say(lease.takeover.describe())
        return _run_leased(cfg, opts, store, corpus, model_cfg, lease)


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


def _run_leased(
    cfg: StudyConfig,
    opts: RunOptions,
    store: StudyStore,
    corpus: Corpus,
    model_cfg: FamilyConfig,
    lease: HeldLease,
) -> RunSummary:
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
    csv = write_table(study_table(store, study), opts.output_csv)
    say(f"Pareto front: {len(rows)} trials -> {csv}")
    if not replicated(store, study).results:
        say(
            "each point is one draw of its trial's batches: `launch-study replicate` with this study "
            "file trains the front again at other seeds (README)"
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


@contextlib.contextmanager
def ray_session(opts: RunOptions, cpus_per_trial: float) -> Iterator[None]:
    """Ray for one run of trials: the cluster ``opts.ray_address`` names, else a local instance
    with the CPUs of ``max_concurrent`` trials, shut down after; a notebook's own Ray (already
    initialised) is used as it is and left running."""
    import ray

    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # our own progress lines, not Tune's tables
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # no TensorBoard/CSV files
    local = {} if opts.ray_address else {"num_cpus": max(1, math.ceil(cpus_per_trial * opts.max_concurrent))}
    joined = ray.is_initialized()
    if not joined:
        try:
            with keep_sigterm_handler():
                _init_ray(opts, local)
        except BaseException as stop:  # stopped or failed while it starts: what it started goes
            with contextlib.suppress(Exception), keep_sigterm_handler():
                ray.shutdown()
            # ray.init's own SIGTERM handler, there while it starts, exits 15: the interrupt it is
            if isinstance(stop, SystemExit) and stop.code == signal.SIGTERM:
                raise Interrupted(signal.SIGTERM) from None
            raise
    try:
        yield
    finally:
        if not joined:
            # ray.shutdown puts SIGTERM back to the system's default under Python's handler: a
            # SIGTERM after it (the front refreshed, the CSV written, the lease released) would
            # kill the run without a word and leave its lease held. Set again, ours is back.
            with keep_sigterm_handler():
                ray.shutdown()


def dense_ref(opts: RunOptions, dense: DenseCheckpoint) -> ModelRef | None:
    """How a worker reads the dense checkpoint: from the object store by its weights' digest;
    None where the driver's path is the workers' too (a local ``--artifacts``)."""
    if not is_remote(opts.artifacts):
        return None
    return ModelRef(dense_location(opts.artifacts, dense), dense_weights(dense))


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


def fit_on_tune(
    cfg: StudyConfig,
    opts: RunOptions,
    trainable,
    tune_config,
    *,
    name: str,
    callback,
    driver: Stoppable,
    param_space: dict | None = None,
) -> None:
    """Tune runs ``trainable`` with each trial's resources, its experiment folder under
    ``<artifacts>/ray/<name>``, ``callback`` told of each trial, Tune's retries of a dead worker,
    and our signal handling: the first Ctrl-C or SIGTERM goes to ``driver.interrupt`` and
    ``RunStopper`` stops the running trials (interrupts.py). Inside ``ray_session``."""
    from ray import tune

    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": cfg.study.cpus_per_trial, "gpu": cfg.study.gpus_per_trial}),
        param_space=param_space,
        tune_config=tune_config,
        run_config=tune.RunConfig(
            name=name,
            storage_path=str(tune_folder(opts.artifacts)),
            callbacks=[callback],
            stop=RunStopper(driver),
            failure_config=tune.FailureConfig(max_failures=cfg.study.max_retries),
            verbose=0,
        ),
    )
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"  # ours (interrupts.py) winds the run down
    # Tune would copy the store's credentials into its workers' runtime environment, and Ray logs it
    with wind_down(driver.interrupt), credentials_hidden():
        tuner.fit()


def tune_folder(artifacts: str) -> Path:
    """Tune's experiment folder: ``<artifacts>/ray``, or this machine's cache with an object
    store. It is a cache either way (the database holds the study, the store the models), and
    kept off the store: while Tune runs the credentials are out of the driver's environment
    (``artifacts.credentials_hidden``), so Tune's filesystem would need them as explicit keys,
    which it would pickle into its experiment state and ship to every worker."""
    return local_cache() / "ray" if is_remote(artifacts) else Path(artifacts) / "ray"


def _init_ray(opts: RunOptions, local: dict) -> None:
    import ray

    ray.init(
        # "local": a fresh instance of our own, never whatever cluster `ray start` left recorded
        # in /tmp/ray; joining a cluster is what --ray-address / RAY_ADDRESS is for.
        address=opts.ray_address or "local",
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=True,
        logging_level="ERROR",
        **local,
    )
