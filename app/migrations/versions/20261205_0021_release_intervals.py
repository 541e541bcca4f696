"""error bars: a done release stores an interval per estimate in the data's units

``release.intervals`` (JSONB, NULL where none could be formed: grouped releases, no public
size, no error model) holds one ``{quantile, low, high}`` per estimate, computed by the
worker from the release's own estimates, the column's public grid and the expected error
stored at the reservation (``app.planner.intervals``: post-processing, no budget). It is
written with the estimates, so a done release stays immutable (``release_guard``). The
completion payload (``release_notify()``, migrations 0007, 0011 and 0013) carries it, so the
waiting request's answer stays byte-identical to a later read.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-05 19:00:00
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _load(name: str, filename: str) -> ModuleType:
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_VERSION = """            'data_version', NEW.data_version
"""
_WITH_INTERVALS = """            'data_version', NEW.data_version,
            'intervals', NEW.intervals
"""


def _notify() -> tuple[str, str]:
    """(migration 0013's ``release_notify()``, this one's: the payload adds intervals)."""
    m13 = _load("dpquant_migration_0013", "20261204_0013_release_data_version.py")
    old = m13._notify()[1]
    assert old.count(_VERSION) == 1
    return old, old.replace(_VERSION, _WITH_INTERVALS)


def upgrade() -> None:
    op.add_column(
        "release",
        sa.Column("intervals", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )
    op.execute(_notify()[1])


def downgrade() -> None:
    op.execute(_notify()[0])
    op.drop_column("release", "intervals")
