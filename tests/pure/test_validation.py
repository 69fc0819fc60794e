"""Untrusted job specs: a written catalogue of bad inputs, the contract's defaults, PATCH rules.

Each catalogue entry names the exception class (400 vs 422), the error code and the field path a
client will see, so a change to any of them is a visible contract change.
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from duetime.core.codec import REDACTED, spec_to_json
from duetime.core.errors import DuetimeError, InvalidRequest, MalformedRequest
from duetime.core.model import (
    Broker,
    CronSchedule,
    DstGap,
    DstOverlap,
    JobSpec,
    Misfire,
    OneOffSchedule,
    QueueTarget,
    RetryPolicy,
    WebhookMethod,
    WebhookTarget,
)
from duetime.core.validation import (
    SpecLimits,
    canonical_body_hash,
    encoded_payload,
    merge_patch,
    parse_idempotency_key,
    parse_job_spec,
    parse_time,
)

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
URL = "https://hooks.example.com/duetime"
DELETE = object()


def webhook_job() -> dict[str, Any]:
    return {
        "target": {"type": "webhook", "url": URL},
        "schedule": {"run_at": "2026-07-01T10:00:00Z"},
    }


def cron_job() -> dict[str, Any]:
    return {
        "target": {"type": "webhook", "url": URL},
        "schedule": {"cron": "0 9 * * 1-5", "timezone": "Europe/Berlin"},
    }


def queue_job(broker: str = "nats", topic: str = "billing.invoices") -> dict[str, Any]:
    return {
        "target": {"type": "queue", "broker": broker, "topic": topic},
        "schedule": {"run_at": "2026-07-01T10:00:00Z"},
    }


def edit(base: dict[str, Any], *path: str, value: Any) -> dict[str, Any]:
    """A copy of ``base`` with the value at ``path`` replaced (or removed with DELETE)."""
    data = copy.deepcopy(base)
    node = data
    for key in path[:-1]:
        node = node.setdefault(key, {})
    if value is DELETE:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value
    return data


def headers(values: dict[str, Any]) -> dict[str, Any]:
    return edit(webhook_job(), "target", "headers", value=values)


BAD = MalformedRequest
INV = InvalidRequest
W = webhook_job()
C = cron_job()

CATALOGUE = [
    # --- the body itself
    pytest.param([], BAD, "wrong_type", None, id="body-is-array"),
    pytest.param("job", BAD, "wrong_type", None, id="body-is-string"),
    pytest.param(None, BAD, "wrong_type", None, id="body-is-null"),
    pytest.param(42, BAD, "wrong_type", None, id="body-is-number"),
    pytest.param(edit(W, "foo", value=1), INV, "unknown_field", "foo", id="unknown-top-field"),
    pytest.param(edit(W, "jiter_s", value=5), INV, "unknown_field", "jiter_s", id="typo-top-field"),
    pytest.param(edit(W, "target", value=DELETE), INV, "missing_field", "target", id="missing-target"),
    pytest.param(edit(W, "schedule", value=DELETE), INV, "missing_field", "schedule", id="missing-schedule"),
    # --- name
    pytest.param(edit(W, "name", value=5), BAD, "wrong_type", "name", id="name-number"),
    pytest.param(edit(W, "name", value=["a"]), BAD, "wrong_type", "name", id="name-array"),
    pytest.param(edit(W, "name", value="x" * 201), INV, "invalid_value", "name", id="name-too-long"),
    pytest.param(edit(W, "name", value="a\x00b"), INV, "invalid_value", "name", id="name-nul"),
    pytest.param(edit(W, "name", value=".."), INV, "invalid_name", "name", id="name-dot-dot"),
    pytest.param(edit(W, "name", value="a/../b"), INV, "invalid_name", "name", id="name-dot-dot-segment"),
    pytest.param(edit(W, "name", value="a/."), INV, "invalid_name", "name", id="name-dot-segment"),
    pytest.param(edit(W, "name", value="a\ud800b"), INV, "invalid_value", "name", id="name-lone-surrogate"),
    pytest.param(edit(W, "name", value="a\nb"), INV, "invalid_value", "name", id="name-newline"),
    pytest.param(edit(W, "name", value=""), INV, "invalid_value", "name", id="name-empty"),
    pytest.param(edit(W, "name", value="/a"), INV, "invalid_value", "name", id="name-leading-slash"),
    pytest.param(edit(W, "name", value="a b"), INV, "invalid_value", "name", id="name-space"),
    # --- target
    pytest.param(edit(W, "target", value=URL), BAD, "wrong_type", "target", id="target-string"),
    pytest.param(edit(W, "target", value=None), BAD, "wrong_type", "target", id="target-null"),
    pytest.param(
        edit(W, "target", "type", value=DELETE), INV, "missing_field", "target.type", id="target-no-type"
    ),
    pytest.param(
        edit(W, "target", "type", value="email"),
        INV,
        "invalid_value",
        "target.type",
        id="target-type-unknown",
    ),
    pytest.param(
        edit(W, "target", "type", value=1), BAD, "wrong_type", "target.type", id="target-type-number"
    ),
    pytest.param(
        edit(W, "target", "retries", value=3),
        INV,
        "unknown_field",
        "target.retries",
        id="webhook-unknown-field",
    ),
    pytest.param(
        edit(W, "target", "topic", value="a.b"), INV, "unknown_field", "target.topic", id="webhook-with-topic"
    ),
    # --- target.url
    pytest.param(
        edit(W, "target", "url", value=DELETE), INV, "missing_field", "target.url", id="url-missing"
    ),
    pytest.param(edit(W, "target", "url", value=80), BAD, "wrong_type", "target.url", id="url-number"),
    pytest.param(edit(W, "target", "url", value=""), INV, "invalid_url", "target.url", id="url-empty"),
    pytest.param(
        edit(W, "target", "url", value="ftp://example.com/x"), INV, "invalid_url", "target.url", id="url-ftp"
    ),
    pytest.param(
        edit(W, "target", "url", value="javascript:alert(1)"),
        INV,
        "invalid_url",
        "target.url",
        id="url-javascript",
    ),
    pytest.param(
        edit(W, "target", "url", value="file:///etc/passwd"), INV, "invalid_url", "target.url", id="url-file"
    ),
    pytest.param(
        edit(W, "target", "url", value="http:///x"), INV, "invalid_url", "target.url", id="url-no-host"
    ),
    pytest.param(
        edit(W, "target", "url", value="http:example.com/x"),
        INV,
        "invalid_url",
        "target.url",
        id="url-no-slashes",
    ),
    pytest.param(
        edit(W, "target", "url", value="hooks.example.com/x"),
        INV,
        "invalid_url",
        "target.url",
        id="url-no-scheme",
    ),
    pytest.param(
        edit(W, "target", "url", value="https://user:pass@example.com/"),
        INV,
        "invalid_url",
        "target.url",
        id="url-userinfo",
    ),
    pytest.param(
        edit(W, "target", "url", value="https://user@example.com/"),
        INV,
        "invalid_url",
        "target.url",
        id="url-user-only",
    ),
    pytest.param(
        edit(W, "target", "url", value="https://example.com/x#frag"),
        INV,
        "invalid_url",
        "target.url",
        id="url-fragment",
    ),
    pytest.param(
        edit(W, "target", "url", value="https://example.com/a b"),
        INV,
        "invalid_url",
        "target.url",
        id="url-space",
    ),
    pytest.param(
        edit(W, "target", "url", value="https://example.com/\r\nX: y"),
        INV,
        "invalid_url",
        "target.url",
        id="url-crlf",
    ),
    pytest.param(
        edit(W, "target", "url", value="https://example.com\\@127.0.0.1/"),
        INV,
        "invalid_url",
        "target.url",
        id="url-backslash",
    ),
    pytest.param(
        edit(W, "target", "url", value="https://example.com:99999/"),
        INV,
        "invalid_url",
        "target.url",
        id="url-port-out-of-range",
    ),
    pytest.param(
        edit(W, "target", "url", value="https://example.com:0/"),
        INV,
        "invalid_url",
        "target.url",
        id="url-port-0",
    ),
    pytest.param(
        edit(W, "target", "url", value="https://example.com:http/"),
        INV,
        "invalid_url",
        "target.url",
        id="url-port-name",
    ),
    pytest.param(
        edit(W, "target", "url", value="https://example.com/" + "a" * 2048),
        INV,
        "invalid_url",
        "target.url",
        id="url-too-long",
    ),
    pytest.param(
        edit(W, "target", "url", value="https://example.com/\x00"),
        INV,
        "invalid_value",
        "target.url",
        id="url-nul",
    ),
    pytest.param(
        edit(W, "target", "url", value="https://example.com/\udfff"),
        INV,
        "invalid_value",
        "target.url",
        id="url-lone-surrogate",
    ),
    pytest.param(
        edit(W, "target", "url", value="http://[::zz]/"), INV, "invalid_url", "target.url", id="url-bad-ipv6"
    ),
    pytest.param(
        edit(W, "target", "url", value="http://%31%32%37.0.0.1/"),
        INV,
        "invalid_url",
        "target.url",
        id="url-percent-encoded-host",
    ),
    pytest.param(
        edit(W, "target", "url", value="http://-bad-.example.com/"),
        INV,
        "invalid_url",
        "target.url",
        id="url-bad-label",
    ),
    pytest.param(
        edit(W, "target", "url", value="http://a..b.example.com/"),
        INV,
        "invalid_url",
        "target.url",
        id="url-empty-label",
    ),
    # --- target.method / timeout_s
    pytest.param(
        edit(W, "target", "method", value="GET"), INV, "invalid_value", "target.method", id="method-get"
    ),
    pytest.param(
        edit(W, "target", "method", value="post"),
        INV,
        "invalid_value",
        "target.method",
        id="method-lowercase",
    ),
    pytest.param(
        edit(W, "target", "method", value=1), BAD, "wrong_type", "target.method", id="method-number"
    ),
    pytest.param(
        edit(W, "target", "method", value=None), BAD, "wrong_type", "target.method", id="method-null"
    ),
    pytest.param(
        edit(W, "target", "timeout_s", value=0), INV, "invalid_value", "target.timeout_s", id="timeout-zero"
    ),
    pytest.param(
        edit(W, "target", "timeout_s", value=301), INV, "invalid_value", "target.timeout_s", id="timeout-301"
    ),
    pytest.param(
        edit(W, "target", "timeout_s", value=True), BAD, "wrong_type", "target.timeout_s", id="timeout-bool"
    ),
    pytest.param(
        edit(W, "target", "timeout_s", value=30.0), BAD, "wrong_type", "target.timeout_s", id="timeout-float"
    ),
    pytest.param(
        edit(W, "target", "timeout_s", value=2.5),
        BAD,
        "wrong_type",
        "target.timeout_s",
        id="timeout-fraction",
    ),
    pytest.param(
        edit(W, "target", "timeout_s", value="30"), BAD, "wrong_type", "target.timeout_s", id="timeout-string"
    ),
    pytest.param(
        edit(W, "target", "timeout_s", value=float("nan")),
        INV,
        "invalid_value",
        "target.timeout_s",
        id="timeout-nan",
    ),
    pytest.param(
        edit(W, "target", "timeout_s", value=None), BAD, "wrong_type", "target.timeout_s", id="timeout-null"
    ),
    # --- target.headers
    pytest.param(headers([]), BAD, "wrong_type", "target.headers", id="headers-array"),  # type: ignore[arg-type]
    pytest.param(headers({"X-A": 1}), BAD, "wrong_type", "target.headers.X-A", id="header-value-number"),
    pytest.param(headers({"X-A": None}), BAD, "wrong_type", "target.headers.X-A", id="header-value-null"),
    pytest.param(
        headers({"X-A": "a\r\nInjected: 1"}),
        INV,
        "invalid_header",
        "target.headers.X-A",
        id="header-value-crlf",
    ),
    pytest.param(headers({"X-A": "a\nb"}), INV, "invalid_header", "target.headers.X-A", id="header-value-lf"),
    pytest.param(headers({"X-A": "a\rb"}), INV, "invalid_header", "target.headers.X-A", id="header-value-cr"),
    pytest.param(
        headers({"X-A": "a\x00b"}), INV, "invalid_header", "target.headers.X-A", id="header-value-nul"
    ),
    pytest.param(
        headers({"X-A": "\ud800"}),
        INV,
        "invalid_header",
        "target.headers.X-A",
        id="header-value-lone-surrogate",
    ),
    pytest.param(
        headers({"X-A": "bell\x07"}), INV, "invalid_header", "target.headers.X-A", id="header-value-control"
    ),
    pytest.param(
        headers({"X-A": "x" * 8193}), INV, "invalid_header", "target.headers.X-A", id="header-value-too-long"
    ),
    pytest.param(
        headers({"Authorization": REDACTED}),
        INV,
        "invalid_header",
        "target.headers.Authorization",
        id="header-value-redacted-placeholder",
    ),
    pytest.param(headers({"X A": "1"}), INV, "invalid_header", "target.headers", id="header-name-space"),
    pytest.param(headers({"X-A:": "1"}), INV, "invalid_header", "target.headers", id="header-name-colon"),
    pytest.param(headers({"X\r\nY": "1"}), INV, "invalid_header", "target.headers", id="header-name-crlf"),
    pytest.param(headers({"": "1"}), INV, "invalid_header", "target.headers", id="header-name-empty"),
    pytest.param(headers({"X-Ä": "1"}), INV, "invalid_header", "target.headers", id="header-name-non-ascii"),
    pytest.param(headers({"Host": "evil"}), INV, "reserved_header", "target.headers.Host", id="header-host"),
    pytest.param(
        headers({"content-length": "5"}),
        INV,
        "reserved_header",
        "target.headers.content-length",
        id="header-content-length",
    ),
    pytest.param(
        headers({"Transfer-Encoding": "chunked"}),
        INV,
        "reserved_header",
        "target.headers.Transfer-Encoding",
        id="header-transfer-encoding",
    ),
    pytest.param(
        headers({"Connection": "close"}),
        INV,
        "reserved_header",
        "target.headers.Connection",
        id="header-connection",
    ),
    pytest.param(
        headers({"Upgrade": "h2c"}), INV, "reserved_header", "target.headers.Upgrade", id="header-upgrade"
    ),
    pytest.param(
        headers({"Idempotency-Key": "k"}),
        INV,
        "reserved_header",
        "target.headers.Idempotency-Key",
        id="header-idempotency-key",
    ),
    pytest.param(
        headers({"webhook-signature": "v1,x"}),
        INV,
        "reserved_header",
        "target.headers.webhook-signature",
        id="header-webhook-star",
    ),
    pytest.param(
        headers({"Duetime-Attempt": "1"}),
        INV,
        "reserved_header",
        "target.headers.Duetime-Attempt",
        id="header-duetime-star",
    ),
    pytest.param(
        headers({"User-Agent": "mine/1"}),
        INV,
        "reserved_header",
        "target.headers.User-Agent",
        id="header-user-agent",
    ),
    pytest.param(headers({"accept": "*/*"}), INV, "reserved_header", "target.headers.accept", id="accept"),
    pytest.param(
        headers({"X-A": "1", "x-a": "2"}),
        INV,
        "invalid_header",
        "target.headers.x-a",
        id="header-duplicate-case",
    ),
    pytest.param(
        headers({f"X-{i}": "v" for i in range(51)}),
        INV,
        "invalid_header",
        "target.headers",
        id="headers-too-many",
    ),
    # --- queue targets
    pytest.param(
        edit(queue_job(), "target", "broker", value=DELETE),
        INV,
        "missing_field",
        "target.broker",
        id="queue-missing-broker",
    ),
    pytest.param(queue_job(broker="kafka"), INV, "invalid_value", "target.broker", id="queue-broker-kafka"),
    pytest.param(
        edit(queue_job(), "target", "topic", value=DELETE),
        INV,
        "missing_field",
        "target.topic",
        id="queue-missing-topic",
    ),
    pytest.param(
        edit(queue_job(), "target", "url", value=URL), INV, "unknown_field", "target.url", id="queue-with-url"
    ),
    pytest.param(queue_job(topic=7), BAD, "wrong_type", "target.topic", id="topic-number"),  # type: ignore[arg-type]
    pytest.param(queue_job(topic="a.*"), INV, "invalid_value", "target.topic", id="nats-wildcard-star"),
    pytest.param(queue_job(topic="a.>"), INV, "invalid_value", "target.topic", id="nats-wildcard-gt"),
    pytest.param(queue_job(topic="a b"), INV, "invalid_value", "target.topic", id="nats-space"),
    pytest.param(queue_job(topic="a..b"), INV, "invalid_value", "target.topic", id="nats-empty-token"),
    pytest.param(queue_job(topic=".a"), INV, "invalid_value", "target.topic", id="nats-leading-dot"),
    pytest.param(queue_job(topic="a."), INV, "invalid_value", "target.topic", id="nats-trailing-dot"),
    pytest.param(
        queue_job(topic="$JS.API.INFO"), INV, "topic_not_allowed", "target.topic", id="nats-system-subject"
    ),
    pytest.param(queue_job(topic="a" * 256), INV, "invalid_value", "target.topic", id="nats-too-long"),
    pytest.param(queue_job(topic=""), INV, "invalid_value", "target.topic", id="nats-empty"),
    pytest.param(queue_job("redis", ""), INV, "invalid_value", "target.topic", id="redis-empty"),
    pytest.param(queue_job("redis", "a\nb"), INV, "invalid_value", "target.topic", id="redis-newline"),
    pytest.param(queue_job("redis", "a\rb"), INV, "invalid_value", "target.topic", id="redis-cr"),
    pytest.param(queue_job("redis", "a\x00b"), INV, "invalid_value", "target.topic", id="redis-nul"),
    pytest.param(
        queue_job("redis", "a\udc80"), INV, "invalid_value", "target.topic", id="redis-lone-surrogate"
    ),
    pytest.param(queue_job("redis", "k" * 256), INV, "invalid_value", "target.topic", id="redis-too-long"),
    # --- payload
    pytest.param(
        edit(W, "payload", value={"blob": "a" * 65536}),
        INV,
        "payload_too_large",
        "payload",
        id="payload-too-large",
    ),
    pytest.param(
        edit(W, "payload", value="é" * 32768),
        INV,
        "payload_too_large",
        "payload",
        id="payload-too-large-utf8",
    ),
    pytest.param(edit(W, "payload", value=float("nan")), INV, "invalid_value", "payload", id="payload-nan"),
    pytest.param(
        edit(W, "payload", value={"a": [1, float("inf")]}),
        INV,
        "invalid_value",
        "payload",
        id="payload-infinity",
    ),
    pytest.param(
        edit(W, "payload", value={"k": "\udc00"}),
        INV,
        "invalid_value",
        "payload",
        id="payload-lone-surrogate",
    ),
    # --- schedule shape
    pytest.param(edit(W, "schedule", value="0 * * * *"), BAD, "wrong_type", "schedule", id="schedule-string"),
    pytest.param(edit(W, "schedule", value={}), INV, "invalid_schedule", "schedule", id="schedule-neither"),
    pytest.param(
        edit(W, "schedule", "cron", value="0 * * * *"),
        INV,
        "invalid_schedule",
        "schedule",
        id="schedule-both",
    ),
    pytest.param(
        edit(W, "schedule", "every", value="1h"),
        INV,
        "invalid_schedule",
        "schedule",
        id="schedule-run-at-and-every",
    ),
    pytest.param(
        edit(W, "schedule", "evry", value="1h"),
        INV,
        "unknown_field",
        "schedule.evry",
        id="schedule-unknown-field",
    ),
    pytest.param(
        edit(W, "schedule", "timezone", value="Europe/Berlin"),
        INV,
        "invalid_schedule",
        "schedule.timezone",
        id="run-at-with-timezone",
    ),
    # --- run_at
    pytest.param(
        edit(W, "schedule", "run_at", value="2026-07-01T10:00:00"),
        INV,
        "invalid_time",
        "schedule.run_at",
        id="run-at-naive",
    ),
    pytest.param(
        edit(W, "schedule", "run_at", value="2026-07-01"),
        INV,
        "invalid_time",
        "schedule.run_at",
        id="run-at-date-only",
    ),
    pytest.param(
        edit(W, "schedule", "run_at", value="tomorrow"),
        INV,
        "invalid_time",
        "schedule.run_at",
        id="run-at-words",
    ),
    pytest.param(
        edit(W, "schedule", "run_at", value="20260701T100000Z"),
        INV,
        "invalid_time",
        "schedule.run_at",
        id="run-at-basic-format",
    ),
    pytest.param(
        edit(W, "schedule", "run_at", value=1782900000),
        BAD,
        "wrong_type",
        "schedule.run_at",
        id="run-at-epoch-number",
    ),
    pytest.param(
        edit(W, "schedule", "run_at", value=None), BAD, "wrong_type", "schedule.run_at", id="run-at-null"
    ),
    pytest.param(
        edit(W, "schedule", "run_at", value="2026-02-30T00:00:00Z"),
        INV,
        "invalid_time",
        "schedule.run_at",
        id="run-at-feb-30",
    ),
    pytest.param(
        edit(W, "schedule", "run_at", value="2026-07-01T25:00:00Z"),
        INV,
        "invalid_time",
        "schedule.run_at",
        id="run-at-hour-25",
    ),
    pytest.param(
        edit(W, "schedule", "run_at", value="2026-07-01T10:00:00+24:00"),
        INV,
        "invalid_time",
        "schedule.run_at",
        id="run-at-offset-24h",
    ),
    pytest.param(
        edit(W, "schedule", "run_at", value="2026-07-01T10:00:00+0200"),
        INV,
        "invalid_time",
        "schedule.run_at",
        id="run-at-offset-no-colon",
    ),
    pytest.param(
        edit(W, "schedule", "run_at", value="2016-12-31T23:59:60Z"),
        INV,
        "invalid_time",
        "schedule.run_at",
        id="run-at-leap-second",
    ),
    pytest.param(
        edit(W, "schedule", "run_at", value="２０２６-07-01T10:00:00Z"),
        INV,
        "invalid_time",
        "schedule.run_at",
        id="run-at-fullwidth-digits",
    ),
    pytest.param(
        edit(W, "schedule", "run_at", value="1969-12-31T23:59:59Z"),
        INV,
        "invalid_time",
        "schedule.run_at",
        id="run-at-before-1970",
    ),
    pytest.param(
        edit(W, "schedule", "run_at", value="2040-01-01T00:00:00Z"),
        INV,
        "invalid_value",
        "schedule.run_at",
        id="run-at-beyond-horizon",
    ),
    # --- cron
    pytest.param(edit(C, "schedule", "cron", value=5), BAD, "wrong_type", "schedule.cron", id="cron-number"),
    pytest.param(
        edit(C, "schedule", "cron", value="61 * * * *"),
        INV,
        "invalid_cron",
        "schedule.cron",
        id="cron-out-of-range",
    ),
    pytest.param(
        edit(C, "schedule", "cron", value="30-10 * * * *"),
        INV,
        "invalid_cron",
        "schedule.cron",
        id="cron-reversed",
    ),
    pytest.param(
        edit(C, "schedule", "cron", value="every day"), INV, "invalid_cron", "schedule.cron", id="cron-words"
    ),
    pytest.param(
        edit(C, "schedule", "cron", value="0 0 0 * * * *"),
        INV,
        "invalid_cron",
        "schedule.cron",
        id="cron-7-fields",
    ),
    pytest.param(
        edit(C, "schedule", "cron", value=""), INV, "invalid_cron", "schedule.cron", id="cron-empty"
    ),
    pytest.param(
        edit(C, "schedule", "cron", value="0 0 * * *\x00"),
        INV,
        "invalid_cron",
        "schedule.cron",
        id="cron-nul",
    ),
    pytest.param(
        edit(C, "schedule", "cron", value="0 0 31 2 *"),
        INV,
        "cron_never_fires",
        "schedule.cron",
        id="cron-never-fires",
    ),
    # --- timezone
    pytest.param(
        edit(C, "schedule", "timezone", value="Mars/Olympus"),
        INV,
        "invalid_timezone",
        "schedule.timezone",
        id="zone-mars",
    ),
    pytest.param(
        edit(C, "schedule", "timezone", value="EST"),
        INV,
        "invalid_timezone",
        "schedule.timezone",
        id="zone-est",
    ),
    pytest.param(
        edit(C, "schedule", "timezone", value="+05:30"),
        INV,
        "invalid_timezone",
        "schedule.timezone",
        id="zone-offset",
    ),
    pytest.param(
        edit(C, "schedule", "timezone", value="../../etc/passwd"),
        INV,
        "invalid_timezone",
        "schedule.timezone",
        id="zone-path",
    ),
    pytest.param(
        edit(C, "schedule", "timezone", value=""),
        INV,
        "invalid_timezone",
        "schedule.timezone",
        id="zone-empty",
    ),
    pytest.param(
        edit(C, "schedule", "timezone", value="Europe/Berlin\x00"),
        INV,
        "invalid_timezone",
        "schedule.timezone",
        id="zone-nul",
    ),
    pytest.param(
        edit(C, "schedule", "timezone", value=1), BAD, "wrong_type", "schedule.timezone", id="zone-number"
    ),
    pytest.param(
        edit(C, "schedule", "timezone", value=None), BAD, "wrong_type", "schedule.timezone", id="zone-null"
    ),
    # --- bounds and DST rules
    pytest.param(
        edit(
            edit(C, "schedule", "start_at", value="2027-01-01T00:00:00Z"),
            "schedule",
            "end_at",
            value="2026-12-01T00:00:00Z",
        ),
        INV,
        "invalid_schedule",
        "schedule.end_at",
        id="start-after-end",
    ),
    pytest.param(
        edit(
            edit(C, "schedule", "start_at", value="2027-01-01T01:00:00+01:00"),
            "schedule",
            "end_at",
            value="2027-01-01T00:00:00Z",
        ),
        INV,
        "invalid_schedule",
        "schedule.end_at",
        id="start-equals-end-other-offset",
    ),
    pytest.param(
        edit(C, "schedule", "end_at", value="2020-01-01T00:00:00Z"),
        INV,
        "cron_never_fires",
        "schedule.end_at",
        id="end-in-past",
    ),
    pytest.param(
        edit(C, "schedule", "start_at", value="2027-01-01T00:00:00"),
        INV,
        "invalid_time",
        "schedule.start_at",
        id="start-at-naive",
    ),
    pytest.param(
        edit(C, "schedule", "end_at", value=5), BAD, "wrong_type", "schedule.end_at", id="end-at-number"
    ),
    pytest.param(
        edit(C, "schedule", "dst_gap", value="later"),
        INV,
        "invalid_value",
        "schedule.dst_gap",
        id="dst-gap-unknown",
    ),
    pytest.param(
        edit(C, "schedule", "dst_overlap", value="last"),
        INV,
        "invalid_value",
        "schedule.dst_overlap",
        id="dst-overlap-unknown",
    ),
    pytest.param(
        edit(C, "schedule", "dst_gap", value=True), BAD, "wrong_type", "schedule.dst_gap", id="dst-gap-bool"
    ),
    # --- retry
    pytest.param(edit(W, "retry", value=[5]), BAD, "wrong_type", "retry", id="retry-array"),
    pytest.param(edit(W, "retry", value=None), BAD, "wrong_type", "retry", id="retry-null"),
    pytest.param(
        edit(W, "retry", "max_retries", value=3),
        INV,
        "unknown_field",
        "retry.max_retries",
        id="retry-unknown-field",
    ),
    pytest.param(
        edit(W, "retry", "max_duration_s", value=0),
        INV,
        "invalid_value",
        "retry.max_duration_s",
        id="window-zero",
    ),
    pytest.param(
        edit(W, "retry", "max_duration_s", value=2592001),
        INV,
        "invalid_value",
        "retry.max_duration_s",
        id="window-past-30-days",
    ),
    pytest.param(
        edit(W, "retry", "max_duration_s", value="60"),
        BAD,
        "wrong_type",
        "retry.max_duration_s",
        id="window-string",
    ),
    pytest.param(
        edit(W, "retry", "max_attempts", value=0),
        INV,
        "invalid_value",
        "retry.max_attempts",
        id="attempts-zero",
    ),
    pytest.param(
        edit(W, "retry", "max_attempts", value=101),
        INV,
        "invalid_value",
        "retry.max_attempts",
        id="attempts-101",
    ),
    pytest.param(
        edit(W, "retry", "max_attempts", value=True),
        BAD,
        "wrong_type",
        "retry.max_attempts",
        id="attempts-bool",
    ),
    pytest.param(
        edit(W, "retry", "max_attempts", value=3.0),
        BAD,
        "wrong_type",
        "retry.max_attempts",
        id="attempts-float",
    ),
    pytest.param(
        edit(W, "retry", "max_attempts", value=10**30),
        INV,
        "invalid_value",
        "retry.max_attempts",
        id="attempts-huge",
    ),
    pytest.param(
        edit(W, "retry", "max_attempts", value=float("inf")),
        INV,
        "invalid_value",
        "retry.max_attempts",
        id="attempts-infinity",
    ),
    pytest.param(
        edit(W, "retry", "backoff_initial_s", value=0),
        INV,
        "invalid_value",
        "retry.backoff_initial_s",
        id="backoff-initial-zero",
    ),
    pytest.param(
        edit(W, "retry", "backoff_initial_s", value=-1.5),
        INV,
        "invalid_value",
        "retry.backoff_initial_s",
        id="backoff-initial-negative",
    ),
    pytest.param(
        edit(W, "retry", "backoff_initial_s", value="1"),
        BAD,
        "wrong_type",
        "retry.backoff_initial_s",
        id="backoff-initial-string",
    ),
    pytest.param(
        edit(W, "retry", "backoff_initial_s", value=False),
        BAD,
        "wrong_type",
        "retry.backoff_initial_s",
        id="backoff-initial-bool",
    ),
    pytest.param(
        edit(W, "retry", "backoff_max_s", value=float("inf")),
        INV,
        "invalid_value",
        "retry.backoff_max_s",
        id="backoff-max-infinity",
    ),
    pytest.param(
        edit(W, "retry", "backoff_max_s", value=float("nan")),
        INV,
        "invalid_value",
        "retry.backoff_max_s",
        id="backoff-max-nan",
    ),
    pytest.param(
        edit(W, "retry", "backoff_max_s", value=0.5),
        INV,
        "invalid_value",
        "retry.backoff_max_s",
        id="backoff-max-below-initial",
    ),
    pytest.param(
        edit(W, "retry", "backoff_max_s", value=1e300),
        INV,
        "invalid_value",
        "retry.backoff_max_s",
        id="backoff-max-huge",
    ),
    pytest.param(
        edit(W, "retry", "backoff_max_s", value=10**400),
        INV,
        "invalid_value",
        "retry.backoff_max_s",
        id="backoff-max-bigint",
    ),
    pytest.param(
        edit(W, "retry", "backoff_multiplier", value=0),
        INV,
        "invalid_value",
        "retry.backoff_multiplier",
        id="multiplier-zero",
    ),
    pytest.param(
        edit(W, "retry", "backoff_multiplier", value=1e6),
        INV,
        "invalid_value",
        "retry.backoff_multiplier",
        id="multiplier-huge",
    ),
    # --- misfire, grace, jitter
    pytest.param(edit(W, "misfire", value="catch_up"), INV, "invalid_value", "misfire", id="misfire-unknown"),
    pytest.param(
        edit(W, "misfire", value="RUN_ONCE"), INV, "invalid_value", "misfire", id="misfire-uppercase"
    ),
    pytest.param(edit(W, "misfire", value=None), BAD, "wrong_type", "misfire", id="misfire-null"),
    pytest.param(
        edit(W, "misfire_grace_s", value=-1), INV, "invalid_value", "misfire_grace_s", id="grace-negative"
    ),
    pytest.param(
        edit(W, "misfire_grace_s", value=86401), INV, "invalid_value", "misfire_grace_s", id="grace-too-big"
    ),
    pytest.param(
        edit(W, "misfire_grace_s", value=True), BAD, "wrong_type", "misfire_grace_s", id="grace-bool"
    ),
    pytest.param(edit(W, "jitter_s", value=3601), INV, "invalid_value", "jitter_s", id="jitter-3601"),
    pytest.param(edit(W, "jitter_s", value=-1), INV, "invalid_value", "jitter_s", id="jitter-negative"),
    pytest.param(edit(W, "jitter_s", value="5"), BAD, "wrong_type", "jitter_s", id="jitter-string"),
    pytest.param(edit(W, "jitter_s", value=1.5), BAD, "wrong_type", "jitter_s", id="jitter-fraction"),
    pytest.param(
        edit(W, "jitter_s", value=float("-inf")), INV, "invalid_value", "jitter_s", id="jitter-infinity"
    ),
    pytest.param(edit(W, "spread_s", value=3601), INV, "invalid_value", "spread_s", id="spread-3601"),
    pytest.param(edit(W, "spread_s", value=-1), INV, "invalid_value", "spread_s", id="spread-negative"),
    pytest.param(edit(W, "spread_s", value="5"), BAD, "wrong_type", "spread_s", id="spread-string"),
    pytest.param(edit(W, "spread_s", value=1.5), BAD, "wrong_type", "spread_s", id="spread-fraction"),
    pytest.param(edit(W, "spread_s", value=None), BAD, "wrong_type", "spread_s", id="spread-null"),
]


def test_catalogue_is_large_and_ids_are_unique() -> None:
    ids = [p.id for p in CATALOGUE]
    assert len(ids) >= 80
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize(("data", "exc_class", "code", "field"), CATALOGUE)
def test_bad_input_is_refused(data: Any, exc_class: type[DuetimeError], code: str, field: str | None) -> None:
    with pytest.raises(DuetimeError) as info:
        parse_job_spec(data, now=NOW)
    error = info.value
    assert type(error) is exc_class, error.message
    assert (error.code, error.field) == (code, field), error.message
    assert len(error.message) > 15


@pytest.mark.parametrize(
    "text",
    [
        "NaN",
        "Infinity",
        "-Infinity",
    ],
)
def test_nan_and_infinity_from_json_loads_are_refused(text: str) -> None:
    data = json.loads(
        f'{{"target": {{"type": "webhook", "url": "{URL}", "timeout_s": 5}},'
        f' "schedule": {{"run_at": "2026-07-01T10:00:00Z"}},'
        f' "retry": {{"backoff_initial_s": {text}}}}}'
    )
    with pytest.raises(InvalidRequest) as info:
        parse_job_spec(data, now=NOW)
    assert (info.value.code, info.value.field) == ("invalid_value", "retry.backoff_initial_s")


def test_unknown_field_message_suggests_the_right_name() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_job_spec(edit(W, "jiter_s", value=5), now=NOW)
    assert "jitter_s" in info.value.message


def test_float_for_integer_message_says_how_to_fix_it() -> None:
    with pytest.raises(MalformedRequest) as info:
        parse_job_spec(edit(W, "jitter_s", value=5.0), now=NOW)
    assert "write 5" in info.value.message


def test_header_errors_never_echo_the_secret_value() -> None:
    secret = "Bearer s3cr3t-t0ken"
    for value in (secret + "\r\n", secret + "\x00", secret + "\x07", secret + "x" * 9000):
        with pytest.raises(InvalidRequest) as info:
            parse_job_spec(headers({"Authorization": value}), now=NOW)
        assert "s3cr3t" not in info.value.message
        assert "s3cr3t" not in str(info.value)


def test_first_problem_wins_in_contract_order() -> None:
    data = edit(edit(W, "jitter_s", value=-1), "target", "url", value="ftp://x")
    with pytest.raises(InvalidRequest) as info:
        parse_job_spec(data, now=NOW)
    assert info.value.field == "target.url"


# --- good input -------------------------------------------------------------------------------


def test_minimal_webhook_one_off_gets_every_contract_default() -> None:
    spec = parse_job_spec(webhook_job(), now=NOW)
    assert spec == JobSpec(
        target=WebhookTarget(url=URL, method=WebhookMethod.POST, headers={}, timeout_s=30),
        schedule=OneOffSchedule(run_at=datetime(2026, 7, 1, 10, tzinfo=UTC)),
        name=None,
        payload=None,
        retry=RetryPolicy(max_attempts=5, backoff_initial_s=1.0, backoff_max_s=600.0, backoff_multiplier=2.0),
        misfire=Misfire.RUN_ONCE,
        misfire_grace_s=60,
        jitter_s=0,
    )
    assert not spec.recurring


def test_minimal_cron_gets_schedule_defaults() -> None:
    data = {
        "target": {"type": "queue", "broker": "redis", "topic": "jobs:stream"},
        "schedule": {"cron": "@daily"},
    }
    spec = parse_job_spec(data, now=NOW)
    assert spec.schedule == CronSchedule(
        cron="@daily",
        timezone="UTC",
        start_at=None,
        end_at=None,
        dst_gap=DstGap.SHIFT,
        dst_overlap=DstOverlap.FIRST,
    )
    assert spec.target == QueueTarget(broker=Broker.REDIS, topic="jobs:stream")
    assert spec.recurring


def test_full_spec_round_trips_through_the_codec() -> None:
    data: dict[str, Any] = {
        "name": "billing/rechnung-maerz:2026",
        "labels": {"team": "billing", "app.example.com/tier": "Rechnung für März 🧾"},
        "target": {
            "type": "webhook",
            "url": "https://bücher.example/hooks?x=1&y=%20",
            "method": "PUT",
            "headers": {"Authorization": "Bearer abc", "X-Trace": "t\tab", "Cookie": "a=b"},
            "timeout_s": 300,
        },
        "payload": {"invoice": 42, "lines": [1.5, None, True, "é"]},
        "schedule": {
            "cron": "30 2 * * *",
            "timezone": "Europe/Berlin",
            "start_at": "2026-06-01T00:00:00Z",
            "end_at": "2027-06-01T00:00:00Z",
            "dst_gap": "skip",
            "dst_overlap": "both",
            "exclude": ["2026-12-25", {"from": "2026-12-31", "to": "2027-01-01"}],
        },
        "retry": {
            "max_attempts": 100,
            "backoff_initial_s": 0.5,
            "backoff_max_s": 3600,
            "backoff_multiplier": 1,
            "max_duration_s": 2592000,
        },
        "misfire": "run_all",
        "misfire_grace_s": 86400,
        "jitter_s": 3600,
        "spread_s": 3600,
        "overlap": "buffer_one",
        "on_failure": {"target": {"type": "queue", "broker": "nats", "topic": "ops.failures"}, "after": 3},
        "pause_after_failures": 1000,
    }
    spec = parse_job_spec(data, now=NOW)
    expected = copy.deepcopy(data)
    expected["retry"]["backoff_max_s"] = 3600.0
    expected["retry"]["backoff_multiplier"] = 1.0
    assert spec_to_json(spec) == expected


@pytest.mark.parametrize(
    ("data", "check"),
    [
        (edit(W, "retry", "max_attempts", value=1), lambda s: s.retry.max_attempts == 1),
        (edit(W, "retry", "backoff_multiplier", value=0.5), lambda s: s.retry.backoff_multiplier == 0.5),
        (edit(W, "retry", "backoff_initial_s", value=600), lambda s: s.retry.backoff_initial_s == 600.0),
        (edit(W, "misfire_grace_s", value=0), lambda s: s.misfire_grace_s == 0),
        (edit(W, "misfire", value="skip"), lambda s: s.misfire is Misfire.SKIP),
        (edit(W, "target", "timeout_s", value=1), lambda s: s.target.timeout_s == 1),
        (edit(W, "name", value="x" * 200), lambda s: s.name == "x" * 200),
        (edit(W, "name", value="a/b:c.d_e-f"), lambda s: s.name == "a/b:c.d_e-f"),
        (edit(W, "name", value=None), lambda s: s.name is None),
        (
            edit(W, "target", "url", value="http://[2606:4700::1111]:8443/x"),
            lambda s: s.target.url == "http://[2606:4700::1111]:8443/x",
        ),
        (
            edit(W, "target", "url", value="HTTPS://Hooks.Example.COM./x"),
            lambda s: s.target.url == "HTTPS://Hooks.Example.COM./x",
        ),
        (
            edit(W, "target", "headers", value={f"X-{i}": "v" * 8192 for i in range(50)}),
            lambda s: len(s.target.headers) == 50,
        ),
        (
            edit(W, "schedule", "run_at", value="2026-07-01T12:00:00.123456789+02:00"),
            lambda s: s.schedule.run_at == datetime(2026, 7, 1, 10, 0, 0, 123456, tzinfo=UTC),
        ),
        (
            edit(W, "schedule", "run_at", value="2026-07-01t10:00:00z"),
            lambda s: s.schedule.run_at == datetime(2026, 7, 1, 10, tzinfo=UTC),
        ),
        (
            edit(W, "schedule", "run_at", value="2026-07-01T10:00:00-00:00"),
            lambda s: s.schedule.run_at == datetime(2026, 7, 1, 10, tzinfo=UTC),
        ),
        (
            edit(W, "schedule", "run_at", value="2000-01-01T00:00:00Z"),
            lambda s: s.schedule.run_at.year == 2000,
        ),
        (
            edit(W, "schedule", "run_at", value="2036-05-29T12:00:00Z"),
            lambda s: s.schedule.run_at == NOW + timedelta(days=3650),
        ),
        (edit(C, "schedule", "cron", value="*/10 * * * * *"), lambda s: s.schedule.cron == "*/10 * * * * *"),
        (
            edit(C, "schedule", "timezone", value="Australia/Lord_Howe"),
            lambda s: s.schedule.timezone.endswith("Howe"),
        ),
        (edit(C, "schedule", "start_at", value=None), lambda s: s.schedule.start_at is None),
        (queue_job(topic="a-b_c.D9"), lambda s: s.target.topic == "a-b_c.D9"),
        (queue_job(topic="a" * 255), lambda s: len(s.target.topic) == 255),
        (queue_job("redis", "jobs:{tenant}:* weird but fine"), lambda s: s.target.broker is Broker.REDIS),
        (edit(W, "payload", value="a" * 65534), lambda s: len(encoded_payload(s.payload)) == 65536),
        (edit(W, "payload", value=[[[[{"deep": None}]]]]), lambda s: s.payload == [[[[{"deep": None}]]]]),
    ],
)
def test_good_inputs_are_accepted(data: dict[str, Any], check: Any) -> None:
    assert check(parse_job_spec(data, now=NOW))


def test_parse_does_not_mutate_its_input() -> None:
    data = edit(cron_job(), "target", "headers", value={"X-A": "1"})
    before = copy.deepcopy(data)
    parse_job_spec(data, now=NOW)
    assert data == before


def test_naive_now_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        parse_job_spec(webhook_job(), now=datetime(2026, 1, 1))


# --- limits -----------------------------------------------------------------------------------


def test_limits_are_the_contract_numbers() -> None:
    limits = SpecLimits()
    assert limits.payload_max_bytes == 65536
    assert limits.name_max == 200
    assert limits.max_attempts_range == (1, 100)
    assert limits.jitter_s_range == (0, 3600)
    assert limits.spread_s_range == (0, 3600)
    assert limits.misfire_grace_s_range == (0, 86400)
    assert limits.timeout_s_range == (1, 300)
    assert limits.run_at_horizon_days == 3650
    assert limits.min_cron_interval_s == 0


def test_operator_limits_apply() -> None:
    tight = SpecLimits(payload_max_bytes=10, timeout_s_range=(1, 60), run_at_horizon_days=30)
    with pytest.raises(InvalidRequest) as info:
        parse_job_spec(edit(W, "payload", value="x" * 9), now=NOW, limits=tight)
    assert info.value.code == "payload_too_large"
    with pytest.raises(InvalidRequest) as info:
        parse_job_spec(edit(W, "target", "timeout_s", value=61), now=NOW, limits=tight)
    assert info.value.field == "target.timeout_s"
    with pytest.raises(InvalidRequest) as info:
        parse_job_spec(edit(W, "schedule", "run_at", value="2026-08-01T00:00:00Z"), now=NOW, limits=tight)
    assert info.value.field == "schedule.run_at"


@pytest.mark.parametrize(
    ("cron", "min_interval_s", "allowed"),
    [
        ("* * * * *", 60, True),
        ("* * * * *", 61, False),
        ("*/30 * * * * *", 60, False),
        ("0,1 0 * * *", 300, False),
        ("0 */2 * * *", 3600, True),
        ("@hourly", 3600, True),
        ("* * * * * *", 0, True),
    ],
)
def test_min_cron_interval(cron: str, min_interval_s: int, allowed: bool) -> None:
    limits = SpecLimits(min_cron_interval_s=min_interval_s)
    data = edit(C, "schedule", "cron", value=cron)
    if allowed:
        parse_job_spec(data, now=NOW, limits=limits)
    else:
        with pytest.raises(InvalidRequest) as info:
            parse_job_spec(data, now=NOW, limits=limits)
        assert (info.value.code, info.value.field) == ("invalid_cron", "schedule.cron")


# --- parse_time -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-12-01T00:00:00Z", datetime(2026, 12, 1, tzinfo=UTC)),
        ("2026-12-01T01:00:00+01:00", datetime(2026, 12, 1, tzinfo=UTC)),
        ("2026-11-30T19:00:00-05:00", datetime(2026, 12, 1, tzinfo=UTC)),
        ("2026-12-01T05:45:00+05:45", datetime(2026, 12, 1, tzinfo=UTC)),
        ("2026-12-01 00:00:00.5Z", datetime(2026, 12, 1, 0, 0, 0, 500000, tzinfo=UTC)),
    ],
)
def test_parse_time_reads_any_offset_into_utc(text: str, expected: datetime) -> None:
    result = parse_time(text, "schedule.run_at")
    assert result == expected
    assert result.tzinfo is UTC


# --- merge_patch ------------------------------------------------------------------------------


def stored() -> dict[str, Any]:
    data = edit(cron_job(), "name", value="nightly")
    data["target"]["headers"] = {"Authorization": "Bearer abc"}
    data["payload"] = {"a": 1}
    data["retry"] = {"max_attempts": 7, "backoff_initial_s": 2}
    return spec_to_json(parse_job_spec(data, now=NOW))


def test_empty_patch_is_a_no_op_and_copies() -> None:
    current = stored()
    merged = merge_patch(current, {})
    assert merged == current
    assert merged is not current
    merged["target"]["headers"]["X"] = "y"
    assert "X" not in current["target"]["headers"]
    assert parse_job_spec(merged, now=NOW).retry.max_attempts == 7


def test_patch_replaces_top_level_fields_and_keeps_the_rest() -> None:
    current = stored()
    spec = parse_job_spec(merge_patch(current, {"name": "renamed", "jitter_s": 30}), now=NOW)
    assert spec.name == "renamed"
    assert spec.jitter_s == 30
    assert spec.payload == {"a": 1}
    assert spec.target.headers == {"Authorization": "Bearer abc"}  # type: ignore[union-attr]


def test_patch_null_clears_name_and_payload() -> None:
    spec = parse_job_spec(merge_patch(stored(), {"name": None, "payload": None}), now=NOW)
    assert spec.name is None
    assert spec.payload is None


def test_patch_retry_merges_key_by_key() -> None:
    spec = parse_job_spec(merge_patch(stored(), {"retry": {"backoff_max_s": 30}}), now=NOW)
    assert spec.retry == RetryPolicy(
        max_attempts=7, backoff_initial_s=2.0, backoff_max_s=30.0, backoff_multiplier=2.0
    )


def test_patch_retry_null_is_a_type_error() -> None:
    with pytest.raises(MalformedRequest) as info:
        parse_job_spec(merge_patch(stored(), {"retry": None}), now=NOW)
    assert (info.value.code, info.value.field) == ("wrong_type", "retry")


def test_patch_retry_unknown_key_is_reported_with_its_path() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_job_spec(merge_patch(stored(), {"retry": {"attempts": 3}}), now=NOW)
    assert (info.value.code, info.value.field) == ("unknown_field", "retry.attempts")


def test_patch_target_is_replaced_whole() -> None:
    patch = {"target": {"type": "webhook", "url": "https://other.example.com/"}}
    spec = parse_job_spec(merge_patch(stored(), patch), now=NOW)
    assert spec.target == WebhookTarget(url="https://other.example.com/")


def test_patch_target_with_redacted_headers_is_refused() -> None:
    current = stored()
    shown = spec_to_json(parse_job_spec(current, now=NOW), redact=True)
    with pytest.raises(InvalidRequest) as info:
        parse_job_spec(merge_patch(current, {"target": shown["target"]}), now=NOW)
    assert (info.value.code, info.value.field) == ("invalid_header", "target.headers.Authorization")


def test_patch_schedule_switches_between_cron_and_run_at() -> None:
    one_off = parse_job_spec(merge_patch(stored(), {"schedule": {"run_at": "2026-06-02T00:00:00Z"}}), now=NOW)
    assert one_off.schedule == OneOffSchedule(run_at=datetime(2026, 6, 2, tzinfo=UTC))
    back = parse_job_spec(merge_patch(spec_to_json(one_off), {"schedule": {"cron": "0 * * * *"}}), now=NOW)
    assert back.schedule == CronSchedule(cron="0 * * * *")


def test_patch_schedule_is_not_merged() -> None:
    spec = parse_job_spec(merge_patch(stored(), {"schedule": {"cron": "0 3 * * *"}}), now=NOW)
    assert spec.schedule == CronSchedule(cron="0 3 * * *", timezone="UTC")


@pytest.mark.parametrize(
    ("patch", "exc_class", "code", "field"),
    [
        pytest.param([], MalformedRequest, "wrong_type", None, id="patch-array"),
        pytest.param("name", MalformedRequest, "wrong_type", None, id="patch-string"),
        pytest.param(None, MalformedRequest, "wrong_type", None, id="patch-null"),
        pytest.param({"state": "paused"}, InvalidRequest, "unknown_field", "state", id="patch-state"),
        pytest.param({"id": "j_1"}, InvalidRequest, "unknown_field", "id", id="patch-id"),
    ],
)
def test_bad_patches_are_refused(
    patch: Any, exc_class: type[DuetimeError], code: str, field: str | None
) -> None:
    current = stored()
    before = copy.deepcopy(current)
    with pytest.raises(DuetimeError) as info:
        merge_patch(current, patch)
    assert type(info.value) is exc_class
    assert (info.value.code, info.value.field) == (code, field)
    assert current == before


@pytest.mark.parametrize(
    ("patch", "code", "field"),
    [
        ({"misfire": None}, "wrong_type", "misfire"),
        ({"target": None}, "wrong_type", "target"),
        (
            {"schedule": {"cron": "0 * * * *", "run_at": "2026-06-02T00:00:00Z"}},
            "invalid_schedule",
            "schedule",
        ),
        ({"jitter_s": 99999}, "invalid_value", "jitter_s"),
    ],
)
def test_patched_specs_are_validated_like_new_ones(patch: dict[str, Any], code: str, field: str) -> None:
    with pytest.raises(DuetimeError) as info:
        parse_job_spec(merge_patch(stored(), patch), now=NOW)
    assert (info.value.code, info.value.field) == (code, field)


# --- canonical body hash ----------------------------------------------------------------------


def test_body_hash_ignores_key_order_and_whitespace() -> None:
    a = json.loads('{"b": 1, "a": {"y": [1, 2], "x": "é"}}')
    b = json.loads('{"a":{"x":"\\u00e9","y":[1,2]},"b":1}')
    assert canonical_body_hash(a) == canonical_body_hash(b)
    assert len(canonical_body_hash(a)) == 32


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ({"a": [1, 2]}, {"a": [2, 1]}),
        ({"a": 1}, {"a": "1"}),
        ({"a": 1}, {"a": True}),
        ({"a": None}, {}),
        ({"a": 1}, {"a": 1.5}),
        ({"a": {"b": 1}}, {"a.b": 1}),
    ],
)
def test_body_hash_tells_different_bodies_apart(left: Any, right: Any) -> None:
    assert canonical_body_hash(left) != canonical_body_hash(right)


def test_body_hash_treats_equal_numbers_as_equal() -> None:
    assert canonical_body_hash(json.loads('{"a": 1.0}')) == canonical_body_hash(json.loads('{"a": 1}'))
    assert canonical_body_hash(json.loads('{"a": 1e2}')) == canonical_body_hash(json.loads('{"a": 100}'))


def test_body_hash_survives_hostile_json() -> None:
    for text in ('"\\ud800"', "NaN", "[Infinity]", '{"\\u0000": 1}'):
        assert len(canonical_body_hash(json.loads(text))) == 32
    assert canonical_body_hash(json.loads('"\\ud800"')) != canonical_body_hash(json.loads('"\\ud801"'))


# --- idempotency keys -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key", ["a", "x" * 255, "7f3c1a9e-uuid-like-key", "with inner space", "~!@#$%^&*()_+{}|:<>?"]
)
def test_idempotency_key_accepted(key: str) -> None:
    assert parse_idempotency_key(key) == key


@pytest.mark.parametrize(
    "key",
    [
        pytest.param("", id="empty"),
        pytest.param("x" * 256, id="too-long"),
        pytest.param(" lead", id="leading-space"),
        pytest.param("trail ", id="trailing-space"),
        pytest.param(" ", id="only-space"),
        pytest.param("tab\there", id="tab"),
        pytest.param("new\nline", id="newline"),
        pytest.param("nul\x00", id="nul"),
        pytest.param("del\x7f", id="del"),
        pytest.param("clé", id="non-ascii"),
    ],
)
def test_idempotency_key_refused(key: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_idempotency_key(key)
    assert (info.value.code, info.value.field) == ("invalid_idempotency_key", "Idempotency-Key")
