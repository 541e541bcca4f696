"""OpenTelemetry traces: one trace per request, joined by the worker's spans of its release.

Off unless ``DPQUANT_OTEL_ENDPOINT`` is set (or a test hands :func:`configure` an exporter):
the OpenTelemetry API's default tracer then records nothing, and no instrumentation is
installed, so tracing costs nothing when off.

On, every web process and every release worker has a tracer provider exporting over OTLP/HTTP
to the endpoint, FastAPI's and psycopg's instrumentations add the request and statement
spans, and the service adds its own (:data:`SPANS`). A release carries its reservation's
W3C ``traceparent`` in its row, so the worker's spans (queue wait, run, completion) join the
trace of the request that paid for it.

What spans carry (``docs/security.md``, "Traces"): route templates, methods, status codes,
statement text with placeholders (psycopg's instrumentation records no parameter), release
and dataset ids, the method, the number of quantiles, the outcome (done / failed and the
failure reason, as the release shows it). Never n, a value, an estimate, a key or a unit id.
Durations depend on the data (a run's time grows with n), as ``/metrics``' histograms do:
traces go to operators only.
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

from opentelemetry import context, trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

#: The service's own span names.
SPANS = ("release.reserve", "release.queue", "release.run", "release.complete")

_PROPAGATOR = TraceContextTextMapPropagator()
_lock = threading.Lock()
_enabled = False


def enabled() -> bool:
    """Whether this process exports traces."""
    return _enabled


def configure(
    endpoint: str | None, *, service: str, exporter: Any | None = None, psycopg: bool = True
) -> bool:
    """Start exporting this process's traces to ``endpoint`` (OTLP/HTTP, e.g.
    ``http://collector:4318/v1/traces``) or to ``exporter`` (tests: the SDK's in-memory
    exporter, spans exported as they end). Idempotent; False (and nothing installed) when
    neither is given."""
    global _enabled
    if endpoint is None and exporter is None:
        return False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    with _lock:
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = TracerProvider(resource=Resource.create({"service.name": service}))
            trace.set_tracer_provider(provider)
        if exporter is not None:
            provider.add_span_processor(SimpleSpanProcessor(exporter))
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        if psycopg and not _enabled:
            from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

            PsycopgInstrumentor().instrument(skip_dep_check=True)
        _enabled = True
    return True


def instrument_app(app: Any) -> None:
    """FastAPI's request spans (not for the health, readiness and metrics probes)."""
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    FastAPIInstrumentor.instrument_app(
        app, excluded_urls="healthz,readyz,metrics", exclude_spans=["receive", "send"]
    )


def tracer() -> trace.Tracer:
    """The service's tracer (a no-op one while tracing is off)."""
    return trace.get_tracer("dpquant")


def current_traceparent() -> str | None:
    """The W3C ``traceparent`` of the current span (None when there is none)."""
    if not _enabled:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent")


def context_of(traceparent: str | None) -> context.Context | None:
    """The context a stored ``traceparent`` continues (None: a new trace)."""
    if not _enabled or not traceparent:
        return None
    return _PROPAGATOR.extract({"traceparent": traceparent})


def ns(moment: datetime) -> int:
    """A timestamp as OpenTelemetry's nanoseconds since the epoch."""
    return int(moment.timestamp() * 1e9)
