"""Tracing with the SDK's in-memory exporter: each attempt of a run is a `duetime.run` span, the
attempts of one occurrence share a trace, and the real receiver and a real Redis stream get the
W3C traceparent of the attempt's span. Off without OTEL_TRACES_EXPORTER."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from duetime.app import Node
from duetime.workers import tracing
from tests.support.node import Owner, at
from tests.support.receiver import Receiver

pytestmark = pytest.mark.redis  # reads the Redis stream itself

# version 00, trace id, span id, flags: sampled (01), with the SDK's random-trace-id bit (02)
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-0[13]")


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.install(tracing.provider(SimpleSpanProcessor(exporter)))
    yield exporter
    tracing.install(None)


async def test_each_attempt_is_a_span_of_the_runs_trace_and_the_target_gets_its_traceparent(
    node: Node, owner: Owner, receiver: Receiver, spans: InMemorySpanExporter
) -> None:
    receiver.behaviour["/traced"] = lambda n: 500 if n == 1 else 200
    job = await owner.create(
        {
            "target": {"type": "webhook", "url": f"{receiver.url}/traced"},
            "schedule": {"run_at": at(0)},
            "retry": {"max_attempts": 3, "backoff_initial_s": 0.1, "backoff_max_s": 0.1},
        }
    )
    calls = await receiver.wait_for("/traced", 2, within=30)
    for _ in range(50):
        finished = [s for s in spans.get_finished_spans() if _attrs(s)["duetime.job_id"] == job["id"]]
        if len(finished) == 2:
            break
        await asyncio.sleep(0.1)
    assert len(finished) == 2, finished
    parents = [_TRACEPARENT.fullmatch(c.headers["traceparent"]) for c in calls]
    assert all(parents), [c.headers.get("traceparent") for c in calls]
    trace_ids = {p.group(1) for p in parents if p}
    assert len(trace_ids) == 1, "both attempts of one occurrence are in one trace"
    by_span = {f"{s.context.span_id:016x}": s for s in finished}
    for call, parent in zip(calls, parents, strict=True):
        assert parent is not None
        span = by_span[parent.group(2)]  # the header names the attempt's own span
        assert f"{span.context.trace_id:032x}" == parent.group(1)
        assert span.name == "duetime.run"
        assert _attrs(span)["duetime.attempt"] == int(call.headers["Duetime-Attempt"])
        assert _attrs(span)["duetime.idempotency_key"] == call.headers["Idempotency-Key"]
    outcomes = sorted(str(_attrs(s)["duetime.outcome"]) for s in finished)
    assert outcomes == ["failed", "succeeded"]
    assert trace_ids == {f"{tracing.trace_id_of(calls[0].headers['Idempotency-Key']):032x}"}


async def test_a_redis_queue_message_carries_the_traceparent(
    node: Node, owner: Owner, spans: InMemorySpanExporter
) -> None:
    stream = f"duetime-test-trace-{uuid.uuid4().hex[:8]}"
    client = aioredis.Redis.from_url("redis://127.0.0.1:6379/0")
    try:
        job = await owner.create(
            {"target": {"type": "queue", "broker": "redis", "topic": stream}, "schedule": {"run_at": at(0)}}
        )
        for _ in range(100):
            entries = await client.xrange(stream)
            if entries:
                break
            await asyncio.sleep(0.1)
        assert entries, "the message arrived"
        fields = entries[0][1]
        assert fields is not None
        raw = fields[b"traceparent"]
        parent = _TRACEPARENT.fullmatch(raw.decode() if isinstance(raw, bytes) else raw)
        assert parent is not None
        for _ in range(50):
            mine = [s for s in spans.get_finished_spans() if _attrs(s)["duetime.job_id"] == job["id"]]
            if mine:
                break
            await asyncio.sleep(0.1)
        assert [f"{s.context.span_id:016x}" for s in mine] == [parent.group(2)]
        assert _attrs(mine[0])["duetime.target.type"] == "queue"
    finally:
        await client.delete(stream)
        await client.aclose()


async def test_no_traceparent_while_tracing_is_off(node: Node, owner: Owner, receiver: Receiver) -> None:
    assert not tracing.enabled()
    await owner.create(
        {"target": {"type": "webhook", "url": f"{receiver.url}/plain"}, "schedule": {"run_at": at(0)}}
    )
    (call,) = await receiver.wait_for("/plain", 1, within=20)
    assert "traceparent" not in {k.lower() for k in call.headers}


def test_the_switch_is_the_standard_variable() -> None:
    try:
        assert tracing.configure({}) is False
        assert tracing.configure({"OTEL_TRACES_EXPORTER": "none"}) is False
        assert not tracing.enabled()
        with pytest.raises(tracing.TracingUnavailable, match="unknown exporter 'zipkinx'"):
            tracing.configure({"OTEL_TRACES_EXPORTER": "zipkinx"})
        assert tracing.configure({"OTEL_TRACES_EXPORTER": "console"}) is True
        assert tracing.enabled()
    finally:
        tracing.install(None)
