"""The holder's TTL stored with its lease (December 2026), and bits per byte on the frontier.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

from orchestrator.storage.migrations.columns import add_missing_column

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    add_missing_column(op, "study_lease", sa.Column("ttl_seconds", sa.Float, nullable=True))
    add_missing_column(
        op, "pareto_frontier", sa.Column("bits_per_byte", sa.Float(precision=53), nullable=True)
    )
