"""Plain helpers shared by the test suites (fixtures live in the conftest files)."""

from __future__ import annotations

from typing import Any

from app.config import Settings


def app_settings(database_url: str, *, admin_key: str, **overrides: Any) -> Settings:
    """Explicit settings for a test app (the caller's environment cannot leak in)."""
    values: dict[str, Any] = {
        "database_url": database_url,
        "bootstrap_admin_key": admin_key,
        "max_upload_bytes": 64 * 1024 * 1024,
        "max_values": 10_000_000,
        "max_quantiles": 1000,
        "max_page_size": 500,
        "min_release_ms": 0,
        "pool_size": 10,
        "max_overflow": 50,
        "log_level": "WARNING",
    }
    values.update(overrides)
    return Settings(**values)
