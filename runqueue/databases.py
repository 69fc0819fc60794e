"""The run path's work split by database: one primary's trouble holds back only its own shards.

The run path's batches mix shards, and shards may live on several primaries. A statement per
database was already the rule; what was missing was that a failure of one of them failed the whole
batch: the fencer retried whole mixed batches, the lease keeper gave up at the first failing
database, the completer put whole batches back. Everything that writes a mixed batch now splits it
here first and handles each database's part on its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol, TypeVar

from duetime.core.errors import is_transient
from duetime.supervisor import STORAGE_RETRIES, error_kind


class _OnShard(Protocol):
    @property
    def shard(self) -> int: ...


class _Databases(Protocol):
    def database_of(self, shard: int) -> int: ...


Item = TypeVar("Item", bound=_OnShard)


def by_database(store: _Databases, items: Iterable[Item]) -> dict[int, list[Item]]:
    """``items`` grouped by the database that holds each one's shard, in their order."""
    parts: dict[int, list[Item]] = {}
    for item in items:
        parts.setdefault(store.database_of(item.shard), []).append(item)
    return parts


async def each_database(
    store: _Databases, items: Iterable[Item], write: Callable[[list[Item]], Awaitable[None]], *, task: str
) -> None:
    """``write`` each database's part of ``items`` on its own: a part whose database is away or
    gave way (a transient error, counted in ``duetime_storage_retries_total``) does not stop the
    others; once all were tried, the last such error is raised for the caller to retry. Any other
    error is raised at once."""
    failed: Exception | None = None
    for part in by_database(store, items).values():
        try:
            await write(part)
        except Exception as exc:
            if not is_transient(exc):
                raise
            STORAGE_RETRIES.labels(task, error_kind(exc)).inc()
            failed = exc
    if failed is not None:
        raise failed
