"""A stored spec's JSON text → ``JobSpec``, decoded by msgspec in C, with ``codec`` as the reference.

Why: every run decodes the spec it was fenced with once, for its call and its completion. With
``json.loads`` and ``codec.spec_from_json`` that was 14.6 µs per run on a 2-core machine (a dict
tree, then a dozen frozen dataclass ``__init__`` calls); the run path's node spends ~90 µs per run
in all. msgspec decodes the text straight into typed objects: the nested records that are plain
dataclasses (``RetryPolicy``) it builds itself, and the unions it cannot (a target is a webhook or
a queue, a schedule one of three shapes with no tag) go through small structs.

What it must not change: the result. ``codec.spec_from_json`` stays the definition of what a stored
spec means, and this module answers exactly what it answers, or falls back to it: any text outside
the shapes our own codec writes (a number where an int belongs, an unknown target type, a naive
time, an empty ``on_failure``, ``NaN``) raises inside msgspec and is decoded again by the reference,
which then returns or raises what it always did. ``tests/pure/test_spectext.py`` holds the two
equal over generated specs and the odd shapes.

Stored specs come from our own codec (the trusted direction, see ``core.codec``): untrusted input
is validated by ``core.validation`` before it is ever stored.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import msgspec

from duetime.core import codec
from duetime.core.interval import parse_every
from duetime.core.model import (
    Broker,
    CronSchedule,
    DstGap,
    DstOverlap,
    Flow,
    IntervalSchedule,
    JobSpec,
    Misfire,
    OneOffSchedule,
    OnFailure,
    Overlap,
    QueueTarget,
    RetryPolicy,
    Schedule,
    Target,
    WebhookMethod,
    WebhookTarget,
)

__all__ = ["spec_from_text"]


class _Flow(msgspec.Struct):
    key: str
    rate_per_s: float
    parallelism: int


class _Queue(msgspec.Struct, tag_field="type", tag="queue"):
    broker: Broker
    topic: str
    flow: _Flow | None = None


class _Webhook(msgspec.Struct, tag_field="type", tag="webhook"):
    url: str
    method: WebhookMethod = WebhookMethod.POST
    headers: dict[str, str] | None = None
    timeout_s: int = 30
    flow: _Flow | None = None


class _Schedule(msgspec.Struct):
    """Every key of the three schedule shapes; which one it is, ``codec.schedule_from_json``'s
    order decides (``run_at``, else ``every``, else cron)."""

    run_at: datetime | None = None
    every: str | None = None
    cron: str | None = None
    timezone: str = "UTC"
    start_at: datetime | None = None
    end_at: datetime | None = None
    dst_gap: DstGap = DstGap.SHIFT
    dst_overlap: DstOverlap = DstOverlap.FIRST
    exclude: list[Any] | None = None


class _OnFailure(msgspec.Struct):
    target: _Queue | _Webhook
    after: int = 1


class _Spec(msgspec.Struct):
    target: _Queue | _Webhook
    schedule: _Schedule
    name: str | None = None
    labels: dict[str, str] | None = None
    payload: Any = None
    retry: RetryPolicy | None = None
    misfire: Misfire = Misfire.RUN_ONCE
    misfire_grace_s: int = 60
    jitter_s: int = 0
    spread_s: int = 0
    overlap: Overlap = Overlap.ALLOW
    on_failure: _OnFailure | None = None
    pause_after_failures: int | None = None


_decode = msgspec.json.Decoder(_Spec).decode


class _Other(Exception):
    """A shape the fast path leaves to the reference decoder."""


def spec_from_text(text: str | bytes) -> JobSpec:
    """The ``JobSpec`` a stored spec's JSON text means: ``codec.spec_from_json(json.loads(text))``."""
    try:
        s = _decode(text)
        schedule = _schedule(s.schedule, text)
        on_failure = None
        if s.on_failure is not None:
            on_failure = OnFailure(target=_target(s.on_failure.target), after=s.on_failure.after)
        return JobSpec(
            target=_target(s.target),
            schedule=schedule,
            name=s.name,
            payload=s.payload,
            labels={} if s.labels is None else s.labels,
            retry=RetryPolicy() if s.retry is None else s.retry,
            misfire=s.misfire,
            misfire_grace_s=s.misfire_grace_s,
            jitter_s=s.jitter_s,
            spread_s=s.spread_s,
            overlap=s.overlap,
            on_failure=on_failure,
            pause_after_failures=s.pause_after_failures,
        )
    except (msgspec.ValidationError, msgspec.DecodeError, _Other):
        return codec.spec_from_json(json.loads(text))


def _target(t: _Queue | _Webhook) -> Target:
    flow = None if t.flow is None else Flow(t.flow.key, t.flow.rate_per_s, t.flow.parallelism)
    if isinstance(t, _Queue):
        return QueueTarget(broker=t.broker, topic=t.topic, flow=flow)
    return WebhookTarget(
        url=t.url,
        method=t.method,
        headers={} if t.headers is None else t.headers,
        timeout_s=t.timeout_s,
        flow=flow,
    )


def _utc(value: datetime | None) -> datetime | None:
    """``codec.parse_time``'s answer for a time msgspec read: aware, in UTC (naive: the reference
    raises, so it decides)."""
    if value is None or value.tzinfo is UTC:
        return value
    if value.tzinfo is None:
        raise _Other
    return value.astimezone(UTC)


def _schedule(s: _Schedule, text: str | bytes) -> Schedule:
    """The reference picks the shape by which keys are present (``"run_at" in data``), not by
    their values, and msgspec reads a null and an absent key alike; so a shape other than a
    one-off is only taken here when the text has no such key anywhere (a payload that happens to
    hold one sends the spec to the reference, which is merely slower)."""
    if s.run_at is not None:
        run_at = _utc(s.run_at)
        assert run_at is not None
        return OneOffSchedule(run_at=run_at)
    raw = text if isinstance(text, str) else text.decode("utf-8", "replace")
    if '"run_at"' in raw:
        raise _Other
    exclude = () if not s.exclude else codec.exclude_from_json(s.exclude)
    if s.every is not None:
        if s.start_at is None:
            raise _Other
        start_at = _utc(s.start_at)
        assert start_at is not None
        return IntervalSchedule(
            every=s.every,
            every_s=parse_every(s.every),
            start_at=start_at,
            end_at=_utc(s.end_at),
            timezone=s.timezone,
            exclude=exclude,
        )
    if s.cron is None or '"every"' in raw:
        raise _Other
    return CronSchedule(
        cron=s.cron,
        timezone=s.timezone,
        start_at=_utc(s.start_at),
        end_at=_utc(s.end_at),
        dst_gap=s.dst_gap,
        dst_overlap=s.dst_overlap,
        exclude=exclude,
    )
