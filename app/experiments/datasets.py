"""The four datasets of the paper's Section 5.2, as samplers of ``n`` points.

* ``gaussian``: ``n`` i.i.d. draws from N(0, 5^2).
* ``uniform``: ``n`` i.i.d. draws from U(-5, 5).
* ``ratings``: ``n`` rows drawn without replacement from the Goodreads table (11,123 books),
  column ``average_rating`` (values 0..5, two decimals, many ties).
* ``pages``: the same table, column ``num_pages`` divided by 100 (values 0..65.76).

The Goodreads table ships inside the package (``app/experiments/data``, see its README) and
is read with :mod:`importlib.resources`, so it works from an installed wheel too.
"""

from __future__ import annotations

import csv
import functools
import io
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]

GOODREADS_FILE = "goodreads_books.csv"
GOODREADS_ROWS = 11_123


@functools.cache
def goodreads_columns() -> dict[str, FloatArray]:
    """The Goodreads table as ``{"average_rating": ..., "num_pages": ...}`` (read once).

    Returns:
        Read-only float arrays, one entry per book, in file order.

    Raises:
        ValueError: If the packaged file does not have the expected shape.
    """
    text = resources.files("app.experiments.data").joinpath(GOODREADS_FILE).read_text("utf-8")
    reader = csv.reader(io.StringIO(text))
    header = next(reader)
    rows = [tuple(float(v) for v in row) for row in reader if row]
    table = np.asarray(rows, dtype=np.float64)
    if header != ["average_rating", "num_pages"] or table.shape != (GOODREADS_ROWS, 2):
        raise ValueError(f"unexpected Goodreads table: header {header}, shape {table.shape}")
    out: dict[str, FloatArray] = {}
    for j, name in enumerate(header):
        col = np.ascontiguousarray(table[:, j])
        col.setflags(write=False)
        out[name] = col
    return out


def _gaussian(rng: np.random.Generator, n: int) -> FloatArray:
    return rng.normal(0.0, 5.0, size=n)


def _uniform(rng: np.random.Generator, n: int) -> FloatArray:
    return rng.uniform(-5.0, 5.0, size=n)


def _subsample(column: str, scale: float) -> Callable[[np.random.Generator, int], FloatArray]:
    def sample(rng: np.random.Generator, n: int) -> FloatArray:
        values = goodreads_columns()[column]
        if n > values.size:
            raise ValueError(f"cannot draw {n} rows without replacement from {values.size}")
        return rng.choice(values, size=n, replace=False) / scale

    return sample


@dataclass(frozen=True)
class Dataset:
    """A named sampler: ``sample(rng, n)`` returns ``n`` unsorted points."""

    name: str
    label: str
    sample: Callable[[np.random.Generator, int], FloatArray]
    max_n: int | None = None


DATASETS: dict[str, Dataset] = {
    d.name: d
    for d in (
        Dataset("gaussian", "Gaussian N(0, 5²)", _gaussian),
        Dataset("uniform", "Uniform(−5, 5)", _uniform),
        Dataset("ratings", "Goodreads ratings", _subsample("average_rating", 1.0), GOODREADS_ROWS),
        Dataset("pages", "Goodreads pages / 100", _subsample("num_pages", 100.0), GOODREADS_ROWS),
    )
}
