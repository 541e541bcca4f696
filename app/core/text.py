"""Text that PostgreSQL can store: no NUL characters, no unpaired UTF-16 surrogates."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator


def _storable(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode (no unpaired surrogates)") from None
    return value


#: A ``str`` field stored in a ``text`` column; bad text is a 422 naming the field, never a
#: database error.
StorableText = Annotated[str, AfterValidator(_storable)]
