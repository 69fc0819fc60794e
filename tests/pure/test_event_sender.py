"""The failure events' delivery service on the in-memory store, with a target that takes its
time: a stop lets the calls in flight finish and settles them within the grace; a stop whose
grace is shorter leaves the events leased, to come due again (at-least-once, never lost)."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any

from duetime.core.model import OnFailure, Outcome, Overlap, WebhookTarget
from duetime.core.runpath import Delivery, Verdict
from duetime.storage.memory import MemoryStore
from duetime.workers.events import EventSender, EventSenderConfig
from tests.contract.conftest import cron, engine_id, new_owner
from tests.contract.test_failure_contract import _occurrence

HOOK = WebhookTarget(url="https://example.com/failures")


@dataclass
class _SlowTarget:
    """Stands in for the workers' Dispatcher: answers 200 after ``delay_s``."""

    delay_s: float
    calls: list[Delivery] = field(default_factory=list)

    async def deliver(self, d: Delivery) -> Any:
        self.calls.append(d)
        await asyncio.sleep(self.delay_s)

        @dataclass
        class _Result:
            verdict: Verdict

        return _Result(Verdict(Outcome.SUCCEEDED, False, 200))


async def _store_with_one_event() -> MemoryStore:
    store = MemoryStore()
    o = new_owner()
    await store.create_api_key(o)
    spec = cron("0 0 1 1 *", overlap=Overlap.SKIP, on_failure=OnFailure(target=HOOK, after=1))
    job, _ = await store.create_job(o, spec)
    await _occurrence(store, o, engine_id(), uuid.UUID(job.id), Outcome.FAILED)
    assert [e.kind.value for e in store.failure_events()] == ["job.failing"]
    return store


async def _started(delay_s: float) -> tuple[MemoryStore, _SlowTarget, EventSender]:
    store = await _store_with_one_event()
    target = _SlowTarget(delay_s)
    sender = EventSender(store, target, EventSenderConfig(interval_s=0.05))  # type: ignore[arg-type]
    sender.start()
    for _ in range(100):
        if target.calls:
            break
        await asyncio.sleep(0.02)
    assert len(target.calls) == 1, "the event's call is in flight"
    return store, target, sender


async def test_a_stop_finishes_the_call_in_flight_and_settles_it() -> None:
    store, target, sender = await _started(0.3)
    await sender.stop(grace_s=5)
    assert store.failure_events() == [], "delivered and removed from the outbox"
    assert target.calls[0].event == "job.failing"


async def test_a_stop_past_its_grace_leaves_the_event_for_a_later_delivery() -> None:
    store, _, sender = await _started(5.0)
    await sender.stop(grace_s=0.1)
    assert [e.kind.value for e in store.failure_events()] == ["job.failing"], "still in the outbox"
    assert await store.claim_events(limit=10, lease_s=1) == [], "leased: not due again at once"
