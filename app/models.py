"""Every domain's ORM models in one place, for code that needs the complete schema.

The database plumbing in :mod:`app.core.db` defines :class:`~app.core.db.Base` but imports no
domain; Alembic and the schema tests call :func:`load_models` to see every table.
"""

from __future__ import annotations

from sqlalchemy import MetaData

from app.core.db import Base


def load_models() -> MetaData:
    """Import every model module so that ``Base.metadata`` is complete; returns it."""
    import app.audit.models
    import app.auth.models
    import app.datasets.models
    import app.ledger.models
    import app.releases.models  # noqa: F401

    return Base.metadata
