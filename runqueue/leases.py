"""Heartbeats for runs that passed the fence and have not been recorded yet.

A fenced run holds a lease of ``lease_s``; while it waits in the run queue or its call is in
flight, the keeper extends every held lease in one batched statement per database each
``heartbeat_s`` (a third of the lease, so two heartbeats can fail before anything lapses).
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from duetime.core.errors import is_transient
from duetime.core.runpath import Leased
from duetime.runqueue import metrics
from duetime.runqueue.databases import each_database
from duetime.storage.ports import RunStore
from duetime.supervisor import SUPERVISOR

log = logging.getLogger("duetime.leases")

_CHUNK = 1000


class LeaseKeeper:
    fence_lease_s: float | None = None
    """How long the fence's lease of a run this keeper keeps should last; None: the engine's
    ``lease_s``. The NATS publisher's keeper fences for longer (see ``PublishedLeaseKeeper``)."""

    def __init__(self, store: RunStore, *, lease_s: float, heartbeat_s: float) -> None:
        self._store = store
        self._lease_s = lease_s
        self._heartbeat_s = heartbeat_s
        # The lease of each run held, as the record it came in (a fenced run, alive anyway while
        # it waits in the run queue or is called): nothing is copied per run.
        self._held: dict[uuid.UUID, Leased] = {}
        self._settling: set[uuid.UUID] = set()
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    def track(self, run: Leased) -> None:
        self._held[run.job_id] = run

    def settling(self, job_ids: list[uuid.UUID]) -> None:
        """These runs' outcomes are being written: a heartbeat that finds them idle is not a
        lost lease, it raced the completion."""
        self._settling.update(job_ids)

    def untrack(self, job_id: uuid.UUID, token: int) -> None:
        self._settling.discard(job_id)
        held = self._held.get(job_id)
        if held is not None and held.lease_token == token:
            del self._held[job_id]

    def _still_held(self, lease: Leased) -> bool:
        held = self._held.get(lease.job_id)
        return held is not None and held.lease_token == lease.lease_token

    def __len__(self) -> int:
        return len(self._held)

    def start(self) -> None:
        self._task = SUPERVISOR.spawn(
            "duetime-lease-keeper", self._run, keep_going=lambda: not self._stop.is_set()
        )

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    async def beat(self) -> None:
        """Extend every held lease once; forget the ones that were taken over. Database by
        database: one that fails is retried at the next beat (leases last three), and the others'
        leases are extended meanwhile; the error is raised once all were tried."""
        await each_database(self._store, self._held.values(), self._beat_part, task="duetime-lease-keeper")

    async def _beat_part(self, items: list[Leased]) -> None:
        for i in range(0, len(items), _CHUNK):
            chunk = items[i : i + _CHUNK]
            kept = await self._store.extend_leases(chunk, lease_s=self._lease_s)
            metrics.LEASE_EXTENSIONS.inc(len(kept))
            lost = [
                lease.job_id
                for lease in chunk
                if lease.job_id not in kept and lease.job_id not in self._settling and self._still_held(lease)
            ]
            if lost:
                metrics.LEASES_LOST.inc(len(lost))
                log.warning("%d leases were taken over while their runs were held", len(lost))

    async def _run(self) -> None:
        while not self._stop.is_set():
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=self._heartbeat_s)
                return
            except TimeoutError:
                pass
            try:
                await self.beat()
            except Exception as exc:  # the next beat retries; leases last three beats
                if not is_transient(exc):
                    raise  # a bug: the supervisor restarts the keeper, and says why
                log.warning("lease heartbeat failed (%s: %s); the next one retries", type(exc).__name__, exc)
