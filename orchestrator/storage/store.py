"""Opening a study's database: one engine per database (Optuna's), and the one way this project
reads and writes it (``transaction`` and ``reading``: a session per unit of work, never kept).

Every failure a user can cause (a malformed URL, a server that does not answer, a file that is
not a database, a schema of another Optuna version) is one line naming the redacted URL.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy as sa
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.orm import Session

from orchestrator.errors import UserError
from orchestrator.storage import schema
from orchestrator.storage.urls import parse_url, redact, scrub, sqlite_database


@dataclass
class StudyStore:
    """An open database: Optuna's storage, whose engine also serves this project's tables."""

    url: str
    storage: optuna.storages.RDBStorage

    @property
    def engine(self) -> sa.Engine:
        return self.storage.engine

    @property
    def safe_url(self) -> str:
        return redact(self.url)


@contextlib.contextmanager
def transaction(engine: sa.Engine) -> Iterator[Session]:
    """A session for one unit of work, committed at the end of the block (rolled back on an
    error): every write this project makes goes through one."""
    with Session(engine) as session, session.begin():
        yield session


@contextlib.contextmanager
def reading(engine: sa.Engine) -> Iterator[Session]:
    """A session for reads, closed at the end of the block."""
    with Session(engine) as session:
        yield session


def probe_database(url: str, create: bool) -> tuple[dict[str, Any], bool]:
    """Connect once on a short-lived engine (clear one-line errors for a malformed or unreachable
    URL, or a file that is not a database); returns the engine's keyword arguments and whether
    the database holds Optuna's tables. ``create=False`` writes nothing: an SQLite file that is
    not there is an error."""
    try:
        parsed = parse_url(url)
    except ArgumentError as err:
        raise UserError(f"malformed database URL ({err})") from None
    sqlite = parsed.get_backend_name() == "sqlite"
    engine, engine_kwargs = unconnected_engine(url, sqlite)
    database = sqlite_database(url)
    try:
        if database:
            if not create and not Path(database).is_file():
                raise UserError(f"no database at {database} (the study's --storage?)")
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        with engine.connect() as conn:
            if sqlite and create:  # WAL (kept in the file): the dashboard reads while the driver writes
                conn.exec_driver_sql("PRAGMA journal_mode=WAL")
        has_optuna_tables = sa.inspect(engine).has_table("studies")  # an SQLite file's header is read here
    except SQLAlchemyError as err:
        reason = scrub(str(getattr(err, "orig", err)).strip().splitlines()[0], url)
        raise UserError(f"cannot connect to database {redact(url)}: {reason}") from None
    finally:
        engine.dispose()
    return engine_kwargs, has_optuna_tables


def unconnected_engine(url: str, sqlite: bool) -> tuple[sa.Engine, dict[str, Any]]:
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


def optuna_storage(url: str, engine_kwargs: dict[str, Any], create: bool) -> optuna.storages.RDBStorage:
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
    """Connect, and bring this project's tables to the current schema (``schema.upgrade``).
    ``create=False`` (status, export, the dashboard): read what is there and change nothing; an
    SQLite file that does not exist, or a database without Optuna's tables, is an error."""
    engine_kwargs, has_optuna_tables = probe_database(url, create)
    if not create and not has_optuna_tables:
        raise UserError(f"database {redact(url)} holds no Optuna study")
    store = StudyStore(url, optuna_storage(url, engine_kwargs, create))
    if create:
        upgrade_schema(store)
    return store


def upgrade_schema(store: StudyStore) -> None:
    """This project's tables at the current revision: idempotent. For a store opened with
    ``create=False``, once what it is for has been checked (``launch-study replicate``)."""
    schema.upgrade(store.engine)


def close_store(store: StudyStore) -> None:
    """Close the store's connections (a server keeps none open for a study that is done)."""
    store.engine.dispose()
