"""traces: a release carries its reservation's W3C traceparent to the worker

``release.trace_parent`` (NULL when tracing is off) is written by ``release_reserve()``
(``p_trace_parent``) and read by the claim, so the worker's spans join the request's trace.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05 01:50:00
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _load(name: str, filename: str) -> ModuleType:
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_EDITS = (
    (
        """    p_accounting varchar DEFAULT 'pure',
    OUT outcome text,""",
        """    p_accounting varchar DEFAULT 'pure',
    p_trace_parent varchar DEFAULT NULL,
    OUT outcome text,""",
    ),
    (
        """                         column_name, cost_rho, remaining_rho)""",
        """                         column_name, cost_rho, remaining_rho, trace_parent)""",
    ),
    (
        """            CASE WHEN accounting = 'zcdp' THEN left_rho - p_cost_rho END)""",
        """            CASE WHEN accounting = 'zcdp' THEN left_rho - p_cost_rho END, p_trace_parent)""",
    ),
)

OLD_SIGNATURE = (
    "release_reserve(uuid, uuid, uuid, varchar, double precision[], numeric, numeric, "
    "numeric, numeric, varchar, varchar, jsonb, jsonb, varchar, bigint, integer, integer, "
    "integer, varchar, numeric, varchar)"
)
NEW_SIGNATURE = OLD_SIGNATURE[:-1] + ", varchar)"


def _functions() -> tuple[str, str, str]:
    """(0017's reserve function, this one's, the old signature)."""
    m17 = _load("dpquant_migration_0017", "20261205_0017_restore_hold.py")
    _, old, _ = m17._functions()
    new = old
    for before, after in _EDITS:
        assert new.count(before) == 1, before
        new = new.replace(before, after)
    return old, new, OLD_SIGNATURE


def upgrade() -> None:
    op.add_column("release", sa.Column("trace_parent", sa.String(64), nullable=True))
    _, new, _ = _functions()
    op.execute(f"DROP FUNCTION {OLD_SIGNATURE}")
    op.execute(new)


def downgrade() -> None:
    old, _, _ = _functions()
    op.execute(f"DROP FUNCTION {NEW_SIGNATURE}")
    op.execute(old)
    op.drop_column("release", "trace_parent")
