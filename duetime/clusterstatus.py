"""``duetime cluster status``: the membership as an operator reads it, from the home database.

What each live engine reports serving (written with its heartbeats), per engine and per shard,
and the shards with fewer live engines than ``DUETIME_SHARD_REPLICAS``. The JSON form is the
contract of api-v1.md ("Additions: the cluster"); the table is for people.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from duetime.core.dealing import Member, deal
from duetime.core.ids import SHARDS
from duetime.settings import format_shard_set
from duetime.storage.ports import EngineRecord


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    replicas: int
    live: tuple[EngineRecord, ...]
    dead: tuple[EngineRecord, ...]

    @classmethod
    def of(cls, records: list[EngineRecord], replicas: int) -> ClusterStatus:
        return cls(
            replicas=replicas,
            live=tuple(r for r in records if r.live),
            dead=tuple(r for r in records if not r.live),
        )

    def engines_of(self, shard: int) -> list[str]:
        return sorted(r.engine_id for r in self.live if shard in r.serving)

    @property
    def under_replicated(self) -> list[int]:
        return [s for s in range(SHARDS) if len(self.engines_of(s)) < self.replicas]

    @property
    def no_engine_may_serve(self) -> list[int]:
        """Shards outside every live engine's allowed set (not only unserved at this moment)."""
        return list(deal([Member(r.engine_id, r.allowed) for r in self.live], self.replicas).unserved)

    def as_json(self) -> dict[str, Any]:
        return {
            "replicas": self.replicas,
            "engines": [
                {
                    "id": r.engine_id,
                    "heartbeat_age_s": round(r.heartbeat_age_s, 2),
                    "shards": sorted(r.serving),
                }
                for r in self.live
            ],
            "shards": {str(s): self.engines_of(s) for s in range(SHARDS)},
            "under_replicated": self.under_replicated,
        }

    def table(self) -> str:
        lines = [f"replicas wanted per shard: {self.replicas}; live engines: {len(self.live)}", ""]
        rows: list[tuple[str, ...]] = [("ENGINE", "HOST", "HEARTBEAT", "MAY SERVE", "SERVES")]
        for r in self.live:
            rows.append(
                (
                    r.engine_id,
                    r.host,
                    f"{r.heartbeat_age_s:.1f} s ago",
                    _spell(r.allowed),
                    _spell(r.serving) or "-",
                )
            )
        for r in self.dead:
            rows.append((r.engine_id, r.host, f"DEAD {r.heartbeat_age_s:.0f} s", _spell(r.allowed), "-"))
        lines += _columns(rows) if self.live or self.dead else ["no engine has joined"]
        lines.append("")
        shard_rows: list[tuple[str, ...]] = [("SHARD", "ENGINES", "")]
        for s in range(SHARDS):
            served = self.engines_of(s)
            note = ""
            if not served:
                note = "NO ENGINE: its runs wait"
            elif len(served) < self.replicas:
                note = f"under-replicated ({len(served)} of {self.replicas})"
            shard_rows.append((str(s), ", ".join(served) or "-", note))
        lines += _columns(shard_rows)
        under = self.under_replicated
        lines.append("")
        lines.append(
            f"under-replicated shards: {', '.join(map(str, under))}"
            if under
            else "every shard has its replicas"
        )
        blocked = self.no_engine_may_serve
        if blocked:
            lines.append(
                f"no live engine may serve shards {', '.join(map(str, blocked))}: widen an engine's "
                "--shards or start one that may serve them"
            )
        return "\n".join(lines)


def _spell(shards: frozenset[int]) -> str:
    return format_shard_set(set(shards)) if shards else ""


def _columns(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
