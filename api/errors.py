"""One place that turns every failure into the contract's error body.

Handlers raise ``core.errors`` classes and never build error responses themselves, so the mapping
from class to status lives here alone. aiohttp's own answers (no route, wrong method, body too
large) are rewritten into the same ``{"error": {...}}`` shape, so a client parses one format.
"""

from __future__ import annotations

import json
from typing import Final

from aiohttp import web

from duetime.core.errors import (
    Conflict,
    DuetimeError,
    InvalidRequest,
    MalformedRequest,
    NotFound,
    RateLimited,
    StorageUnavailable,
    Unauthorized,
)
from duetime.logs import request_id_var

JSON_CONTENT_TYPE: Final = "application/json"
# A 500 says nothing about its cause to the caller; the request_id beside it finds the log lines.
INTERNAL_ERROR_MESSAGE: Final = (
    "An unexpected error occurred; the server log has it under this answer's request_id."
)

# Ordered most specific first: TargetNotAllowed is an InvalidRequest, and so on.
_STATUS_BY_CLASS: Final[tuple[tuple[type[DuetimeError], int], ...]] = (
    (MalformedRequest, 400),
    (Unauthorized, 401),
    (NotFound, 404),
    (Conflict, 409),
    (InvalidRequest, 422),
    (RateLimited, 429),
    (StorageUnavailable, 503),
)

# Codes and messages for the answers aiohttp produces itself, before a handler runs.
_HTTP_CODES: Final[dict[int, tuple[str, str]]] = {
    400: ("malformed_request", "The request could not be read."),
    404: ("not_found", "No such resource."),
    405: ("method_not_allowed", "This method is not allowed on this resource."),
    408: ("request_timeout", "The request body did not arrive in time; send it without pausing."),
    413: ("body_too_large", "The request body is larger than the 256 KiB limit."),
    415: ("unsupported_media_type", "The body must be JSON, sent with Content-Type: application/json."),
}


def status_for(error: DuetimeError) -> int:
    """The HTTP status of a domain error; an unclassified ``DuetimeError`` is our fault (500)."""
    for cls, status in _STATUS_BY_CLASS:
        if isinstance(error, cls):
            return status
    return 500


def error_body(code: str, message: str, field: str | None = None, request_id: str | None = None) -> bytes:
    detail: dict[str, str] = {"code": code, "message": message}
    if field is not None:
        detail["field"] = field
    if request_id is not None:
        detail["request_id"] = request_id
    return json.dumps({"error": detail}, ensure_ascii=False, separators=(",", ":")).encode()


def error_response(
    status: int,
    code: str,
    message: str,
    *,
    field: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """The error answer; a 5xx names the request id (the log lines of its failure carry it too)."""
    request_id = request_id_var.get() if status >= 500 else None
    return web.Response(
        status=status,
        body=error_body(code, message, field, request_id),
        content_type=JSON_CONTENT_TYPE,
        headers=headers,
    )


def from_domain_error(error: DuetimeError) -> web.Response:
    status = status_for(error)
    headers: dict[str, str] = {}
    if isinstance(error, Unauthorized):
        headers["WWW-Authenticate"] = "Bearer"
    elif isinstance(error, RateLimited):
        headers["Retry-After"] = str(max(1, error.retry_after_s))
    elif isinstance(error, StorageUnavailable):
        # A client that retries after a short pause usually succeeds: the database is failing over.
        headers["Retry-After"] = "1"
    code = error.code if status != 500 else "internal_error"
    message = error.message if status != 500 else INTERNAL_ERROR_MESSAGE
    return error_response(status, code, message, field=error.field, headers=headers or None)


def from_http_exception(exc: web.HTTPException) -> web.StreamResponse:
    """Rewrite aiohttp's plain-text 4xx/5xx into the JSON error body; keep its headers (Allow)."""
    status = exc.status
    if status < 400:
        return exc
    code, message = _HTTP_CODES.get(status, (_snake(exc.reason), exc.reason or "Request failed."))
    headers = {k: v for k, v in exc.headers.items() if k.lower() not in ("content-type", "content-length")}
    return error_response(status, code, message, headers=headers or None)


def _snake(reason: str | None) -> str:
    if not reason:
        return "http_error"
    return "_".join(reason.lower().replace("-", " ").split())
