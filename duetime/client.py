"""A typed Python client for Duetime's /v1 API: ``DuetimeClient`` (sync) and ``AsyncDuetimeClient``.

Both clients share everything but the transport. Each call is first described as an
``Operation`` (method, path, query, body, whether it is idempotent, and how to read the answer),
so the two clients cannot drift apart in what they send or how they read the answer; the sync
one sends it with ``urllib.request`` (no dependency beyond the standard library), the async one
with aiohttp.

Retries follow the contract's rule that retries happen in one layer only, and only for calls
that are safe to repeat: reads, ``DELETE``, ``PATCH`` (a merge patch applied twice is applied
once), previews, and a create that carries an ``Idempotency-Key``. Those are retried after a
*connection* failure (refused, reset, timed out) and after a 429 or a 503, which say when to come
back (``Retry-After``, honoured up to ``retry_after_max_s``). A create without a key, a pause, a
trigger or a replay are never resent: the first one may have landed.

Without a URL or key the clients read ``DUETIME_URL`` and ``DUETIME_API_KEY``, as ``duetime jobs``
does. The sync client keeps its connections open (HTTP/1.1 keep-alive) and reuses them.

The client imports nothing else of Duetime, so an owner can copy this one file. docs/client.md
has examples.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import http.client
import json
import os
import select
import ssl
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, Generic, Literal, NotRequired, TypedDict, TypeVar

if TYPE_CHECKING:
    import aiohttp

__all__ = [
    "AsyncDuetimeClient",
    "AuthenticationError",
    "BadRequestError",
    "BulkResult",
    "Change",
    "ClientRequestError",
    "ConflictError",
    "CronScheduleSpec",
    "DateRangeSpec",
    "DuetimeApiError",
    "DuetimeClient",
    "DuetimeClientError",
    "DuetimeConnectionError",
    "DuetimeTimeoutError",
    "EveryScheduleSpec",
    "FlowSpec",
    "Job",
    "JobSpec",
    "NotFoundError",
    "OneOffScheduleSpec",
    "Operation",
    "Operations",
    "Page",
    "Preview",
    "PreviewItem",
    "PreviewSkipped",
    "QueueTargetSpec",
    "RateLimitedError",
    "RetrySpec",
    "Run",
    "ServerError",
    "ServiceUnavailableError",
    "ValidationError",
    "WebhookTargetSpec",
]

DEFAULT_URL: Final = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT_S: Final = 30.0
DEFAULT_RETRIES: Final = 2
DEFAULT_RETRY_BACKOFF_S: Final = 0.2
DEFAULT_RETRY_AFTER_MAX_S: Final = 30.0
URL_ENV: Final = "DUETIME_URL"
API_KEY_ENV: Final = "DUETIME_API_KEY"
RETRIED_STATUSES: Final = frozenset({429, 503})
USER_AGENT: Final = "duetime-client/1"
#: The header that carries a change's reason (printable, at most 500 characters): every call that
#: changes a job takes ``reason=``, and the job's change history (``changes()``) keeps it.
REASON_HEADER: Final = "Duetime-Reason"

T = TypeVar("T")

# --- what owners send: the job spec as typed dicts ----------------------------------------------


class FlowSpec(TypedDict):
    """Flow control: the owner's jobs naming ``key`` share these limits across the cluster."""

    key: str
    rate_per_s: float
    parallelism: int


class WebhookTargetSpec(TypedDict):
    type: Literal["webhook"]
    url: str
    method: NotRequired[Literal["POST", "PUT"]]
    headers: NotRequired[dict[str, str]]
    timeout_s: NotRequired[int]
    flow: NotRequired[FlowSpec | None]


class QueueTargetSpec(TypedDict):
    type: Literal["queue"]
    broker: Literal["nats", "redis"]
    topic: str
    flow: NotRequired[FlowSpec | None]


class OneOffScheduleSpec(TypedDict):
    run_at: str


# An inclusive range of local dates ``YYYY-MM-DD`` (the functional form: "from" is a keyword).
DateRangeSpec = TypedDict("DateRangeSpec", {"from": str, "to": str})


class CronScheduleSpec(TypedDict):
    cron: str
    timezone: NotRequired[str]
    start_at: NotRequired[str | None]
    end_at: NotRequired[str | None]
    dst_gap: NotRequired[Literal["shift", "skip"]]
    dst_overlap: NotRequired[Literal["first", "both"]]
    exclude: NotRequired[list[str | DateRangeSpec] | None]


class EveryScheduleSpec(TypedDict):
    """``start_at + k × every`` in exact elapsed time; ``every`` like ``"90m"`` or ``"1h30m"``."""

    every: str
    start_at: NotRequired[str | None]
    end_at: NotRequired[str | None]
    timezone: NotRequired[str]
    exclude: NotRequired[list[str | DateRangeSpec] | None]


class RetrySpec(TypedDict, total=False):
    max_attempts: int
    backoff_initial_s: float
    backoff_max_s: float
    backoff_multiplier: float
    max_duration_s: int | None


class OnFailureSpec(TypedDict):
    """Where failure events go (``job.failing``, ``job.paused``, ``job.recovered``)."""

    target: WebhookTargetSpec | QueueTargetSpec
    after: NotRequired[int]


class JobSpec(TypedDict):
    target: WebhookTargetSpec | QueueTargetSpec
    schedule: OneOffScheduleSpec | CronScheduleSpec | EveryScheduleSpec
    name: NotRequired[str | None]
    labels: NotRequired[dict[str, str]]
    payload: NotRequired[Any]
    retry: NotRequired[RetrySpec]
    misfire: NotRequired[Literal["run_once", "run_all", "skip"]]
    misfire_grace_s: NotRequired[int]
    jitter_s: NotRequired[int]
    spread_s: NotRequired[int]
    overlap: NotRequired[Literal["allow", "skip", "buffer_one"]]
    on_failure: NotRequired[OnFailureSpec | None]
    pause_after_failures: NotRequired[int | None]


