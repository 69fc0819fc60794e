"""Plain-JSON form of the domain records, as stored in ``jobs.spec`` and shown by the API.

This is the trusted direction (our own records in and out); untrusted input goes through
``core.validation`` first. Header values are kept here in clear because workers need them;
``redacted`` is what every response and log line uses instead.
"""

from __future__ import annotations

import functools
import json
from datetime import UTC, date, datetime
from typing import Any

from duetime.core.interval import parse_every
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
    Outcome,
    Overlap,
    QueueTarget,
    RetryPolicy,
    Run,
    Schedule,
    Target,
    WebhookMethod,
    WebhookTarget,
)

REDACTED = "<redacted>"


def format_time(value: datetime) -> str:
    """RFC 3339 in UTC with a ``Z``; fractions only when the instant has them."""
    if value.tzinfo is not UTC:
        value = value.astimezone(UTC)
    return _format_utc(value)


@functools.lru_cache(maxsize=1024)
def _format_utc(value: datetime) -> str:
    """``format_time`` of a UTC instant, remembered: runs share their instants. A burst's runs
    share ``scheduled_for`` (midnight), and a Redis batch's 500 runs their ``started_at`` and
    ``finished_at``; each run spells three to five of them (history row, stream fields,
    idempotency key) at 1.4 µs a spelling, against 0.1 µs for a hit. Only UTC values are keys:
    two aware times in one other zone that differ only by ``fold`` compare equal yet are
    different instants, and converting first makes every key its own instant."""
    if value.year < 1000:  # strftime's %Y does not pad; keep that spelling for such years
        if value.microsecond:
            return value.strftime("%Y-%m-%dT%H:%M:%S.%f").rstrip("0") + "Z"
        return value.strftime("%Y-%m-%dT%H:%M:%S") + "Z"
    # isoformat is several times faster than strftime, and this runs a few times per run.
    text = value.replace(tzinfo=None).isoformat()
    return (text.rstrip("0") if value.microsecond else text) + "Z"


def parse_time(text: str) -> datetime:
    """Inverse of ``format_time`` for our own stored values (any RFC 3339 offset)."""
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if value.tzinfo is None:
        raise ValueError(f"naive datetime in stored record: {text!r}")
    return value.astimezone(UTC)


def _opt_time(value: datetime | None) -> str | None:
    return None if value is None else format_time(value)


def flow_to_json(flow: Flow) -> dict[str, Any]:
    return {"key": flow.key, "rate_per_s": flow.rate_per_s, "parallelism": flow.parallelism}


def flow_from_json(data: dict[str, Any] | None) -> Flow | None:
    if data is None:
        return None
    return Flow(key=data["key"], rate_per_s=float(data["rate_per_s"]), parallelism=int(data["parallelism"]))


def target_to_json(target: Target, *, redact: bool = False) -> dict[str, Any]:
    """A target's fields; ``flow`` only when it has one, so a spec stored before flow control
    existed and the same spec written now are the same JSON (PUT's "nothing changed" compares
    them, and the API shows no field an owner never set)."""
    out: dict[str, Any]
    if isinstance(target, WebhookTarget):
        headers = {k: (REDACTED if redact else v) for k, v in target.headers.items()}
        out = {
            "type": "webhook",
            "url": target.url,
            "method": target.method.value,
            "headers": headers,
            "timeout_s": target.timeout_s,
        }
    else:
        out = {"type": "queue", "broker": target.broker.value, "topic": target.topic}
    if target.flow is not None:
        out["flow"] = flow_to_json(target.flow)
    return out


def target_from_json(data: dict[str, Any]) -> Target:
    flow = flow_from_json(data.get("flow"))
    if data["type"] == "webhook":
        return WebhookTarget(
            url=data["url"],
            method=WebhookMethod(data.get("method", "POST")),
            headers=dict(data.get("headers") or {}),
            timeout_s=int(data.get("timeout_s", 30)),
            flow=flow,
        )
    return QueueTarget(broker=Broker(data["broker"]), topic=data["topic"], flow=flow)


