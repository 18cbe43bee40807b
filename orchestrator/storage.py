"""Everything that touches the database: Optuna's RDB storage and this project's own tables.

One database holds a study: Optuna's tables (trials, values, attributes; what optuna-dashboard
reads), ``pareto_frontier``, which this module keeps equal to the non-dominated set of the
study's COMPLETE trials, and ``trial_replicates``, the front's points trained again with other
seeds (``launch-study replicate``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import socket
import threading
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import optuna
import sqlalchemy as sa
from optuna.distributions import BaseDistribution, distribution_to_json
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from orchestrator.errors import LeaseLost, UserError
from orchestrator.frontier import pareto_front
from orchestrator.records import OBJECTIVES, RESULT_COLUMNS, TrialRecord

DIRECTIONS = (optuna.study.StudyDirection.MINIMIZE, optuna.study.StudyDirection.MINIMIZE)
STORAGE_ENV = "HEADPRUNE_STORAGE"
MODELS_FOLDER_KEY = "models_folder"  # the study user attribute that names it (models_folder below)


class Base(DeclarativeBase):
    pass


class ParetoPoint(Base):
    """One non-dominated COMPLETE trial of a study."""

    __tablename__ = "pareto_frontier"
    __table_args__ = (sa.UniqueConstraint("study_name", "trial_number"),)

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    study_name: Mapped[str] = mapped_column(sa.String(512), index=True)
    trial_number: Mapped[int]
    test_perplexity: Mapped[float | None] = mapped_column(sa.Float(precision=53), nullable=True)
    val_perplexity: Mapped[float] = mapped_column(sa.Float(precision=53))
    bits_per_byte: Mapped[float | None] = mapped_column(sa.Float(precision=53), nullable=True)
    n_params: Mapped[int] = mapped_column(sa.BigInteger)
    n_params_nonembed: Mapped[int] = mapped_column(sa.BigInteger)
    sparsity: Mapped[float] = mapped_column(sa.Float(precision=53))
    heads_per_layer: Mapped[str] = mapped_column(sa.Text)  # JSON list
    method: Mapped[str] = mapped_column(sa.String(64))
    lineage_steps: Mapped[int | None] = mapped_column(sa.BigInteger, nullable=True)
    params: Mapped[str] = mapped_column(sa.Text)  # JSON object of every hyperparameter
    updated_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True))


class StudyLease(Base):
    """One driver per study: the owner keeps ``heartbeat_at`` fresh; a lease silent for longer
    than its owner's ``ttl_seconds`` is free. The TTL is the holder's, stored with the lease:
    a newcomer judging a fresh lease by its own (shorter) TTL would take it from a live driver."""

    __tablename__ = "study_lease"

    study_name: Mapped[str] = mapped_column(sa.String(512), primary_key=True)
    owner: Mapped[str] = mapped_column(sa.String(256))
    heartbeat_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True))
    ttl_seconds: Mapped[float | None] = mapped_column(sa.Float, nullable=True)  # None: rows of 0.1


class Replicate(Base):
    """One point of the front trained again with another seed (``launch-study replicate``): the
    trial's hyperparameters, other batches. Rows of a trial stay when it leaves the front."""

    __tablename__ = "trial_replicates"

    study_name: Mapped[str] = mapped_column(sa.String(512), primary_key=True)
    trial_number: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    seed: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    val_perplexity: Mapped[float] = mapped_column(sa.Float(precision=53))
    n_params: Mapped[int] = mapped_column(sa.BigInteger)
    cpu_seconds: Mapped[float] = mapped_column(sa.Float(precision=53))
    # What the replicate was measured under (``config.setup_digest``): a study resumed with
    # other trial settings no longer counts it.
    setup: Mapped[str] = mapped_column(sa.String(64))
    recorded_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True))


class ReplicateResult(NamedTuple):
    val_perplexity: float
    n_params: int  # of the pruned model: a method whose size is not fixed may keep other heads


FRONTIER_COLUMNS = (*RESULT_COLUMNS, "params", "updated_at")


