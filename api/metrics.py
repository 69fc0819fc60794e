"""API request metrics on the process-wide Prometheus registry.

Labels are the route *template* (``/v1/jobs/{job_id}``), never the raw path, and a fixed set of
methods: a client choosing URLs or verbs must not be able to grow the number of series.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import Counter, Histogram

REQUESTS: Final = Counter(
    "duetime_api_requests",
    "HTTP requests answered by the API, by route template, method and status.",
    ("route", "method", "status"),
)
LATENCY: Final = Histogram(
    "duetime_api_request_duration_seconds",
    "Time from request received to response ready, by route template and method.",
    ("route", "method"),
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)

UNMATCHED_ROUTE: Final = "unmatched"
_METHODS: Final = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})


def method_label(method: str) -> str:
    return method if method in _METHODS else "other"


def observe(route: str, method: str, status: int, seconds: float) -> None:
    label = method_label(method)
    REQUESTS.labels(route, label, str(status)).inc()
    LATENCY.labels(route, label).observe(seconds)
