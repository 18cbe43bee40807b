"""This project's tables, beside Optuna's in the study's database, and their migrations.

The tables are declared here as they are now; ``upgrade`` brings a database made by any earlier
version to them with Alembic (``orchestrator/storage/migrations/versions``: one revision per
change), recording the revision in a version table of its own: Optuna's migrations use
Alembic's default one in the same database.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from orchestrator.errors import UserError
from orchestrator.storage.urls import redact, scrub

VERSION_TABLE = "headprune_alembic_version"
# Alembic's ``context`` (migrations/env.py) is one per process: upgrades in threads take turns.
_ALEMBIC = threading.Lock()
MIGRATIONS = Path(__file__).parent / "migrations"


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


def _config(connection: sa.Connection) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection  # migrations/env.py runs on it
    return config


def head_revision() -> str:
    return ScriptDirectory(str(MIGRATIONS)).get_current_head()


def current_revision(engine: sa.Engine) -> str | None:
    """The revision a database is at (None: none of this project's migrations has run on it)."""
    with engine.connect() as connection:
        return MigrationContext.configure(
            connection, opts={"version_table": VERSION_TABLE}
        ).get_current_revision()


def known_revisions() -> set[str]:
    return {script.revision for script in ScriptDirectory(str(MIGRATIONS)).walk_revisions()}


def upgrade(engine: sa.Engine, revision: str = "head", patience_seconds: float = 60.0) -> None:
    """Bring the database to ``revision`` (the head: the tables as declared here): a no-op when
    it is there. A database a newer version migrated further is refused in one line.

    Several drivers may upgrade one database at once (a study started twice, replicate beside
    run). Where DDL is transactional (PostgreSQL) the later ones fail once the first has
    committed; on SQLite and MySQL each statement commits alone, so a later one fails mid-way.
    Either way it tries again until the revision is there: every revision makes only what is
    missing, so a retry finishes what another driver began."""
    target = head_revision() if revision == "head" else revision
    found = current_revision(engine)
    if found == target:
        return
    if found is not None and found not in known_revisions():
        raise UserError(
            f"database {_shown(engine)}: this project's tables are at revision {found}, made by a "
            f"newer headprune (this one knows up to {head_revision()}): upgrade headprune"
        )
    deadline, wait = time.monotonic() + patience_seconds, 0.05
    while True:
        try:
            with _ALEMBIC, engine.begin() as connection:
                command.upgrade(_config(connection), target)
            return
        except SQLAlchemyError as err:
            if current_revision(engine) == target:
                return  # another driver finished it
            if time.monotonic() > deadline:
                reason = scrub(str(getattr(err, "orig", err)).strip().splitlines()[0], _real(engine))
                raise UserError(
                    f"database {_shown(engine)}: cannot bring this project's tables to revision "
                    f"{target} ({reason})"
                ) from None
            time.sleep(wait)  # another driver is part-way through: let it go on
            wait = min(wait * 2, 1.0)


def _shown(engine: sa.Engine) -> str:
    return redact(_real(engine))


def _real(engine: sa.Engine) -> str:
    return engine.url.render_as_string(hide_password=False)
