"""Request and response bodies of the key endpoints."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from app.core.amounts import BudgetDecimal, DecimalText
from app.core.text import StorableText

Role = Literal["admin", "analyst", "viewer"]


class KeyCreate(BaseModel):
    """A new key's role, optional dataset scope and a label."""

    model_config = ConfigDict(extra="forbid")

    role: Role
    dataset_id: uuid.UUID | None = Field(
        default=None, description="Restrict the key to one dataset (analyst and viewer keys)."
    )
    name: StorableText = Field(default="", max_length=200, description="A label for humans.")
    max_epsilon: BudgetDecimal | None = Field(
        default=None,
        description="Cap on the epsilon this key may spend in total (all its releases "
        "together); null: no cap beyond the dataset's budget.",
    )
    max_delta: BudgetDecimal | None = Field(
        default=None, description="Cap on the delta this key may spend in total; null: no cap."
    )
    expires_at: AwareDatetime | None = Field(
        default=None,
        description="The key stops working at this instant (ISO 8601 with a time zone; must "
        "lie in the future); null: never.",
    )


class KeyPublic(BaseModel):
    """A key as listed: never the secret, only its public prefix."""

    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    prefix: str
    role: Role
    dataset_id: uuid.UUID | None
    name: str = Field(description="The key's label, or an OpenID Connect subject.")
    kind: Literal["key", "oidc"] = Field(
        default="key", description="key: an API key; oidc: an OpenID Connect subject."
    )
    created_at: datetime
    revoked_at: datetime | None
    max_epsilon: DecimalText | None = Field(description="Cap on the epsilon spent (null: none).")
    max_delta: DecimalText | None = Field(description="Cap on the delta spent (null: none).")
    spent_epsilon: DecimalText = Field(description="Epsilon spent by this key's releases.")
    spent_delta: DecimalText = Field(description="Delta spent by this key's releases.")
    expires_at: datetime | None
    last_used_at: datetime | None = Field(
        description="Last successful authentication (refreshed at most once a minute)."
    )
    rotated_at: datetime | None


class KeyCreated(KeyPublic):
    """A freshly created (or rotated) key, including the secret: shown this once, stored
    only hashed."""

    key: str


class KeyList(BaseModel):
    """All keys, newest first."""

    items: list[KeyPublic]


class KeySelf(BaseModel):
    """What the calling key may know about itself (for dashboards and clients)."""

    id: uuid.UUID
    role: Role
    dataset_id: uuid.UUID | None = Field(description="The key's dataset scope, if any.")
    datasets: list[uuid.UUID] | None = Field(
        default=None, description="An OpenID Connect token's datasets (null: not scoped so)."
    )
    subject: str | None = Field(
        default=None, description="An OpenID Connect token's subject (null for keys)."
    )


class KeyCaps(BaseModel):
    """New spending caps for a key or an OpenID Connect subject (only the fields given
    change; ``null`` removes a cap)."""

    model_config = ConfigDict(extra="forbid")

    max_epsilon: BudgetDecimal | None = None
    max_delta: BudgetDecimal | None = None