# --- errors -------------------------------------------------------------------------------------


class DuetimeClientError(Exception):
    """Root of everything this client raises."""


class DuetimeConnectionError(DuetimeClientError):
    """The server could not be reached or the connection broke; nothing was answered."""

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(message)
        self.message = message
        self.url = url


class DuetimeTimeoutError(DuetimeConnectionError):
    """No answer within the client's timeout. The call may or may not have taken effect."""


class DuetimeApiError(DuetimeClientError):
    """The server answered with an error body: ``{"error": {"code", "message", "field"?}}``."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        field: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        where = f" ({field})" if field else ""
        super().__init__(f"{status} {code}{where}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.retry_after_s = retry_after_s


class ClientRequestError(DuetimeApiError):
    """A 4xx: the request must change before it can succeed."""


class BadRequestError(ClientRequestError):
    """400: malformed JSON or a value of the wrong type."""


class AuthenticationError(ClientRequestError):
    """401: no API key, or an unknown or revoked one."""


class NotFoundError(ClientRequestError):
    """404: no such job for this owner."""


class ConflictError(ClientRequestError):
    """409: the job's state does not allow the call."""


class ValidationError(ClientRequestError):
    """422: readable input with values that cannot be accepted; ``field`` names the culprit."""


class RateLimitedError(ClientRequestError):
    """429: slow down; ``retry_after_s`` says for how long."""


class ServerError(DuetimeApiError):
    """A 5xx: the server's fault or an outage; the request itself may be fine."""


class ServiceUnavailableError(ServerError):
    """503: the database could not be reached; nothing was changed. Retry after ``retry_after_s``."""


_ERRORS_BY_STATUS: Final[dict[int, type[DuetimeApiError]]] = {
    400: BadRequestError,
    401: AuthenticationError,
    404: NotFoundError,
    409: ConflictError,
    422: ValidationError,
    429: RateLimitedError,
    503: ServiceUnavailableError,
}


def retry_after_of(headers: Mapping[str, str], now: datetime | None = None) -> int | None:
    """``Retry-After`` in whole seconds: delay-seconds or an HTTP date (RFC 9110); None if absent."""
    for name, value in headers.items():
        if name.lower() != "retry-after":
            continue
        text = value.strip()
        if text.isdigit():
            return int(text)
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return max(0, int((when - (now or datetime.now(UTC))).total_seconds() + 0.999))
    return None


def error_from_response(status: int, headers: Mapping[str, str], body: bytes) -> DuetimeApiError:
    """The typed error for a non-2xx answer, also when a proxy answered with a non-JSON body."""
    cls = _ERRORS_BY_STATUS.get(status) or (ServerError if status >= 500 else ClientRequestError)
    retry_after = retry_after_of(headers)
    try:
        detail = json.loads(body)["error"]
        code, message = str(detail["code"]), str(detail["message"])
        field_path = detail.get("field")
    except (ValueError, KeyError, TypeError):
        text = body.decode("utf-8", "replace").strip()
        code, message, field_path = f"http_{status}", text[:500] or f"HTTP {status}", None
    return cls(
        status,
        code,
        message,
        field=None if field_path is None else str(field_path),
        retry_after_s=retry_after,
    )


# --- what the server answers ----------------------------------------------------------------------


def _time(value: Any) -> datetime:
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def _opt_time(value: Any) -> datetime | None:
    return None if value is None else _time(value)


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True, slots=True)
class Run:
    """One attempt of one occurrence (or a skipped occurrence); ``raw`` is the JSON as received."""

    scheduled_for: datetime
    attempt: int
    started_at: datetime | None
    finished_at: datetime | None
    outcome: str
    status_code: int | None
    error: str | None
    lateness_ms: int | None
    raw: dict[str, Any] = field(repr=False, compare=False)
    # The job's spec_version the run ran under (None from a server without change history).
    spec_version: int | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Run:
        return cls(
            scheduled_for=_time(data["scheduled_for"]),
            attempt=int(data["attempt"]),
            started_at=_opt_time(data.get("started_at")),
            finished_at=_opt_time(data.get("finished_at")),
            outcome=str(data["outcome"]),
            status_code=data.get("status_code"),
            error=data.get("error"),
            lateness_ms=data.get("lateness_ms"),
            raw=dict(data),
            spec_version=_opt_int(data.get("spec_version")),
        )