# Query parameters that carry a credential (libpq, psycopg, PyMySQL, mysqlclient, SQLAlchemy).
SECRET_QUERY_KEYS = frozenset({"password", "passwd", "pwd", "sslpassword", "passfile", "token", "secret"})


def _parse_url(url: str) -> sa.URL:
    """make_url, with a reason that never repeats the URL (it may hold a password)."""
    try:
        parsed = make_url(url)
    except ValueError:  # make_url's int() of the port
        raise ArgumentError("its port is not a number") from None
    except ArgumentError:
        raise ArgumentError("expected dialect+driver://user@host:port/database") from None
    if parsed.get_backend_name() != "sqlite" and url.split("?", 1)[0].count("@") > 1:
        # user:p@ss@host parses as password "p", host "ss@host" (u:p@ss/w@h as host "ss",
        # database "w@h"): the rest of the password would be shown in every message as the
        # host or the database, so such a URL is refused.
        raise ArgumentError("an '@' in the user name or password must be written %40")
    return parsed


def redact(url: str) -> str:
    """The URL with every credential replaced by ***, whether it is in ``user:password@`` or a
    query parameter (``?password=``): the only form that may be logged."""
    try:
        parsed = _parse_url(url)
    except ArgumentError:
        return "<malformed database URL>"
    hidden = {k: "***" for k in parsed.query if k.lower() in SECRET_QUERY_KEYS}
    rendered = parsed.update_query_dict(hidden).render_as_string(hide_password=True)
    return rendered.replace("%2A%2A%2A", "***")


def _secrets(url: str) -> list[str]:
    """The credentials a URL holds: its password and its secret query parameters' values (none
    for a malformed URL, which is never shown: ``redact``)."""
    try:
        parsed = _parse_url(url)
    except ArgumentError:
        return []
    found = [parsed.password] + [v for k, v in parsed.query.items() if k.lower() in SECRET_QUERY_KEYS]
    return [str(value) for item in found for value in (item if isinstance(item, tuple) else (item,)) if value]


def scrub(text: str, url: str) -> str:
    """``text`` (a driver's error message) with the URL's secrets in it replaced by ***."""
    for secret in _secrets(url):
        text = text.replace(secret, "***")
    return text


def redact_command(argv: list[str]) -> str:
    """A command line to show (the resume command after an interrupt), with the ``--storage``
    URL's credentials replaced by *** and a word on how to give them back."""
    shown, hidden = list(argv), False
    for i, arg in enumerate(argv):
        prefix = "--storage=" if arg.startswith("--storage=") else ""
        if not prefix and not (i > 0 and argv[i - 1] == "--storage"):
            continue
        url = arg.removeprefix(prefix)
        if _secrets(url):
            shown[i], hidden = prefix + redact(url), True
    note = (
        f" (put the password back in --storage, or leave --storage out and give the URL in ${STORAGE_ENV})"
        if hidden
        else ""
    )
    return shlex.join(shown) + note


def sqlite_database(url: str) -> str | None:
    """The file of an SQLite URL (None for other databases, in-memory ones and malformed URLs)."""
    try:
        parsed = _parse_url(url)
    except ArgumentError:
        return None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return parsed.database


def resolve_url(url: str | None, study_name: str) -> str:
    """--storage, else $HEADPRUNE_STORAGE, else an SQLite file runs/<study>.db."""
    return url or os.environ.get(STORAGE_ENV) or f"sqlite:///runs/{study_name}.db"


@dataclass
class StudyStore:
    """An open database: the Optuna storage and an engine for our own tables."""

    url: str
    storage: optuna.storages.RDBStorage
    engine: sa.Engine

    @property
    def safe_url(self) -> str:
        return redact(self.url)


