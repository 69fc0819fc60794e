"""``duetime worker``: a worker process fed by the NATS run queue instead of an engine in-process.

It is the in-process worker pool (same dispatcher, same batching completer, same heartbeats) with
a different queue in front: ``NatsRunConsumer`` takes each run's lease over in PostgreSQL before
the call and acks its message only once the completer has recorded the outcome.

Shutdown (SIGTERM): stop fetching → the calls already taken finish within the grace and are
recorded → their messages are acked → heartbeats stop → the connection closes. A call still in
flight after the grace keeps its lease until it lapses; the janitor then retries it.
"""

from __future__ import annotations

import os
import secrets
import socket

from duetime.engine.leases import LeaseKeeper
from duetime.engine.natsqueue import NatsRunConsumer
from duetime.settings import Settings
from duetime.storage.ports import RunStore
from duetime.workers.dispatch import Dispatcher
from duetime.workers.pool import WorkerPool


def worker_id() -> str:
    """Unique per process: a worker's leases must never be mistaken for a restarted one's."""
    return f"worker:{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class RemoteWorker:
    def __init__(self, store: RunStore, dispatcher: Dispatcher, settings: Settings) -> None:
        s = settings
        assert s.nats_url is not None, "DUETIME_RUN_QUEUE=nats needs DUETIME_NATS_URL (checked by Settings)"
        self.id = worker_id()
        self._grace = s.shutdown_grace_s
        self.keeper = LeaseKeeper(store, lease_s=s.lease_s, heartbeat_s=s.heartbeat_s)
        self.queue = NatsRunConsumer(
            store,
            self.keeper,
            url=s.nats_url,
            prefix=s.nats_run_subject,
            holder=self.id,
            lease_s=s.lease_s,
            ack_wait_s=s.nats_ack_wait_s,
            concurrency=s.worker_concurrency,
        )
        self.pool = WorkerPool(
            store,
            self.queue,
            dispatcher,
            self.keeper,
            concurrency=s.worker_concurrency,
            on_recorded=self.queue.recorded,
        )

    async def start(self) -> None:
        await self.queue.start()
        self.keeper.start()
        self.pool.start()

    def ready(self) -> str | None:
        """Why this worker cannot work right now, or None."""
        return None if self.queue.connected else "not connected to NATS"

    async def stop(self) -> None:
        await self.queue.stop_fetching()
        await self.pool.stop(self._grace)
        await self.keeper.stop()
        await self.queue.close()
