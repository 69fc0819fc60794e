"""What every Duetime process serves on /metrics: one registry, one content type, build info.

The API and the engine/worker processes all answer /metrics through ``metrics_response``, so a
scrape sees the same content type and the same ``duetime_build_info`` series from each, and a
dashboard can tell which version each process runs (``count by (version) (duetime_build_info)``
during a rolling upgrade).

``*_created`` series are switched off: prometheus_client adds one per counter and histogram
child by default, doubling the series count with timestamps nobody graphs (rate() handles
counter resets without them).
"""

from __future__ import annotations

from typing import Final

from aiohttp import web
from prometheus_client import REGISTRY, Gauge, disable_created_metrics, generate_latest

from duetime._version import __version__

METRICS_CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

disable_created_metrics()  # type: ignore[no-untyped-call]

BUILD_INFO: Final = Gauge(
    "duetime_build_info", "Always 1; the labels say which Duetime version this process runs", ["version"]
)
BUILD_INFO.labels(__version__).set(1)


def metrics_response() -> web.Response:
    return web.Response(body=generate_latest(REGISTRY), headers={"Content-Type": METRICS_CONTENT_TYPE})