def _connect(url: str, create: bool) -> tuple[sa.Engine, dict[str, Any], bool]:
    """An engine on ``url``, connected once (clear one-line errors for a malformed or unreachable
    URL, or a file that is not a database), its keyword arguments, and whether the database holds
    Optuna's tables. ``create=False`` writes nothing: an SQLite file that is not there is an error."""
    try:
        parsed = _parse_url(url)
    except ArgumentError as err:
        raise UserError(f"malformed database URL ({err})") from None
    sqlite = parsed.get_backend_name() == "sqlite"
    engine, engine_kwargs = _engine(url, sqlite)
    database = sqlite_database(url)
    if database:
        if not create and not Path(database).is_file():
            raise UserError(f"no database at {database} (the study's --storage?)")
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    try:
        with engine.connect() as conn:
            if sqlite and create:  # WAL (kept in the file): the dashboard reads while the driver writes
                conn.exec_driver_sql("PRAGMA journal_mode=WAL")
        has_optuna_tables = sa.inspect(engine).has_table("studies")  # an SQLite file's header is read here
    except SQLAlchemyError as err:
        reason = scrub(str(getattr(err, "orig", err)).strip().splitlines()[0], url)
        raise UserError(f"cannot connect to database {redact(url)}: {reason}") from None
    return engine, engine_kwargs, has_optuna_tables


def _engine(url: str, sqlite: bool) -> tuple[sa.Engine, dict[str, Any]]:
    """An engine on ``url`` and its keyword arguments, not yet connected: the driver is loaded and
    the URL's query options are read (``?timeout=abc`` is refused here), nothing touches the disk
    or the server."""
    engine_kwargs: dict[str, Any] = {"connect_args": {"timeout": 60}} if sqlite else {"pool_pre_ping": True}
    try:
        return sa.create_engine(url, **engine_kwargs), engine_kwargs
    except (NoSuchModuleError, ModuleNotFoundError) as err:
        raise UserError(f"database URL {redact(url)}: driver not installed ({err})") from None
    except (ArgumentError, TypeError, ValueError) as err:  # a query option the driver cannot take
        reason = scrub(str(err).strip().splitlines()[0], url)
        raise UserError(f"database URL {redact(url)}: bad option ({reason})") from None


def _optuna_storage(url: str, engine_kwargs: dict[str, Any], create: bool) -> optuna.storages.RDBStorage:
    """Optuna's storage on the database; tables made only with ``create``. A schema Optuna
    cannot use (an older version's, or tables it did not make) is one line, not a traceback."""
    try:
        return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, skip_table_creation=not create)
    except (RuntimeError, optuna.exceptions.StorageInternalError) as err:
        reason = scrub(str(err).strip().splitlines()[0], url)
        # RuntimeError: a schema of another Optuna version; the other: tables it cannot use
        hint = (
            " (`optuna storage upgrade --storage URL` upgrades it)" if isinstance(err, RuntimeError) else ""
        )
        raise UserError(f"database {redact(url)}: {reason}{hint}") from None


def open_store(url: str, create: bool = True) -> StudyStore:
    """Connect and create the tables. ``create=False`` (status, export, the dashboard): read
    what is there and change nothing; an SQLite file that does not exist, or a database without
    Optuna's tables, is an error."""
    engine, engine_kwargs, has_optuna_tables = _connect(url, create)
    if not create and not has_optuna_tables:
        raise UserError(f"database {redact(url)} holds no Optuna study")
    store = StudyStore(url, _optuna_storage(url, engine_kwargs, create), engine)
    if create:
        create_own_tables(store)
    return store


def check_store(url: str, study_name: str) -> None:
    """What a run checks of its database before it writes anything anywhere (the corpus's
    caches, a new database's tables, WAL mode): the URL parses, the database answers, and a
    study of this name there has this project's objectives. Reads only; an SQLite file that is
    not there yet is left to ``open_store`` to make."""
    database = sqlite_database(url)
    if database and not Path(database).exists():
        _engine(url, sqlite=True)[0].dispose()  # its options, read without making the file
        return
    engine, engine_kwargs, has_optuna_tables = _connect(url, create=False)
    storage = None
    try:
        if has_optuna_tables:
            storage = _optuna_storage(url, engine_kwargs, create=False)
            store = StudyStore(url, storage, engine)
            if study_exists(store, study_name):
                check_objectives(store, study_name)
    finally:  # no connection kept open on a server while the corpus is prepared
        engine.dispose()
        if storage is not None:
            storage.engine.dispose()


