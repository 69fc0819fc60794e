"""The aiohttp application: one middleware, the /v1 routes, and the unauthenticated probes.

The single middleware does, in order: time the request, authenticate it when it is under /v1,
run the handler, turn any failure into the contract's error body, and count the answer by route
*template*. Keeping it one function keeps the hot path (thousands of creates a second) short.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import REGISTRY, generate_latest

from duetime._version import __version__
from duetime.api.auth import KeyCache, bearer_key
from duetime.api.errors import error_response, from_domain_error, from_http_exception, status_for
from duetime.api.handlers import OWNER, JobsApi
from duetime.api.limits import JobCap, OwnerRateLimiter
from duetime.api.metrics import UNMATCHED_ROUTE, observe
from duetime.api.openapi import build_openapi
from duetime.api.preview import PreviewApi
from duetime.api.render import dumps, json_response
from duetime.core.errors import DuetimeError, StorageUnavailable
from duetime.core.ssrf import AddressPolicy
from duetime.core.validation import SpecLimits
from duetime.storage.base import Registry

log = logging.getLogger("duetime.api")

MAX_BODY_BYTES: Final = 256 * 1024
READY_TIMEOUT_S: Final = 5.0
METRICS_CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"


def _needs_auth(path: str) -> bool:
    return path.startswith("/v1/") or path == "/v1"


def _route_label(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return UNMATCHED_ROUTE if resource is None else resource.canonical


def _make_middleware(keys: KeyCache, rate: OwnerRateLimiter | None, cap: JobCap | None) -> Middleware:
    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        started = time.perf_counter()
        response: web.StreamResponse
        try:
            creating = False
            if _needs_auth(request.path):
                owner = await keys.owner_for(bearer_key(request.headers.get("Authorization")))
                request[OWNER] = owner
                if rate is not None:
                    rate.check(owner)
                creating = cap is not None and request.method == "POST" and request.path == "/v1/jobs"
                if creating:
                    assert cap is not None
                    await cap.check(owner)
            response = await handler(request)
            if creating and response.status == 201:
                assert cap is not None
                cap.created(request[OWNER])
        except web.HTTPException as exc:
            response = from_http_exception(exc)
        except DuetimeError as exc:
            status = status_for(exc)
            if status >= 500:
                log.log(
                    logging.WARNING if isinstance(exc, StorageUnavailable) else logging.ERROR,
                    "%s %s failed: %s",
                    request.method,
                    _route_label(request),
                    exc.message,
                    exc_info=not isinstance(exc, StorageUnavailable),
                )
            response = from_domain_error(exc)
        except Exception:
            log.exception("unexpected error in %s %s", request.method, _route_label(request))
            response = error_response(
                500, "internal_error", "An unexpected error occurred; it has been logged."
            )
        observe(_route_label(request), request.method, response.status, time.perf_counter() - started)
        return response

    return middleware


def create_app(
    registry: Registry,
    *,
    policy: AddressPolicy,
    limits: SpecLimits | None = None,
    readiness: Callable[[], Awaitable[None]] | None = None,
    key_cache_ttl_s: float = 5.0,
    owner_rate_per_s: float = 0.0,
    max_jobs_per_owner: int = 0,
    bulk_max: int = 10_000,
) -> web.Application:
    """The API as an aiohttp application; the caller owns the registry's lifetime.

    ``readiness`` is an extra probe for /readyz (brokers, engines): it raises when not ready.
    ``key_cache_ttl_s`` bounds how long a revoked key keeps working on this process.
    ``owner_rate_per_s`` (0 = off) and ``max_jobs_per_owner`` (0 = off) are the per-owner limits
    of ``api.limits``; ``bulk_max`` bounds the jobs one bulk call changes (DUETIME_BULK_MAX).
    """
    rate = OwnerRateLimiter(owner_rate_per_s, 2 * owner_rate_per_s) if owner_rate_per_s > 0 else None
    cap = JobCap(max_jobs_per_owner, registry.count_active_jobs) if max_jobs_per_owner > 0 else None
    keys = KeyCache(registry, ttl_s=key_cache_ttl_s)
    spec_limits = limits if limits is not None else SpecLimits()
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_make_middleware(keys, rate, cap)])
    jobs_api = JobsApi(registry, policy=policy, limits=spec_limits, bulk_max=bulk_max, cap=cap)
    app.router.add_routes(jobs_api.routes())
    app.router.add_routes(PreviewApi(registry, limits=spec_limits).routes())

    openapi_body = dumps(build_openapi(spec_limits))

    async def healthz(request: web.Request) -> web.Response:
        return json_response({"status": "ok", "version": __version__})

    async def readyz(request: web.Request) -> web.Response:
        try:
            async with asyncio.timeout(READY_TIMEOUT_S):
                await registry.ping()
                if readiness is not None:
                    await readiness()
        except StorageUnavailable:
            raise
        except TimeoutError:
            raise StorageUnavailable(
                f"Readiness checks did not answer within {READY_TIMEOUT_S:g} s."
            ) from None
        except Exception as exc:
            log.warning("not ready: %r", exc)
            return error_response(503, "not_ready", f"Not ready: {type(exc).__name__}: {exc}"[:500])
        return json_response({"status": "ready"})

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(REGISTRY), headers={"Content-Type": METRICS_CONTENT_TYPE})

    async def openapi(request: web.Request) -> web.Response:
        return web.Response(body=openapi_body, content_type="application/json")

    app.router.add_get("/healthz", healthz, name="healthz", allow_head=False)
    app.router.add_get("/readyz", readyz, name="readyz", allow_head=False)
    app.router.add_get("/metrics", metrics, name="metrics", allow_head=False)
    app.router.add_get("/openapi.json", openapi, name="openapi", allow_head=False)
    return app
