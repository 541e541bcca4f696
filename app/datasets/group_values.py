"""Loading the per-key histograms a grouped release reads (release workers)."""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import psycopg
from numpy.typing import NDArray

from app.codec.histogram import decode_histogram
from app.datasets.service import VALUES_CACHE

IntArray = NDArray[np.int64]
GroupHistograms = dict[str, tuple[IntArray, IntArray]]


def load_groups(
    conn: psycopg.Connection[Any],
    *,
    dataset_id: uuid.UUID,
    version: int,
    group_column: str,
    column: str,
) -> GroupHistograms | None:
    """Every key's histogram of ``column`` within ``group_column`` at data ``version``
    (keys with no rows are absent), or None when the dataset's values are not at that version
    or its per-key histograms were not built. The arrays are read-only (cached per version,
    like :func:`~app.datasets.service.load_histogram`'s)."""
    cache_key = (dataset_id, version, f"groups:{group_column}:{column}")
    cached = VALUES_CACHE.get(cache_key)
    if cached is not None:
        return _unpack(cached)
    with conn.cursor(binary=True) as cursor:
        cursor.execute(
            "SELECT c.keys_stored IS NOT NULL AND d.data_version = %s FROM dataset d "
            "JOIN dataset_column c ON c.dataset_id = d.id AND c.name = %s WHERE d.id = %s",
            (version, group_column, dataset_id),
        )
        ready = cursor.fetchone()
        if ready is None or not ready[0]:
            return None
        cursor.execute(
            "SELECT group_key, data FROM dataset_group_data WHERE dataset_id = %s "
            "AND group_column = %s AND column_name = %s ORDER BY group_key",
            (dataset_id, group_column, column),
        )
        rows = cursor.fetchall()
    keys = [str(key) for key, _ in rows]
    parts = [decode_histogram(bytes(blob)) for _, blob in rows]
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([p[0].size for p in parts], out=offsets[1:])
    cells = np.concatenate([p[0] for p in parts]) if parts else np.empty(0, np.int64)
    counts = np.concatenate([p[1] for p in parts]) if parts else np.empty(0, np.int64)
    packed = (np.array(keys, dtype=object), offsets, cells, counts)
    for array in packed:
        array.flags.writeable = False
    VALUES_CACHE.put(cache_key, packed)
    return _unpack(packed)


def _unpack(packed: tuple[NDArray[Any], ...]) -> GroupHistograms:
    keys, offsets, cells, counts = packed
    return {
        str(key): (cells[offsets[i] : offsets[i + 1]], counts[offsets[i] : offsets[i + 1]])
        for i, key in enumerate(keys)
    }


__all__ = ["GroupHistograms", "load_groups"]
