"""Issue 9 item 5: ``dpquant ingest`` with the local (pyarrow) and the Spark engine.

Spark runs in local mode, started once for this module (a JVM start takes ~20 s). The
cross-engine tests prove that Spark SQL's double arithmetic computes bit-identical cells to
:func:`app.codec.grid.cell_of`, on inputs chosen to sit on rounding edges.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

from app.codec.grid import cell_of
from app.datasets import parquet_scan
from app.ingest import core
from app.ingest.core import Grid
from app.runtime import cli

from .conftest import ADMIN, ADMIN_KEY, Api
from .test_parquet_bounds import page_bomb

GRIDS = [Grid(0.0, 100.0, 1e-4), Grid(-3.3, 7.7, 1.1), Grid(-1e6, 1e6, 0.3), Grid(0.1, 0.7, 0.1)]


def edge_values(grid: Grid, n: int, seed: int) -> np.ndarray:
    """Uniform values, exact half-steps and their neighbouring doubles, bounds, outliers."""
    rng = np.random.default_rng(seed)
    span = grid.upper - grid.lower
    k = rng.integers(0, grid.k_max + 1, n // 4)
    half = grid.lower + (k + 0.5) * grid.granularity
    parts = [
        rng.uniform(grid.lower - 0.1 * span, grid.upper + 0.1 * span, n // 2),
        half,
        np.nextafter(half, np.inf),
        np.nextafter(half, -np.inf),
        [grid.lower, grid.upper, np.nextafter(grid.upper, np.inf), -1e300, 1e300, -0.0],
    ]
    return np.concatenate(parts)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    if shutil.which("java") is None:  # pragma: no cover - Java 17 is on CI machines
        pytest.skip("Spark needs a Java runtime")
    from app.ingest.spark import session

    s = session("local[2]")
    s.sparkContext.setLogLevel("OFF")
    yield s
    s.stop()


def write_parquet_dir(root: Path, values: np.ndarray, parts: int = 3) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i, part in enumerate(np.array_split(values, parts)):
        mask = np.zeros(part.size, bool)
        mask[::97] = True  # some nulls
        pq.write_table(
            pa.table({"x": pa.array(part, mask=mask), "id": np.arange(part.size)}),
            root / f"part-{i:05d}.parquet",
            row_group_size=5000,
        )
    (root / "_SUCCESS").write_text("")
    return root


@pytest.mark.parametrize("grid", GRIDS, ids=lambda g: f"{g.lower}:{g.upper}:{g.granularity}")
def test_local_and_spark_engines_give_identical_histograms(
    spark: Any, tmp_path: Path, grid: Grid
) -> None:
    from app.ingest.spark import count_spark

    values = edge_values(grid, 40_000, seed=11)
    kind, files = core.expand_paths([str(write_parquet_dir(tmp_path / "data", values))])
    assert kind == "parquet" and len(files) == 3
    local = core.count_local(kind, files, "x", grid)
    remote = count_spark(spark, kind, files, "x", grid)
    np.testing.assert_array_equal(local.cells, remote.cells)
    np.testing.assert_array_equal(local.counts, remote.counts)
    assert (local.n, local.n_outside, local.skipped) == (
        remote.n,
        remote.n_outside,
        remote.skipped,
    )
    # and both equal the server's own map on the non-null values
    kept = np.concatenate([p[np.arange(p.size) % 97 != 0] for p in np.array_split(values, 3)])
    cells, counts = np.unique(
        cell_of(kept, grid.lower, grid.upper, grid.granularity), return_counts=True
    )
    np.testing.assert_array_equal(local.cells, cells)
    np.testing.assert_array_equal(local.counts, counts)
    assert local.n == kept.size
    assert local.n_outside == int(np.sum((kept < grid.lower) | (kept > grid.upper)))


def test_csv_files_give_the_same_histogram_in_both_engines(spark: Any, tmp_path: Path) -> None:
    from app.ingest.spark import count_spark

    grid = Grid(0.0, 10.0, 0.5)
    values = edge_values(grid, 2_000, seed=3)
    lines = ["id,x"] + [f"{i},{v!r}" if i % 50 else f"{i}," for i, v in enumerate(values.tolist())]
    (tmp_path / "a.csv").write_text("\n".join(lines) + "\n")
    kind, files = core.expand_paths([str(tmp_path / "a.csv")])
    local = core.count_local(kind, files, "x", grid)
    remote = count_spark(spark, kind, files, "x", grid)
    np.testing.assert_array_equal(local.cells, remote.cells)
    np.testing.assert_array_equal(local.counts, remote.counts)
    assert local.skipped == remote.skipped == len(range(0, values.size, 50))


@pytest.fixture
def in_process(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Route the CLI's HTTP client to the in-process app; records the request paths."""
    seen: list[str] = []

    class Client:
        def __init__(self, server: str, api_key: str) -> None:
            self.headers = {"Authorization": f"Bearer {api_key}"}

        def __enter__(self) -> Client:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def get(self, path: str) -> Any:
            seen.append("GET " + path)
            return client.get(path, headers=self.headers)

        def put(self, path: str, **kw: Any) -> Any:
            seen.append("PUT " + path + " " + kw["headers"]["content-type"])
            return client.put(path, headers=self.headers | kw.pop("headers"), **kw)

    monkeypatch.setattr(core, "make_client", Client)
    monkeypatch.setenv("DPQUANT_API_KEY", ADMIN_KEY)
    return seen


