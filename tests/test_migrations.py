"""This project's tables migrate by Alembic (orchestrator/storage/schema.py): a new database gets
the tables the code declares, and databases made by earlier versions (tests/fixtures, each made
by the smoke study at the commit its README names) are brought to them and still export, resume
and replicate."""

from __future__ import annotations

import csv
import json
import shutil
import uuid
from pathlib import Path

import optuna
import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from helpers import (
    SMOKE,
    cli_in_process,
    expected_front,
    kill_new_ray_processes,
    launch,
    ray_processes,
    server_url,
)
from optuna.trial import TrialState

from orchestrator.storage import open_store, read_frontier
from orchestrator.storage.schema import VERSION_TABLE, Base, current_revision, head_revision, upgrade

FIXTURES = Path(__file__).parent / "fixtures"
TODAY = FIXTURES / "main_2026-12-07"  # made by d1a02ae, with the trials' models
BEFORE_TEST_SPLIT = FIXTURES / "before_test_split"  # made by 6c2c090: no test_perplexity, lineage_steps
OWN_TABLES = {table.name for table in Base.metadata.sorted_tables}


def differences(engine: sa.Engine) -> list:
    """How the database's tables of this project differ from what the code declares (Alembic's
    comparison, as ``alembic check`` makes it; Optuna's tables left out)."""
    include = lambda name, type_, parent: type_ != "table" or name in OWN_TABLES  # noqa: E731
    with engine.connect() as connection:
        opts = {"version_table": VERSION_TABLE, "include_name": include}
        return compare_metadata(MigrationContext.configure(connection, opts=opts), Base.metadata)


def structural(found: list) -> list:
    """Tables, columns and indexes missing or extra; a column type as another version's ALTER
    spelt it (DOUBLE PRECISION for FLOAT(53)) is the same column."""
    return [
        d for d in found if not isinstance(d, list) and d[0].split("_", 1)[1] in ("table", "column", "index")
    ]


def copied(fixture: Path, tmp_path: Path) -> str:
    shutil.copy(fixture / "smoke.db", tmp_path / "smoke.db")
    return f"sqlite:///{tmp_path}/smoke.db"


def optuna_schema_version(url: str) -> str:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return connection.exec_driver_sql("SELECT version_num FROM alembic_version").scalar_one()
    finally:
        engine.dispose()


def test_a_new_database_gets_the_declared_tables_at_the_head_revision(tmp_path):
    store = open_store(f"sqlite:///{tmp_path}/new.db")
    assert current_revision(store.engine) == head_revision()
    assert differences(store.engine) == []
    open_store(store.url)  # a second open at the head changes nothing
    assert current_revision(store.engine) == head_revision()


@pytest.mark.parametrize("fixture", [TODAY, BEFORE_TEST_SPLIT], ids=["today", "before-test-split"])
def test_a_database_of_an_earlier_version_is_upgraded_in_place(fixture, tmp_path):
    url = copied(fixture, tmp_path)
    engine = sa.create_engine(url)
    columns = {c["name"] for c in sa.inspect(engine).get_columns("pareto_frontier")}
    assert sa.inspect(engine).has_table(VERSION_TABLE) is False  # made before the migrations
    assert ("test_perplexity" in columns) == (fixture == TODAY)
    frontier_before = engine.connect().execute(
        sa.text("SELECT trial_number, val_perplexity FROM pareto_frontier")
    )
    rows_before = sorted(tuple(r) for r in frontier_before)
    engine.dispose()
    optuna_version = optuna_schema_version(url)

    store = open_store(url)
    assert current_revision(store.engine) == head_revision()
    assert structural(differences(store.engine)) == []
    rows = read_frontier(store, "smoke")
    assert sorted((r["trial_number"], r["val_perplexity"]) for r in rows) == rows_before
    if fixture == BEFORE_TEST_SPLIT:
        assert all(r["test_perplexity"] is None and r["lineage_steps"] is None for r in rows)
    assert optuna_schema_version(url) == optuna_version  # Optuna's own version table untouched