@dataclass(frozen=True, slots=True)
class Job:
    """A job as the API shows it; ``raw`` keeps the JSON exactly as received (for printing)."""

    id: str
    owner: str
    name: str | None
    labels: dict[str, str]
    target: dict[str, Any]
    payload: Any
    schedule: dict[str, Any]
    retry: dict[str, Any]
    misfire: str
    misfire_grace_s: int
    jitter_s: int
    overlap: str
    state: str
    next_run_at: datetime | None
    attempt: int
    created_at: datetime
    updated_at: datetime
    last_run: Run | None
    raw: dict[str, Any] = field(repr=False, compare=False)
    # Failure handling: where failure events go ({"target", "after"}) and when the job pauses.
    on_failure: dict[str, Any] | None = None
    pause_after_failures: int | None = None
    # The job's stable spread window (seconds): every occurrence is due at a fixed offset in it.
    spread_s: int = 0
    # 1 at create, one more per change of the spec (None from a server without change history).
    spec_version: int | None = None
    # While paused: {"at", "note", "until", "actor": {"type", "key_id"}}; None otherwise.
    paused: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Job:
        last_run = data.get("last_run")
        return cls(
            id=str(data["id"]),
            owner=str(data["owner"]),
            name=data.get("name"),
            labels=dict(data.get("labels") or {}),
            target=dict(data["target"]),
            payload=data.get("payload"),
            schedule=dict(data["schedule"]),
            retry=dict(data["retry"]),
            misfire=str(data["misfire"]),
            misfire_grace_s=int(data["misfire_grace_s"]),
            jitter_s=int(data["jitter_s"]),
            overlap=str(data.get("overlap", "allow")),
            state=str(data["state"]),
            next_run_at=_opt_time(data.get("next_run_at")),
            attempt=int(data["attempt"]),
            created_at=_time(data["created_at"]),
            updated_at=_time(data["updated_at"]),
            last_run=None if last_run is None else Run.from_json(last_run),
            raw=dict(data),
            on_failure=None if data.get("on_failure") is None else dict(data["on_failure"]),
            pause_after_failures=(
                None if data.get("pause_after_failures") is None else int(data["pause_after_failures"])
            ),
            spread_s=int(data.get("spread_s", 0)),
            spec_version=_opt_int(data.get("spec_version")),
            paused=None if data.get("paused") is None else dict(data["paused"]),
        )


@dataclass(frozen=True, slots=True)
class Change:
    """One record of a job's change history: who changed it (``actor_type`` "owner" with the API
    key's id, or "duetime"), what (``action``), why (``reason``), the job's ``spec_version`` after
    it, and how the spec moved (``diff``: JSON Pointer -> ``{"from", "to"}``, secrets redacted)."""

    seq: int
    at: datetime
    actor_type: str
    key_id: str | None
    action: str
    reason: str | None
    spec_version: int
    diff: dict[str, Any]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Change:
        actor = data.get("actor") or {}
        return cls(
            seq=int(data["seq"]),
            at=_time(data["at"]),
            actor_type=str(actor.get("type")),
            key_id=actor.get("key_id"),
            action=str(data["action"]),
            reason=data.get("reason"),
            spec_version=int(data["spec_version"]),
            diff=dict(data.get("diff") or {}),
            raw=dict(data),
        )


@dataclass(frozen=True, slots=True)
class BulkResult:
    """What a bulk pause, resume or cancel did; call again while ``more`` is true."""

    matched: int
    changed: int
    more: bool
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BulkResult:
        return cls(
            matched=int(data["matched"]),
            changed=int(data["changed"]),
            more=bool(data["more"]),
            raw=dict(data),
        )


@dataclass(frozen=True, slots=True)
class Backfill:
    """What ``backfill_job`` queued: how many occurrences, the oldest and the newest."""

    job_id: str
    start: datetime
    end: datetime
    queued: int
    first: datetime | None
    last: datetime | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Backfill:
        return cls(
            job_id=str(data["job_id"]),
            start=_time(data["from"]),
            end=_time(data["to"]),
            queued=int(data["queued"]),
            first=_opt_time(data.get("first")),
            last=_opt_time(data.get("last")),
            raw=dict(data),
        )


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    items: list[T]
    next_cursor: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class PreviewItem:
    """One occurrence: ``at`` in UTC and ``local`` (naive) on the schedule's wall clock."""

    at: datetime
    local: str
    utc_offset: str
    abbreviation: str | None
    dst: str | None  # None | "gap_shifted" | "overlap_first" | "overlap_second"
    shifted_from: str | None = None
    due_at: datetime | None = None  # job previews: the job's spread and jitter included

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PreviewItem:
        return cls(
            at=_time(data["at"]),
            local=str(data["local"]),
            utc_offset=str(data["utc_offset"]),
            abbreviation=data.get("abbreviation"),
            dst=data.get("dst"),
            shifted_from=data.get("shifted_from"),
            due_at=_opt_time(data.get("due_at")),
        )


@dataclass(frozen=True, slots=True)
class PreviewSkipped:
    """A spring-forward gap whose wall times a ``dst_gap: skip`` schedule drops."""

    at: datetime
    local_from: str
    local_until: str
    first_skipped: str | None
    reason: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PreviewSkipped:
        return cls(
            at=_time(data["at"]),
            local_from=str(data["local_from"]),
            local_until=str(data["local_until"]),
            first_skipped=data.get("first_skipped"),
            reason=str(data["reason"]),
        )


@dataclass(frozen=True, slots=True)
class Preview:
    timezone: str
    start: datetime
    items: list[PreviewItem]
    has_more: bool
    skipped: list[PreviewSkipped]
    job_id: str | None
    state: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)
    truncated: bool = False  # the server's cap on one preview's work cut the list short
    resume_from: datetime | None = None  # when truncated: the ``start`` that lists what follows
    spread_ms: int | None = None  # job previews: the job's fixed offset, in every item's due_at

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Preview:
        return cls(
            timezone=str(data["timezone"]),
            start=_time(data["from"]),
            items=[PreviewItem.from_json(i) for i in data["items"]],
            has_more=bool(data["has_more"]),
            skipped=[PreviewSkipped.from_json(s) for s in data["skipped"]],
            job_id=data.get("job_id"),
            state=data.get("state"),
            raw=dict(data),
            truncated=bool(data.get("truncated", False)),
            resume_from=_opt_time(data.get("resume_from")),
            spread_ms=data.get("spread_ms"),
        )


def _job_page(data: Mapping[str, Any]) -> Page[Job]:
    return Page([Job.from_json(j) for j in data["items"]], data.get("next_cursor"), dict(data))


