"""The first version's tables: the frontier, the study's lease and the replicates.

A database made before these migrations may hold them already (made by ``create_all``): each is
made only where it is missing, and the revisions after it add only missing columns.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    existing = set(sa.inspect(op.get_bind()).get_table_names())
    if "pareto_frontier" not in existing:
        op.create_table(
            "pareto_frontier",
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("study_name", sa.String(512), nullable=False, index=True),
            sa.Column("trial_number", sa.Integer, nullable=False),
            sa.Column("val_perplexity", sa.Float(precision=53), nullable=False),
            sa.Column("n_params", sa.BigInteger, nullable=False),
            sa.Column("n_params_nonembed", sa.BigInteger, nullable=False),
            sa.Column("sparsity", sa.Float(precision=53), nullable=False),
            sa.Column("heads_per_layer", sa.Text, nullable=False),
            sa.Column("method", sa.String(64), nullable=False),
            sa.Column("params", sa.Text, nullable=False),
            sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
            sa.UniqueConstraint("study_name", "trial_number"),
        )
    if "study_lease" not in existing:
        op.create_table(
            "study_lease",
            sa.Column("study_name", sa.String(512), primary_key=True),
            sa.Column("owner", sa.String(256), nullable=False),
            sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        )
    if "trial_replicates" not in existing:
        op.create_table(
            "trial_replicates",
            sa.Column("study_name", sa.String(512), primary_key=True),
            sa.Column("trial_number", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("seed", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("val_perplexity", sa.Float(precision=53), nullable=False),
            sa.Column("n_params", sa.BigInteger, nullable=False),
            sa.Column("cpu_seconds", sa.Float(precision=53), nullable=False),
            sa.Column("setup", sa.String(64), nullable=False),
            sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        )
