"""Moving a logical shard from one database to another (``duetime shards move``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import asyncpg

from duetime.core.errors import Conflict, InvalidRequest
from duetime.storage.postgres.pools import translated
from duetime.storage.queries import Q


@dataclass(frozen=True, slots=True)
class ShardMoveReport:
    shard: int
    jobs: int
    runs: int
    idempotency_keys: int


_MOVE_TABLES: tuple[tuple[str, str, tuple[str, ...] | None], ...] = (
    ("jobs", "copy_out_jobs", None),
    (
        "runs",
        "copy_out_runs",
        (
            "job_id",
            "shard",
            "scheduled_for",
            "attempt",
            "started_at",
            "finished_at",
            "outcome",
            "status_code",
            "error",
            "lateness_ms",
            "fencing_token",
            "spec_version",
        ),
    ),
    ("idempotency_keys", "copy_out_idempotency_keys", ("owner", "key", "body_hash", "job_id", "created_at")),
    (
        "job_changes",
        "copy_out_changes",
        ("job_id", "seq", "shard", "at", "actor", "key_id", "action", "reason", "spec_version", "diff"),
    ),
    ("pause_ends", "copy_out_pause_ends", ("shard", "until", "job_id")),
)


async def _pipe_copy(
    src: asyncpg.Connection,
    dst: asyncpg.Connection,
    query: str,
    *,
    shard: int,
    table: str,
    columns: tuple[str, ...] | None,
) -> int:
    """COPY out of one connection straight into another, streamed (a shard may not fit in memory)."""
    chunks: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=64)

    async def sink(chunk: bytes) -> None:
        await chunks.put(bytes(chunk))

    async def source() -> AsyncIterator[bytes]:
        while (chunk := await chunks.get()) is not None:
            yield chunk

    async def produce() -> None:
        try:
            await src.copy_from_query(query, shard, output=sink, format="binary")
        finally:
            await chunks.put(None)

    status = await asyncio.gather(
        produce(),
        dst.copy_to_table(
            table, source=source(), columns=list(columns) if columns else None, format="binary"
        ),
    )
    return int(str(status[1]).rsplit(" ", 1)[-1])


Progress = Callable[[str], None]


async def _holds_shard(conn: asyncpg.Connection, shard: int) -> bool:
    if not await conn.fetchval(Q["has_schema"]):
        return False
    there = await conn.fetchrow(Q["shard_rows"], shard)
    return bool(there["total"] or await conn.fetchval(Q["shard_runs_count"], shard))


def _quiet(_: str) -> None:
    pass


async def move_shard(
    shard: int, source_dsn: str, target_dsn: str, *, dry_run: bool = False, progress: Progress = _quiet
) -> ShardMoveReport:
    """Copy every row of one logical shard from its database to another, then delete it at the
    source. Refuses while any of its rows is claimed or running (drain its engines first) and when
    the target already holds rows of the shard. Writes on the source wait while the copy runs.

    ``dry_run`` makes the same checks without locking or changing anything and reports what would
    move. ``progress`` gets one line per step, so an operator watching a long copy sees which
    table it is in (and that the source's writes are being held) rather than silence."""
    if source_dsn == target_dsn:
        raise InvalidRequest(f"shard {shard} already lives in that database", code="same_database")
    async with translated():
        src = await asyncpg.connect(source_dsn)
        try:
            dst = await asyncpg.connect(target_dsn)
            try:
                async with src.transaction():
                    if not dry_run:
                        progress("locking the source tables against writes (reads go on)")
                        await src.execute(Q["lock_for_shard_move"])
                    here = await src.fetchrow(Q["shard_rows"], shard)
                    if here["busy"]:
                        raise Conflict(
                            f"shard {shard} has {here['busy']} claimed or running rows: stop or restart "
                            "its engines without it (and let its workers finish) before moving it"
                        )
                    if await _holds_shard(dst, shard):
                        raise Conflict(
                            f"the target already holds rows of shard {shard}; a shard lives in one "
                            "database only (delete them there if they are a leftover of an earlier move)"
                        )
                    if dry_run:
                        return ShardMoveReport(
                            shard,
                            here["total"],
                            await src.fetchval(Q["shard_runs_count"], shard),
                            await src.fetchval(Q["shard_idempotency_keys_count"], shard),
                        )
                    copied: dict[str, int] = {}
                    async with dst.transaction():
                        for table, query, columns in _MOVE_TABLES:
                            progress(f"copying {table} of shard {shard}")
                            copied[table] = await _pipe_copy(
                                src, dst, Q[query], shard=shard, table=table, columns=columns
                            )
                            progress(f"copied {copied[table]} {table}")
                        if copied["jobs"] != here["total"]:
                            raise Conflict(
                                f"copied {copied['jobs']} jobs of shard {shard} but the source has "
                                f"{here['total']}; nothing was changed"
                            )
                        progress("committing the copy at the target")
                    progress("deleting the shard's rows at the source")
                    await src.execute(Q["delete_shard_idempotency_keys"], shard)
                    await src.execute(Q["delete_shard_changes"], shard)
                    await src.execute(Q["delete_shard_pause_ends"], shard)
                    await src.execute(Q["delete_shard_runs"], shard)
                    await src.execute(Q["delete_shard_jobs"], shard)
            finally:
                await dst.close()
        finally:
            await src.close()
    return ShardMoveReport(shard, copied["jobs"], copied["runs"], copied["idempotency_keys"])
