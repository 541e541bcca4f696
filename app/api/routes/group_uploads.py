"""``PUT /v1/datasets/{id}/group-histograms``: per-key histograms computed elsewhere."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Request
from pydantic import Field

from app.api.deps import AdminDep, SessionDep
from app.api.http import DecimalJSONRoute
from app.api.routes.datasets import present
from app.api.routes.uploads import (
    ByteCounter,
    _declared_too_large,
    _media_type,
    request_chunks,
)
from app.audit.service import record
from app.codec.histogram import TooManyCells, decode_histogram
from app.core.errors import DpquantError, error_responses, invalid
from app.datasets import service, upload
from app.datasets.group_upload import check_within, read_groups_octet
from app.datasets.groups import store_key_histograms
from app.datasets.models import DatasetData
from app.datasets.schemas import MAX_COLUMNS, DatasetAdmin, DatasetPublic

router = APIRouter(prefix="/v1/datasets", tags=["datasets"], route_class=DecimalJSONRoute)

GROUP_BODY = {
    "requestBody": {
        "required": True,
        "description": "Per-key histograms (octet-stream, streamed, up to "
        "`DPQUANT_MAX_UPLOAD_BYTES`): for each key, a little-endian uint32 byte length, the "
        "key in UTF-8, then for each column named by `?column=` (in order) an int64 pair "
        "count followed by that many little-endian int64 (cell, count) pairs.",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


@router.put(
    "/{dataset_id}/group-histograms",
    response_model=DatasetAdmin,
    responses=error_responses(401, 403, 404, 409, 413, 415, 422, 503),
    openapi_extra=GROUP_BODY,
    summary="Upload (replace) the per-key histograms of one categorical column",
)
def upload_group_histograms(
    dataset_id: uuid.UUID,
    request: Request,
    session: SessionDep,
    principal: AdminDep,
    group_by: Annotated[
        str, Query(min_length=1, max_length=200, description="The categorical column.")
    ],
    column: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=200)]],
        Query(
            min_length=1,
            max_length=MAX_COLUMNS,
            description="Every numeric column, in the body's order (repeat the parameter).",
        ),
    ],
) -> DatasetPublic:
    """What grouped releases read, for values uploaded as a histogram (``dpquant ingest
    --group-by``): upload the columns' histograms first, then these, from the same rows
    after the same bounding. Each key's counts, summed over the keys, must stay within the
    column's stored counts in every cell. Replace only, before the first release."""
    settings = request.app.state.settings
    dataset = service.get_visible(session, principal=principal, dataset_id=dataset_id)
    service.ensure_writable(dataset)
    target = next((c for c in dataset.columns if c.name == group_by), None)
    if target is None or target.numeric:
        raise invalid("query.group_by", "is not a categorical column of this dataset")
    numeric = [c.name for c in dataset.columns if c.numeric]
    if sorted(column) != sorted(numeric) or len(set(column)) != len(column):
        raise invalid("query.column", f"must name every numeric column once: {numeric}")
    if dataset.n is None:
        raise DpquantError(409, "no_values", "upload the columns' histograms first")
    if _media_type(request) != upload.MEDIA_OCTET:
        raise upload.unsupported((upload.MEDIA_OCTET,))
    _declared_too_large(request, settings.max_upload_bytes)
    by_name = {c.name: c for c in dataset.columns}
    builders = [service.column_builder(by_name[name], max_cells=settings.max_cells)
                for name in column]  # fmt: skip
    declared = None if target.keys is None else frozenset(target.keys)
    version = dataset.data_version
    session.commit()  # no connection is held while the body streams in
    counted = ByteCounter(request_chunks(request))
    try:
        groups = read_groups_octet(
            upload.limited(iter(counted), settings.max_upload_bytes), columns=list(column),
            builders=builders, declared=declared, max_values=settings.max_values,
            max_cells=settings.max_cells,
        )  # fmt: skip
    except TooManyCells as exc:
        raise DpquantError(413, "payload_too_large", str(exc)) from None
    locked = service.get_visible(
        session, principal=principal, dataset_id=dataset_id, for_update=True
    )
    service.ensure_writable(locked)
    if locked.data_version != version:
        raise DpquantError(
            409, "values_changed", "the values changed while this upload streamed in: retry"
        )
    stored = []
    for name in column:
        row = session.get(DatasetData, (locked.id, name))
        if row is None:
            raise DpquantError(409, "no_values", "upload the columns' histograms first")
        stored.append(decode_histogram(row.data))
    check_within(groups, stored, list(column))
    store_key_histograms(
        session, dataset_id=locked.id, group_column=target, columns=list(column), groups=groups
    )
    record(
        session,
        actor=principal,
        action="dataset.upload",
        target_type="dataset",
        target_id=locked.id,
        details={
            "kind": "group_histograms",
            "mode": "replace",
            "media_type": upload.MEDIA_OCTET,
            "bytes": counted.total,
        },
    )
    session.flush()
    return present(session, locked, principal)
