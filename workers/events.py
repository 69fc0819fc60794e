"""The delivery service of failure events (``job.failing``, ``job.paused``, ``job.recovered``).

The completion writer puts events into an outbox in the transaction that counted the failure
(core/failures.py); this service empties it, apart from the run path: it claims due events in
batches (SKIP LOCKED and a lease, so every worker process can run one), calls each event's target
through the workers' own ``Dispatcher`` (the SSRF guard, per-host limits, the Standard Webhooks
signature under the owner's secret, the queue publishers), and settles the batch: a delivered
event is deleted, a failed one is tried again by the default retry policy (full-jitter backoff,
a 429/503's Retry-After), and one whose attempts ran out is given up on (logged, counted, kept
for ``given_up_retention_s`` and then deleted). At-least-once: an event whose holder dies
before settling comes due again when its lease ends. Nothing here blocks a run: the service has
its own task, its own batch and at most ``concurrency`` calls in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from prometheus_client import Counter

from duetime.core import retry
from duetime.core.errors import DuetimeError
from duetime.core.model import Outcome, RetryPolicy
from duetime.core.runpath import Delivery, Verdict
from duetime.storage.ports import EventOutbox, EventSettlement, OutboxEvent
from duetime.supervisor import SUPERVISOR
from duetime.workers.dispatch import Dispatcher
from duetime.workers.pool import SecretCache

log = logging.getLogger("duetime.events")

EVENTS = Counter(
    "duetime_failure_events_total",
    "Failure event delivery attempts by result: delivered, retried (another attempt is due), "
    "gave_up (the default retry policy's attempts ran out, or the target refused it for good)",
    ["result"],
)

#: The contract's "default retry policy": what a job gets when its spec says nothing.
DEFAULT_POLICY = RetryPolicy()


@dataclass(frozen=True, slots=True)
class EventSenderConfig:
    batch: int = 100  # events claimed per round
    interval_s: float = 1.0  # how often the outbox is looked at when the last round was empty
    # An event's lease: longer than any call (a webhook's timeout_s is at most 300 s), so a live
    # holder settles it first; a dead holder's events come due again after it.
    lease_s: float = 360.0
    concurrency: int = 64  # calls in flight at most
    given_up_retention_s: int = 2_592_000  # 0 keeps events given up on forever
    purge_every_s: float = 60.0


def _utcnow() -> datetime:
    return datetime.now(UTC)


def settle(
    event: OutboxEvent,
    verdict: Verdict,
    now: datetime,
    policy: RetryPolicy = DEFAULT_POLICY,
) -> EventSettlement:
    """What one attempt of ``event`` leads to: delivered; retried by ``policy`` (a retryable
    failure with attempts left); or given up on."""
    if verdict.outcome is Outcome.SUCCEEDED:
        return EventSettlement(event, delivered=True)
    error = verdict.error or verdict.outcome.value
    if verdict.retryable and event.attempts < policy.max_attempts:
        at = retry.plan_retry(policy, event.attempts, now, due=now, retry_after=verdict.retry_after_s)
        if at is not None:
            return EventSettlement(event, delivered=False, retry_at=at, error=error)
    return EventSettlement(event, delivered=False, retry_at=None, error=error)


class EventSender:
    """Delivers the outbox's failure events; ``run_round`` is one batch, ``start`` loops it."""

    def __init__(
        self,
        store: EventOutbox,
        dispatcher: Dispatcher,
        config: EventSenderConfig = EventSenderConfig(),
        *,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        self._store = store
        self._dispatcher = dispatcher
        self._config = config
        self._clock = clock
        self._secrets = SecretCache(store)
        self._slots = asyncio.Semaphore(config.concurrency)
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._next_purge = 0.0

    async def run_round(self) -> int:
        """Claim one batch, deliver it, settle it; returns how many events were claimed."""
        events = await self._store.claim_events(limit=self._config.batch, lease_s=self._config.lease_s)
        if not events:
            return 0
        settlements = await asyncio.gather(*(self._deliver(e) for e in events))
        await self._store.settle_events(settlements)
        for s in settlements:
            if s.delivered:
                EVENTS.labels("delivered").inc()
            elif s.retry_at is not None:
                EVENTS.labels("retried").inc()
            else:
                EVENTS.labels("gave_up").inc()
                log.warning(
                    "gave up on failure event %s after %d attempts: %s",
                    s.event.event_id,
                    s.event.attempts,
                    s.error,
                )
        return len(events)

    async def _deliver(self, event: OutboxEvent) -> EventSettlement:
        async with self._slots:
            try:
                secrets = await self._secrets.get(event.owner)
            except (LookupError, DuetimeError) as exc:
                verdict = Verdict(Outcome.FAILED, True, None, f"signing secret unavailable: {exc}")
                return settle(event, verdict, self._clock())
            delivery = Delivery(
                job_id=str(event.job_id),
                scheduled_for=event.scheduled_for,
                attempt=event.attempts,
                fencing_token=event.fencing_token,
                owner=event.owner,
                signing_secret=secrets[0],
                payload=event.body,
                target=event.target,
                extra_signing_secrets=secrets[1:],
                event=event.kind,
            )
            result = await self._dispatcher.deliver(delivery)
            return settle(event, result.verdict, self._clock())

    async def purge(self) -> int:
        """Delete the events given up on longer ago than the retention."""
        keep = self._config.given_up_retention_s
        if keep <= 0:
            return 0
        before = self._clock() - timedelta(seconds=keep)
        return await self._store.purge_given_up_events(before=before, limit=1000)

    def start(self) -> None:
        if self._task is None:
            self._task = SUPERVISOR.spawn("duetime-events", self._loop)

    async def stop(self, grace_s: float) -> None:
        """Stop claiming; let the calls of the round in flight finish and settle within the grace.
        A round cut short leaves its events leased: they come due again after the lease."""
        self._stopping.set()
        task, self._task = self._task, None
        if task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout=grace_s)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            claimed = 0
            try:
                claimed = await self.run_round()
                if time.monotonic() >= self._next_purge:
                    self._next_purge = time.monotonic() + self._config.purge_every_s
                    purged = await self.purge()
                    if purged:
                        log.info("deleted %d failure events given up on", purged)
            except DuetimeError as exc:
                log.warning("failure event round failed, the next one retries: %s", exc)
            except Exception:
                log.exception("failure event round failed; the next one retries")
            if claimed < self._config.batch:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), timeout=self._config.interval_s)


__all__ = ["DEFAULT_POLICY", "EventSender", "EventSenderConfig", "settle"]