def exclude_to_json(ranges: tuple[DateRange, ...]) -> list[Any]:
    """A single day as ``"YYYY-MM-DD"``, a longer stretch as ``{"from", "to"}`` (inclusive)."""
    return [
        r.first.isoformat() if r.first == r.last else {"from": r.first.isoformat(), "to": r.last.isoformat()}
        for r in ranges
    ]


def exclude_from_json(items: list[Any] | None) -> tuple[DateRange, ...]:
    ranges = []
    for item in items or ():
        if isinstance(item, str):
            day = date.fromisoformat(item)
            ranges.append(DateRange(day, day))
        else:
            ranges.append(DateRange(date.fromisoformat(item["from"]), date.fromisoformat(item["to"])))
    return tuple(ranges)


def schedule_to_json(schedule: Schedule) -> dict[str, Any]:
    if isinstance(schedule, OneOffSchedule):
        return {"run_at": format_time(schedule.run_at)}
    if isinstance(schedule, IntervalSchedule):
        return {
            "every": schedule.every,
            "start_at": format_time(schedule.start_at),
            "end_at": _opt_time(schedule.end_at),
            "timezone": schedule.timezone,
            "exclude": exclude_to_json(schedule.exclude),
        }
    return {
        "cron": schedule.cron,
        "timezone": schedule.timezone,
        "start_at": _opt_time(schedule.start_at),
        "end_at": _opt_time(schedule.end_at),
        "dst_gap": schedule.dst_gap.value,
        "dst_overlap": schedule.dst_overlap.value,
        "exclude": exclude_to_json(schedule.exclude),
    }


def schedule_from_json(data: dict[str, Any]) -> Schedule:
    if "run_at" in data:
        return OneOffSchedule(run_at=parse_time(data["run_at"]))
    if "every" in data:
        return IntervalSchedule(
            every=data["every"],
            every_s=parse_every(data["every"]),
            start_at=parse_time(data["start_at"]),
            end_at=parse_time(data["end_at"]) if data.get("end_at") else None,
            timezone=data.get("timezone", "UTC"),
            exclude=exclude_from_json(data.get("exclude")),
        )
    return CronSchedule(
        cron=data["cron"],
        timezone=data.get("timezone", "UTC"),
        start_at=parse_time(data["start_at"]) if data.get("start_at") else None,
        end_at=parse_time(data["end_at"]) if data.get("end_at") else None,
        dst_gap=DstGap(data.get("dst_gap", "shift")),
        dst_overlap=DstOverlap(data.get("dst_overlap", "first")),
        exclude=exclude_from_json(data.get("exclude")),
    )


def retry_to_json(retry: RetryPolicy) -> dict[str, Any]:
    return {
        "max_attempts": retry.max_attempts,
        "backoff_initial_s": retry.backoff_initial_s,
        "backoff_max_s": retry.backoff_max_s,
        "backoff_multiplier": retry.backoff_multiplier,
        "max_duration_s": retry.max_duration_s,
    }


def spec_to_json(spec: JobSpec, *, redact: bool = False) -> dict[str, Any]:
    return {
        "name": spec.name,
        "labels": dict(spec.labels),
        "target": target_to_json(spec.target, redact=redact),
        "payload": spec.payload,
        "schedule": schedule_to_json(spec.schedule),
        "retry": retry_to_json(spec.retry),
        "misfire": spec.misfire.value,
        "misfire_grace_s": spec.misfire_grace_s,
        "jitter_s": spec.jitter_s,
        "spread_s": spec.spread_s,
        "overlap": spec.overlap.value,
        "on_failure": on_failure_to_json(spec.on_failure, redact=redact),
        "pause_after_failures": spec.pause_after_failures,
    }


