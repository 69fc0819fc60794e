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
from dataclasses import replace

from duetime.runqueue.leases import LeaseKeeper
from duetime.runqueue.natsqueue import NatsRunConsumer
from duetime.storage.ports import RunStore
from duetime.workers.dispatch import Dispatcher
from duetime.workers.pool import WorkerOptions, WorkerPool


def worker_id() -> str:
    """Unique per process: a worker's leases must never be mistaken for a restarted one's."""
    return f"worker:{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class RemoteWorker:
    """Takes its figures as arguments, not the settings: the composition root (duetime/app.py)
    reads DUETIME_* and passes them on, so the workers do not depend on it."""

    def __init__(
        self,
        store: RunStore,
        dispatcher: Dispatcher,
        *,
        nats_url: str,
        subject_prefix: str,
        lease_s: float,
        heartbeat_s: float,
        ack_wait_s: float,
        concurrency: int,
        shutdown_grace_s: float,
        options: WorkerOptions | None = None,
    ) -> None:
        self.id = worker_id()
        options = replace(options or WorkerOptions(), worker_id=self.id)
        self._grace = shutdown_grace_s
        self.keeper = LeaseKeeper(store, lease_s=lease_s, heartbeat_s=heartbeat_s)
        self.queue = NatsRunConsumer(
            store,
            self.keeper,
            url=nats_url,
            prefix=subject_prefix,
            holder=self.id,
            lease_s=lease_s,
            ack_wait_s=ack_wait_s,
            # The runs it holds: those called and those waiting in the host queues for their host.
            concurrency=concurrency + options.max_waiting,
        )
        self.pool = WorkerPool(
            store,
            self.queue,
            dispatcher,
            self.keeper,
            concurrency=concurrency,
            on_recorded=self.queue.recorded,
            options=options,
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
