"""Request and response bodies of the key endpoints."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from app.text import StorableText

Role = Literal["admin", "analyst", "viewer"]


class KeyCreate(BaseModel):
    """A new key's role, optional dataset scope and a label."""

    model_config = ConfigDict(extra="forbid")

    role: Role
    dataset_id: uuid.UUID | None = Field(
        default=None, description="Restrict the key to one dataset (analyst and viewer keys)."
    )
    name: StorableText = Field(default="", max_length=200, description="A label for humans.")


class KeyPublic(BaseModel):
    """A key as listed: never the secret, only its public prefix."""

    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    prefix: str
    role: Role
    dataset_id: uuid.UUID | None
    name: str
    created_at: datetime
    revoked_at: datetime | None


class KeyCreated(KeyPublic):
    """A freshly created key, including the secret: shown this once, stored only hashed."""

    key: str


class KeyList(BaseModel):
    """All keys, newest first."""

    items: list[KeyPublic]


class KeySelf(BaseModel):
    """What the calling key may know about itself (for dashboards and clients)."""

    id: uuid.UUID
    role: Role
    dataset_id: uuid.UUID | None = Field(description="The key's dataset scope, if any.")
