"""What the service counts as "the database is unavailable", and the log redaction that keeps
stored values out of SQLAlchemy's logs. The ASGI guard that turns any escaped exception
into a JSON 503 is :mod:`app.api.middleware.guard`.
"""

from __future__ import annotations

import logging

import psycopg
from psycopg_pool import PoolTimeout
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

#: Exceptions that mean "the database is unavailable" (SQLAlchemy's and psycopg's own).
UNAVAILABLE = (OperationalError, PoolTimeoutError, psycopg.OperationalError, PoolTimeout)


def database_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` says the database (or a connection to it) is unavailable."""
    return isinstance(exc, UNAVAILABLE) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated
    )


class _HideResultRows(logging.Filter):
    """Redact the result rows SQLAlchemy logs at DEBUG (a row may be a dataset's values)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == "Row %r":
            record.args = ("[result row hidden: it may hold data values]",)
        return True


_ROW_FILTER = _HideResultRows()


def hide_result_rows() -> None:
    """Install the redaction on SQLAlchemy's engine logger (idempotent).

    Together with ``create_engine(hide_parameters=True)`` (which hides statement parameters
    in logs and in exception messages) no stored value reaches a log at any level.
    """
    engine_logger = logging.getLogger("sqlalchemy.engine.Engine")
    if _ROW_FILTER not in engine_logger.filters:
        engine_logger.addFilter(_ROW_FILTER)
