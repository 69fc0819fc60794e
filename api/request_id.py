"""``X-Request-Id`` on every HTTP answer, and the optional access log.

The outermost middleware of every Duetime HTTP server (the API and the engine's and worker's
/healthz, /readyz, /metrics): it takes the caller's request id when it is 1-128 printable ASCII
characters (a proxy or a client that already tags its requests keeps its id end to end), else
makes one, and puts it in a context variable for the duration of the request. Every log line
written while answering then carries it (``duetime.logs``), the 500 body names it
(``api.errors``), and the answer echoes it: a user who reports a request id lets an operator find
that request's log lines.

It is a middleware of its own, separate from the API's main one, so it also covers the processes
that do not serve /v1 and stays out of the hot path's error mapping.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Middleware

from duetime.api.errors import INTERNAL_ERROR_MESSAGE, error_response
from duetime.logs import ACCESS_LOGGER, request_id_var

REQUEST_ID_HEADER: Final = "X-Request-Id"
MAX_REQUEST_ID_LEN: Final = 128

log = logging.getLogger("duetime.api")
access = logging.getLogger(ACCESS_LOGGER)


def accepted_request_id(value: str | None) -> str | None:
    """The caller's id when it is 1-128 printable ASCII characters (0x20-0x7E), else None."""
    if value is None or not 1 <= len(value) <= MAX_REQUEST_ID_LEN:
        return None
    if not all(0x20 <= ord(c) <= 0x7E for c in value):
        return None
    return value


def new_request_id() -> str:
    """32 hex digits: unique enough to find one request among billions of log lines."""
    return secrets.token_hex(16)


def _route(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return "unmatched" if resource is None else resource.canonical


def request_id_middleware(*, access_log: bool = False) -> Middleware:
    """The middleware; with ``access_log`` it also writes one ``duetime.access`` line per answer
    (method, route template, status, milliseconds; the raw path is left out because it may carry
    query strings nobody wants in a log)."""

    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        rid = accepted_request_id(request.headers.get(REQUEST_ID_HEADER)) or new_request_id()
        token = request_id_var.set(rid)
        started = time.perf_counter()
        status = 500
        try:
            try:
                response = await handler(request)
            except web.HTTPException as exc:
                # aiohttp's own answers (404 of an unknown path on a process without the API's
                # error mapping): they are raised, so the header goes onto the exception.
                exc.headers[REQUEST_ID_HEADER] = rid
                status = exc.status
                raise
            except Exception:
                log.exception("unexpected error in %s %s", request.method, _route(request))
                response = error_response(500, "internal_error", INTERNAL_ERROR_MESSAGE)
            response.headers[REQUEST_ID_HEADER] = rid
            status = response.status
            return response
        finally:
            if access_log:
                access.info(
                    "%s %s %d %.1fms",
                    request.method,
                    _route(request),
                    status,
                    (time.perf_counter() - started) * 1000,
                    extra={
                        "method": request.method,
                        "route": _route(request),
                        "status": status,
                        "duration_ms": round((time.perf_counter() - started) * 1000, 3),
                    },
                )
            request_id_var.reset(token)

    return middleware