def _run_page(data: Mapping[str, Any]) -> Page[Run]:
    return Page([Run.from_json(r) for r in data["items"]], data.get("next_cursor"), dict(data))


def _change_page(data: Mapping[str, Any]) -> Page[Change]:
    return Page([Change.from_json(c) for c in data["items"]], data.get("next_cursor"), dict(data))


# --- operations: one description per /v1 call, shared by both clients ------------------------------


@dataclass(frozen=True, slots=True)
class Operation(Generic[T]):
    """One HTTP call and how to read its answer."""

    method: str
    path: str
    parse: Callable[[Any], T]
    query: dict[str, str | list[str]] = field(default_factory=dict)
    body: Any = None
    has_body: bool = False
    headers: dict[str, str] = field(default_factory=dict)
    idempotent: bool = False


def _job_path(job_id: str, suffix: str = "") -> str:
    return "/v1/jobs/" + urllib.parse.quote(job_id, safe="") + suffix


def _name_path(name: str) -> str:
    # A name may hold "/" and ":"; they are sent as they are (the server takes %2F too).
    return "/v1/jobs/by-name/" + urllib.parse.quote(name, safe="/:")


def _reason(reason: str | None, headers: Mapping[str, str] | None = None) -> dict[str, str]:
    """The headers of a call that changes a job: ``headers`` and, when given, its reason."""
    out = dict(headers or {})
    if reason is not None:
        out[REASON_HEADER] = reason
    return out


def _pause_body(note: str | None, until: datetime | str | None) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if note is not None:
        body["note"] = note
    if until is not None:
        body["until"] = _rfc3339(until)
    return body


def _label_query(labels: Mapping[str, str] | None) -> list[str]:
    return [f"{key}={value}" for key, value in (labels or {}).items()]


def _rfc3339(value: datetime | str) -> str:
    if isinstance(value, str):
        return value
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("pass an aware datetime (with a UTC offset), not a naive one")
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _query(**params: str | int | datetime | None) -> dict[str, str | list[str]]:
    out: dict[str, str | list[str]] = {}
    for name, value in params.items():
        if value is None:
            continue
        out[name] = _rfc3339(value) if isinstance(value, datetime) else str(value)
    return out


class Operations:
    """The /v1 calls as ``Operation`` values.

    ``client.send(Operations.get_job(job_id))`` is what ``client.get_job(job_id)`` does.
    """

    @staticmethod
    def create_job(
        spec: Mapping[str, Any], idempotency_key: str | None = None, reason: str | None = None
    ) -> Operation[Job]:
        headers = _reason(reason, {} if idempotency_key is None else {"Idempotency-Key": idempotency_key})
        return Operation(
            "POST",
            "/v1/jobs",
            Job.from_json,
            body=dict(spec),
            has_body=True,
            headers=headers,
            idempotent=idempotency_key is not None,
        )

    @staticmethod
    def get_job(job_id: str) -> Operation[Job]:
        return Operation("GET", _job_path(job_id), Job.from_json, idempotent=True)

    @staticmethod
    def list_jobs(
        state: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        labels: Mapping[str, str] | None = None,
        name_prefix: str | None = None,
    ) -> Operation[Page[Job]]:
        query = _query(state=state, limit=limit, cursor=cursor, name_prefix=name_prefix)
        if labels:
            query["label"] = _label_query(labels)
        return Operation("GET", "/v1/jobs", _job_page, query=query, idempotent=True)

    @staticmethod
    def get_job_by_name(name: str) -> Operation[Job]:
        return Operation("GET", _name_path(name), Job.from_json, idempotent=True)

    @staticmethod
    def put_job_by_name(name: str, spec: Mapping[str, Any], reason: str | None = None) -> Operation[Job]:
        """Create or update the named job; the same PUT twice is the PUT once, so it may be resent."""
        return Operation(
            "PUT",
            _name_path(name),
            Job.from_json,
            body=dict(spec),
            has_body=True,
            headers=_reason(reason),
            idempotent=True,
        )

    @staticmethod
    def bulk_action(
        action: Literal["pause", "resume", "cancel"],
        labels: Mapping[str, str],
        state: str | None = None,
        reason: str | None = None,
        pause: Mapping[str, Any] | None = None,
    ) -> Operation[BulkResult]:
        """``pause``: a bulk pause's ``note`` and ``until`` (see ``pause_job``)."""
        body: dict[str, Any] = {"labels": dict(labels), **(pause or {})}
        if state is not None:
            body["state"] = state
        return Operation(
            "POST",
            f"/v1/jobs/bulk/{action}",
            BulkResult.from_json,
            body=body,
            has_body=True,
            headers=_reason(reason),
        )

    @staticmethod
    def update_job(job_id: str, patch: Mapping[str, Any], reason: str | None = None) -> Operation[Job]:
        return Operation(
            "PATCH",
            _job_path(job_id),
            Job.from_json,
            body=dict(patch),
            has_body=True,
            headers=_reason(reason),
            idempotent=True,
        )

    @staticmethod
    def cancel_job(job_id: str, reason: str | None = None) -> Operation[Job]:
        return Operation("DELETE", _job_path(job_id), Job.from_json, headers=_reason(reason), idempotent=True)

    @staticmethod
    def job_action(
        job_id: str, action: Literal["pause", "resume", "trigger", "replay"], reason: str | None = None
    ) -> Operation[Job]:
        return Operation("POST", _job_path(job_id, "/" + action), Job.from_json, headers=_reason(reason))

    @staticmethod
    def pause_job(
        job_id: str,
        note: str | None = None,
        until: datetime | str | None = None,
        reason: str | None = None,
    ) -> Operation[Job]:
        """Without ``note`` and ``until`` as ``job_action(job_id, "pause")``; with them, the body
        ``{"note", "until"}``: the note is shown while paused, and the server resumes the job at
        ``until`` by itself."""
        body = _pause_body(note, until)
        return Operation(
            "POST",
            _job_path(job_id, "/pause"),
            Job.from_json,
            body=body or None,
            has_body=bool(body),
            headers=_reason(reason),
        )

    @staticmethod
    def backfill_job(
        job_id: str, start: datetime | str, end: datetime | str, reason: str | None = None
    ) -> Operation[Backfill]:
        """Not idempotent (a second call queues the occurrences again), so never resent."""
        body = {"from": _rfc3339(start), "to": _rfc3339(end)}
        return Operation(
            "POST",
            _job_path(job_id, "/backfill"),
            Backfill.from_json,
            body=body,
            has_body=True,
            headers=_reason(reason),
        )

    @staticmethod
    def list_runs(job_id: str, limit: int | None = None, cursor: str | None = None) -> Operation[Page[Run]]:
        query = _query(limit=limit, cursor=cursor)
        return Operation("GET", _job_path(job_id, "/runs"), _run_page, query=query, idempotent=True)

    @staticmethod
    def list_changes(
        job_id: str, limit: int | None = None, cursor: str | None = None
    ) -> Operation[Page[Change]]:
        query = _query(limit=limit, cursor=cursor)
        return Operation("GET", _job_path(job_id, "/changes"), _change_page, query=query, idempotent=True)

    @staticmethod
    def preview_schedule(
        schedule: Mapping[str, Any], count: int | None = None, start: datetime | str | None = None
    ) -> Operation[Preview]:
        body: dict[str, Any] = {"schedule": dict(schedule)}
        if count is not None:
            body["count"] = count
        if start is not None:
            body["from"] = _rfc3339(start)
        return Operation(
            "POST", "/v1/schedules/preview", Preview.from_json, body=body, has_body=True, idempotent=True
        )

    @staticmethod
    def preview_job(
        job_id: str, count: int | None = None, start: datetime | str | None = None
    ) -> Operation[Preview]:
        query = _query(count=count, **{"from": start})
        return Operation(
            "GET", _job_path(job_id, "/preview"), Preview.from_json, query=query, idempotent=True
        )