def create_own_tables(store: StudyStore) -> None:
    """This project's tables, and the columns added since an earlier version: idempotent. For a
    store opened with ``create=False``, once what it is for has been checked."""
    Base.metadata.create_all(store.engine)
    _add_missing_columns(store.engine)


# Columns added since the first version: (table, column, SQL type). create_all makes missing
# tables, never missing columns; these are added, nullable, so older rows stay valid.
ADDED_COLUMNS = (
    ("study_lease", "ttl_seconds", "FLOAT"),
    ("pareto_frontier", "bits_per_byte", "DOUBLE PRECISION"),
    ("pareto_frontier", "test_perplexity", "DOUBLE PRECISION"),
    ("pareto_frontier", "lineage_steps", "BIGINT"),
)


def _add_missing_columns(engine: sa.Engine) -> None:
    """Bring a database made by an earlier version up to ``ADDED_COLUMNS``."""

    def has_column(table: str, column: str) -> bool:
        return column in {c["name"] for c in sa.inspect(engine).get_columns(table)}

    for table, column, sql_type in ADDED_COLUMNS:
        if has_column(table, column):
            continue
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN {column} {sql_type}")
        except SQLAlchemyError:
            if not has_column(table, column):  # else another driver added it at the same moment
                raise


def study_exists(store: StudyStore, name: str) -> bool:
    try:
        store.storage.get_study_id_from_name(name)
    except KeyError:
        return False
    return True


def check_objectives(store: StudyStore, name: str, *, to_run: bool = True) -> None:
    """An existing study of this name must have our two objectives, both minimised: a run must
    not add trials to another tool's study, and status or export cannot read one."""
    study_id = store.storage.get_study_id_from_name(name)
    directions = tuple(store.storage.get_study_directions(study_id))
    names = optuna.load_study(study_name=name, storage=store.storage).metric_names
    if directions != DIRECTIONS or (names is not None and tuple(names) != OBJECTIVES):
        shown = ", ".join(names or [d.name.lower() for d in directions])
        what = "already exists" if to_run else "is not headprune's"
        raise UserError(
            f"study {name!r} {what} in {store.safe_url}, with other objectives ({shown}); "
            f"expected {', '.join(OBJECTIVES)} (both minimised)"
            + (": choose another --study-name" if to_run else "")
        )


def create_or_load_study(store: StudyStore, name: str, sampler: optuna.samplers.BaseSampler) -> optuna.Study:
    if study_exists(store, name):
        check_objectives(store, name)
        study = optuna.load_study(study_name=name, storage=store.storage, sampler=sampler)
        if MODELS_FOLDER_KEY not in study.user_attrs and not study.get_trials(deepcopy=False):
            _draw_models_folder(study)  # made by a run stopped before it drew one
        return study
    study = optuna.create_study(
        storage=store.storage, study_name=name, directions=["minimize", "minimize"], sampler=sampler
    )
    with warnings.catch_warnings():  # set_metric_names is "experimental" since Optuna 3.2
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(list(OBJECTIVES))
    _draw_models_folder(study)
    return study


def _draw_models_folder(study: optuna.Study) -> None:
    study.set_user_attr(MODELS_FOLDER_KEY, f"{study.study_name}-{uuid.uuid4().hex[:8]}")


def models_folder(study: optuna.Study) -> str:
    """The folder under ``<artifacts>/trials`` that holds this study's trial models, one
    subfolder per trial number. Its name is the study's with a suffix drawn when the study was
    created: a study of the same name in another database, run with the same ``--artifacts``,
    would otherwise write its trial N over this one's. A study created before December 2026 has
    no suffix and keeps the folder its trials already use."""
    return study.user_attrs.get(MODELS_FOLDER_KEY, study.study_name)


def load_existing_study(store: StudyStore, name: str) -> optuna.Study:
    if not study_exists(store, name):
        raise UserError(f"no study named {name!r} in {store.safe_url}")
    check_objectives(store, name, to_run=False)
    return optuna.load_study(study_name=name, storage=store.storage)


