"""The run path's work split by database: one primary's trouble holds back only its own shards.

The run path's batches mix shards, and shards may live on several primaries. A statement per
database was already the rule; what was missing was that a failure of one of them failed the whole
batch: the fencer retried whole mixed batches, the lease keeper gave up at the first failing
database, the completer put whole batches back. Everything that writes a mixed batch now splits it
here first and handles each database's part on its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar


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
