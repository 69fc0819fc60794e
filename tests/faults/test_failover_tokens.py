"""Fencing tokens across a failover to an asynchronous standby that lost the last transactions.

A private primary with a streaming standby (pg_basebackup, as an operator sets one up). The standby
is stopped, the primary goes on claiming (those tokens are lost with it), the primary dies, the
standby is promoted: the next claim of the row must issue a token above every token the old
primary gave out, or a process still holding one of the lost tokens would pass the fence.

Before migration 0014 the claim after the failover issued the old primary's lost token again.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest

from duetime.core.ids import shard_of
from duetime.core.model import JobSpec, OneOffSchedule, WebhookTarget
from duetime.embedded_pg import SUPERUSER, EmbeddedPostgres, free_port
from duetime.storage.migrate import migrate
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from tests.support.pgcluster import private_cluster, stop_immediately
from tests.support.wait import until

pytestmark = [pytest.mark.timeout(240), pytest.mark.processes]


class _Standby:
    """A streaming standby of an ``EmbeddedPostgres`` primary, run by the same server user."""

    def __init__(self, primary: EmbeddedPostgres, root: Path) -> None:
        self.primary = primary
        self.pgdata = root / "standby"
        self.log = root / "standby.log"
        self.port = free_port()

    async def _run(self, *argv: str) -> None:
        code, out = await self.primary._as_server_user(list(argv), limit_s=120)
        assert code == 0, out

    def _tool(self, name: str) -> str:
        assert self.primary._binaries is not None
        return self.primary._binaries.tool(name)

    async def create(self) -> None:
        self.pgdata.parent.chmod(0o777)
        await self._run(
            self._tool("pg_basebackup"),
            "-h", "127.0.0.1", "-p", str(self.primary.port), "-U", SUPERUSER,
            "-D", str(self.pgdata), "-R", "-X", "stream", "-c", "fast",
        )  # fmt: skip
        # The primary's own settings (a standby needs max_connections and the rest at least as
        # high), on a port of its own.
        conf = (self.primary.pgdata / "duetime.conf").read_text().splitlines()
        kept = [line for line in conf if not line.startswith(("port", "unix_socket_directories"))]
        kept += [f"port = {self.port}", "unix_socket_directories = ''"]
        (self.pgdata / "duetime.conf").write_text("\n".join(kept) + "\n")

    async def start(self) -> None:
        await self._run(self._tool("pg_ctl"), "start", "-D", str(self.pgdata), "-w", "-l", str(self.log))

    async def stop(self) -> None:
        await self._run(self._tool("pg_ctl"), "stop", "-D", str(self.pgdata), "-w", "-m", "fast")

    async def promote(self) -> None:
        await self._run(self._tool("pg_ctl"), "promote", "-D", str(self.pgdata), "-w")

    @property
    def dsn(self) -> str:
        return self.primary.dsn.replace(f":{self.primary.port}/", f":{self.port}/")


@pytest.fixture
async def primary() -> AsyncIterator[EmbeddedPostgres]:
    async with private_cluster() as pg:
        yield pg


async def _token(dsn: str, job_id: uuid.UUID) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("SELECT lease_token FROM jobs WHERE job_id = $1", job_id))
    finally:
        await conn.close()


async def test_tokens_never_repeat_after_a_failover_that_lost_transactions(
    primary: EmbeddedPostgres,
) -> None:
    await migrate(primary.dsn)
    standby = _Standby(primary, primary.data_dir.parent)
    await standby.create()
    await standby.start()
    engine = "e-failover"
    store = await PostgresStore.open(ShardMap.single(primary.dsn), pool_size=2)
    try:
        await store.create_api_key("owner")
        due = datetime.now(UTC) + timedelta(seconds=5)
        job, _ = await store.create_job(
            "owner", JobSpec(target=WebhookTarget(url="https://example.com/x"), schedule=OneOffSchedule(due))
        )
        job_id = uuid.UUID(job.id)
        shard = shard_of(job_id)
        [claim] = await store.claim_due(shard, engine, lookahead_s=60, lease_s=30, limit=10)
        replicated = claim.lease_token
        await until(
            lambda: _replayed(standby.dsn, job_id, replicated),
            within=60,
            what="the standby replayed the first claim",
        )
        await standby.stop()  # the standby falls behind: what follows is lost with the primary
        issued = [replicated]
        for _ in range(3):
            issued.extend(r.lease_token for r in await store.retake_claims(engine, [shard], lease_s=30))
        assert issued == sorted(set(issued)) and len(issued) == 4
    finally:
        await store.close()
    await stop_immediately(primary)
    await standby.start()
    await standby.promote()
    promoted = await PostgresStore.open(ShardMap.single(standby.dsn), pool_size=2)
    try:
        assert await _token(standby.dsn, job_id) == replicated, "the standby lost the later claims"
        [again] = await promoted.retake_claims(engine, [shard], lease_s=30)
    finally:
        await promoted.close()
        await standby.stop()
    print(f"tokens issued before the failover: {issued}; the first after it: {again.lease_token}")
    assert again.lease_token > max(issued), "a token the old primary gave out was issued again"


async def _replayed(dsn: str, job_id: uuid.UUID, token: int) -> bool:
    try:
        return await _token(dsn, job_id) == token
    except (OSError, asyncpg.PostgresError, TypeError):
        return False
