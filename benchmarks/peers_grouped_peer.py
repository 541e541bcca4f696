"""The peers' side of ``benchmarks/peers_grouped.py``: PipelineDP and Tumult Analytics.

Runs under the peers' own virtual environment (never a dpquant dependency, see
``benchmarks/peers_grouped.py`` for its setup) and imports nothing from ``app``::

    /work/peers-venv/bin/python benchmarks/peers_grouped_peer.py JOB_DIR

``JOB_DIR`` holds ``job.json``: ``{"keys": [...], "quantiles": [...], "epsilon": e, "lower":
lo, "upper": hi, "trials": T}``, and per trial ``t`` the files ``values_t.npy`` (float64: the
groups' raw values, one group after the other in the order of ``keys``) and ``sizes_t.npy``
(int64: the groups' sizes). It writes ``JOB_DIR/out.json``: ``{"estimates": {tool: [trial]
[group] -> m sorted estimates}, "seconds": {tool: [trial] -> s}, "budget": {tool: ...},
"versions": {...}}``. Progress goes to stderr.

How each peer is called (one grouped release = the m quantiles of every group, at total ε):

* **PipelineDP** (``LocalBackend``, no Spark): one ``DPEngine.aggregate`` with one
  ``Metrics.PERCENTILE(100 q)`` per level and the keys as public partitions. All percentiles of
  an aggregation share one quantile tree (Google's ``QuantileTree`` through PyDP, height 4,
  branching 16) with Laplace noise, and the ``NaiveBudgetAccountant`` gives that tree the whole
  ``total_epsilon = ε``; ``total_delta = 0`` is accepted (Laplace noise, public partitions: no
  mechanism asks for δ), so the release is pure ε-DP. Every row is its own privacy unit with
  ``max_partitions_contributed = 1``, ``max_contributions_per_partition = 1``: add/remove one
  row, nothing dropped by contribution bounding.
* **Tumult Analytics**: a ``Session`` over the rows with ``PureDPBudget(ε)`` and
  ``AddOneRow()`` (add/remove one row), then one ``groupby(KeySet.from_dict(...)).quantile(
  column, q, low, high)`` query per level at ``PureDPBudget(ε / m)``: m queries use the whole ε
  (checked: the session's remaining budget is 0 afterwards). Spark starts before the first
  timed release (``local[2]``: both cores of the machine).

The seconds of a release include the peer's own loading of the rows (building PipelineDP's row
collection, Tumult's Spark DataFrame and Session).
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

Groups = dict[str, np.ndarray]
Estimates = dict[str, list[float]]


def pipelinedp_release(groups: Groups, job: dict[str, Any]) -> tuple[Estimates, dict[str, Any]]:
    """One grouped release with PipelineDP; also the budget its accountant gave out."""
    import pipeline_dp

    rows = [(f"{key}/{i}", key, float(v)) for key, x in groups.items() for i, v in enumerate(x)]
    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=job["epsilon"], total_delta=0)
    engine = pipeline_dp.DPEngine(accountant, pipeline_dp.LocalBackend())
    params = pipeline_dp.AggregateParams(
        metrics=[pipeline_dp.Metrics.PERCENTILE(100.0 * q) for q in job["quantiles"]],
        noise_kind=pipeline_dp.NoiseKind.LAPLACE,
        max_partitions_contributed=1,
        max_contributions_per_partition=1,
        min_value=float(job["lower"]),
        max_value=float(job["upper"]),
    )
    extractors = pipeline_dp.DataExtractors(
        privacy_id_extractor=lambda r: r[0],
        partition_extractor=lambda r: r[1],
        value_extractor=lambda r: r[2],
    )
    lazy = engine.aggregate(rows, params, extractors, public_partitions=list(groups))
    accountant.compute_budgets()
    out: Estimates = {}
    for key, metrics in lazy:
        values = [
            float(v)
            for name, v in zip(metrics._fields, metrics, strict=True)
            if name.startswith("percentile")
        ]
        out[key] = sorted(values)
    specs = [
        {
            "name": s.mechanism_spec.name,
            "eps": s.mechanism_spec.eps,
            "delta": s.mechanism_spec.delta,
            "noise": str(s.mechanism_spec.mechanism_type),
        }
        for s in accountant._mechanisms  # no public accessor for the specs it gave out
    ]
    return out, {"mechanisms": specs}


class Tumult:
    """Tumult Analytics on one local Spark session, started once (outside the timings)."""

    def __init__(self) -> None:
        from pyspark.sql import SparkSession

        self.spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "1")
            .config("spark.driver.memory", "2g")
            .getOrCreate()
        )
        self.spark.sparkContext.setLogLevel("ERROR")
        self.spark.createDataFrame([(1, 1.0)], ["a", "b"]).count()

    def release(self, groups: Groups, job: dict[str, Any]) -> tuple[Estimates, dict[str, Any]]:
        """One grouped release: m quantile queries at ε/m each; also the budget left."""
        import pandas as pd
        from tmlt.analytics import AddOneRow, KeySet, PureDPBudget, QueryBuilder, Session

        frame = pd.DataFrame(
            {
                "g": np.repeat(list(groups), [x.size for x in groups.values()]),
                "v": np.concatenate(list(groups.values())).astype(np.float64),
            }
        )
        session = Session.from_dataframe(
            privacy_budget=PureDPBudget(job["epsilon"]),
            source_id="rows",
            dataframe=self.spark.createDataFrame(frame),
            protected_change=AddOneRow(),
        )
        keys = KeySet.from_dict({"g": list(groups)})
        share = job["epsilon"] / len(job["quantiles"])
        out: Estimates = {key: [] for key in groups}
        for q in job["quantiles"]:
            query = (
                QueryBuilder("rows")
                .groupby(keys)
                .quantile("v", q, float(job["lower"]), float(job["upper"]), name="est")
            )
            for row in session.evaluate(query, PureDPBudget(share)).collect():
                out[row["g"]].append(float(row["est"]))
        left = session.remaining_privacy_budget
        return {k: sorted(v) for k, v in out.items()}, {
            "per_query_epsilon": share,
            "queries": len(job["quantiles"]),
            "remaining": str(left),
        }


def load(job_dir: Path, job: dict[str, Any], trial: int) -> Groups:
    values = np.load(job_dir / f"values_{trial}.npy")
    sizes = np.load(job_dir / f"sizes_{trial}.npy")
    parts = np.split(values, np.cumsum(sizes)[:-1])
    return dict(zip(job["keys"], parts, strict=True))


def main() -> int:
    job_dir = Path(sys.argv[1])
    job = json.loads((job_dir / "job.json").read_text())
    tumult = Tumult()
    tools = {"pipelinedp": pipelinedp_release, "tumult": tumult.release}
    out: dict[str, Any] = {
        "estimates": {name: [] for name in tools},
        "seconds": {name: [] for name in tools},
        "budget": {},
        "versions": {
            p: importlib.metadata.version(p)
            for p in ("pipeline-dp", "python-dp", "tmlt.analytics", "tmlt.core", "pyspark")
        },
    }
    for trial in range(job["trials"]):
        groups = load(job_dir, job, trial)
        for name, release in tools.items():
            t0 = time.perf_counter()
            est, budget = release(groups, job)
            out["seconds"][name].append(time.perf_counter() - t0)
            out["estimates"][name].append([est[key] for key in job["keys"]])
            out["budget"][name] = budget
        print(f"peers: trial {trial + 1}/{job['trials']} done", file=sys.stderr, flush=True)
    (job_dir / "out.json").write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