def complete_trials(study: optuna.Study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def front_rows(study: optuna.Study) -> list[dict[str, Any]]:
    """The front of the study's COMPLETE trials, as rows of the frontier table. What reads the
    front (export, replicate) computes it here rather than reading the table, which lags the
    trials when a driver was killed, or a database call failed, between a tell and the refresh."""
    return pareto_front(
        [TrialRecord.from_trial(t).row() for t in complete_trials(study)],
        key=lambda r: (r["val_perplexity"], r["n_params"]),
    )


def refresh_frontier(store: StudyStore, study: optuna.Study) -> list[dict[str, Any]]:
    """Replace the study's frontier rows by the front recomputed from all COMPLETE trials."""
    rows = front_rows(study)
    now = datetime.now(UTC)
    with Session(store.engine) as session, session.begin():
        session.execute(sa.delete(ParetoPoint).where(ParetoPoint.study_name == study.study_name))
        session.add_all(ParetoPoint(study_name=study.study_name, updated_at=now, **r) for r in rows)
    return rows


def change_frontier(
    store: StudyStore, study_name: str, added: list[dict[str, Any]], removed: list[int]
) -> None:
    """The frontier table as a change: a trial that joined the front (its row) and the ones it
    pushed off (their numbers), in one transaction; what ``refresh_frontier`` would leave, at a
    cost that does not grow with the study (``study_trials.StudyTrials`` keeps the front)."""
    now = datetime.now(UTC)
    with Session(store.engine) as session, session.begin():
        if removed:
            session.execute(
                sa.delete(ParetoPoint).where(
                    ParetoPoint.study_name == study_name, ParetoPoint.trial_number.in_(removed)
                )
            )
        session.add_all(ParetoPoint(study_name=study_name, updated_at=now, **r) for r in added)


def read_frontier(store: StudyStore, study_name: str) -> list[dict[str, Any]]:
    """The study's rows of the frontier table (none in a database no run has written)."""
    if not sa.inspect(store.engine).has_table(ParetoPoint.__tablename__):
        return []
    with Session(store.engine) as session:
        points = session.scalars(
            sa.select(ParetoPoint)
            .where(ParetoPoint.study_name == study_name)
            .order_by(ParetoPoint.n_params, ParetoPoint.val_perplexity, ParetoPoint.trial_number)
        ).all()
        return [{c: getattr(p, c) for c in FRONTIER_COLUMNS} for p in points]


def record_replicate(
    store: StudyStore,
    study_name: str,
    trial_number: int,
    seed: int,
    result: ReplicateResult,
    cpu_seconds: float,
    setup: str,
) -> None:
    """Keep one replicate's result (one measured again, under another setup, replaces its row)."""
    row = Replicate(
        study_name=study_name,
        trial_number=trial_number,
        seed=seed,
        val_perplexity=result.val_perplexity,
        n_params=result.n_params,
        cpu_seconds=cpu_seconds,
        setup=setup,
        recorded_at=datetime.now(UTC),
    )
    with Session(store.engine) as session, session.begin():
        session.merge(row)


def read_replicates(store: StudyStore, study_name: str, setup: str) -> dict[int, dict[int, ReplicateResult]]:
    """trial number -> seed -> result, of the study's replicates measured under ``setup`` (none in
    a database of an earlier version, which has no such table)."""
    if not sa.inspect(store.engine).has_table(Replicate.__tablename__):
        return {}
    found: dict[int, dict[int, ReplicateResult]] = {}
    query = sa.select(Replicate).where(Replicate.study_name == study_name, Replicate.setup == setup)
    with Session(store.engine) as session:
        for row in session.scalars(query):
            found.setdefault(row.trial_number, {})[row.seed] = ReplicateResult(
                row.val_perplexity, row.n_params
            )
    return found


def fail_and_ask_again(store: StudyStore, study: optuna.Study, trials: list[FrozenTrial], why: str) -> None:
    """Mark these unfinished trials FAIL, saying ``why``, and ask for each again (the same
    hyperparameters, linked by ``retry_of``: the retry resumes from its after-pruning checkpoint).
    The dense control is not enqueued: the driver asks for it anew while the study has none.

    The retry is asked for before the trial is told FAIL, and only once: a driver killed between
    the two leaves the trial RUNNING beside its retry, and the next driver fails it without asking
    again (told first, a kill in between would lose the retry: only RUNNING trials are orphans)."""
    study_id = store.storage.get_study_id_from_name(study.study_name)
    asked_again = {
        t.user_attrs["retry_of"] for t in study.get_trials(deepcopy=False) if "retry_of" in t.user_attrs
    }
    for trial in trials:
        trial_id = store.storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
        if store.storage.get_trial(trial_id).state.is_finished():
            continue  # told meanwhile (by its worker's last report): nothing to ask again
        store.storage.set_trial_user_attr(trial_id, "error", why)
        if not trial.user_attrs.get("dense_control") and trial.number not in asked_again:
            study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
        study.tell(trial.number, state=TrialState.FAIL)


def fail_orphaned_trials(store: StudyStore, study: optuna.Study) -> list[FrozenTrial]:
    """Every RUNNING trial, failed and asked for again. Called by the driver holding the lease
    before it asks for trials, so these can only be left over from a driver that died."""
    orphans = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    fail_and_ask_again(store, study, orphans, "its driver stopped while it ran")
    return orphans


def _utc(moment: datetime) -> datetime:
    """SQLite returns naive datetimes: read them as UTC."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _pid_namespace() -> str:
    """Which process-id space this process's pid is counted in: a container sharing the host's
    name (``--network host``) counts its own, where the host's pids look gone."""
    try:
        return os.readlink("/proc/self/ns/pid").strip("pid:[]")
    except OSError:  # no /proc (macOS): one space per host
        return ""


def _lease_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}:{_pid_namespace()}"


