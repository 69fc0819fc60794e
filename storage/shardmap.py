"""Which PostgreSQL primary holds which of the 16 logical shards.

Moving a logical shard between primaries is a change of this map (after its engines are drained
and its rows copied); nothing else in the code knows where a shard lives.
"""

from __future__ import annotations

from dataclasses import dataclass

from duetime.core.ids import SHARDS


@dataclass(frozen=True, slots=True)
class ShardMap:
    dsns: tuple[str, ...]  # index = logical shard

    def __post_init__(self) -> None:
        if len(self.dsns) != SHARDS:
            raise ValueError(f"a shard map names exactly {SHARDS} DSNs, got {len(self.dsns)}")

    @classmethod
    def single(cls, dsn: str) -> ShardMap:
        return cls(tuple([dsn] * SHARDS))

    @classmethod
    def from_dsns(cls, dsns: list[str] | tuple[str, ...]) -> ShardMap:
        return cls(tuple(dsns))

    def dsn_for(self, shard: int) -> str:
        return self.dsns[shard]

    @property
    def home(self) -> str:
        """Where owners and API keys live: the database of shard 0."""
        return self.dsns[0]

    def databases(self) -> dict[str, list[int]]:
        """Each distinct DSN with the shards it holds, in shard order."""
        out: dict[str, list[int]] = {}
        for shard, dsn in enumerate(self.dsns):
            out.setdefault(dsn, []).append(shard)
        return out
