"""The test split's perplexity and the weight updates of a point's lineage, on the frontier.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

from orchestrator.storage.migrations.columns import add_missing_column

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    add_missing_column(
        op, "pareto_frontier", sa.Column("test_perplexity", sa.Float(precision=53), nullable=True)
    )
    add_missing_column(op, "pareto_frontier", sa.Column("lineage_steps", sa.BigInteger, nullable=True))