def on_failure_to_json(on_failure: OnFailure | None, *, redact: bool = False) -> dict[str, Any] | None:
    if on_failure is None:
        return None
    return {"target": target_to_json(on_failure.target, redact=redact), "after": on_failure.after}


def on_failure_from_json(data: dict[str, Any] | None) -> OnFailure | None:
    if not data:
        return None
    return OnFailure(target=target_from_json(data["target"]), after=int(data.get("after", 1)))


def spec_from_json(data: dict[str, Any]) -> JobSpec:
    retry = data.get("retry") or {}
    return JobSpec(
        name=data.get("name"),
        labels=dict(data.get("labels") or {}),
        target=target_from_json(data["target"]),
        payload=data.get("payload"),
        schedule=schedule_from_json(data["schedule"]),
        retry=RetryPolicy(
            max_attempts=int(retry.get("max_attempts", 5)),
            backoff_initial_s=float(retry.get("backoff_initial_s", 1.0)),
            backoff_max_s=float(retry.get("backoff_max_s", 600.0)),
            backoff_multiplier=float(retry.get("backoff_multiplier", 2.0)),
            max_duration_s=None if retry.get("max_duration_s") is None else int(retry["max_duration_s"]),
        ),
        misfire=Misfire(data.get("misfire", "run_once")),
        misfire_grace_s=int(data.get("misfire_grace_s", 60)),
        jitter_s=int(data.get("jitter_s", 0)),
        spread_s=int(data.get("spread_s", 0)),
        overlap=Overlap(data.get("overlap", "allow")),
        on_failure=on_failure_from_json(data.get("on_failure")),
        pause_after_failures=(
            None if data.get("pause_after_failures") is None else int(data["pause_after_failures"])
        ),
    )


def run_to_json(run: Run) -> dict[str, Any]:
    return {
        "scheduled_for": format_time(run.scheduled_for),
        "attempt": run.attempt,
        "started_at": _opt_time(run.started_at),
        "finished_at": _opt_time(run.finished_at),
        "outcome": run.outcome.value,
        "status_code": run.status_code,
        "error": run.error,
        "lateness_ms": run.lateness_ms,
        "spec_version": run.spec_version,
    }


def history_text(
    *,
    scheduled_for: datetime,
    attempt: int,
    started_at: datetime | None,
    finished_at: datetime | None,
    outcome: Outcome,
    status_code: int | None,
    error: str | None,
    lateness_ms: int | None,
) -> str:
    """``run_to_json`` of the run with these fields, as JSON text: what the completion's one
    statement stores as ``last_run`` (``::jsonb``), written straight from the columns instead of a
    dict per run encoded again by the driver. Same values, same keys (jsonb keeps no key order);
    outcome values are plain words, the error is escaped. All but ``spec_version``, which the
    node does not know: the fence wrote it on the row, and the statement adds it from there."""
    started = "null" if started_at is None else f'"{format_time(started_at)}"'
    finished = "null" if finished_at is None else f'"{format_time(finished_at)}"'
    code = "null" if status_code is None else str(int(status_code))
    late = "null" if lateness_ms is None else str(int(lateness_ms))
    err = "null" if error is None else json.dumps(error)
    return (
        f'{{"scheduled_for":"{format_time(scheduled_for)}","attempt":{int(attempt)},'
        f'"started_at":{started},"finished_at":{finished},"outcome":"{outcome.value}",'
        f'"status_code":{code},"error":{err},"lateness_ms":{late}}}'
    )


def run_from_json(data: dict[str, Any]) -> Run:
    return Run(
        scheduled_for=parse_time(data["scheduled_for"]),
        attempt=int(data["attempt"]),
        started_at=parse_time(data["started_at"]) if data.get("started_at") else None,
        finished_at=parse_time(data["finished_at"]) if data.get("finished_at") else None,
        outcome=Outcome(data["outcome"]),
        status_code=data.get("status_code"),
        error=data.get("error"),
        lateness_ms=data.get("lateness_ms"),
        spec_version=int(data.get("spec_version", 1)),
    )