def _died_here(owner: str) -> bool:
    """True when the owner was a driver on this machine, in this pid namespace, whose process is
    gone: its lease need not be waited out (a driver restarted after a crash takes over at once).
    An owner written before the namespace was recorded is judged by its host alone."""
    parts = owner.split(":")  # host:pid:nonce:namespace
    host, pid = parts[0], parts[1] if len(parts) > 1 else ""
    namespace = parts[3] if len(parts) > 3 else _pid_namespace()
    if host != socket.gethostname() or not pid.isdigit() or namespace != _pid_namespace():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, someone else's
        return False
    return False


@dataclass(frozen=True)
class Takeover:
    """Whose lease a driver took, and why it could."""

    previous_owner: str
    reason: str  # "died": a driver of this machine whose process is gone; "expired": silent too long

    def describe(self) -> str:
        if self.reason == "died":
            return f"took over the study from {self.previous_owner}, whose process on this machine is gone"
        return f"took over the study from {self.previous_owner}, whose lease had expired"


def _now() -> datetime:
    return datetime.now(UTC)


def acquire_lease(
    store: StudyStore, study_name: str, owner: str, ttl_seconds: float, now: datetime | None = None
) -> Takeover | None:
    """Take the study's lease; returns the takeover when another driver's lease was taken.
    Raises UserError while another driver's heartbeat is fresh by that driver's own TTL."""
    now = now or _now()
    try:
        with Session(store.engine) as session, session.begin():
            lease = session.get(StudyLease, study_name, with_for_update=True)
            if lease is None:
                session.add(
                    StudyLease(study_name=study_name, owner=owner, heartbeat_at=now, ttl_seconds=ttl_seconds)
                )
                return None
            age = (now - _utc(lease.heartbeat_at)).total_seconds()
            holder_ttl = lease.ttl_seconds or ttl_seconds
            died = lease.owner != owner and _died_here(lease.owner)
            if lease.owner != owner and age < holder_ttl and not died:
                raise UserError(
                    f"study {study_name!r} is being run by another driver ({lease.owner}, heartbeat "
                    f"{age:.0f}s ago); wait for it, or for its lease to expire ({holder_ttl:.0f}s after "
                    "its last heartbeat)"
                )
            previous = lease.owner
            # Taken only from the owner just read: SQLite ignores FOR UPDATE (its SELECT runs
            # outside a transaction), so two drivers restarted at once may both have read the
            # dead owner; the row changes hands once, and the second finds no row to update.
            taken = session.execute(
                sa.update(StudyLease)
                .where(StudyLease.study_name == study_name, StudyLease.owner == previous)
                .values(owner=owner, heartbeat_at=now, ttl_seconds=ttl_seconds)
                .execution_options(synchronize_session=False)
            )
            if taken.rowcount != 1:
                raise UserError(f"study {study_name!r} is being started by another driver")
            if previous == owner:
                return None
            return Takeover(previous, "died" if died else "expired")
    except sa.exc.IntegrityError:  # another driver inserted the row between our read and write
        raise UserError(f"study {study_name!r} is being started by another driver") from None


