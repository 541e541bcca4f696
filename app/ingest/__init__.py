"""``dpquant ingest``: count a dataset's grid histogram where the data lives, upload counts only.

The grid (public bounds and granularity) is read from the server; the files are read here
(``local``: pyarrow, streamed by record batch) or by Apache Spark (``spark``: one GROUP BY on
the executors, only the (cell, count) rows come back to the driver). Either way the only
thing sent to the server is the histogram: int64 (cell, count) pairs plus the figures
``n_outside`` and ``values_skipped``. Both engines compute the cell with the same IEEE double
expression (:func:`app.codec.grid.cell_of`), so their histograms are identical.
"""

from app.ingest.core import (
    Counted,
    Grid,
    IngestError,
    Target,
    count_columns_local,
    count_local,
    expand_paths,
)

__all__ = [
    "Counted",
    "Grid",
    "IngestError",
    "Target",
    "count_columns_local",
    "count_local",
    "expand_paths",
]
