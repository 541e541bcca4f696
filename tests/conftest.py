"""Shared pytest configuration. Service fixtures (PostgreSQL) live in tests/service/conftest.py."""