def renew_lease(store: StudyStore, study_name: str, owner: str, now: datetime | None = None) -> bool:
    """Refresh the heartbeat; False when the lease is no longer ours."""
    with store.engine.begin() as conn:
        updated = conn.execute(
            sa.update(StudyLease)
            .where(StudyLease.study_name == study_name, StudyLease.owner == owner)
            .values(heartbeat_at=now or _now())
        )
    return updated.rowcount == 1


def release_lease(store: StudyStore, study_name: str, owner: str) -> None:
    with store.engine.begin() as conn:
        conn.execute(
            sa.delete(StudyLease).where(StudyLease.study_name == study_name, StudyLease.owner == owner)
        )


class HeldLease:
    """A driver's hold on its study. ``beat`` renews it (a thread calls it every ttl/6 s, so a
    failed renewal is retried twice before 2/3 of the TTL). ``lost`` is set once the lease is
    another driver's, or once no renewal has succeeded for 2/3 of the TTL (from the whole TTL on
    another driver may take it at any moment). ``held`` is what the driver asks before each ask
    and tell: it judges the time since the last renewal itself, since a renewal stuck in a
    half-dropped connection never returns to say it failed."""

    def __init__(self, store: StudyStore, study_name: str, ttl_seconds: float, clock=_now) -> None:
        self.store, self.study_name, self.ttl_seconds, self.clock = store, study_name, ttl_seconds, clock
        self.owner = _lease_owner()
        self.beat_every = ttl_seconds / 6  # seconds between renewals (hold_lease's thread)
        self.takeover = acquire_lease(store, study_name, self.owner, ttl_seconds, now=clock())
        self.last_renewed = clock()
        self.lost = threading.Event()
        self.lost_reason = ""

    def beat(self) -> None:
        now = self.clock()
        try:
            if renew_lease(self.store, self.study_name, self.owner, now=now):
                self.last_renewed = now
                return
            self._lose("another driver took the study's lease")
        except SQLAlchemyError as err:  # a missed beat is retried on the next
            self._lose_if_silent(now, f" ({type(err).__name__})")

    def held(self) -> bool:
        """Whether the driver may still ask and tell."""
        self._lose_if_silent(self.clock(), " (none has succeeded since)")
        return not self.lost.is_set()

    def _lose_if_silent(self, now: datetime, why: str) -> None:
        # Given up at 2/3 of the TTL: from the whole TTL on another driver may take the study,
        # and this one must have stopped telling by then (it beats every TTL/6).
        silent = (now - self.last_renewed).total_seconds()
        if silent >= self.ttl_seconds * 2 / 3:
            self._lose(
                f"the lease could not be renewed for {silent:.0f}s of its {self.ttl_seconds:.0f}s{why}"
            )

    def _lose(self, reason: str) -> None:
        if not self.lost.is_set():
            self.lost_reason = reason
            self.lost.set()

    def check(self, unrecorded: str = "its running trials (the study's holder resumes them)") -> None:
        """Raise LeaseLost once the lease is gone, saying what was not recorded."""
        if not self.held():
            raise LeaseLost(
                f"study {self.study_name!r}: {self.lost_reason}; this driver stopped without recording "
                f"{unrecorded}"
            )


