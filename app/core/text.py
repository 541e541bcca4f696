"""Text that PostgreSQL can store: no NUL characters, no unpaired UTF-16 surrogates."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator


def text_problem(value: str) -> str | None:
    """Why PostgreSQL could not store ``value`` as text (None: it can)."""
    if "\x00" in value:
        return "must not contain NUL characters"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "must be valid Unicode (no unpaired surrogates)"
    return None


def _storable(value: str) -> str:
    problem = text_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


#: A ``str`` field stored in a ``text`` column; bad text is a 422 naming the field, never a
#: database error.
StorableText = Annotated[str, AfterValidator(_storable)]
