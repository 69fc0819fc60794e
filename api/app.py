"""The aiohttp application: one middleware, the /v1 routes, and the unauthenticated probes.

The single middleware does, in order: time the request, authenticate it when it is under /v1,
run the handler, turn any failure into the contract's error body, and count the answer by route
*template*. Keeping it one function keeps the hot path (thousands of creates a second) short.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Middleware
from aiohttp.web_protocol import RequestPayloadError

from duetime._version import __version__
from duetime.api.auth import KeyCache, bearer_key
from duetime.api.cpupool import CpuPool
from duetime.api.errors import (
    INTERNAL_ERROR_MESSAGE,
    error_response,
    from_domain_error,
    from_http_exception,
    status_for,
)
from duetime.api.handlers import KEY_ID, OWNER, JobsApi
from duetime.api.limits import COST, JobBytesCap, JobCap, OwnerRateLimiter, RefusalHolds, response_tokens
from duetime.api.metrics import UNMATCHED_ROUTE, observe
from duetime.api.openapi import build_openapi
from duetime.api.paging import PageCursors
from duetime.api.preview import PreviewApi
from duetime.api.render import dumps, json_response
from duetime.api.request_id import request_id_middleware
from duetime.api.targets import TargetsApi
from duetime.core.errors import DuetimeError, MalformedRequest, RateLimited, StorageUnavailable
from duetime.core.ssrf import AddressPolicy
from duetime.core.topics import TopicPolicy
from duetime.core.validation import SpecLimits
from duetime.exposition import metrics_response
from duetime.storage.ports import ApiStore
from duetime.storage.registry_rules import key_prefix

log = logging.getLogger("duetime.api")

MAX_BODY_BYTES: Final = 256 * 1024
READY_TIMEOUT_S: Final = 5.0
# Query parameters the contract lets a client repeat (GET /v1/jobs?label=a=1&label=b=2 is an AND).
REPEATABLE_PARAMETERS: Final = frozenset({"label"})
# Headers whose repetition would let a proxy and this server read different values: 400.
_SINGLE_HEADERS: Final = ("Authorization", "Idempotency-Key", "Duetime-Reason")


def _needs_auth(path: str) -> bool:
    return path.startswith("/v1/") or path == "/v1"


def _route_label(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return UNMATCHED_ROUTE if resource is None else resource.canonical


def _check_declared_length(request: web.Request) -> None:
    """413 from the declared Content-Length alone, before a byte of the body is awaited."""
    length = request.content_length
    if length is not None and length > MAX_BODY_BYTES:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_BODY_BYTES, actual_size=length)


def _check_duplicates(request: web.Request) -> None:
    """A repeated Authorization header or query parameter is ambiguous: refuse it, never guess.

    First-one-wins reading lets a proxy and this server see different keys or limits in one
    request. Parameters the contract defines as repeatable (``label``) are exempt.
    """
    for header in _SINGLE_HEADERS:
        if len(request.headers.getall(header, ())) > 1:
            message = f"Send exactly one {header} header."
            raise MalformedRequest(message, code="duplicate_header", field=header)
    query = request.query
    if len(query) != len(set(query.keys())):
        for name in query:
            if name not in REPEATABLE_PARAMETERS and len(query.getall(name)) > 1:
                raise MalformedRequest(
                    f"The query parameter {name!r} is given more than once; send it once.",
                    code="duplicate_parameter",
                    field=name,
                )


class _ClientGone(Exception):
    """The client disconnected before its request was read: nobody to answer, no server error."""


async def _read_body(request: web.Request, timeout_s: float) -> None:
    """Read (and cache) the body under a deadline, so handlers never wait on a stalled client."""
    try:
        async with asyncio.timeout(timeout_s):
            await request.read()
    except TimeoutError:
        raise web.HTTPRequestTimeout() from None
    except (ConnectionError, RequestPayloadError) as exc:
        transport = request.transport
        if transport is None or transport.is_closing():
            raise _ClientGone from None
        raise MalformedRequest(
            f"The request body could not be read ({type(exc).__name__}); send it whole.",
            code="malformed_body",
        ) from None


def _make_middleware(
    keys: KeyCache,
    rate: OwnerRateLimiter | None,
    cap: JobCap | None,
    byte_cap: JobBytesCap | None,
    body_timeout_s: float,
) -> Middleware:
    holds = RefusalHolds()

    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        started = time.perf_counter()
        response: web.StreamResponse
        authenticated = _needs_auth(request.path)
        try:
            creating = False
            _check_declared_length(request)
            _check_duplicates(request)
            if authenticated:
                key = bearer_key(request.headers.get("Authorization"))
                owner = await keys.owner_for(key)
                request[OWNER] = owner
                request[KEY_ID] = key_prefix(key)  # names the key in change records
                if rate is not None:
                    rate.check(owner)
                creating = request.method == "POST" and request.path == "/v1/jobs"
                if creating and cap is not None:
                    await cap.check(owner)
                if creating and byte_cap is not None:
                    await byte_cap.check(owner)
            if request.can_read_body:
                # After auth and the owner limits: a client without a key costs no body read.
                await _read_body(request, body_timeout_s)
            response = await handler(request)
            if creating and response.status == 201:
                if cap is not None:
                    cap.created(request[OWNER])
                if byte_cap is not None:
                    byte_cap.created(request[OWNER], len(await request.read()))
        except web.HTTPException as exc:
            response = from_http_exception(exc)
            if exc.status in (408, 413):
                response.force_close()  # the rest of the body is not worth waiting for
        except _ClientGone:
            log.debug("%s %s: the client disconnected mid-request", request.method, _route_label(request))
            gone = web.Response(status=400)
            gone.force_close()
            return gone  # not observed: no answer was given, and it is nobody's error here
        except DuetimeError as exc:
            if isinstance(exc, RateLimited) and OWNER in request:
                await holds.hold(request[OWNER])
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
            response = error_response(500, "internal_error", INTERNAL_ERROR_MESSAGE)
        if authenticated:
            response.headers["Cache-Control"] = "no-store"
            if rate is not None and OWNER in request:
                # What the request's work cost beyond its admission, success or refusal alike:
                # its schedule search, the jobs or occurrences it changed, the answer's size.
                cost = request.get(COST)
                body = response.body if isinstance(response, web.Response) else None
                size = len(body) if isinstance(body, bytes) else 0
                extra = (0.0 if cost is None else cost.total_tokens()) + response_tokens(size)
                # The admission token pays for up to one token of work: an ordinary request
                # (a short search, a page under 32 KiB) costs exactly one, as before.
                rate.charge(request[OWNER], extra - 1.0)
        observe(_route_label(request), request.method, response.status, time.perf_counter() - started)
        return response

    return middleware


def create_app(
    registry: ApiStore,
    *,
    policy: AddressPolicy,
    limits: SpecLimits | None = None,
    readiness: Callable[[], Awaitable[None]] | None = None,
    key_cache_ttl_s: float = 5.0,
    owner_rate_per_s: float = 0.0,
    max_jobs_per_owner: int = 0,
    bulk_max: int = 10_000,
    access_log: bool = False,
    max_job_bytes_per_owner: int = 0,
    body_timeout_s: float = 30.0,
    topic_policy: TopicPolicy | None = None,
    metrics_token: str | None = None,
    serve_metrics: bool = True,
    preview_workers: int = 1,
    preview_max_waiting: int = 8,
    preview_per_owner: int = 2,
    preview_processes: bool = True,
) -> web.Application:
    """The API as an aiohttp application; the caller owns the registry's lifetime (the store:
    the registry of jobs and the target health it lists).

    ``readiness`` is an extra probe for /readyz (brokers, engines): it raises when not ready.
    ``key_cache_ttl_s`` bounds how long a revoked key keeps working on this process.
    ``owner_rate_per_s`` (0 = off) and ``max_jobs_per_owner`` (0 = off) are the per-owner limits
    of ``api.limits``; ``bulk_max`` bounds the jobs one bulk call changes (DUETIME_BULK_MAX).
    ``access_log`` writes one ``duetime.access`` line per answer.
    ``body_timeout_s`` bounds the wait for a request body (408 after it).
    ``metrics_token`` (None = open) guards /metrics; ``serve_metrics=False`` leaves /metrics to a
    separate listener (``metrics_app``).
    ``preview_workers``, ``preview_max_waiting`` and ``preview_per_owner`` bound the worker
    processes that compute schedule previews (``api.cpupool``); ``preview_processes=False``
    runs them in threads instead.
    """
    rate = OwnerRateLimiter(owner_rate_per_s, 2 * owner_rate_per_s) if owner_rate_per_s > 0 else None
    cap = JobCap(max_jobs_per_owner, registry.count_active_jobs) if max_jobs_per_owner > 0 else None
    byte_cap = (
        JobBytesCap(max_job_bytes_per_owner, registry.active_job_bytes)
        if max_job_bytes_per_owner > 0
        else None
    )
    keys = KeyCache(registry, ttl_s=key_cache_ttl_s)
    spec_limits = limits if limits is not None else SpecLimits()
    app = web.Application(
        client_max_size=MAX_BODY_BYTES,
        middlewares=[
            request_id_middleware(access_log=access_log),
            _make_middleware(keys, rate, cap, byte_cap, body_timeout_s),
        ],
    )
    topics = topic_policy if topic_policy is not None else TopicPolicy()
    # One seal for every list of this process: the installation's key is read once, lazily.
    cursors = PageCursors(registry.cursor_key)
    jobs_api = JobsApi(
        registry,
        policy=policy,
        limits=spec_limits,
        topics=topics,
        bulk_max=bulk_max,
        cursors=cursors,
        cap=cap,
        byte_cap=byte_cap,
    )
    app.router.add_routes(jobs_api.routes())
    pool = CpuPool(preview_workers, preview_max_waiting, preview_per_owner, processes=preview_processes)

    async def close_pool(_app: web.Application) -> None:
        await pool.close()

    app.on_cleanup.append(close_pool)
    app.router.add_routes(PreviewApi(registry, limits=spec_limits, pool=pool).routes())
    app.router.add_routes(TargetsApi(registry, cursors=cursors).routes())

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

    async def openapi(request: web.Request) -> web.Response:
        return web.Response(body=openapi_body, content_type="application/json")

    app.router.add_get("/healthz", healthz, name="healthz", allow_head=False)
    app.router.add_get("/readyz", readyz, name="readyz", allow_head=False)
    if serve_metrics:
        app.router.add_get("/metrics", metrics_handler(metrics_token), name="metrics", allow_head=False)
    app.router.add_get("/openapi.json", openapi, name="openapi", allow_head=False)
    return app


def metrics_handler(token: str | None) -> Callable[[web.Request], Awaitable[web.Response]]:
    """/metrics, open or behind ``Authorization: Bearer <token>`` (compared in constant time).

    Metrics name routes, owners' traffic volumes and the build: worth keeping from whoever can
    reach the port. The token is the operator's (DUETIME_METRICS_TOKEN), not an owner's API key.
    """
    expected = None if token is None else token.encode()

    def authorized(given: list[str]) -> bool:
        # The scheme is case-insensitive (RFC 9110 §11.1: bearer, BEARER); the token is compared
        # exactly, in constant time.
        assert expected is not None
        scheme, _, credentials = given[0].partition(" ") if len(given) == 1 else ("", "", "")
        matches = hmac.compare_digest(credentials.encode(errors="replace"), expected)
        return scheme.lower() == "bearer" and matches

    async def metrics(request: web.Request) -> web.Response:
        if expected is not None and not authorized(request.headers.getall("Authorization", [])):
            return error_response(
                401,
                "unauthorized",
                "Send the operator's metrics token as 'Authorization: Bearer <token>'.",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return metrics_response()

    return metrics


def metrics_app(token: str | None) -> web.Application:
    """/metrics alone, for the separate listener of DUETIME_METRICS_PORT."""
    app = web.Application()
    app.router.add_get("/metrics", metrics_handler(token), name="metrics", allow_head=False)
    return app
