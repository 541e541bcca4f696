"""growing data: a release records the data version it ran on; appends after releases

Values may now be appended after the first release (a replace stays refused): each upload
bumps ``dataset.data_version`` and a run records the version it loaded in
``release.data_version`` (NULL for releases before this migration and for failed ones).
The completion payload (``release_notify()``, migrations 0007 and 0011) carries it, so the
waiting request's answer stays byte-identical to a later read.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04 23:30:00
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _load(name: str, filename: str) -> ModuleType:
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_ESTIMATES = """            'estimates', NEW.estimates
"""
_WITH_VERSION = """            'estimates', NEW.estimates,
            'data_version', NEW.data_version
"""


def _notify() -> tuple[str, str]:
    """(migration 0011's ``release_notify()``, this one's: the payload adds data_version)."""
    old = _load("dpquant_migration_0011", "20261203_0011_publication_times.py")._notify()[1]
    assert old.count(_ESTIMATES) == 1
    return old, old.replace(_ESTIMATES, _WITH_VERSION)


def upgrade() -> None:
    op.add_column("release", sa.Column("data_version", sa.Integer(), nullable=True))
    op.execute(_notify()[1])


def downgrade() -> None:
    op.execute(_notify()[0])
    op.drop_column("release", "data_version")
