"""The worker's outbound edge: turn one ``Delivery`` into one call of its target.

``Dispatcher.deliver`` is the only entry point. It waits for the target host's politeness limits
(per-host concurrency and rate, then a cap on all calls in flight), makes exactly one attempt and
classifies the result. It never retries and never raises for a target's failure: the scheduler
owns retries, and it needs a verdict (outcome + retryable), not an exception, to apply the job's
retry policy.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from duetime.core import signing, ssrf
from duetime.core.model import Outcome, QueueTarget, Target, WebhookTarget
from duetime.core.runpath import CallResult, Delivery, Verdict
from duetime.core.topics import TopicPolicy
from duetime.storage.dbclock import DB_CLOCK
from duetime.workers import http1, webhook
from duetime.workers.limits import HostLimiter
from duetime.workers.queues import QueuePublisher

log = logging.getLogger(__name__)


__all__ = ["BatchResult", "CallResult", "Delivery", "Dispatcher"]


@dataclass(frozen=True, slots=True)
class BatchResult:
    """One attempt each for a batch of deliveries sent together: one verdict per delivery, in
    order, and the one send's start and end."""

    started_at: datetime
    finished_at: datetime
    verdicts: list[Verdict]


def _utcnow() -> datetime:
    """Attempt times by the database's clock (storage.dbclock): lateness is measured against it."""
    return DB_CLOCK.now()


class Dispatcher:
    """Calls targets for one worker process: one HTTP client (keep-alive pool), one connection per
    broker."""

    def __init__(
        self,
        *,
        policy: ssrf.AddressPolicy,
        nats_url: str | None,
        redis_url: str | None,
        host_concurrency: int = 256,
        host_rate_per_s: float = 10000.0,
        host_burst: int | None = None,
        total_concurrency: int = 4096,
        broker_timeout_s: float = 10.0,
        clock: Callable[[], datetime] = _utcnow,
        ssl_context: ssl.SSLContext | None = None,
        topic_policy: TopicPolicy | None = None,
    ) -> None:
        self._policy = policy
        self._total_concurrency = total_concurrency
        self._limiter = HostLimiter(host_concurrency, host_rate_per_s, host_burst)
        # The worker's per-host queues apply the same limits to runs (workers/pool.py).
        self.host_concurrency = host_concurrency
        self.host_rate_per_s = host_rate_per_s
        self.host_burst = host_burst
        self._total = asyncio.Semaphore(total_concurrency)
        self.broker_timeout_s = broker_timeout_s
        self._queues = QueuePublisher(
            nats_url=nats_url, redis_url=redis_url, timeout_s=broker_timeout_s, topic_policy=topic_policy
        )
        self._clock = clock
        self._ssl_context = ssl_context
        self._http: http1.Http1Pool | None = None

    @property
    def limiter(self) -> HostLimiter:
        return self._limiter

    async def start(self) -> None:
        if self._http is None:
            self._http = webhook.new_client(
                self._policy, total_concurrency=self._total_concurrency, ssl_context=self._ssl_context
            )

    async def close(self) -> None:
        http, self._http = self._http, None
        if http is not None:
            await http.close()
        await self._queues.close()

    async def deliver(self, d: Delivery) -> CallResult:
        """One attempt, after waiting for its host's politeness limits here (the failure events'
        path). Cancellation (worker shutdown) propagates; every other failure is a result."""
        try:
            key = self.host_of(d.target)
        except ValueError:
            now = self._clock()
            return CallResult(Verdict(Outcome.FAILED, False, None, "invalid webhook URL"), now, now)
        # Host first, then the global cap: a slow host queues behind its own limit without
        # holding global slots that other hosts could use.
        async with self._limiter.slot(key), self._total:
            return await self.call(d)

    async def call(self, d: Delivery) -> CallResult:
        """One attempt now: the caller (the worker's per-host queues, workers/hostqueues.py) has
        already given it its host's slot. Cancellation propagates; every other failure is a
        result."""
        http = self._http
        if http is None:
            raise RuntimeError("Dispatcher.call() before start()")
        target = d.target
        started_at = self._clock()
        try:
            body = signing.encode_body(d.payload)
            verdict = await self._call(http, d, target, body, started_at)
        except Exception as exc:
            # Our own bug, not the target's: record it as a retryable failure and keep going.
            log.exception("delivery of job %s failed inside the dispatcher", d.job_id)
            verdict = Verdict(Outcome.FAILED, True, None, f"internal error ({type(exc).__name__})")
        return CallResult(verdict, started_at, max(self._clock(), started_at))

    def now(self) -> datetime:
        """The clock attempts are timed by (the database's: lateness is measured against it)."""
        return self._clock()

    def begin(self, d: Delivery, now: datetime) -> Verdict | webhook.Started:
        """A webhook attempt started without a task (``webhook.begin``), or its verdict when it
        was decided before any request; the caller has given it its host's slot, as for
        ``call``. An error of ours is a retryable failure here too, never raised."""
        http = self._http
        if http is None:
            raise RuntimeError("Dispatcher.begin() before start()")
        target = d.target
        if not isinstance(target, WebhookTarget):
            raise TypeError("Dispatcher.begin() starts webhook calls; queue targets go through call()")
        try:
            body = signing.encode_body(d.payload)
            return webhook.begin(http, policy=self._policy, d=d, target=target, body=body, now=now)
        except Exception as exc:
            log.exception("delivery of job %s failed inside the dispatcher", d.job_id)
            return Verdict(Outcome.FAILED, True, None, f"internal error ({type(exc).__name__})")

    async def deliver_redis_many(self, ds: list[Delivery]) -> BatchResult:
        """One attempt each for many deliveries to Redis targets, sent together in one batcher
        call; the caller has given the batch its slot (one) and its rate (one token a run)."""
        started_at = self._clock()
        try:
            verdicts = await self._queues.publish_redis_many(ds)
        except Exception as exc:
            log.exception("delivery of %d Redis runs failed inside the dispatcher", len(ds))
            failed = Verdict(Outcome.FAILED, True, None, f"internal error ({type(exc).__name__})")
            verdicts = [failed] * len(ds)
        return BatchResult(started_at, max(self._clock(), started_at), verdicts)

    async def _call(
        self, http: http1.Http1Pool, d: Delivery, target: Target, body: bytes, now: datetime
    ) -> Verdict:
        if isinstance(target, WebhookTarget):
            return await webhook.call(http, policy=self._policy, d=d, target=target, body=body, now=now)
        return await self._queues.publish(d, target, body)

    @staticmethod
    def host_of(target: Target) -> str:
        """The unit the per-host limits and health are counted in: ``host:port`` of a webhook
        URL (``ValueError`` when it does not parse), ``broker:<name>`` for a queue."""
        if isinstance(target, QueueTarget):
            return f"broker:{target.broker.value}"
        return webhook.limiter_key(target.url)
