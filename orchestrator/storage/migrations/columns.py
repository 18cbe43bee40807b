"""What the revisions share: a nullable column added where a table lacks it (a database made
before these migrations had its columns added by hand-written ``ALTER TABLE`` already)."""

from __future__ import annotations

import sqlalchemy as sa


def add_missing_column(op, table: str, column: sa.Column) -> None:
    present = {c["name"] for c in sa.inspect(op.get_bind()).get_columns(table)}
    if column.name not in present:
        op.add_column(table, column)
