"""The peers' side of :mod:`benchmarks.peers_grouped`: runs in the peers' own virtual
environment (PipelineDP and Tumult Analytics; never a dpquant dependency) and imports nothing
from ``app``.

Usage (called by ``peers_grouped``)::

    /work/peers-venv/bin/python benchmarks/peers_grouped_peer.py IN.json OUT.json

IN: ``{"jobs": [{"groups": {key: [values]}, "quantiles": [...], "epsilon": e, "lower": lo,
"upper": hi}, ...]}`` (one job per trial). OUT: ``{"pipelinedp": [job][key] ->
[estimates], "tumult": ..., "seconds": {"pipelinedp": s, "tumult": s}}`` (seconds per
release, median; the first Tumult release includes Spark's start).
Both peers run with add/remove-one-row neighbours (their defaults), one row per person,
public partitions (the keys), pure DP with the whole ε for the m quantiles: PipelineDP's
quantile tree splits it over its metrics; Tumult answers one quantile per query, so each
query gets ε/m.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any


def pipelinedp_release(data: dict[str, Any]) -> dict[str, list[float]]:
    import pipeline_dp

    rows = [(i, key, v) for key, values in data["groups"].items() for i, v in enumerate(values)]
    rows = [(f"{key}:{i}", key, v) for i, key, v in rows]  # one privacy id per row
    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=data["epsilon"], total_delta=0)
    engine = pipeline_dp.DPEngine(accountant, pipeline_dp.LocalBackend())
    metrics = [pipeline_dp.Metrics.PERCENTILE(100.0 * q) for q in data["quantiles"]]
    params = pipeline_dp.AggregateParams(
        metrics=metrics,
        noise_kind=pipeline_dp.NoiseKind.LAPLACE,
        max_partitions_contributed=1,
        max_contributions_per_partition=1,
        min_value=data["lower"],
        max_value=data["upper"],
    )
    extractors = pipeline_dp.DataExtractors(
        privacy_id_extractor=lambda r: r[0],
        partition_extractor=lambda r: r[1],
        value_extractor=lambda r: r[2],
    )
    result = engine.aggregate(rows, params, extractors, public_partitions=list(data["groups"]))
    accountant.compute_budgets()
    out: dict[str, list[float]] = {}
    for key, metrics_tuple in list(result):
        values = [v for name, v in zip(metrics_tuple._fields, metrics_tuple, strict=True)
                  if name.startswith("percentile")]  # fmt: skip
        out[key] = sorted(float(v) for v in values)
    return out


_spark: Any = None


def tumult_release(data: dict[str, Any]) -> dict[str, list[float]]:
    global _spark
    from pyspark.sql import SparkSession
    from tmlt.analytics import AddOneRow, KeySet, PureDPBudget, QueryBuilder, Session

    if _spark is None:
        _spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "4")
            .getOrCreate()
        )
        _spark.sparkContext.setLogLevel("ERROR")
    rows = [(key, float(v)) for key, values in data["groups"].items() for v in values]
    frame = _spark.createDataFrame(rows, ["g", "v"])
    m = len(data["quantiles"])
    session = Session.from_dataframe(
        privacy_budget=PureDPBudget(data["epsilon"]), source_id="d", dataframe=frame,
        protected_change=AddOneRow(),
    )  # fmt: skip
    keys = KeySet.from_dict({"g": list(data["groups"])})
    out: dict[str, list[float]] = {key: [] for key in data["groups"]}
    for q in data["quantiles"]:
        query = QueryBuilder("d").groupby(keys).quantile("v", q, data["lower"], data["upper"],
                                                           name="est")  # fmt: skip
        answer = session.evaluate(query, PureDPBudget(data["epsilon"] / m)).collect()
        for row in answer:
            out[row["g"]].append(float(row["est"]))
    return {key: sorted(values) for key, values in out.items()}


def main() -> int:
    src, dst = sys.argv[1], sys.argv[2]
    with open(src) as f:
        jobs = json.load(f)["jobs"]
    out: dict[str, Any] = {"pipelinedp": [], "tumult": [], "seconds": {}}
    for name, fn in (("pipelinedp", pipelinedp_release), ("tumult", tumult_release)):
        times = []
        for data in jobs:
            t0 = time.perf_counter()
            out[name].append(fn(data))
            times.append(time.perf_counter() - t0)
        out["seconds"][name] = statistics.median(times)
    with open(dst, "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
