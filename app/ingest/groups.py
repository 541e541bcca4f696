"""Per-key histograms where the data lives (``dpquant ingest --group-by``).

Both engines count, over the rows they keep (after the bounding, when there is a unit),
the cells of every numeric column within each key of one categorical column, and upload
them with ``PUT /v1/datasets/{id}/group-histograms`` after the columns' histograms. An empty
or null key belongs to no group (as in uploads). Key values leave only inside that upload,
which is the data owner's own (admin) channel, never in a message.
"""

from __future__ import annotations

from typing import Any, NoReturn

import numpy as np
from numpy.typing import NDArray

from app.codec.grid import cell_of
from app.core.text import text_problem
from app.datasets.group_upload import encode_groups
from app.datasets.groups import KeyCodes, PairCounts
from app.ingest.core import Grid, IngestError, _check

IntArray = NDArray[np.int64]
KeyHistograms = dict[str, list[tuple[IntArray, IntArray]]]


def batch_codes(array: Any, coder: KeyCodes, path: str) -> IntArray:
    """A record batch's key column as codes (-1: null or empty), by its dictionary."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_dictionary(array.type):
        array = array.cast(array.type.value_type)
    if not (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)):
        raise IngestError(f"{path}: the group column must hold strings")
    encoded = pc.dictionary_encode(array)
    mapping = np.array(
        [-1 if not key.strip() else coder.code(key) for key in encoded.dictionary.to_pylist()]
        + [-1],
        dtype=np.int64,
    )
    indices = encoded.indices.fill_null(len(mapping) - 1).to_numpy(zero_copy_only=False)
    out: IntArray = mapping[indices.astype(np.int64)]
    return out


def refuse_ingest(problem: str) -> NoReturn:
    """A key problem as the operator sees it (exit status 2), never with the key itself."""
    raise IngestError(f"--group-by {problem}")


class KeyCounter:
    """(key, cell) counts of every numeric column, for one categorical column."""

    def __init__(self, name: str, grids: list[Grid]) -> None:
        self.name = name
        self.coder = KeyCodes(name, refuse=refuse_ingest)
        self.grids = grids
        self.pairs = [PairCounts() for _ in grids]

    def codes(self, batch: Any, path: str) -> IntArray:
        """The batch's keys as codes (its column ``self.name``)."""
        return batch_codes(batch.column(batch.schema.get_field_index(self.name)), self.coder, path)

    def add_cells(self, codes: IntArray, cells: list[IntArray]) -> None:
        for pairs, column_cells in zip(self.pairs, cells, strict=True):
            pairs.add(codes, column_cells)

    def add_values(self, codes: IntArray, block: NDArray[np.float64]) -> None:
        self.add_cells(
            codes,
            [cell_of(np.ascontiguousarray(block[:, i]), g.lower, g.upper, g.granularity)
             for i, g in enumerate(self.grids)],
        )  # fmt: skip

    def result(self) -> KeyHistograms:
        per_column = [pairs.per_code() for pairs in self.pairs]
        codes = sorted(set().union(*(set(p) for p in per_column)))
        return {self.coder.keys[c]: [p[c] for p in per_column] for c in codes}


def spark_key_counts(
    data: Any, xs: list[str], grids: list[Grid], key: str, name: str | None = None
) -> KeyHistograms:
    """Per key of string column ``key`` of ``data`` (rows with a null or empty key left
    out), the (cell, count) rows of each double column of ``xs``: one GROUP BY (key,
    column, cell) over the columns stacked by an explode."""
    from pyspark.sql import functions as F

    from app.ingest.spark import cell_column

    stacked = F.explode(
        F.array(*(F.struct(F.lit(i).alias("c"), cell_column(F.col(x), g).alias("cell"))
                  for i, (x, g) in enumerate(zip(xs, grids, strict=True))))
    )  # fmt: skip
    rows = (
        data.where(F.col(key).isNotNull() & (F.trim(F.col(key)) != ""))
        .select(F.col(key).alias("k"), stacked.alias("s"))
        .select("k", "s.c", "s.cell")
    )
    table = rows.groupBy("k", "c", "cell").count().orderBy("k", "c", "cell").toArrow()
    keys = table.column("k").to_pylist()
    which = table.column("c").to_numpy()
    cells = table.column("cell").to_numpy().astype(np.int64)
    counts = table.column("count").to_numpy().astype(np.int64)
    out: KeyHistograms = {}
    start = 0
    while start < len(keys):
        end = start
        while end < len(keys) and keys[end] == keys[start]:
            end += 1
        part = slice(start, end)
        found = str(keys[start])
        if (problem := text_problem(found)) is not None:
            refuse_ingest(f"column {name or key!r}: a key {problem}")
        out[found] = [
            (cells[part][which[part] == i], counts[part][which[part] == i]) for i in range(len(xs))
        ]
        start = end
    return out


def upload_groups(
    client: Any, dataset_id: str, group_by: str, columns: list[str], groups: KeyHistograms
) -> Any:
    """PUT the per-key histograms (after the columns' own) and return the dataset's view."""
    if not groups:
        raise IngestError(f"no row has a key in {group_by!r}")
    # every key carries every column (a kept row has a cell in each)
    return _check(
        client.put(
            f"/v1/datasets/{dataset_id}/group-histograms",
            params=[("group_by", group_by), *(("column", c) for c in columns)],
            content=encode_groups(groups),
            headers={"content-type": "application/octet-stream"},
        ),
        "uploading the per-key histograms",
    )


__all__ = ["KeyCounter", "KeyHistograms", "batch_codes", "spark_key_counts", "upload_groups"]
