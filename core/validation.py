"""Untrusted decoded JSON in, frozen ``core.model`` records out: the only door into the domain.

Everything an owner sends is judged here once, so storage, engine and workers can trust a
``JobSpec`` without re-checking it. The rules follow the "Job spec" section of
/work/shared/design/api-v1.md; docs/api-errors.md lists every error code with an example.

Two error classes, by what the client has to fix:
- ``MalformedRequest`` (HTTP 400, code ``wrong_type``): the JSON has the wrong shape: a string
  where an object belongs, a boolean or a fractional number where an integer belongs. Python's
  ``True`` is an ``int`` and ``5.0 == 5``, so both are refused explicitly: an integer field takes
  only a JSON integer (write ``5``, not ``5.0`` or ``true``).
- ``InvalidRequest`` (HTTP 422): the shape is right but a value is not acceptable. Its ``code``
  says which rule failed, its ``field`` names the path (``target.headers.X-Foo``), and its
  message says what to change. ``unknown_field`` and ``missing_field`` are 422 as well: the JSON
  is readable, it just does not describe a job.

Only the first problem found is reported, in the contract's field order, so one request gives
one stable answer. Messages never quote header values or the payload: those may be secrets.
"""

from __future__ import annotations

import copy
import difflib
import enum
import hashlib
import itertools
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from ipaddress import IPv6Address
from typing import Any, NoReturn, TypeVar

from duetime.core.codec import REDACTED, format_time
from duetime.core.errors import InvalidRequest, MalformedRequest
from duetime.core.headers import is_reserved_header
from duetime.core.interval import parse_every
from duetime.core.labels import parse_labels, parse_name, refuse_dot_segments
from duetime.core.model import (
    Broker,
    CronSchedule,
    DateRange,
    DstGap,
    DstOverlap,
    Flow,
    IntervalSchedule,
    JobSpec,
    Misfire,
    OneOffSchedule,
    OnFailure,
    Overlap,
    PauseRequest,
    QueueTarget,
    RetryPolicy,
    Schedule,
    Target,
    WebhookMethod,
    WebhookTarget,
)
from duetime.core.schedule import check_cron_schedule, check_interval_schedule, load_zone, occurrences
from duetime.core.topics import broker_refusal
from duetime.core.weburl import split_webhook_url
from duetime.core.workbudget import WorkBudget

E = TypeVar("E", bound=enum.Enum)


@dataclass(frozen=True, slots=True)
class SpecLimits:
    """Bounds on what one job may ask for; the defaults are the API contract's numbers.

    Ranges are inclusive ``(low, high)``. Limits the contract does not state are chosen so that
    no accepted value can overflow later arithmetic (a backoff of 1e300 seconds is not a date).
    """

    payload_max_bytes: int = 65536  # UTF-8 size of the compact JSON encoding of ``payload``
    name_max: int = 200  # characters (code points)
    headers_max_count: int = 50
    header_name_max: int = 256
    header_value_max: int = 8192  # characters
    url_max: int = 2048  # characters
    topic_max: int = 255  # characters
    flow_key_max: int = 100  # characters (code points) of target.flow.key
    flow_rate_range: tuple[float, float] = (0.01, 10000.0)  # target.flow.rate_per_s, calls a second
    flow_parallelism_range: tuple[int, int] = (1, 10000)  # target.flow.parallelism, calls at once
    max_attempts_range: tuple[int, int] = (1, 100)
    jitter_s_range: tuple[int, int] = (0, 3600)
    spread_s_range: tuple[int, int] = (0, 3600)
    misfire_grace_s_range: tuple[int, int] = (0, 86400)
    timeout_s_range: tuple[int, int] = (1, 300)
    backoff_s_max: float = 31_536_000.0  # one year: bound for backoff_initial_s and backoff_max_s
    backoff_multiplier_max: float = 100.0
    run_at_horizon_days: int = 3650  # a run_at later than now + this is refused
    backfill_max_occurrences: int = 1000  # per backfill call, and waiting per job at a time
    backfill_pace_per_s: float = 10.0  # overlap=allow: backfilled runs start at most this fast
    min_cron_interval_s: int = 0  # operator setting: >0 refuses crons that fire more often
    max_pending_triggers: int = 100  # operator setting: triggered runs one job may have waiting


TOP_LEVEL_FIELDS = (
    "name",
    "labels",
    "target",
    "payload",
    "schedule",
    "retry",
    "misfire",
    "misfire_grace_s",
    "jitter_s",
    "spread_s",
    "overlap",
    "on_failure",
    "pause_after_failures",
)
ON_FAILURE_FIELDS = ("target", "after")
FAILURE_COUNT_RANGE = (1, 1000)  # on_failure.after and pause_after_failures
WEBHOOK_FIELDS = ("type", "url", "method", "headers", "timeout_s", "flow")
QUEUE_FIELDS = ("type", "broker", "topic", "flow")
FLOW_FIELDS = ("key", "rate_per_s", "parallelism")
CRON_FIELDS = ("cron", "timezone", "start_at", "end_at", "dst_gap", "dst_overlap", "exclude")
EVERY_FIELDS = ("every", "start_at", "end_at", "timezone", "exclude")
SCHEDULE_FIELDS = (
    "run_at",
    "cron",
    "every",
    "timezone",
    "start_at",
    "end_at",
    "dst_gap",
    "dst_overlap",
    "exclude",
)
MAX_EXCLUDE = 1000
_LOCAL_DATE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})", re.ASCII)
RETRY_FIELDS = ("max_attempts", "backoff_initial_s", "backoff_max_s", "backoff_multiplier", "max_duration_s")
MAX_DURATION_S_RANGE = (1, 2_592_000)


