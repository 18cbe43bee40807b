"""Alembic's entry for this project's migrations: run on the connection ``schema.upgrade``
passes, with the project's own version table (Optuna's migrations use the default one)."""

from alembic import context

from orchestrator.storage.schema import VERSION_TABLE, Base

context.configure(
    connection=context.config.attributes["connection"],
    target_metadata=Base.metadata,
    version_table=VERSION_TABLE,
)
with context.begin_transaction():
    context.run_migrations()