@pytest.mark.parametrize("engine", ["local", "spark"])
def test_ingest_command_uploads_counts_only(
    engine: str,
    spark: Any,
    api: Api,
    client: TestClient,
    tmp_path: Path,
    in_process: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    ds = api.dataset(lower=0.0, upper=100.0, epsilon="1")
    values = np.random.default_rng(5).normal(50, 30, 30_000)
    data = write_parquet_dir(tmp_path / "d", values)
    argv = ["ingest", "--server", "http://dpquant.invalid", "--dataset", ds["id"]]
    argv += ["--column", "x", "--engine", engine, str(data)]
    # nulls are refused by default, as an upload refuses them without ?missing=skip
    assert cli.main(argv) == 2
    assert "use --missing skip" in capsys.readouterr().err
    assert cli.main([*argv[:-1], "--missing", "skip", argv[-1]]) == 0, capsys.readouterr().err
    assert in_process == [
        f"GET /v1/datasets/{ds['id']}",
        f"GET /v1/datasets/{ds['id']}",
        f"PUT /v1/datasets/{ds['id']}/histogram application/octet-stream",
    ]
    view = client.get(f"/v1/datasets/{ds['id']}", headers=ADMIN).json()
    kept = np.concatenate([p[np.arange(p.size) % 97 != 0] for p in np.array_split(values, 3)])
    assert view["n"] == kept.size
    assert view["values_skipped"] == values.size - kept.size
    assert view["n_outside_bounds"] == int(np.sum((kept < 0) | (kept > 100)))
    assert api.query(ds["id"]).status_code == 201


def test_ingest_reports_problems_without_values(
    spark: Any,
    tmp_path: Path,
    in_process: list[str],
    api: Api,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ds = api.dataset()
    pq.write_table(pa.table({"x": [1.0, float("nan")]}), tmp_path / "bad.parquet")
    argv = ["ingest", "--server", "http://x", "--dataset", ds["id"], "--column"]
    assert cli.main([*argv, "x", str(tmp_path / "bad.parquet")]) == 2
    assert "NaN or infinite" in capsys.readouterr().err
    assert cli.main([*argv, "y", str(tmp_path / "bad.parquet")]) == 2
    assert "no column 'y'" in capsys.readouterr().err
    assert cli.main([*argv, "x", str(tmp_path / "missing")]) == 2
    (tmp_path / "text.csv").write_text("x\n1\nsecret-abc\n")
    for engine in ("local", "spark"):
        spark.sparkContext.setLogLevel("ERROR")  # the CLI must turn it off again
        assert cli.main([*argv, "x", "--engine", engine, str(tmp_path / "text.csv")]) == 2
        err = capsys.readouterr().err
        assert "secret-abc" not in err and "error:" in err
    assert cli.main([*argv, "x", "hdfs://nn/data"]) == 2
    assert "remote paths need --engine spark" in capsys.readouterr().err
    assert core.expand_paths(["s3a://b/x.csv"], allow_uris=True) == ("csv", ["s3a://b/x.csv"])
    assert cli.main(["ingest", "--server", "http://x", "--dataset", "nope", "--column", "x",
                     str(tmp_path / "bad.parquet")]) == 2  # fmt: skip
    assert "HTTP 422" in capsys.readouterr().err


# --------------------------------------------------------------------------- bounds (issue 28)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records every ``ParquetFile.iter_batches`` call: the only way data pages are read."""
    calls: list[str] = []
    real = pq.ParquetFile.iter_batches

    def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append("read")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    return calls


def test_local_ingest_refuses_page_and_null_bombs_before_reading(
    tmp_path: Path, reads: list[str]
) -> None:
    grid = Grid(0.0, 10.0, 0.5)
    bound = 1 << 20
    bomb = tmp_path / "bomb.parquet"
    bomb.write_bytes(page_bomb(4 * bound // 8))  # one 4 MiB page, a few kB on disk
    with pytest.raises(core.IngestError) as refused:
        core.count_local("parquet", [str(bomb)], "x", grid, max_page_bytes=bound)
    assert str(refused.value).startswith(f"{bomb}: column 'x': Parquet pages are limited to")
    nulls = tmp_path / "nulls.parquet"
    column = pa.concat_arrays([pa.nulls(10**6, pa.float64()), pa.array([1.0, 2.0, 3.0])])
    pq.write_table(pa.table({"x": column}), nulls)
    with pytest.raises(core.IngestError) as refused:
        core.count_local("parquet", [str(nulls)], "x", grid, max_values=1000)
    assert str(refused.value) == (
        f"{nulls}: more than 1000 values in all (column 'x', missing values included; "
        "DPQUANT_MAX_VALUES)"
    )
    assert reads == []
    # values and nulls of all files count together: the second file is refused unread
    parts = []
    for i in range(2):
        parts.append(tmp_path / f"part-{i}.parquet")
        pq.write_table(pa.table({"x": pa.array(np.ones(600), mask=np.arange(600) < 100)}), parts[i])
    with pytest.raises(core.IngestError, match=r"part-1\.parquet: more than 1000 values"):
        core.count_local("parquet", [str(p) for p in parts], "x", grid, max_values=1000)
    assert reads == ["read"]
    counted = core.count_local("parquet", [str(p) for p in parts], "x", grid, max_values=1200)
    assert (counted.n, counted.skipped) == (1000, 200)
    # CSV has no footer: empty cells count as they are read
    (tmp_path / "empty.csv").write_text("x,y\n" + ",0\n" * 1500 + "1,0\n")
    with pytest.raises(core.IngestError, match=r"empty\.csv: more than 1000 values"):
        core.count_local("csv", [str(tmp_path / "empty.csv")], "x", grid, max_values=1000)


def test_ingest_command_names_the_file_of_a_null_bomb(
    tmp_path: Path,
    api: Api,
    in_process: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from app.core.config import get_settings

    nulls = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"x": pa.nulls(5000, pa.float64())}), nulls)
    monkeypatch.setenv("DPQUANT_MAX_VALUES", "1000")
    get_settings.cache_clear()
    try:
        ds = api.dataset()
        argv = ["ingest", "--server", "http://x", "--dataset", ds["id"], "--column", "x"]
        assert cli.main([*argv, str(nulls)]) == 2
    finally:
        get_settings.cache_clear()
    assert f"error: {nulls}: more than 1000 values in all" in capsys.readouterr().err
    assert in_process == [f"GET /v1/datasets/{ds['id']}"]  # nothing uploaded


def test_page_scan_accepts_files_written_by_spark(spark: Any, tmp_path: Path) -> None:
    """parquet-mr's pages (Spark's writer) pass the header scan, whose sums match its footer."""
    from pyspark.sql import functions as F

    frame = spark.range(0, 300_000, 1, 1).select(
        F.when(F.col("id") % 7 == 0, None).otherwise(F.rand(3)).alias("x"),
        (F.col("id") % 100).cast("int").alias("k"),
    )
    frame.write.parquet(str(tmp_path / "out"))
    _, files = core.expand_paths([str(tmp_path / "out")])
    for path in files:
        with open(path, "rb") as file:
            parquet = pq.ParquetFile(file)
            assert parquet.metadata.created_by.startswith("parquet-mr")
            for column in ("x", "k"):
                leaf = parquet_scan.parquet_leaf(parquet, column)
                assert leaf is not None
                meta = parquet.metadata
                scan = parquet_scan.check_parquet_pages(file, meta, leaf, max_page_bytes=1 << 20)
                assert scan.uncompressed == sum(
                    meta.row_group(g).column(leaf).total_uncompressed_size
                    for g in range(meta.num_row_groups)
                )
    counted = core.count_local("parquet", files, "x", Grid(0.0, 1.0, 0.01), max_values=300_000)
    assert counted.n + counted.skipped == 300_000


# ------------------------------------------------------------------ privacy units (bounded)


def unit_parquet(root: Path, rows_per_unit: np.ndarray, seed: int, parts: int = 3) -> Path:
    """Parquet files of (x, person): unit u has ``rows_per_unit[u]`` rows (ids as strings),
    rows shuffled over ``parts`` files."""
    rng = np.random.default_rng(seed)
    people = np.repeat(np.arange(rows_per_unit.size), rows_per_unit)
    rng.shuffle(people)
    x = np.round(rng.normal(50, 20, people.size), 2)
    root.mkdir(parents=True)
    for i, (xs, ps) in enumerate(
        zip(np.array_split(x, parts), np.array_split(people, parts), strict=True)
    ):
        table = pa.table({"x": xs, "person": pa.array([f"id-{p}" for p in ps])})
        pq.write_table(table, root / f"part{i}.parquet")
    return root


def test_both_engines_bound_each_unit_to_k_rows(spark: Any, tmp_path: Path) -> None:
    from app.ingest.bounded import count_local_bounded, count_spark_bounded

    grid, k = Grid(0.0, 100.0, 0.01), 3
    per_unit = np.random.default_rng(3).integers(1, 9, 4000)
    kind, files = core.expand_paths([str(unit_parquet(tmp_path / "d", per_unit, 1))])
    want_n = int(np.minimum(per_unit, k).sum())
    for counted, units, dropped in (
        count_local_bounded(kind, files, "x", "person", grid, k),
        count_spark_bounded(spark, kind, files, "x", "person", grid, k),
    ):
        assert counted.n == int(counted.counts.sum()) == want_n
        assert units == per_unit.size and dropped == int(per_unit.sum()) - want_n
        assert np.all(np.diff(counted.cells) > 0)


def test_without_excess_rows_both_engines_count_the_unbounded_histogram(
    spark: Any, tmp_path: Path
) -> None:
    from app.ingest.bounded import count_local_bounded, count_spark_bounded

    grid, k = Grid(-3.3, 107.7, 1.1), 5
    per_unit = np.random.default_rng(4).integers(1, k + 1, 3000)  # nobody above k
    kind, files = core.expand_paths([str(unit_parquet(tmp_path / "d", per_unit, 2))])
    plain = core.count_local(kind, files, "x", grid)
    local, _, dropped_local = count_local_bounded(kind, files, "x", "person", grid, k)
    remote, _, dropped_remote = count_spark_bounded(spark, kind, files, "x", "person", grid, k)
    assert dropped_local == dropped_remote == 0
    for counted in (local, remote):
        assert np.array_equal(counted.cells, plain.cells)
        assert np.array_equal(counted.counts, plain.counts)
        assert counted.n_outside == plain.n_outside


def test_the_kept_rows_are_uniform_per_unit(tmp_path: Path) -> None:
    """One unit with rows at 10, 20, 30, 40 and k = 1, counted 400 times by the local engine:
    each row kept ~100 times (5 standard deviations allowed)."""
    from app.ingest.bounded import count_local_bounded

    root = tmp_path / "d"
    root.mkdir()
    pq.write_table(
        pa.table({"x": [10.0, 20.0, 30.0, 40.0], "person": ["a"] * 4}), root / "p.parquet"
    )
    kind, files = core.expand_paths([str(root)])
    seen = dict.fromkeys((1000, 2000, 3000, 4000), 0)
    for _ in range(400):
        counted, _, _ = count_local_bounded(kind, files, "x", "person", Grid(0, 100, 0.01), 1)
        (cell,) = counted.cells.tolist()
        seen[cell] += 1
    assert all(abs(c - 100) <= 5 * (400 * 0.25 * 0.75) ** 0.5 for c in seen.values())


@pytest.mark.parametrize("engine", ["local", "spark"])
def test_ingest_into_a_unit_dataset_then_appends_are_refused(
    engine: str,
    spark: Any,
    api: Api,
    client: TestClient,
    tmp_path: Path,
    in_process: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    ds = api.dataset(lower=0.0, upper=100.0, epsilon="1", privacy_unit="person",
                     max_rows_per_unit=2)  # fmt: skip
    per_unit = np.full(500, 4)
    data = unit_parquet(tmp_path / "d", per_unit, 5)
    argv = ["ingest", "--server", "http://dpquant.invalid", "--dataset", ds["id"]]
    argv += ["--column", "x", "--engine", engine, str(data)]
    assert cli.main(argv) == 0, capsys.readouterr().err
    view = client.get(f"/v1/datasets/{ds['id']}", headers=ADMIN).json()
    assert (view["n"], view["units"], view["rows_dropped"]) == (1000, 500, 1000)
    assert api.query(ds["id"], quantiles=[0.5], epsilon="0.1").status_code == 201
    r = client.post(
        f"/v1/datasets/{ds['id']}/values?column=x",
        content=b"x,person\n1.0,id-1\n",
        headers={**ADMIN, "content-type": "text/csv"},
    )
    assert r.status_code == 409 and r.json()["type"] == "unit_counts_unknown"
    # a histogram without the bounding's attestation is refused, as is a wrong k
    for params in ({}, {"rows_per_unit": 3}):
        r = client.put(
            f"/v1/datasets/{ds['id']}/histogram",
            params=params,
            json={"cells": [1], "counts": [1]},
            headers=ADMIN,
        )
        assert r.status_code == 409 and r.json()["type"] in (
            "privacy_unit_needs_rows",
            "dataset_frozen",
        )


# ------------------------------------------------------------------ tables (--columns)

TABLE_GRIDS = [Grid(0.0, 120.0, 1.0), Grid(-3.3, 7.7, 1.1)]


def table_parquet(root: Path, per_unit: np.ndarray, seed: int, parts: int = 3) -> Path:
    """Parquet files of (age, score, person, note): unit u has ``per_unit[u]`` rows; some
    ages and some scores are null (their rows are skipped whole)."""
    rng = np.random.default_rng(seed)
    people = np.repeat(np.arange(per_unit.size), per_unit)
    rng.shuffle(people)
    age = rng.integers(0, 130, people.size).astype(np.float64)
    score = edge_values(TABLE_GRIDS[1], people.size, seed)[: people.size]
    score = np.resize(score, people.size)
    root.mkdir(parents=True)
    for i, idx in enumerate(np.array_split(np.arange(people.size), parts)):
        pq.write_table(
            pa.table({
                "age": pa.array(age[idx], mask=(idx % 89 == 0)),
                "score": pa.array(score[idx], mask=(idx % 71 == 5)),
                "person": pa.array([f"p{p}" for p in people[idx]]),
                "note": pa.array(["x"] * idx.size),
            }),
            root / f"part{i}.parquet",
        )  # fmt: skip
    return root


def complete_rows(root: Path) -> tuple[np.ndarray, np.ndarray, int]:
    """(ages, scores) of the rows with no null, and how many rows have one."""
    table = pq.read_table(root, columns=["age", "score"])
    age = table.column("age").to_numpy(zero_copy_only=False)
    score = table.column("score").to_numpy(zero_copy_only=False)
    ok = ~(np.isnan(age) | np.isnan(score))
    return age[ok], score[ok], int((~ok).sum())


def test_both_engines_count_every_column_of_a_table_over_the_same_rows(
    spark: Any, tmp_path: Path
) -> None:
    from app.ingest.spark import count_columns_spark

    root = table_parquet(tmp_path / "d", np.ones(20_000, dtype=int), 21)
    kind, files = core.expand_paths([str(root)])
    columns = ["score", "age"]  # any order
    grids = [TABLE_GRIDS[1], TABLE_GRIDS[0]]
    local = core.count_columns_local(kind, files, columns, grids)
    remote = count_columns_spark(spark, kind, files, columns, grids)
    age, score, skipped = complete_rows(root)
    for one_local, one_remote, x, grid in zip(local, remote, (score, age), grids, strict=True):
        cells, counts = np.unique(
            cell_of(x, grid.lower, grid.upper, grid.granularity), return_counts=True
        )
        for got in (one_local, one_remote):
            np.testing.assert_array_equal(got.cells, cells)
            np.testing.assert_array_equal(got.counts, counts)
            assert (got.n, got.skipped) == (x.size, skipped)
            assert got.n_outside == int(np.sum((x < grid.lower) | (x > grid.upper)))


def test_both_engines_bound_a_table_by_unit_and_agree_without_excess(
    spark: Any, tmp_path: Path
) -> None:
    from app.ingest.bounded import count_columns_local_bounded, count_columns_spark_bounded

    columns, k = ["age", "score"], 3
    per_unit = np.random.default_rng(8).integers(1, 9, 3000)
    kind, files = core.expand_paths([str(table_parquet(tmp_path / "a", per_unit, 2))])
    _, _, skipped = complete_rows(tmp_path / "a")
    for counted, units, dropped in (
        count_columns_local_bounded(kind, files, columns, "person", TABLE_GRIDS, k),
        count_columns_spark_bounded(spark, kind, files, columns, "person", TABLE_GRIDS, k),
    ):
        n = counted[0].n
        assert all(one.n == int(one.counts.sum()) == n for one in counted)
        assert n + dropped + skipped == int(per_unit.sum())
        assert units <= per_unit.size and n <= k * units
        assert all(one.skipped == skipped for one in counted)
    # nobody above k: both engines keep every complete row, exactly the unbounded counts
    few = np.random.default_rng(9).integers(1, k + 1, 3000)
    kind, files = core.expand_paths([str(table_parquet(tmp_path / "b", few, 4))])
    plain = core.count_columns_local(kind, files, columns, TABLE_GRIDS)
    for counted, _, dropped in (
        count_columns_local_bounded(kind, files, columns, "person", TABLE_GRIDS, k),
        count_columns_spark_bounded(spark, kind, files, columns, "person", TABLE_GRIDS, k),
    ):
        assert dropped == 0
        for got, want in zip(counted, plain, strict=True):
            np.testing.assert_array_equal(got.cells, want.cells)
            np.testing.assert_array_equal(got.counts, want.counts)
            assert got.n_outside == want.n_outside


def test_a_unit_keeps_whole_rows_across_columns(tmp_path: Path) -> None:
    """k = 1 on one unit whose rows pair (age, score) as (10, 1.1), (20, 2.2), (30, 3.3):
    the kept age and the kept score always come from the same row."""
    from app.ingest.bounded import count_columns_local_bounded

    root = tmp_path / "d"
    root.mkdir()
    pq.write_table(
        pa.table({"age": [10.0, 20.0, 30.0], "score": [1.1, 2.2, 3.3], "person": ["a"] * 3}),
        root / "p.parquet",
    )
    kind, files = core.expand_paths([str(root)])
    seen = set()
    for _ in range(60):
        (age, score), units, dropped = count_columns_local_bounded(
            kind, files, ["age", "score"], "person", TABLE_GRIDS, 1
        )
        assert (units, dropped) == (1, 2)
        seen.add((int(age.cells[0]), int(score.cells[0])))
    assert seen == {(10, 4), (20, 5), (30, 6)}  # score cell = round((s + 3.3) / 1.1)


@pytest.mark.parametrize("engine", ["local", "spark"])
def test_ingest_columns_fills_a_unit_table_in_one_upload(
    engine: str,
    spark: Any,
    api: Api,
    client: TestClient,
    tmp_path: Path,
    in_process: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    columns = [
        {"name": "age", "type": "integer", "lower": 0, "upper": 120},
        {"name": "score", "type": "numeric", "lower": -3.3, "upper": 7.7, "granularity": 1.1},
        {"name": "note", "type": "categorical"},
    ]
    r = client.post(
        "/v1/datasets",
        json={"name": f"ingest-table-{engine}", "columns": columns, "epsilon": "10",
              "privacy_unit": "person", "max_rows_per_unit": 2},
        headers=ADMIN,
    )  # fmt: skip
    assert r.status_code == 201, r.text
    ds = r.json()
    per_unit = np.full(400, 3)
    data = table_parquet(tmp_path / "d", per_unit, 6)
    argv = ["ingest", "--server", "http://dpquant.invalid", "--dataset", ds["id"]]
    argv += ["--engine", engine, "--missing", "skip", str(data)]
    # --column is for one-column datasets; --columns must name every numeric column
    assert cli.main([*argv[:5], "--column", "age", *argv[5:]]) == 2
    assert "use --columns age,score" in capsys.readouterr().err
    assert cli.main([*argv[:5], "--columns", "age", *argv[5:]]) == 2
    assert "misses 'score'" in capsys.readouterr().err
    assert cli.main([*argv[:5], "--unit", "age", *argv[5:]]) == 2
    assert "'age' is the privacy unit column" in capsys.readouterr().err
    assert in_process == [f"GET /v1/datasets/{ds['id']}"] * 3
    assert cli.main([*argv[:5], "--columns", "score,age", *argv[5:]]) == 0, capsys.readouterr()
    report = json.loads(capsys.readouterr().out)
    assert report["columns"] == ["score", "age"]
    assert in_process[-1] == f"PUT /v1/datasets/{ds['id']}/histogram application/octet-stream"
    view = client.get(f"/v1/datasets/{ds['id']}", headers=ADMIN).json()
    _, _, skipped = complete_rows(data)
    assert view["units"] <= 400 and view["n"] <= 2 * view["units"]
    assert view["n"] + view["rows_dropped"] + view["values_skipped"] == per_unit.sum()
    assert view["values_skipped"] == skipped
    for column in ("age", "score"):
        rel = api.query(ds["id"], quantiles=[0.5], epsilon="1", column=column)
        assert rel.status_code == 201 and rel.json()["column"] == column
    r = client.post(
        f"/v1/datasets/{ds['id']}/values",
        content=b"person,age,score,note\np1,1,1,x\n",
        headers={**ADMIN, "content-type": "text/csv"},
    )
    assert r.status_code == 409 and r.json()["type"] == "unit_counts_unknown"


def test_plan_columns_maps_files_to_the_dataset() -> None:
    table = core.Target((("age", TABLE_GRIDS[0]), ("score", TABLE_GRIDS[1])), None, 1)
    assert core.plan_columns(table, None, None) == (["age", "score"], ["age", "score"],
                                                    TABLE_GRIDS)  # fmt: skip
    assert core.plan_columns(table, None, ["score", "age"])[2] == TABLE_GRIDS[::-1]
    one = core.Target((("value", TABLE_GRIDS[0]),), None, 1)
    assert core.plan_columns(one, "x", None) == (["x"], ["value"], [TABLE_GRIDS[0]])
    assert core.plan_columns(one, None, None) == (["value"], ["value"], [TABLE_GRIDS[0]])
    for target, column, listed, problem in (
        (table, "age", None, "use --columns"),
        (table, None, ["age", "height"], "not a numeric column"),
        (table, None, ["age", "age", "score"], "twice"),
        (table, None, ["score"], "misses 'age'"),
        (one, "x", ["value"], "not both"),
    ):
        with pytest.raises(core.IngestError, match=problem):
            core.plan_columns(target, column, listed)


@pytest.mark.parametrize("engine", ["local", "spark"])
def test_ingest_reads_missing_values_as_an_upload_does(
    engine: str,
    spark: Any,
    api: Api,
    client: TestClient,
    tmp_path: Path,
    in_process: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The same CSV, with empty cells and NA / NaN / null markers in any case, uploaded
    with ?missing=skip and ingested with --missing skip, stores the same histogram."""
    rng = np.random.default_rng(4)
    markers = ["", "NA", "na", "NaN", "nan", "null", "NULL", "N/A", "none", "#N/A", "-nan"]
    lines = ["id,x"]
    for i in range(600):
        cell = markers[i % len(markers)] if i % 7 == 0 else repr(round(rng.uniform(0, 100), 3))
        lines.append(f"{i},{cell}")
    body = ("\n".join(lines) + "\n").encode()
    (tmp_path / "d.csv").write_bytes(body)
    uploaded = api.dataset(lower=0.0, upper=100.0)
    r = client.put(f"/v1/datasets/{uploaded['id']}/values?column=x&missing=skip", content=body,
                   headers={**ADMIN, "content-type": "text/csv"})  # fmt: skip
    assert r.status_code == 200, r.text
    refused = client.put(f"/v1/datasets/{uploaded['id']}/values?column=x", content=body,
                         headers={**ADMIN, "content-type": "text/csv"})  # fmt: skip
    assert refused.status_code == 422 and "row 1: empty cell" in refused.text
    ingested = api.dataset(lower=0.0, upper=100.0)
    argv = ["ingest", "--server", "http://dpquant.invalid", "--dataset", ingested["id"],
            "--column", "x", "--engine", engine, str(tmp_path / "d.csv")]  # fmt: skip
    assert cli.main(argv) == 2
    assert cli.main([*argv[:-1], "--missing", "skip", argv[-1]]) == 0, capsys.readouterr().err
    a = client.get(f"/v1/datasets/{uploaded['id']}", headers=ADMIN).json()
    b = client.get(f"/v1/datasets/{ingested['id']}", headers=ADMIN).json()
    for figure in ("n", "values_skipped", "n_cells", "n_outside_bounds"):
        assert a[figure] == b[figure], figure
    assert a["values_skipped"] == len(range(0, 600, 7))


# ------------------------------------------------------------------- per-key histograms


def regional_parquet(root: Path, per_unit: np.ndarray, seed: int, parts: int = 3) -> Path:
    """:func:`table_parquet` plus a ``region`` column: each unit's rows spread over regions
    (some rows with no region: null or empty)."""
    table_parquet(root, per_unit, seed, parts)
    rng = np.random.default_rng(seed + 1)
    for path in sorted(root.glob("*.parquet")):
        table = pq.read_table(path)
        n = table.num_rows
        regions = rng.choice(["north", "south", "east", "", None], n, p=[0.4, 0.3, 0.2, 0.05, 0.05])
        pq.write_table(table.append_column("region", pa.array(list(regions))), path)
    return root


def direct_key_counts(root: Path) -> dict[str, list[tuple[np.ndarray, np.ndarray]]]:
    table = pq.read_table(root, columns=["age", "score", "region"])
    age = table.column("age").to_numpy(zero_copy_only=False)
    score = table.column("score").to_numpy(zero_copy_only=False)
    region = np.array(table.column("region").to_pylist(), dtype=object)
    ok = ~(np.isnan(age) | np.isnan(score))
    out = {}
    for key in ("north", "south", "east"):
        mine = ok & (region == key)
        hists = []
        for x, g in ((age[mine], TABLE_GRIDS[0]), (score[mine], TABLE_GRIDS[1])):
            cells, counts = np.unique(cell_of(x, g.lower, g.upper, g.granularity),
                                      return_counts=True)  # fmt: skip
            hists.append((cells, counts))
        out[key] = hists
    return out


def same_groups(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert sorted(got) == sorted(want)
    for key, hists in want.items():
        for (gc, gn), (wc, wn) in zip(got[key], hists, strict=True):
            np.testing.assert_array_equal(gc, wc)
            np.testing.assert_array_equal(gn, wn)


def test_both_engines_count_each_keys_histograms_after_the_bounding(
    spark: Any, tmp_path: Path
) -> None:
    from app.ingest.bounded import count_columns_local_bounded, count_columns_spark_bounded
    from app.ingest.groups import KeyCounter
    from app.ingest.spark import count_columns_spark

    columns = ["age", "score"]
    few = np.random.default_rng(12).integers(1, 3, 2000)  # nobody above k = 2
    root = regional_parquet(tmp_path / "a", few, 13)
    kind, files = core.expand_paths([str(root)])
    want = direct_key_counts(root)
    local = KeyCounter("region", TABLE_GRIDS)
    core.count_columns_local(kind, files, columns, TABLE_GRIDS, keys=local)
    same_groups(local.result(), want)
    found: dict[str, Any] = {}
    count_columns_spark(spark, kind, files, columns, TABLE_GRIDS, "region", found)
    same_groups(found, want)
    bounded_local = KeyCounter("region", TABLE_GRIDS)
    count_columns_local_bounded(kind, files, columns, "person", TABLE_GRIDS, 2, bounded_local)
    same_groups(bounded_local.result(), want)
    bounded_spark: dict[str, Any] = {}
    count_columns_spark_bounded(spark, kind, files, columns, "person", TABLE_GRIDS, 2,
                                "region", bounded_spark)  # fmt: skip
    same_groups(bounded_spark, want)
    # with excess rows, the keys count exactly the kept rows that have a key
    many = np.random.default_rng(14).integers(1, 9, 1500)
    root = regional_parquet(tmp_path / "b", many, 15)
    kind, files = core.expand_paths([str(root)])
    for engine in ("local", "spark"):
        if engine == "local":
            keys = KeyCounter("region", TABLE_GRIDS)
            counted, _, _ = count_columns_local_bounded(
                kind, files, columns, "person", TABLE_GRIDS, 2, keys
            )
            groups = keys.result()
        else:
            groups = {}
            counted, _, _ = count_columns_spark_bounded(
                spark, kind, files, columns, "person", TABLE_GRIDS, 2, "region", groups
            )
        for i in range(2):
            total = {
                int(c): int(n) for c, n in zip(counted[i].cells, counted[i].counts, strict=True)
            }
            summed: dict[int, int] = {}
            for hists in groups.values():
                for c, n in zip(*hists[i], strict=True):
                    summed[int(c)] = summed.get(int(c), 0) + int(n)
            assert all(summed[c] <= total.get(c, 0) for c in summed)
            keyed = sum(summed.values())
            assert 0.85 * counted[i].n < keyed < counted[i].n  # ~10 % of rows have no key


@pytest.mark.parametrize("engine", ["local", "spark"])
def test_ingest_group_by_feeds_grouped_releases(
    engine: str,
    spark: Any,
    api: Api,
    client: TestClient,
    tmp_path: Path,
    in_process: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    columns = [
        {"name": "age", "type": "integer", "lower": 0, "upper": 120},
        {"name": "score", "type": "numeric", "lower": -3.3, "upper": 7.7, "granularity": 1.1},
        {"name": "region", "type": "categorical"},
    ]
    r = client.post(
        "/v1/datasets",
        json={"name": f"ingest-groups-{engine}", "columns": columns, "epsilon": "10",
              "privacy_unit": "person", "max_rows_per_unit": 2},
        headers=ADMIN,
    )  # fmt: skip
    assert r.status_code == 201, r.text
    ds = r.json()["id"]
    data = regional_parquet(tmp_path / "d", np.full(1500, 2), 21)
    argv = ["ingest", "--server", "http://dpquant.invalid", "--dataset", ds, "--engine", engine,
            "--missing", "skip", "--group-by", "region", str(data)]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    assert report["group_by"] == "region"
    assert in_process[-2:] == [
        f"PUT /v1/datasets/{ds}/histogram application/octet-stream",
        f"PUT /v1/datasets/{ds}/group-histograms application/octet-stream",
    ]
    rel = api.query(ds, quantiles=[0.5], epsilon="2", method="jointexp", column="age",
                    group_by="region", keys=["north", "east", "west"])  # fmt: skip
    assert rel.status_code == 201, rel.text
    north, east, west = rel.json()["groups"]
    assert (
        40 <= north["estimates"][0] <= 90 and 40 <= east["estimates"][0] <= 90
    )  # ages 0-129 uniform, clamped at 120
    assert 0 <= west["estimates"][0] <= 120  # no rows: noise, but answered


@pytest.mark.parametrize("engine", ["local", "spark"])
def test_ingest_refuses_a_key_postgresql_cannot_store_without_naming_it(
    engine: str,
    spark: Any,
    client: TestClient,
    tmp_path: Path,
    in_process: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = [
        {"name": "x", "type": "numeric", "lower": 0, "upper": 10, "granularity": 1},
        {"name": "region", "type": "categorical"},
    ]
    r = client.post("/v1/datasets", json={"name": f"ingest-nul-{engine}", "columns": columns,
                                          "epsilon": "1"}, headers=ADMIN)  # fmt: skip
    assert r.status_code == 201, r.text
    ds = r.json()["id"]
    data = tmp_path / "nul.parquet"
    pq.write_table(pa.table({"x": [1.0, 2.0, 3.0], "region": ["a", "SECRET\x00", "b"]}), data)
    sent = len(in_process)
    argv = ["ingest", "--server", "http://dpquant.invalid", "--dataset", ds, "--engine", engine,
            "--group-by", "region", str(data)]  # fmt: skip
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "column 'region': a key must not contain NUL characters" in err
    assert "SECRET" not in err
    assert not [call for call in in_process[sent:] if call.startswith("PUT")]  # no upload


def group_body(groups: dict[str, list[tuple[list[int], list[int]]]]) -> bytes:
    from app.datasets.group_upload import encode_groups

    arrays = {k: [(np.array(c, np.int64), np.array(n, np.int64)) for c, n in v]
              for k, v in groups.items()}  # fmt: skip
    return b"".join(encode_groups(arrays))


def test_group_histogram_uploads_are_checked(api: Api, client: TestClient) -> None:
    columns = [
        {"name": "x", "type": "numeric", "lower": 0, "upper": 10, "granularity": 1},
        {"name": "region", "type": "categorical", "keys": ["a", "b"]},
    ]
    body = {"name": f"gh-{np.random.randint(1e9)}", "columns": columns, "epsilon": "1"}
    r = client.post("/v1/datasets", json=body, headers=ADMIN)
    ds = r.json()["id"]
    octet = {**ADMIN, "content-type": "application/octet-stream"}
    url = f"/v1/datasets/{ds}/group-histograms?group_by=region&column=x"
    good = group_body({"a": [([1, 2], [3, 1])], "b": [([2], [2])]})
    early = client.put(url, content=good, headers=octet)
    assert early.status_code == 409 and early.json()["type"] == "no_values"
    counts = {"cells": [1, 2, 5], "counts": [3, 4, 1]}
    hist = client.put(f"/v1/datasets/{ds}/histogram", json=counts, headers=ADMIN)
    assert hist.status_code == 200, hist.text
    bad = [
        (group_body({"a": [([1], [4])]}), "exceed the column's stored values"),
        (group_body({"a": [([3], [1])]}), "exceed the column's stored values"),
        (group_body({"c": [([1], [1])]}), "key 0: not one of the column's declared keys"),
        (group_body({"a\x00": [([1], [1])]}), "key 0: must not contain NUL characters"),
        (good[:-3], "ends inside"),
        (good + good, "key 2: repeats an earlier key"),
        (group_body({"a": [([11], [1])]}), "cell outside the grid"),
        (b"", "holds no key"),
    ]
    for body, words in bad:
        r = client.put(url, content=body, headers=octet)
        assert r.status_code == 422 and words in r.text, (words, r.text)
    assert client.put(url, content=good, headers={**ADMIN, "content-type": "application/json"}
                      ).status_code == 415  # fmt: skip
    wrong = client.put(url.replace("group_by=region", "group_by=x"), content=good, headers=octet)
    assert wrong.status_code == 422 and "group_by" in wrong.text
    ok = client.put(url, content=good, headers=octet)
    assert ok.status_code == 200, ok.text
    rel = api.query(ds, quantiles=[0.5], epsilon="0.5", method="aq", group_by="region")
    assert rel.status_code == 201, rel.text
    assert [g["key"] for g in rel.json()["groups"]] == ["a", "b"]
    frozen = client.put(url, content=good, headers=octet)
    assert frozen.status_code == 409  # values never change once a release is paid for