EARLIEST_TIME = datetime(1970, 1, 1, tzinfo=UTC)
_INTERVAL_SAMPLE = 100

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_NATS_SUBJECT = re.compile(r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*")
_HOST_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})?",
    re.ASCII,
)


# --- error helpers ----------------------------------------------------------------------------


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _wrong_type(field: str | None, expected: str, value: object) -> NoReturn:
    where = field or "the request body"
    raise MalformedRequest(
        f"{where} must be {expected}, not {_json_type(value)}", code="wrong_type", field=field
    )


def _invalid(field: str, message: str, code: str = "invalid_value") -> NoReturn:
    raise InvalidRequest(message, code=code, field=field)


def _path(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _object(value: object, field: str | None, what: str = "an object") -> dict[str, Any]:
    if not isinstance(value, dict):
        _wrong_type(field, what, value)
    return value


def _check_keys(obj: dict[str, Any], allowed: Iterable[str], prefix: str) -> None:
    allowed = tuple(allowed)
    for key in obj:
        if key in allowed:
            continue
        hint = difflib.get_close_matches(str(key), allowed, n=1)
        suggestion = f"did you mean {hint[0]!r}? " if hint else ""
        _invalid(
            _path(prefix, str(key)),
            f"unknown field {_path(prefix, str(key))!r}; {suggestion}allowed here: {', '.join(allowed)}",
            "unknown_field",
        )


def _require(obj: dict[str, Any], key: str, prefix: str) -> Any:
    if key not in obj:
        _invalid(_path(prefix, key), f"{_path(prefix, key)} is required", "missing_field")
    return obj[key]


# --- scalar readers ---------------------------------------------------------------------------


def _plain_text(value: str, field: str, code: str = "invalid_value") -> str:
    """Refuse NUL bytes and lone surrogates, which JSON can carry but no store or wire can."""
    if "\x00" in value:
        _invalid(field, f"{field} must not contain NUL (\\u0000) characters", code)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        _invalid(
            field,
            f"{field} contains a lone UTF-16 surrogate (such as \\ud800); send valid Unicode text",
            code,
        )
    return value


def _string(value: object, field: str) -> str:
    if not isinstance(value, str):
        _wrong_type(field, "a string", value)
    return _plain_text(value, field)


def _finite(value: float, field: str) -> None:
    if not math.isfinite(value):
        _invalid(field, f"{field} must be a finite number; NaN and Infinity are not JSON numbers")


def _integer(value: object, field: str, bounds: tuple[int, int]) -> int:
    low, high = bounds
    if isinstance(value, bool):
        _wrong_type(field, f"an integer from {low} to {high}", value)
    if isinstance(value, float):
        _finite(value, field)
        raise MalformedRequest(
            f"{field} must be a whole number written without a fraction or exponent "
            f"(write {int(value) if value.is_integer() else low}, not {value!r})",
            code="wrong_type",
            field=field,
        )
    if not isinstance(value, int):
        _wrong_type(field, f"an integer from {low} to {high}", value)
    if not low <= value <= high:
        shown = value if abs(value) < 10**12 else "a very large number"
        _invalid(field, f"{field} must be from {low} to {high}, got {shown}")
    return value


def _positive_number(value: object, field: str, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        _wrong_type(field, "a number", value)
    if isinstance(value, float):
        _finite(value, field)
    if not 0 < value <= high:
        shown = value if abs(value) < 10**12 else "a very large number"
        _invalid(field, f"{field} must be greater than 0 and at most {high:g}, got {shown}")
    return float(value)


def _bounded_number(value: object, field: str, bounds: tuple[float, float]) -> float:
    """A JSON number (integer or fraction) from ``low`` to ``high``, both included."""
    low, high = bounds
    if isinstance(value, bool) or not isinstance(value, int | float):
        _wrong_type(field, f"a number from {low:g} to {high:g}", value)
    if isinstance(value, float):
        _finite(value, field)
    if not low <= value <= high:
        shown = value if abs(value) < 10**12 else "a very large number"
        _invalid(field, f"{field} must be from {low:g} to {high:g}, got {shown}")
    return float(value)


def _choice(value: object, field: str, kind: type[E]) -> E:
    options = " | ".join(str(m.value) for m in kind)
    if not isinstance(value, str):
        _wrong_type(field, f"one of the strings {options}", value)
    try:
        return kind(value)
    except ValueError:
        _invalid(field, f"{field} must be one of {options}, got {value[:50]!r}")


def parse_time(value: object, field: str) -> datetime:
    """An RFC 3339 timestamp with a required offset, as an aware UTC datetime.

    Any offset is accepted (``-00:00`` reads as UTC); fractions finer than a microsecond are
    truncated. A leap second (``:60``) cannot be represented and is refused.
    """
    if not isinstance(value, str):
        _wrong_type(field, "an RFC 3339 timestamp string", value)
    match = _RFC3339.fullmatch(value)
    example = "2026-12-01T09:30:00Z or 2026-12-01T10:30:00+01:00"
    if match is None:
        _invalid(field, f"{field} is not an RFC 3339 timestamp; write e.g. {example}", "invalid_time")
    year, month, day, hour, minute, second, fraction, offset = match.groups()
    if offset is None:
        _invalid(
            field,
            f"{field} has no UTC offset; add Z or an offset such as +01:00 (e.g. {example})",
            "invalid_time",
        )
    if second == "60":
        _invalid(field, f"{field}: leap seconds (:60) are not supported", "invalid_time")
    micro = int((fraction[1:] + "000000")[:6]) if fraction else 0
    if offset in ("Z", "z"):
        delta = timedelta(0)
    else:
        sign = -1 if offset[0] == "-" else 1
        off_h, off_m = int(offset[1:3]), int(offset[4:6])
        if off_h > 23 or off_m > 59:
            _invalid(field, f"{field} has an impossible UTC offset {offset}", "invalid_time")
        delta = sign * timedelta(hours=off_h, minutes=off_m)
    try:
        local = datetime(
            int(year), int(month), int(day), int(hour), int(minute), int(second), micro, tzinfo=UTC
        )
        result = local - delta
    except (ValueError, OverflowError) as exc:
        _invalid(field, f"{field} is not a real date and time ({exc})", "invalid_time")
    if result < EARLIEST_TIME:
        _invalid(field, f"{field} is before 1970-01-01T00:00:00Z; check the year", "invalid_time")
    return result


# --- target -----------------------------------------------------------------------------------


def _check_host(host: str, field: str) -> None:
    """Syntax only; whether the host may be called is core.ssrf's question."""
    if host.startswith("["):
        inner = host[1:-1] if host.endswith("]") else ""
        address = inner.replace("%25", "%").partition("%")[0]
        try:
            IPv6Address(address)
        except ValueError:
            _invalid(field, f"{field} has an invalid IPv6 literal {host[:60]!r}", "invalid_url")
        return
    if "%" in host:
        _invalid(field, f"{field}: percent-encoding is not allowed in the host", "invalid_url")
    try:
        ascii_host = host if host.isascii() else host.encode("idna").decode("ascii")
    except UnicodeError:
        _invalid(field, f"{field} has a host that is not a valid domain name", "invalid_url")
    name = ascii_host.lower()
    name = name.removesuffix(".")
    if not name or len(name) > 253 or not all(_HOST_LABEL.fullmatch(p) for p in name.split(".")):
        _invalid(
            field,
            f"{field} has an invalid host {host[:60]!r}; use a DNS name or an IP address",
            "invalid_url",
        )


def _parse_url(value: object, field: str, limits: SpecLimits) -> str:
    url = _string(value, field)
    if len(url) > limits.url_max:
        _invalid(field, f"{field} is longer than {limits.url_max} characters", "invalid_url")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        _invalid(
            field,
            f"{field} contains whitespace or control characters; percent-encode them (%20)",
            "invalid_url",
        )
    if "\\" in url:
        _invalid(field, f"{field} contains a backslash; use / in paths", "invalid_url")
    parts = split_webhook_url(url, field)
    if parts.userinfo:
        _invalid(
            field,
            f"{field} must not contain credentials (user:pass@); send them in a header such as "
            "Authorization instead",
            "invalid_url",
        )
    if "#" in url:
        _invalid(field, f"{field} must not have a #fragment: it is never sent", "invalid_url")
    host = parts.host
    _check_host(host, field)
    return url


def _parse_headers(value: object, field: str, limits: SpecLimits) -> dict[str, str]:
    obj = _object(value, field, "an object mapping header names to string values")
    if len(obj) > limits.headers_max_count:
        _invalid(
            field, f"{field} has {len(obj)} headers; at most {limits.headers_max_count}", "invalid_header"
        )
    seen: set[str] = set()
    headers: dict[str, str] = {}
    for name, raw in obj.items():
        if not isinstance(name, str) or not _TOKEN.fullmatch(name):
            shown = name[:60] if isinstance(name, str) else name
            _invalid(
                field,
                f"{field}: {shown!r} is not a valid header name (letters, digits and "
                "!#$%&'*+-.^_`|~ only; no spaces, colons or control characters)",
                "invalid_header",
            )
        path = f"{field}.{name}"
        if len(name) > limits.header_name_max:
            _invalid(
                path,
                f"{field}: header names are at most {limits.header_name_max} characters",
                "invalid_header",
            )
        lower = name.lower()
        if is_reserved_header(lower):
            _invalid(
                path,
                f"{path}: the {name} header is set by Duetime or the HTTP client and cannot be set "
                "by a job (reserved: Host, Content-Length, Content-Type, Transfer-Encoding, Connection "
                "and other hop-by-hop headers, User-Agent, Accept, Idempotency-Key, webhook-*, "
                "Duetime-*)",
                "reserved_header",
            )
        if lower in seen:
            _invalid(
                path, f"{path}: header names are case-insensitive; {name} is given twice", "invalid_header"
            )
        seen.add(lower)
        if not isinstance(raw, str):
            _wrong_type(path, "a string", raw)
        _plain_text(raw, path, "invalid_header")
        if "\r" in raw or "\n" in raw:
            _invalid(path, f"{path}: header values must not contain CR or LF", "invalid_header")
        if any(c != "\t" and (ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F) for c in raw):
            _invalid(path, f"{path}: header values must not contain control characters", "invalid_header")
        if len(raw) > limits.header_value_max:
            _invalid(
                path,
                f"{path}: header values are at most {limits.header_value_max} characters",
                "invalid_header",
            )
        if raw == REDACTED:
            _invalid(
                path,
                f"{path} is the redacted placeholder {REDACTED!r} shown in responses; "
                "send the real value when you replace a target",
                "invalid_header",
            )
        headers[name] = raw
    return headers


def _parse_topic(value: object, field: str, broker: Broker, limits: SpecLimits) -> str:
    topic = _string(value, field)
    if not topic:
        _invalid(field, f"{field} must not be empty")
    if len(topic) > limits.topic_max:
        _invalid(field, f"{field} is longer than {limits.topic_max} characters")
    reserved = broker_refusal(broker, topic)
    if reserved is not None:
        _invalid(
            field,
            f"{field} {topic[:100]!r} is {reserved}; pick another topic",
            "topic_not_allowed",
        )
    if broker is Broker.NATS:
        if not _NATS_SUBJECT.fullmatch(topic):
            _invalid(
                field,
                f"{field} is not a valid NATS subject: use tokens of letters, digits, _ and - "
                "separated by single dots (e.g. billing.invoices); no spaces or wildcards (* >)",
            )
    elif any(ord(c) < 0x20 or ord(c) == 0x7F for c in topic):
        _invalid(field, f"{field} must not contain CR, LF or other control characters")
    return topic


def _parse_flow(value: object, field: str, limits: SpecLimits) -> Flow | None:
    """``target.flow``: the cluster-wide limits the owner's jobs naming one key share.

    ``null`` is the same as leaving it out (no flow control). Every field is required: a default
    rate or parallelism would be a limit the owner never chose, shared by jobs they did not mean
    to tie together.
    """
    if value is None:
        return None
    obj = _object(value, field, 'an object {"key", "rate_per_s", "parallelism"}')
    _check_keys(obj, FLOW_FIELDS, field)
    key = _string(_require(obj, "key", field), f"{field}.key")
    if not 1 <= len(key) <= limits.flow_key_max:
        _invalid(
            f"{field}.key",
            f"{field}.key must be 1 to {limits.flow_key_max} characters, got {len(key)}",
        )
    if not key.isprintable():
        _invalid(
            f"{field}.key",
            f"{field}.key must be printable text: no control characters, line breaks, tabs or "
            "invisible formatting characters",
        )
    rate = _bounded_number(_require(obj, "rate_per_s", field), f"{field}.rate_per_s", limits.flow_rate_range)
    parallelism = _integer(
        _require(obj, "parallelism", field), f"{field}.parallelism", limits.flow_parallelism_range
    )
    return Flow(key=key, rate_per_s=rate, parallelism=parallelism)


def _parse_target(value: object, limits: SpecLimits, at: str = "target") -> Target:
    """A target object; ``at`` is its path in the spec (``target``, ``on_failure.target``)."""
    obj = _object(value, at)
    kind = _require(obj, "type", at)
    if not isinstance(kind, str):
        _wrong_type(f"{at}.type", 'the string "webhook" or "queue"', kind)
    if kind == "webhook":
        _check_keys(obj, WEBHOOK_FIELDS, at)
        url = _parse_url(_require(obj, "url", at), f"{at}.url", limits)
        method = (
            _choice(obj["method"], f"{at}.method", WebhookMethod) if "method" in obj else WebhookMethod.POST
        )
        headers = _parse_headers(obj["headers"], f"{at}.headers", limits) if "headers" in obj else {}
        timeout_s = (
            _integer(obj["timeout_s"], f"{at}.timeout_s", limits.timeout_s_range)
            if "timeout_s" in obj
            else 30
        )
        flow = _parse_flow(obj.get("flow"), f"{at}.flow", limits)
        return WebhookTarget(url=url, method=method, headers=headers, timeout_s=timeout_s, flow=flow)
    if kind == "queue":
        _check_keys(obj, QUEUE_FIELDS, at)
        broker = _choice(_require(obj, "broker", at), f"{at}.broker", Broker)
        topic = _parse_topic(_require(obj, "topic", at), f"{at}.topic", broker, limits)
        flow = _parse_flow(obj.get("flow"), f"{at}.flow", limits)
        return QueueTarget(broker=broker, topic=topic, flow=flow)
    _invalid(f"{at}.type", f'{at}.type must be "webhook" or "queue", got {kind[:30]!r}')


def _parse_on_failure(value: object, limits: SpecLimits) -> OnFailure | None:
    """``on_failure``: null, or where failure events go and after how many failed occurrences."""
    if value is None:
        return None
    obj = _object(value, "on_failure")
    _check_keys(obj, ON_FAILURE_FIELDS, "on_failure")
    target = _parse_target(_require(obj, "target", "on_failure"), limits, "on_failure.target")
    after = _integer(obj["after"], "on_failure.after", FAILURE_COUNT_RANGE) if "after" in obj else 1
    return OnFailure(target=target, after=after)


# --- schedule ---------------------------------------------------------------------------------


def _parse_schedule(
    value: object, now: datetime, limits: SpecLimits, budget: WorkBudget | None = None
) -> Schedule:
    obj = _object(value, "schedule")
    _check_keys(obj, SCHEDULE_FIELDS, "schedule")
    kinds = [key for key in ("run_at", "cron", "every") if key in obj]
    if len(kinds) != 1:
        _invalid(
            "schedule",
            "schedule must have exactly one of run_at (one run), cron or every (recurring), "
            + (f"not {' and '.join(kinds)}" if kinds else "and has none"),
            "invalid_schedule",
        )
    if "every" in obj:
        return _parse_every_schedule(obj, now, limits, budget)
    if "run_at" in obj:
        for key in CRON_FIELDS[1:]:
            if key in obj:
                _invalid(
                    f"schedule.{key}",
                    f"schedule.{key} applies only to cron schedules; a run_at carries its own UTC offset",
                    "invalid_schedule",
                )
        run_at = parse_time(obj["run_at"], "schedule.run_at")
        horizon = now + timedelta(days=limits.run_at_horizon_days)
        if run_at > horizon:
            _invalid(
                "schedule.run_at",
                f"schedule.run_at is more than {limits.run_at_horizon_days} days ahead; pick an earlier time",
            )
        return OneOffSchedule(run_at=run_at)

    cron_raw = obj["cron"]
    if not isinstance(cron_raw, str):
        _wrong_type("schedule.cron", "a cron expression string", cron_raw)
    cron = _plain_text(cron_raw, "schedule.cron", "invalid_cron")
    timezone = _parse_timezone(obj)
    start_at = _optional_time(obj, "start_at")
    end_at = _optional_time(obj, "end_at")
    if start_at is not None and end_at is not None and start_at >= end_at:
        _invalid(
            "schedule.end_at",
            "schedule.end_at must be later than schedule.start_at",
            "invalid_schedule",
        )
    schedule = CronSchedule(
        cron=cron,
        timezone=timezone,
        start_at=start_at,
        end_at=end_at,
        dst_gap=_choice(obj["dst_gap"], "schedule.dst_gap", DstGap) if "dst_gap" in obj else DstGap.SHIFT,
        dst_overlap=(
            _choice(obj["dst_overlap"], "schedule.dst_overlap", DstOverlap)
            if "dst_overlap" in obj
            else DstOverlap.FIRST
        ),
        exclude=_parse_exclude(obj.get("exclude")),
    )
    # The horizon first: a start_at past it has no occurrence either, and the more specific
    # answer (cron_never_fires on schedule.start_at) says what to change.
    _check_start_horizon(start_at, now, limits)
    check_cron_schedule(schedule, now, budget)
    if limits.min_cron_interval_s > 0:
        _check_cron_interval(schedule, now, limits.min_cron_interval_s, budget)
    return schedule


def _parse_timezone(obj: dict[str, Any]) -> str:
    if "timezone" not in obj:
        return "UTC"
    tz_raw = obj["timezone"]
    if not isinstance(tz_raw, str):
        _wrong_type("schedule.timezone", "an IANA time zone id string", tz_raw)
    timezone = _plain_text(tz_raw, "schedule.timezone", "invalid_timezone")
    load_zone(timezone)
    return timezone


def _parse_every_schedule(
    obj: dict[str, Any], now: datetime, limits: SpecLimits, budget: WorkBudget | None
) -> IntervalSchedule:
    """``{"every": "90m", "start_at", "end_at", "timezone", "exclude"}``: exact elapsed time."""
    for key in ("dst_gap", "dst_overlap"):
        if key in obj:
            _invalid(
                f"schedule.{key}",
                f"schedule.{key} applies only to cron schedules: an every schedule counts elapsed "
                f"time, so daylight saving never moves it",
                "invalid_schedule",
            )
    every = obj["every"]
    every_s = parse_every(every)
    assert isinstance(every, str)
    timezone = _parse_timezone(obj)
    start_at = _optional_time(obj, "start_at")
    _check_start_horizon(start_at, now, limits)
    if start_at is None:
        start_at = now.replace(microsecond=0)
    end_at = _optional_time(obj, "end_at")
    if end_at is not None and start_at >= end_at:
        _invalid(
            "schedule.end_at", "schedule.end_at must be later than schedule.start_at", "invalid_schedule"
        )
    if limits.min_cron_interval_s > 0 and every_s < limits.min_cron_interval_s:
        _invalid(
            "schedule.every",
            f"schedule.every is {every_s} s; this server allows at most one run every "
            f"{limits.min_cron_interval_s} s",
            "invalid_every",
        )
    schedule = IntervalSchedule(
        every=every,
        every_s=every_s,
        start_at=start_at,
        end_at=end_at,
        timezone=timezone,
        exclude=_parse_exclude(obj.get("exclude")),
    )
    check_interval_schedule(schedule, now, budget)
    return schedule


def _local_date(value: object, field: str) -> date:
    if not isinstance(value, str):
        _wrong_type(field, 'a local date string "YYYY-MM-DD"', value)
    match = _LOCAL_DATE.fullmatch(value)
    try:
        if match is None:
            raise ValueError
        return date(int(match[1]), int(match[2]), int(match[3]))
    except ValueError:
        _invalid(
            field,
            f"{field} {value[:40]!r} is not a calendar date: write YYYY-MM-DD, e.g. 2026-12-25",
            "invalid_exclude",
        )


def _parse_exclude(value: object) -> tuple[DateRange, ...]:
    """Local dates and inclusive ranges on which no occurrence is due (see core/exclusion.py)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        _wrong_type("schedule.exclude", 'a list of dates "YYYY-MM-DD" or {"from", "to"} ranges', value)
    if len(value) > MAX_EXCLUDE:
        _invalid(
            "schedule.exclude",
            f"schedule.exclude has {len(value)} entries; at most {MAX_EXCLUDE} (use ranges "
            f'{{"from": "YYYY-MM-DD", "to": "YYYY-MM-DD"}} for stretches of days)',
            "invalid_exclude",
        )
    ranges: list[DateRange] = []
    for index, item in enumerate(value):
        field = f"schedule.exclude[{index}]"
        if isinstance(item, dict):
            _check_keys(item, ("from", "to"), field)
            for key in ("from", "to"):
                if key not in item:
                    _invalid(
                        f"{field}.{key}",
                        f"{field} needs both from and to (inclusive dates)",
                        "invalid_exclude",
                    )
            first = _local_date(item["from"], f"{field}.from")
            last = _local_date(item["to"], f"{field}.to")
            if last < first:
                _invalid(
                    f"{field}.to",
                    f"{field}.to ({last.isoformat()}) is before its from ({first.isoformat()}); a range "
                    f"is inclusive and runs forwards",
                    "invalid_exclude",
                )
            ranges.append(DateRange(first, last))
        elif isinstance(item, str):
            day = _local_date(item, field)
            ranges.append(DateRange(day, day))
        else:
            _wrong_type(field, 'a date "YYYY-MM-DD" or a {"from", "to"} range', item)
    return tuple(ranges)


def _check_start_horizon(start_at: datetime | None, now: datetime, limits: SpecLimits) -> None:
    """Refuse a recurring schedule that cannot fire within the horizon a ``run_at`` has.

    A ``start_at`` in year 9999 used to be stored, find no occurrence the clock can reach, and
    complete the job at once: a 201 (or a PATCH) that quietly killed it. It is the same mistake
    as a cron that never fires, so it gets the same answer.
    """
    if start_at is None:
        return
    horizon = now + timedelta(days=limits.run_at_horizon_days)
    if start_at > horizon:
        _invalid(
            "schedule.start_at",
            f"schedule.start_at is more than {limits.run_at_horizon_days} days ahead, so this "
            "schedule would never fire within the server's horizon; pick an earlier start_at",
            "cron_never_fires",
        )


def _optional_time(obj: dict[str, Any], key: str) -> datetime | None:
    value = obj.get(key)
    return None if value is None else parse_time(value, f"schedule.{key}")


def _check_cron_interval(
    schedule: CronSchedule, now: datetime, min_interval_s: int, budget: WorkBudget | None
) -> None:
    """Refuse a cron that fires more often than the operator allows, judged on its next firings.

    A sample of consecutive firings is enough: a cron's tightest spacing shows up within a few
    dozen firings for every expression that repeats at least daily, and the rare sparse cron
    that bunches later (say, every minute on 1 January only) still shows it within the sample.
    """
    fires = occurrences(schedule, now, _INTERVAL_SAMPLE, budget)
    for previous, fire in itertools.pairwise(fires):
        gap_s = (fire - previous).total_seconds()
        if gap_s < min_interval_s:
            _invalid(
                "schedule.cron",
                f"schedule.cron fires {gap_s:g} s apart at times; this server allows at most one "
                f"run every {min_interval_s} s",
                "invalid_cron",
            )


# --- the job spec -----------------------------------------------------------------------------


def encoded_payload(payload: object) -> bytes:
    """The payload as it goes on the wire: compact JSON, UTF-8; the size limit counts this."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def _parse_payload(value: object, limits: SpecLimits) -> Any:
    try:
        size = len(encoded_payload(value))
    except ValueError:
        _invalid("payload", "payload contains NaN or Infinity, which are not JSON numbers")
    except UnicodeEncodeError:
        _invalid("payload", "payload contains a lone UTF-16 surrogate (such as \\ud800)")
    except RecursionError:
        _invalid("payload", "payload is nested too deeply")
    except TypeError:
        _wrong_type("payload", "JSON", value)
    if size > limits.payload_max_bytes:
        raise InvalidRequest(
            f"payload is {size} bytes as compact JSON; the limit is {limits.payload_max_bytes}. "
            "Send a reference (a URL or id) instead of the data itself",
            code="payload_too_large",
            field="payload",
        )
    return value


def _parse_name(value: object, limits: SpecLimits, keep_name: str | None) -> str | None:
    name = parse_name(value)
    if name is not None and len(name) > limits.name_max:
        _invalid("name", f"name is {len(name)} characters long; at most {limits.name_max}")
    if name is not None and name != keep_name:
        refuse_dot_segments(name)
    return name


def _parse_retry(value: object, limits: SpecLimits) -> RetryPolicy:
    obj = _object(value, "retry")
    _check_keys(obj, RETRY_FIELDS, "retry")
    defaults = RetryPolicy()
    max_attempts = (
        _integer(obj["max_attempts"], "retry.max_attempts", limits.max_attempts_range)
        if "max_attempts" in obj
        else defaults.max_attempts
    )
    initial = (
        _positive_number(obj["backoff_initial_s"], "retry.backoff_initial_s", limits.backoff_s_max)
        if "backoff_initial_s" in obj
        else defaults.backoff_initial_s
    )
    maximum = (
        _positive_number(obj["backoff_max_s"], "retry.backoff_max_s", limits.backoff_s_max)
        if "backoff_max_s" in obj
        else defaults.backoff_max_s
    )
    multiplier = (
        _positive_number(obj["backoff_multiplier"], "retry.backoff_multiplier", limits.backoff_multiplier_max)
        if "backoff_multiplier" in obj
        else defaults.backoff_multiplier
    )
    if maximum < initial:
        _invalid(
            "retry.backoff_max_s",
            f"retry.backoff_max_s ({maximum:g}) must be at least retry.backoff_initial_s ({initial:g})",
        )
    raw_window = obj.get("max_duration_s")
    max_duration_s = (
        None if raw_window is None else _integer(raw_window, "retry.max_duration_s", MAX_DURATION_S_RANGE)
    )
    return RetryPolicy(
        max_attempts=max_attempts,
        backoff_initial_s=initial,
        backoff_max_s=maximum,
        backoff_multiplier=multiplier,
        max_duration_s=max_duration_s,
    )


def parse_job_spec(
    data: object,
    *,
    now: datetime,
    limits: SpecLimits = SpecLimits(),
    keep_name: str | None = None,
    budget: WorkBudget | None = None,
) -> JobSpec:
    """Judge a decoded POST body (or a merged PATCH) and return the spec with defaults filled in.

    ``now`` anchors the run_at horizon and the cron checks (an ``end_at`` in the past never
    fires). ``keep_name`` is the name the job already has (a PATCH, a PUT that updates): it
    passes the rules only new names are held to (no ``.``/``..`` segment). ``budget`` counts the
    schedule search the checks do (the request's cost). Raises ``MalformedRequest`` or
    ``InvalidRequest``; see the module docstring.
    """
    if now.tzinfo is None:
        raise ValueError("parse_job_spec needs an aware datetime for now")
    obj = _object(data, None, "a JSON object")
    _check_keys(obj, TOP_LEVEL_FIELDS, "")
    name = _parse_name(obj.get("name"), limits, keep_name)
    labels = parse_labels(obj["labels"]) if obj.get("labels") is not None else {}
    target = _parse_target(_require(obj, "target", ""), limits)
    payload = _parse_payload(obj.get("payload"), limits)
    schedule = _parse_schedule(_require(obj, "schedule", ""), now, limits, budget)
    retry = _parse_retry(obj["retry"], limits) if "retry" in obj else RetryPolicy()
    misfire = _choice(obj["misfire"], "misfire", Misfire) if "misfire" in obj else Misfire.RUN_ONCE
    misfire_grace_s = (
        _integer(obj["misfire_grace_s"], "misfire_grace_s", limits.misfire_grace_s_range)
        if "misfire_grace_s" in obj
        else 60
    )
    jitter_s = _integer(obj["jitter_s"], "jitter_s", limits.jitter_s_range) if "jitter_s" in obj else 0
    spread_s = _integer(obj["spread_s"], "spread_s", limits.spread_s_range) if "spread_s" in obj else 0
    overlap = _choice(obj["overlap"], "overlap", Overlap) if "overlap" in obj else Overlap.ALLOW
    on_failure = _parse_on_failure(obj.get("on_failure"), limits)
    raw_pause = obj.get("pause_after_failures")
    pause_after_failures = (
        None if raw_pause is None else _integer(raw_pause, "pause_after_failures", FAILURE_COUNT_RANGE)
    )
    return JobSpec(
        target=target,
        schedule=schedule,
        name=name,
        labels=labels,
        payload=payload,
        retry=retry,
        misfire=misfire,
        misfire_grace_s=misfire_grace_s,
        jitter_s=jitter_s,
        spread_s=spread_s,
        overlap=overlap,
        on_failure=on_failure,
        pause_after_failures=pause_after_failures,
    )


def merge_patch(current: dict[str, Any], patch: object) -> dict[str, Any]:
    """Apply a PATCH body to the stored spec JSON; the caller then runs ``parse_job_spec``.

    Semantics (also in docs/api-errors.md):
    - a top-level field present in the patch replaces the current one; absent fields stay;
    - ``retry`` merges key by key (``{"retry": {"max_attempts": 3}}`` keeps the backoff);
    - ``target`` and ``schedule`` are replaced whole, so a schedule can switch between run_at and
      cron, and fields left out of a new cron schedule take their defaults again;
    - ``labels`` is replaced whole (send the full object; ``{}`` or ``null`` clears it);
    - ``on_failure`` is replaced whole too (its target is a new target); ``null`` clears it, as
      ``null`` clears ``pause_after_failures``;
    - ``null`` for ``name`` or ``payload`` sets it to null; ``null`` elsewhere is a type error
      (omit a field to keep it);
    - ``{}`` is a valid patch that changes nothing; unknown fields are refused.
    """
    body = _object(patch, None, "a JSON object")
    _check_keys(body, TOP_LEVEL_FIELDS, "")
    merged = copy.deepcopy(current)
    for key, value in body.items():
        if key == "retry" and isinstance(value, dict):
            base = merged.get("retry")
            merged["retry"] = {**(base if isinstance(base, dict) else {}), **copy.deepcopy(value)}
        else:
            merged[key] = copy.deepcopy(value)
    return merged


# --- request-level helpers --------------------------------------------------------------------


def _canonical(value: object) -> object:
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


def canonical_body_hash(data: object) -> bytes:
    """SHA-256 of a canonical JSON form, to tell whether an Idempotency-Key's body is the same.

    Keys are sorted and whitespace dropped, so key order and formatting do not matter; numbers
    that are equal as JSON numbers (``1`` and ``1.0``) hash the same. Non-ASCII is escaped, so
    even lone surrogates hash without error.
    """
    text = json.dumps(
        _canonical(data), sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True
    )
    return hashlib.sha256(text.encode("ascii")).digest()


def parse_idempotency_key(value: str) -> str:
    """1 to 255 printable ASCII characters (space allowed inside, not at either end)."""
    ok = (
        isinstance(value, str)
        and 1 <= len(value) <= 255
        and all(0x20 <= ord(c) <= 0x7E for c in value)
        and value[0] != " "
        and value[-1] != " "
    )
    if not ok:
        raise InvalidRequest(
            "Idempotency-Key must be 1 to 255 printable ASCII characters, without leading or "
            "trailing spaces (a UUID works well)",
            code="invalid_idempotency_key",
            field="Idempotency-Key",
        )
    return value


BACKFILL_FIELDS = ("from", "to")


def parse_backfill_range(data: object) -> tuple[datetime, datetime]:
    """The body of POST /v1/jobs/{id}/backfill: ``{"from": …, "to": …}``, both RFC 3339."""
    obj = _object(data, None, "a JSON object")
    _check_keys(obj, BACKFILL_FIELDS, "")
    start = parse_time(_require(obj, "from", ""), "from")
    end = parse_time(_require(obj, "to", ""), "to")
    return start, end


def parse_replay_request(data: object) -> datetime:
    """The body of POST /v1/jobs/{id}/replay for one occurrence: ``{"scheduled_for": …}``."""
    obj = _object(data, None, "a JSON object")
    _check_keys(obj, ("scheduled_for",), "")
    return parse_time(_require(obj, "scheduled_for", ""), "scheduled_for")


PAUSE_FIELDS = ("note", "until")
#: The longest note a pause may carry (characters).
PAUSE_NOTE_MAX = 500


def parse_pause_fields(obj: dict[str, Any], *, now: datetime, limits: SpecLimits) -> PauseRequest:
    """``note`` and ``until`` of a pause (``POST /v1/jobs/{id}/pause``'s body, and a bulk pause's
    beside its selector); both optional, ``null`` as absent.

    ``note``: text of at most ``PAUSE_NOTE_MAX`` characters (no control characters but line
    breaks and tabs). ``until``: an RFC 3339 instant after ``now`` and no later than the horizon a
    ``run_at`` has; anything else about it is 422 ``invalid_until``.
    """
    note = obj.get("note")
    if note is not None:
        if not isinstance(note, str):
            _wrong_type("note", "a string", note)
        note = _plain_text(note, "note")
        if len(note) > PAUSE_NOTE_MAX or any(not c.isprintable() and c not in "\n\t" for c in note):
            _invalid(
                "note",
                f"note must be text of at most {PAUSE_NOTE_MAX} characters without control characters "
                f"(line breaks and tabs are fine); this one has {len(note)}",
            )
    raw = obj.get("until")
    if raw is None:
        return PauseRequest(note=note, until=None)
    if not isinstance(raw, str):
        _wrong_type("until", "an RFC 3339 timestamp string", raw)
    try:
        until = parse_time(raw, "until")
    except InvalidRequest as exc:
        raise InvalidRequest(exc.message, code="invalid_until", field="until") from None
    horizon = now + timedelta(days=limits.run_at_horizon_days)
    if until <= now:
        _invalid(
            "until",
            f"until must be in the future; it is {format_time(until)}, and now is {format_time(now)}. "
            "Leave it out to pause until a resume",
            "invalid_until",
        )
    if until > horizon:
        _invalid(
            "until",
            f"until is more than {limits.run_at_horizon_days} days ahead; pick an earlier time or leave "
            "it out to pause until a resume",
            "invalid_until",
        )
    return PauseRequest(note=note, until=until)


def parse_pause_request(data: object, *, now: datetime, limits: SpecLimits) -> PauseRequest:
    """The optional body of ``POST /v1/jobs/{id}/pause``: ``{"note", "until"}``."""
    obj = _object(data, None, "a JSON object")
    _check_keys(obj, PAUSE_FIELDS, "")
    return parse_pause_fields(obj, now=now, limits=limits)


PREVIEW_FIELDS = ("schedule", "count", "from")


def parse_preview_request(
    data: object,
    *,
    now: datetime,
    limits: SpecLimits,
    max_count: int,
    default_count: int,
    budget: WorkBudget | None = None,
) -> tuple[Schedule, int, datetime]:
    """The body of POST /v1/schedules/preview: (schedule, count, from). The schedule is judged
    exactly as a job's would be, so a preview never accepts what registration refuses."""
    obj = _object(data, None, "a JSON object")
    _check_keys(obj, PREVIEW_FIELDS, "")
    schedule = _parse_schedule(_require(obj, "schedule", ""), now, limits, budget)
    count = _integer(obj["count"], "count", (1, max_count)) if "count" in obj else default_count
    start = parse_time(obj["from"], "from") if obj.get("from") is not None else now
    return schedule, count, start