# --- the shared part of both clients --------------------------------------------------------------


def _pages(fetch: Callable[[str | None], Page[T]]) -> Iterator[T]:
    """Every item of a listing, following ``next_cursor`` until the last page."""
    cursor: str | None = None
    while True:
        page = fetch(cursor)
        yield from page.items
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


async def _async_pages(fetch: Callable[[str | None], Awaitable[Page[T]]]) -> AsyncIterator[T]:
    cursor: str | None = None
    while True:
        page = await fetch(cursor)
        for item in page.items:
            yield item
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


class _Base:
    def __init__(
        self,
        url: str | None = None,
        key: str | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retries: int = DEFAULT_RETRIES,
        retry_backoff_s: float = DEFAULT_RETRY_BACKOFF_S,
        retry_after_max_s: float = DEFAULT_RETRY_AFTER_MAX_S,
    ) -> None:
        """``url`` defaults to ``$DUETIME_URL``, else http://127.0.0.1:8080; ``key`` to
        ``$DUETIME_API_KEY``. A 429 or 503 asking to wait longer than ``retry_after_max_s`` is
        raised at once rather than waited for."""
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        if retries < 0:
            raise ValueError("retries must be 0 or more")
        if retry_after_max_s < 0:
            raise ValueError("retry_after_max_s must be 0 or more")
        self.url = (url or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/")
        self._key = key if key is not None else (os.environ.get(API_KEY_ENV) or None)
        self.timeout_s = timeout_s
        self.retries = retries
        self.retry_backoff_s = retry_backoff_s
        self.retry_after_max_s = retry_after_max_s

    def _url_for(self, op: Operation[Any]) -> str:
        url = self.url + op.path
        return url + "?" + urllib.parse.urlencode(op.query, doseq=True) if op.query else url

    def _headers_for(self, op: Operation[Any]) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT, **op.headers}
        if self._key is not None:
            headers["Authorization"] = f"Bearer {self._key}"
        if op.has_body:
            headers["Content-Type"] = "application/json"
        return headers

    @staticmethod
    def _body_for(op: Operation[Any]) -> bytes | None:
        if not op.has_body:
            return None
        return json.dumps(op.body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()

    def _attempts(self, op: Operation[Any]) -> int:
        return 1 + (self.retries if op.idempotent else 0)

    def _delay(self, attempt: int) -> float:
        return float(self.retry_backoff_s * (2 ** (attempt - 1)))

    def _answer_delay(
        self, op: Operation[Any], attempt: int, status: int, headers: Mapping[str, str]
    ) -> float | None:
        """How long to wait before resending after this answer, or None to return it as it is.

        Only a 429 or 503 to a call that is safe to repeat is resent, after its ``Retry-After``
        (else the backoff); one that asks for more than ``retry_after_max_s`` is not waited for."""
        if status not in RETRIED_STATUSES or attempt >= self._attempts(op):
            return None
        after = retry_after_of(headers)
        delay = float(after) if after is not None else self._delay(attempt)
        return None if delay > self.retry_after_max_s else delay

    @staticmethod
    def _read(op: Operation[T], status: int, headers: Mapping[str, str], body: bytes) -> T:
        if not 200 <= status < 300:
            raise error_from_response(status, headers, body)
        try:
            data = json.loads(body)
        except ValueError:
            raise DuetimeApiError(status, "invalid_response", "The answer is not JSON.") from None
        return op.parse(data)


# --- sync -------------------------------------------------------------------------------------------


class DuetimeClient(_Base):
    """Blocking client on ``http.client``: keeps its connections open and reuses them.

    Safe to share between threads (each call takes an idle connection or opens one); ``close()``
    (or ``with``) closes the idle ones.

    >>> client = DuetimeClient("http://127.0.0.1:8080", key="dt_...")
    >>> job = client.create_job({"target": {...}, "schedule": {"cron": "0 3 * * *"}})
    """

    MAX_IDLE = 8

    def __init__(
        self,
        url: str | None = None,
        key: str | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retries: int = DEFAULT_RETRIES,
        retry_backoff_s: float = DEFAULT_RETRY_BACKOFF_S,
        retry_after_max_s: float = DEFAULT_RETRY_AFTER_MAX_S,
    ) -> None:
        super().__init__(
            url,
            key,
            timeout_s=timeout_s,
            retries=retries,
            retry_backoff_s=retry_backoff_s,
            retry_after_max_s=retry_after_max_s,
        )
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url must be http:// or https:// with a host, not {self.url!r}")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def __enter__(self) -> DuetimeClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        # A client dropped without close() (the common case in scripts) closes its idle sockets
        # itself rather than leaving them to the garbage collector's ResourceWarning.
        with contextlib.suppress(Exception):
            self.close()

    def close(self) -> None:
        """Close the idle connections (a later call opens a new one)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def send(self, op: Operation[T]) -> T:
        attempt = 1
        while True:
            try:
                status, headers, body = self._transport(op)
            except DuetimeConnectionError:
                if attempt >= self._attempts(op):
                    raise
                time.sleep(self._delay(attempt))
                attempt += 1
                continue
            delay = self._answer_delay(op, attempt, status, headers)
            if delay is None:
                return self._read(op, status, headers, body)
            time.sleep(delay)
            attempt += 1

    def _connection(self) -> http.client.HTTPConnection:
        """An idle connection the server has not closed meanwhile, else a new one."""
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                break
            if _still_open(conn):
                conn.timeout = self.timeout_s
                if conn.sock is not None:
                    conn.sock.settimeout(self.timeout_s)
                return conn
            conn.close()
        if self._https:
            return http.client.HTTPSConnection(
                self._host, self._port, timeout=self.timeout_s, context=ssl.create_default_context()
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=self.timeout_s)

    def _release(self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse) -> None:
        if response.will_close:
            conn.close()
            return
        with self._lock:
            if len(self._idle) < self.MAX_IDLE:
                self._idle.append(conn)
                return
        conn.close()

    def _transport(self, op: Operation[Any]) -> tuple[int, dict[str, str], bytes]:
        url = self._url_for(op)
        target = urllib.parse.urlsplit(url)
        path = target.path + (f"?{target.query}" if target.query else "")
        conn = self._connection()
        try:
            # No redirect is followed (http.client follows none): a 3xx would carry the key elsewhere.
            headers: dict[str, str | bytes] = {
                # http.client would send a str as Latin-1 (or fail): a reason goes as UTF-8 bytes,
                # as aiohttp sends it and the server reads it.
                k: (v if v.isascii() else v.encode())
                for k, v in self._headers_for(op).items()
            }
            conn.request(op.method, path, body=self._body_for(op), headers=headers)
            response = conn.getresponse()
            body = response.read()
        except TimeoutError as exc:
            conn.close()
            raise DuetimeTimeoutError(
                f"no answer from {self.url} within {self.timeout_s:g} s", url=url
            ) from exc
        except ConnectionRefusedError as exc:
            conn.close()
            raise DuetimeConnectionError(f"cannot reach {self.url}: {exc}", url=url) from exc
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise DuetimeConnectionError(f"connection to {self.url} failed: {exc!r}", url=url) from exc
        self._release(conn, response)
        return response.status, dict(response.headers.items()), body

    # The calls, one per /v1 endpoint.

    def create_job(
        self,
        spec: JobSpec | Mapping[str, Any],
        *,
        idempotency_key: str | None = None,
        reason: str | None = None,
    ) -> Job:
        """``reason`` (here and on every call that changes a job): why, kept in its change history."""
        return self.send(Operations.create_job(spec, idempotency_key, reason))

    def get_job(self, job_id: str) -> Job:
        return self.send(Operations.get_job(job_id))

    def list_jobs(
        self,
        *,
        state: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        labels: Mapping[str, str] | None = None,
        name_prefix: str | None = None,
    ) -> Page[Job]:
        return self.send(Operations.list_jobs(state, limit, cursor, labels, name_prefix))

    def iter_jobs(
        self,
        *,
        state: str | None = None,
        page_size: int | None = None,
        labels: Mapping[str, str] | None = None,
        name_prefix: str | None = None,
    ) -> Iterator[Job]:
        """Every job (of ``state``, carrying ``labels``), following ``next_cursor`` page by page."""
        return _pages(
            lambda cursor: self.list_jobs(
                state=state, limit=page_size, cursor=cursor, labels=labels, name_prefix=name_prefix
            )
        )

    def get_job_by_name(self, name: str) -> Job:
        return self.send(Operations.get_job_by_name(name))

    def put_job_by_name(
        self, name: str, spec: JobSpec | Mapping[str, Any], *, reason: str | None = None
    ) -> Job:
        return self.send(Operations.put_job_by_name(name, spec, reason))

    def bulk_pause(
        self,
        labels: Mapping[str, str],
        *,
        state: str | None = None,
        note: str | None = None,
        until: datetime | str | None = None,
        reason: str | None = None,
    ) -> BulkResult:
        """Pause every scheduled job carrying ``labels``; ``note`` and ``until`` as for ``pause_job``."""
        return self.send(Operations.bulk_action("pause", labels, state, reason, _pause_body(note, until)))

    def bulk_resume(
        self, labels: Mapping[str, str], *, state: str | None = None, reason: str | None = None
    ) -> BulkResult:
        return self.send(Operations.bulk_action("resume", labels, state, reason))

    def bulk_cancel(
        self, labels: Mapping[str, str], *, state: str | None = None, reason: str | None = None
    ) -> BulkResult:
        return self.send(Operations.bulk_action("cancel", labels, state, reason))

    def update_job(self, job_id: str, patch: Mapping[str, Any], *, reason: str | None = None) -> Job:
        return self.send(Operations.update_job(job_id, patch, reason))

    def cancel_job(self, job_id: str, *, reason: str | None = None) -> Job:
        return self.send(Operations.cancel_job(job_id, reason))

    def pause_job(
        self,
        job_id: str,
        *,
        note: str | None = None,
        until: datetime | str | None = None,
        reason: str | None = None,
    ) -> Job:
        """Pause the job: ``note`` is shown in its ``paused`` while paused, and at ``until`` (an
        aware datetime or RFC 3339) the server resumes it by itself."""
        return self.send(Operations.pause_job(job_id, note, until, reason))

    def resume_job(self, job_id: str, *, reason: str | None = None) -> Job:
        return self.send(Operations.job_action(job_id, "resume", reason))

    def trigger_job(self, job_id: str, *, reason: str | None = None) -> Job:
        return self.send(Operations.job_action(job_id, "trigger", reason))

    def replay_job(self, job_id: str, *, reason: str | None = None) -> Job:
        return self.send(Operations.job_action(job_id, "replay", reason))

    def backfill_job(
        self, job_id: str, start: datetime | str, end: datetime | str, *, reason: str | None = None
    ) -> Backfill:
        """Run every occurrence of a recurring job in [start, end) again (see docs/api.md)."""
        return self.send(Operations.backfill_job(job_id, start, end, reason))

    def list_runs(self, job_id: str, *, limit: int | None = None, cursor: str | None = None) -> Page[Run]:
        return self.send(Operations.list_runs(job_id, limit, cursor))

    def iter_runs(self, job_id: str, *, page_size: int | None = None) -> Iterator[Run]:
        """The job's whole history, newest first."""
        return _pages(lambda cursor: self.list_runs(job_id, limit=page_size, cursor=cursor))

    def changes(self, job_id: str, *, limit: int | None = None, cursor: str | None = None) -> Page[Change]:
        """A page of the job's change history, newest first (``iter_changes`` walks all of it)."""
        return self.send(Operations.list_changes(job_id, limit, cursor))

    def iter_changes(self, job_id: str, *, page_size: int | None = None) -> Iterator[Change]:
        """The job's whole change history, newest first."""
        return _pages(lambda cursor: self.changes(job_id, limit=page_size, cursor=cursor))

    def preview_schedule(
        self,
        schedule: OneOffScheduleSpec | CronScheduleSpec | EveryScheduleSpec | Mapping[str, Any],
        *,
        count: int | None = None,
        start: datetime | str | None = None,
    ) -> Preview:
        return self.send(Operations.preview_schedule(schedule, count, start))

    def preview_job(
        self, job_id: str, *, count: int | None = None, start: datetime | str | None = None
    ) -> Preview:
        return self.send(Operations.preview_job(job_id, count, start))


def _still_open(conn: http.client.HTTPConnection) -> bool:
    """False when the server closed an idle connection (it is readable: EOF or stray bytes), the
    check urllib3 makes before reusing one, so a request is not sent into a closed socket."""
    sock = conn.sock
    if sock is None:
        return False
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


# --- async ------------------------------------------------------------------------------------------


class AsyncDuetimeClient(_Base):
    """Client on aiohttp, one pooled session; use ``async with`` or call ``close()``.

    >>> async with AsyncDuetimeClient("http://127.0.0.1:8080", key="dt_...") as client:
    ...     job = await client.get_job(job_id)
    """

    def __init__(
        self,
        url: str | None = None,
        key: str | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retries: int = DEFAULT_RETRIES,
        retry_backoff_s: float = DEFAULT_RETRY_BACKOFF_S,
        retry_after_max_s: float = DEFAULT_RETRY_AFTER_MAX_S,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        """``session``: share one you own (it is then not closed here); else one is made on first use."""
        super().__init__(
            url,
            key,
            timeout_s=timeout_s,
            retries=retries,
            retry_backoff_s=retry_backoff_s,
            retry_after_max_s=retry_after_max_s,
        )
        self._session = session
        self._owns_session = session is None

    async def __aenter__(self) -> AsyncDuetimeClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def send(self, op: Operation[T]) -> T:
        attempt = 1
        while True:
            try:
                status, headers, body = await self._transport(op)
            except DuetimeConnectionError:
                if attempt >= self._attempts(op):
                    raise
                await asyncio.sleep(self._delay(attempt))
                attempt += 1
                continue
            delay = self._answer_delay(op, attempt, status, headers)
            if delay is None:
                return self._read(op, status, headers, body)
            await asyncio.sleep(delay)
            attempt += 1

    async def _transport(self, op: Operation[Any]) -> tuple[int, dict[str, str], bytes]:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession()
            # aiohttp silently resends an idempotent request once when a pooled connection drops;
            # retries belong to this client alone (``retries``), so turn that off where it exists.
            if hasattr(self._session, "_retry_connection"):
                self._session._retry_connection = False
        url = self._url_for(op)
        try:
            async with self._session.request(
                op.method,
                url,
                data=self._body_for(op),
                headers=self._headers_for(op),
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                allow_redirects=False,
            ) as response:
                return response.status, dict(response.headers.items()), await response.read()
        except TimeoutError as exc:
            raise DuetimeTimeoutError(
                f"no answer from {self.url} within {self.timeout_s:g} s", url=url
            ) from exc
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError) as exc:
            raise DuetimeConnectionError(f"cannot reach {self.url}: {exc}", url=url) from exc

    async def create_job(
        self,
        spec: JobSpec | Mapping[str, Any],
        *,
        idempotency_key: str | None = None,
        reason: str | None = None,
    ) -> Job:
        return await self.send(Operations.create_job(spec, idempotency_key, reason))

    async def get_job(self, job_id: str) -> Job:
        return await self.send(Operations.get_job(job_id))

    async def list_jobs(
        self,
        *,
        state: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        labels: Mapping[str, str] | None = None,
        name_prefix: str | None = None,
    ) -> Page[Job]:
        return await self.send(Operations.list_jobs(state, limit, cursor, labels, name_prefix))

    def iter_jobs(
        self,
        *,
        state: str | None = None,
        page_size: int | None = None,
        labels: Mapping[str, str] | None = None,
        name_prefix: str | None = None,
    ) -> AsyncIterator[Job]:
        """Every job (of ``state``, carrying ``labels``), following ``next_cursor`` page by page."""
        return _async_pages(
            lambda cursor: self.list_jobs(
                state=state, limit=page_size, cursor=cursor, labels=labels, name_prefix=name_prefix
            )
        )

    async def get_job_by_name(self, name: str) -> Job:
        return await self.send(Operations.get_job_by_name(name))

    async def put_job_by_name(
        self, name: str, spec: JobSpec | Mapping[str, Any], *, reason: str | None = None
    ) -> Job:
        return await self.send(Operations.put_job_by_name(name, spec, reason))

    async def bulk_pause(
        self,
        labels: Mapping[str, str],
        *,
        state: str | None = None,
        note: str | None = None,
        until: datetime | str | None = None,
        reason: str | None = None,
    ) -> BulkResult:
        """Pause every scheduled job carrying ``labels``; ``note`` and ``until`` as for ``pause_job``."""
        return await self.send(
            Operations.bulk_action("pause", labels, state, reason, _pause_body(note, until))
        )

    async def bulk_resume(
        self, labels: Mapping[str, str], *, state: str | None = None, reason: str | None = None
    ) -> BulkResult:
        return await self.send(Operations.bulk_action("resume", labels, state, reason))

    async def bulk_cancel(
        self, labels: Mapping[str, str], *, state: str | None = None, reason: str | None = None
    ) -> BulkResult:
        return await self.send(Operations.bulk_action("cancel", labels, state, reason))

    async def update_job(self, job_id: str, patch: Mapping[str, Any], *, reason: str | None = None) -> Job:
        return await self.send(Operations.update_job(job_id, patch, reason))

    async def cancel_job(self, job_id: str, *, reason: str | None = None) -> Job:
        return await self.send(Operations.cancel_job(job_id, reason))

    async def pause_job(
        self,
        job_id: str,
        *,
        note: str | None = None,
        until: datetime | str | None = None,
        reason: str | None = None,
    ) -> Job:
        """Pause the job: ``note`` is shown in its ``paused`` while paused, and at ``until`` (an
        aware datetime or RFC 3339) the server resumes it by itself."""
        return await self.send(Operations.pause_job(job_id, note, until, reason))

    async def resume_job(self, job_id: str, *, reason: str | None = None) -> Job:
        return await self.send(Operations.job_action(job_id, "resume", reason))

    async def trigger_job(self, job_id: str, *, reason: str | None = None) -> Job:
        return await self.send(Operations.job_action(job_id, "trigger", reason))

    async def replay_job(self, job_id: str, *, reason: str | None = None) -> Job:
        return await self.send(Operations.job_action(job_id, "replay", reason))

    async def backfill_job(
        self, job_id: str, start: datetime | str, end: datetime | str, *, reason: str | None = None
    ) -> Backfill:
        """Run every occurrence of a recurring job in [start, end) again (see docs/api.md)."""
        return await self.send(Operations.backfill_job(job_id, start, end, reason))

    async def list_runs(
        self, job_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> Page[Run]:
        return await self.send(Operations.list_runs(job_id, limit, cursor))

    def iter_runs(self, job_id: str, *, page_size: int | None = None) -> AsyncIterator[Run]:
        """The job's whole history, newest first."""
        return _async_pages(lambda cursor: self.list_runs(job_id, limit=page_size, cursor=cursor))

    async def changes(
        self, job_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> Page[Change]:
        """A page of the job's change history, newest first (``iter_changes`` walks all of it)."""
        return await self.send(Operations.list_changes(job_id, limit, cursor))

    def iter_changes(self, job_id: str, *, page_size: int | None = None) -> AsyncIterator[Change]:
        """The job's whole change history, newest first."""
        return _async_pages(lambda cursor: self.changes(job_id, limit=page_size, cursor=cursor))

    async def preview_schedule(
        self,
        schedule: OneOffScheduleSpec | CronScheduleSpec | EveryScheduleSpec | Mapping[str, Any],
        *,
        count: int | None = None,
        start: datetime | str | None = None,
    ) -> Preview:
        return await self.send(Operations.preview_schedule(schedule, count, start))

    async def preview_job(
        self, job_id: str, *, count: int | None = None, start: datetime | str | None = None
    ) -> Preview:
        return await self.send(Operations.preview_job(job_id, count, start))