@contextlib.contextmanager
def hold_lease(store: StudyStore, study_name: str, ttl_seconds: float) -> Iterator[HeldLease]:
    """Hold the study's lease for the block, renewing it from a thread every ttl/6 seconds."""
    held = HeldLease(store, study_name, ttl_seconds)
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(held.beat_every) and not held.lost.is_set():
            held.beat()

    thread = threading.Thread(target=beat, name="lease-heartbeat", daemon=True)
    thread.start()
    try:
        yield held
    finally:
        stop.set()
        thread.join()
        if not held.lost.is_set():
            release_lease(store, study_name, held.owner)


def write_trial_rows(
    engine: sa.Engine,
    trial_id: int,
    attrs: dict[str, Any],
    params: list[tuple[str, float, BaseDistribution]] = (),
) -> None:
    """A running trial's user attributes and parameters (name, internal value, distribution) in
    one transaction. Optuna's storage commits each ``set_user_attr`` and each parameter on its
    own, a transaction of three statements per key (a finished trial had 40 statements), and
    has no call that writes several; this writes the same rows of its schema
    (``trial_user_attributes``: one JSON value per key; ``trial_params``: the internal value and
    the distribution's JSON; what optuna-dashboard and every Optuna version read) at once. The
    caller (``driver_storage.DriverStorage``) has checked the trial runs and each distribution
    agrees with the study's, as Optuna does."""
    tables = _optuna_tables(engine)
    user_attrs, trial_params = tables["trial_user_attributes"], tables["trial_params"]
    with engine.begin() as conn:
        if attrs:
            conn.execute(
                sa.delete(user_attrs).where(
                    user_attrs.c.trial_id == trial_id, user_attrs.c.key.in_(list(attrs))
                )
            )
            conn.execute(
                sa.insert(user_attrs),
                [{"trial_id": trial_id, "key": k, "value_json": json.dumps(v)} for k, v in attrs.items()],
            )
        if params:
            conn.execute(
                sa.insert(trial_params),
                [
                    {
                        "trial_id": trial_id,
                        "param_name": name,
                        "param_value": value,
                        "distribution_json": distribution_to_json(distribution),
                    }
                    for name, value, distribution in params
                ],
            )


def trial_times(engine: sa.Engine, trial_id: int) -> tuple[int, datetime | None, datetime | None]:
    """A trial's number and the start and end times the storage set (one row, one query)."""
    trials = _optuna_tables(engine)["trials"]
    query = sa.select(trials.c.number, trials.c.datetime_start, trials.c.datetime_complete).where(
        trials.c.trial_id == trial_id
    )
    with engine.connect() as conn:
        return tuple(conn.execute(query).one())


def trial_ids(engine: sa.Engine, study_id: int) -> dict[int, int]:
    """Trial number -> trial id of every trial of a study, in one query (Optuna's storage has
    a call per trial)."""
    trials = _optuna_tables(engine)["trials"]
    query = sa.select(trials.c.number, trials.c.trial_id).where(trials.c.study_id == study_id)
    with engine.connect() as conn:
        return {number: trial_id for number, trial_id in conn.execute(query)}


_OPTUNA_TABLES: dict[str, dict[str, sa.Table]] = {}


def _optuna_tables(engine: sa.Engine) -> dict[str, sa.Table]:
    """Optuna's ``trials``, ``trial_user_attributes`` and ``trial_params`` tables, read from the
    database once per engine (their columns are Optuna's schema, whose version ``RDBStorage``
    checks when it opens the database)."""
    key = str(engine.url)
    if key not in _OPTUNA_TABLES:
        metadata = sa.MetaData()
        names = ("trials", "trial_user_attributes", "trial_params")
        _OPTUNA_TABLES[key] = {name: sa.Table(name, metadata, autoload_with=engine) for name in names}
    return _OPTUNA_TABLES[key]
