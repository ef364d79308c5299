"""Prometheus metrics of the API, in one registry per app (so tests can build several apps)."""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class ServingMetrics:
    """The counters, histograms and gauges the server and the routes update."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("indusflow_requests_total", "HTTP requests by route, method and status.",
                                ["endpoint", "method", "status"], registry=r)
        self.latency = Histogram("indusflow_request_latency_seconds", "Request latency by route.",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.rows = Counter("indusflow_rows_total", "Rows scored by model.", ["model"], registry=r)
        self.batch_size = Histogram("indusflow_batch_size", "Rows per model call (dynamic batches included).",
                                    ["model"], buckets=BATCH_BUCKETS, registry=r)
        self.model_version = Gauge("indusflow_model_version", "Version of the model being served.",
                                   ["model"], registry=r)
        self.model_errors = Counter("indusflow_model_errors_total", "Failed model calls (and loads).",
                                    ["model", "stage"], registry=r)
        self.breaker_open = Gauge("indusflow_breaker_open", "1 while the model's circuit breaker is open.",
                                  ["model"], registry=r)
        self.reloads = Counter("indusflow_model_reloads_total", "Model versions loaded (hot reloads).",
                               ["model"], registry=r)
        self.rate_limited = Counter("indusflow_rate_limited_total", "Requests refused by a rate limit, by scope.",
                                    ["scope"], registry=r)

    def observe_batch(self, model: str, size: int) -> None:
        """Report one model call over ``size`` rows (called by routes and the dynamic batcher)."""
        self.batch_size.labels(model=model).observe(size)
        self.rows.labels(model=model).inc(size)

    def render(self) -> bytes:
        """The exposition text of every metric."""
        return generate_latest(self.registry)
