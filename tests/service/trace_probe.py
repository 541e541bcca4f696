"""Run in a subprocess by ``test_tracing.py`` (tracing is process-global): with the SDK's
in-memory exporter, one release through the app (reserved by a request) and one worker
iteration in this process, then print every finished span as JSON lines."""

from __future__ import annotations

import json
import sys


def main(url: str, admin_key: str, secret_value: float) -> None:
    from fastapi.testclient import TestClient
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from app.api.factory import create_app
    from app.core import tracing
    from app.core.db import upgrade_database
    from app.core.pg import Link
    from app.runtime.worker import process_one
    from tests.support import app_settings

    exporter = InMemorySpanExporter()
    tracing.configure(None, service="dpquant-test", exporter=exporter)
    upgrade_database(url)
    settings = app_settings(url, admin_key=admin_key)
    admin = {"Authorization": f"Bearer {admin_key}"}
    with TestClient(create_app(settings)) as c:
        ds = c.post(
            "/v1/datasets",
            json={"name": "traced", "lower": 0, "upper": 1000, "epsilon": "1",
                  "neighbors": "add_remove"},
            headers=admin,
        ).json()["id"]  # fmt: skip
        values = [secret_value] * 37 + [1.0, 2.0, 3.0]
        assert c.put(f"/v1/datasets/{ds}/values", json=values, headers=admin).status_code == 200
        r = c.post(
            f"/v1/datasets/{ds}/quantiles",
            json={"quantiles": [0.5, 0.9], "epsilon": "0.5", "method": "jointexp"},
            headers=admin | {"Prefer": "respond-async"},
        )
        assert r.status_code == 202, r.text
        release_id = r.json()["id"]
        link = Link(url, settings)
        assert process_one(link, settings)
        link.close()
        done = c.get(f"/v1/releases/{release_id}", headers=admin).json()
        assert done["status"] == "done"
    for span in exporter.get_finished_spans():
        print(
            json.dumps(
                {
                    "name": span.name,
                    "trace_id": format(span.context.trace_id, "032x"),
                    "span_id": format(span.context.span_id, "016x"),
                    "parent": None if span.parent is None else format(span.parent.span_id, "016x"),
                    "attributes": {k: str(v) for k, v in (span.attributes or {}).items()},
                    "release_id": release_id,
                    "estimates": done["estimates"],
                }
            )
        )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
