"""Foundations every other layer may use: settings, database plumbing (SQLAlchemy and the
psycopg hot path), errors, metrics, the guard middleware, text and amount types, the caller.

Imports no domain package and no HTTP layer."""
