"""The options of a command that trains for a study (run, replicate, reference), the checks
made of them before anything is written, and the study as those commands hold it
(``StudySession``): one way to open it, prepare what it trains on, hold its lease and write its
front, for starting or resuming a study (``launch-study run``) and for revisiting one that ran
(``replicate``, ``reference``)."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import optuna

from orchestrator.artifacts import (
    check_root,
    is_remote,
    parse_root,
)
from orchestrator.config import (
    CORPUS_FILES,
    EXECUTION_ONLY,
    MEASUREMENT_SECTIONS,
    StudyConfig,
    config_from_raw,
    measurement_settings,
    setup_digest,
    user_model,
)
from orchestrator.errors import UserError
from orchestrator.export import study_table, write_table
from orchestrator.inputs import corpus_cache, prepare_inputs, study_dense_checkpoint
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
from orchestrator.storage import (
    HeldLease,
    StudyStore,
    check_objectives,
    check_store,
    hold_lease,
    load_existing_study,
    open_store,
    resolve_url,
    sqlite_database,
    study_exists,
)
from trainers.data import Corpus
from trainers.families import FamilyConfig
from trainers.trial import TrialSetup


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


class StudySession:
    """A study as a command that trains for it holds it: its file and options, its database,
    what it trains on (prepared once, on first use) and its lease. ``to_run`` opens it for
    ``launch-study run`` (a new study, or one resumed); ``to_revisit`` for a command that trains
    again for a study that ran (``replicate``, ``reference``), checked to measure as it did."""

    def __init__(self, cfg: StudyConfig, opts: RunOptions, store: StudyStore | None = None) -> None:
        self.cfg, self.opts, self.store = cfg, opts, store
        self.study: optuna.Study | None = None  # the study revisited (to_revisit)
        self.stored: dict | None = None  # the configuration it stored (None: a version before that)
        self.setup: str | None = None  # the setup digest its results are measured under
        self._inputs: tuple[Corpus, FamilyConfig] | None = None

    @classmethod
    def to_run(cls, cfg: StudyConfig, opts: RunOptions) -> StudySession:
        """Every check before anything is written (the options, the database read only), then
        what the study trains on prepared (the corpus's caches are written under --artifacts)
        and the database opened, made if it is new."""
        preflight(cfg, opts)  # first: the corpus's caches are written under --artifacts
        check_store(opts.storage_url, opts.study_name)  # reads only: a mistake there writes nothing
        session = cls(cfg, opts)
        session.inputs()
        session.store = open_store(opts.storage_url)
        if study_exists(session.store, opts.study_name):
            check_objectives(session.store, opts.study_name)  # again: another driver may have made it since
        return session

    @classmethod
    def to_revisit(cls, cfg: StudyConfig, opts: RunOptions) -> StudySession:
        """The study a command revisits, checked before anything is written: it exists, and the
        study file measures as it did (``check_same_setup``)."""
        preflight(cfg, opts)
        session = cls(cfg, opts, open_store(opts.storage_url, create=False))  # it must exist
        study = session.study = load_existing_study(session.store, opts.study_name)
        session.stored = study.user_attrs.get("config")
        if session.stored is None:  # a study of a version before the configuration was stored
            say(f"study {opts.study_name!r} stored no configuration: assuming it ran with this study file")
        else:
            check_same_setup(session.stored, cfg, opts.study_name)
        # The run's own digest where it stored one (the same settings: checked above), else this
        # file's with the dense checkpoint the study recorded (a study of an earlier version).
        stored_setup = study.user_attrs.get("setup")
        session.setup = stored_setup or setup_digest(cfg, study.user_attrs.get("dense_val_perplexity"))
        return session

    def inputs(self) -> tuple[Corpus, FamilyConfig]:
        """The corpus, tokenized (its caches under --artifacts), and the model's config."""
        if self._inputs is None:
            self._inputs = prepare_inputs(self.cfg, cache_dir=corpus_cache(self.opts.artifacts))
        return self._inputs

    @contextlib.contextmanager
    def leased(self) -> Iterator[HeldLease]:
        """The study's lease for the block (one driver per study), a takeover said."""
        with hold_lease(self.store, self.opts.study_name, self.cfg.study.lease_seconds) as lease:
            if lease.takeover:
                say(lease.takeover.describe())
            yield lease

    def revisited_setup(self) -> TrialSetup:
        """What every trial run again for the revisited study shares: the corpus and the dense
        checkpoint the study pruned (another one is refused: it would not measure its points)."""
        corpus, model_cfg = self.inputs()
        dense = study_dense_checkpoint(
            self.cfg, corpus, model_cfg, self.opts.artifacts, progress=PhaseProgress()
        )
        pruned_from = self.study.user_attrs.get("dense_val_perplexity")
        if pruned_from is not None and not math.isclose(dense.val_perplexity, pruned_from, rel_tol=1e-6):
            raise UserError(
                f"the dense checkpoint here scores {dense.val_perplexity:.6f}, the one study "
                f"{self.opts.study_name!r} pruned {pruned_from:.6f}: replicates would not measure its points"
            )
        return TrialSetup(corpus, dense, self.cfg.budget, self.cfg.study.seed)

    def write_front(self, study: optuna.Study) -> Path:
        """The study's Pareto CSV (``--output``), as ``launch-study export`` writes it."""
        return write_table(study_table(self.store, study), self.opts.output_csv)


def check_same_setup(stored: dict, cfg: StudyConfig, study_name: str) -> None:
    """The study file (with its --set values) measures trials as the study did: its
    ``config.measurement_settings`` equal those of the configuration the study stored (a
    replicate from a file that differs in one would not measure the same point). Paths are
    compared as written (the dense checkpoint's score catches another corpus at the same path).
    A stored configuration this version cannot read (a key since removed) is compared as
    written, section by section."""
    try:
        ran, here = measurement_settings(config_from_raw(cfg.source, stored)), measurement_settings(cfg)
    except UserError:
        sections = (*MEASUREMENT_SECTIONS, "study")
        ran = {section: dict(stored.get(section, {})) for section in sections}
        here = {section: dict(cfg.raw.get(section, {})) for section in sections}
        for values in (ran, here):
            values["study"] = {"seed": values["study"].get("seed", 0)}
            for section, key in EXECUTION_ONLY:
                values[section].pop(key, None)
    for section, values in here.items():
        for key in {**ran[section], **values}:
            mine, theirs = values.get(key, "(not set)"), ran[section].get(key, "(not set)")
            if mine != theirs:
                raise UserError(
                    f"[{section}] {key} is {mine!r} here but {theirs!r} in the run of study "
                    f"{study_name!r}: replicate with the study file (and --set values) it ran with"
                )