def test_export_of_a_database_of_today_gives_the_front_it_recorded(tmp_path):
    url = copied(TODAY, tmp_path)
    out = tmp_path / "front.csv"
    run = cli_in_process(
        "export", "--storage", url, "--study-name", "smoke", "--output", str(out), cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr
    study = optuna.load_study(study_name="smoke", storage=url)
    with out.open() as f:
        exported = sorted(
            (int(row["trial_number"]), float(row["val_perplexity"]), int(row["n_params"]))
            for row in csv.DictReader(f)
        )
    assert exported == expected_front(study)


def test_a_trial_model_saved_by_today_exports(tmp_path):
    """The fixture was made with --artifacts /tmp/fx_main/art; its folders are copied here and
    the trials' recorded folders pointed at the copy, as after moving a study's artifacts."""
    url = copied(TODAY, tmp_path)
    artifacts = tmp_path / "artifacts"
    shutil.copytree(TODAY / "artifacts", artifacts)
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        rows = connection.exec_driver_sql(
            "SELECT trial_user_attribute_id, value_json FROM trial_user_attributes WHERE key = 'model_dir'"
        ).all()
        for row_id, value in rows:
            moved = str(artifacts / Path(json.loads(value)).relative_to("/tmp/fx_main/art"))
            connection.exec_driver_sql(
                "UPDATE trial_user_attributes SET value_json = ? WHERE trial_user_attribute_id = ?",
                (json.dumps(moved), row_id),
            )
    engine.dispose()
    out = tmp_path / "model1"
    run = cli_in_process(
        "export-model",
        "--storage",
        url,
        "--study-name",
        "smoke",
        "--trial",
        "1",
        "--output",
        str(out),
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()


@pytest.mark.parametrize("kind", ["postgresql", "mysql"])
def test_a_server_database_made_before_the_migrations_is_upgraded(kind):
    """Tables as an earlier version's ``create_all`` made them (revision 0001's, without the
    columns added since, and no version table), on a database of their own on the server."""
    server = sa.make_url(server_url(kind))
    name = f"migrate_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f"CREATE DATABASE {name}")
    url = server.set(database=name).render_as_string(hide_password=False)
    engine = sa.create_engine(url)
    try:
        upgrade(engine, "0001")
        with engine.begin() as connection:
            connection.exec_driver_sql(f"DROP TABLE {VERSION_TABLE}")
        assert "ttl_seconds" not in {c["name"] for c in sa.inspect(engine).get_columns("study_lease")}
        upgrade(engine)
        assert current_revision(engine) == head_revision()
        assert structural(differences(engine)) == []
    finally:
        engine.dispose()
        with admin.connect() as connection:
            connection.exec_driver_sql(f"DROP DATABASE {name}")
        admin.dispose()


@pytest.mark.slow
def test_a_study_of_today_resumes_and_replicates(tmp_path):
    """The database and the dense checkpoint of today's main: a run asks one more trial, which
    leaves the first three as they were, and replicate trains the front again."""
    url = copied(TODAY, tmp_path)
    shutil.copytree(TODAY / "artifacts", tmp_path / "artifacts")
    before = {t.number: t.values for t in optuna.load_study(study_name="smoke", storage=url).trials}
    ray_before = ray_processes()
    try:
        common = ("--storage", url, "--artifacts", str(tmp_path / "artifacts"))
        run = launch(
            "run", str(SMOKE), "--n-trials", "4", *common, "--output", str(tmp_path / "f.csv"), cwd=tmp_path
        )
        assert run.returncode == 0, run.stderr[-2000:]
        assert "pretrain: step" not in run.stderr  # the dense checkpoint of today is used as it is
        trials = optuna.load_study(study_name="smoke", storage=url).trials
        assert [t.state for t in trials] == [TrialState.COMPLETE] * 4
        assert {t.number: t.values for t in trials[:3]} == before
        rep = launch(
            "replicate",
            str(SMOKE),
            "--seeds",
            "1",
            *common,
            "--output",
            str(tmp_path / "r.csv"),
            cwd=tmp_path,
        )
        assert rep.returncode == 0, rep.stderr[-2000:]
        with (tmp_path / "r.csv").open() as f:
            assert {row["seeds"] for row in csv.DictReader(f)} == {"2"}
    finally:
        kill_new_ray_processes(ray_before)


UPGRADE = """
import sys, time
from pathlib import Path
import sqlalchemy as sa
from orchestrator.storage.schema import upgrade
engine = sa.create_engine(sys.argv[1], connect_args={"timeout": 60})
print("ready", flush=True)
while not Path(sys.argv[2]).exists():  # all start together, once every one is ready
    time.sleep(0.001)
upgrade(engine)
"""


@pytest.mark.slow  # processes of their own: Alembic's context is one per process
@pytest.mark.parametrize("fixture", [None, BEFORE_TEST_SPLIT], ids=["new", "before-migrations"])
def test_drivers_upgrading_one_database_at_once_all_end_at_the_head(fixture, tmp_path):
    """Found in review: on SQLite (and MySQL) each DDL statement commits alone, so a driver that
    lost the race to make the version table failed with a traceback. Each now tries again."""
    import subprocess
    import sys

    url = copied(fixture, tmp_path) if fixture else f"sqlite:///{tmp_path}/new.db"
    if not fixture:
        optuna.storages.RDBStorage(url)  # Optuna's tables, as a run makes them first
    go = tmp_path / "go"
    drivers = [
        subprocess.Popen(
            [sys.executable, "-c", UPGRADE, url, str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    assert [d.stdout.readline().strip() for d in drivers] == ["ready"] * 4
    go.touch()
    failures = [d.stderr.read() for d in drivers if d.wait(timeout=180) != 0]
    assert failures == []
    engine = sa.create_engine(url)
    assert current_revision(engine) == head_revision() and structural(differences(engine)) == []
    engine.dispose()


def test_a_database_a_newer_version_migrated_is_refused_in_one_line(tmp_path):
    from orchestrator.errors import UserError

    url = copied(TODAY, tmp_path)
    open_store(url)
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        connection.exec_driver_sql(f"UPDATE {VERSION_TABLE} SET version_num = '9999'")
    with pytest.raises(UserError, match="revision 9999, made by a newer headprune"):
        open_store(url)
    engine.dispose()


def test_an_upgrade_that_lost_a_race_tries_again(monkeypatch, tmp_path):
    """The race above made deterministic: the first attempt fails as a loser's CREATE TABLE does
    on SQLite (the other driver made the table first); the driver tries again and finishes."""
    from alembic import command

    url = copied(BEFORE_TEST_SPLIT, tmp_path)
    real, attempts = command.upgrade, []

    def lost_the_race_once(config, revision):
        attempts.append(revision)
        if len(attempts) == 1:
            raise sa.exc.OperationalError("CREATE TABLE", {}, Exception("table already exists"))
        real(config, revision)

    monkeypatch.setattr(command, "upgrade", lost_the_race_once)
    engine = sa.create_engine(url)
    upgrade(engine)
    assert len(attempts) == 2 and current_revision(engine) == head_revision()
    engine.dispose()
