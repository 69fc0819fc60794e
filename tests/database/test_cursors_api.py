"""Page cursors over HTTP (issue 32, item 4): opaque, bound to their owner, and refused whole.

The contract (api-v1.md, "Additions: limits found by the second probe"): every malformed cursor,
on every list, is 422 ``invalid_cursor``, never 5xx; cursors reveal no counter shared between
owners. Before, a cursor of ``GET /v1/runs`` was base64 of a run id, a sequence every owner's runs
draw from. Each case runs on the four lists: ``/v1/jobs``, ``/v1/jobs/{id}/runs``, ``/v1/runs``
``/v1/targets``, and ``/v1/jobs/{id}/changes`` (issue 30).
"""

from __future__ import annotations

import base64
import secrets
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import asyncpg

from duetime.api.app import create_app
from duetime.api.cursors import MAX_SEALED_CHARS, CursorSeal
from duetime.core.errors import StorageUnavailable
from duetime.core.ids import shard_of
from duetime.core.model import TargetState
from duetime.core.ssrf import AddressPolicy
from duetime.storage.ports import ApiStore, TargetHealthReport
from duetime.storage.postgres import PostgresStore
from duetime.storage.registry_rules import encode_cursor
from duetime.storage.shardmap import ShardMap
from tests.support.fixtures import Client, serve

PUBLIC_URL = "https://1.1.1.1/hook"  # a public literal: no DNS lookup, allowed by the default policy
ITEMS = 5  # of each list, paged 2 at a time: three pages, two cursors
# Near the longest host a target cursor may carry (storage/target_rules.py CURSOR_MAX_BYTES, 768),
# fourth in host order, so that the second page ends at it: the longest cursor crosses HTTP too.
LONG_HOST = "h3" + "x" * 758 + ":443"


@dataclass
class Owner:
    name: str
    headers: dict[str, str]
    job_id: str  # a job with ITEMS runs in its history, and ITEMS change records
    run_ids: list[int]  # those runs' ids, oldest first

    def lists(self) -> list[str]:
        return [
            "/v1/jobs",
            f"/v1/jobs/{self.job_id}/runs",
            "/v1/runs",
            "/v1/targets",
            f"/v1/jobs/{self.job_id}/changes",
        ]


async def new_owner(client: Client, store: PostgresStore, db: asyncpg.Connection) -> Owner:
    """An owner with ITEMS of everything: jobs, runs of one job (so of /v1/runs too), hosts."""
    name = f"owner-{uuid.uuid4().hex[:12]}"
    api_key, _ = await store.create_api_key(name)
    headers = {"Authorization": f"Bearer {api_key}"}
    spec = {"target": {"type": "webhook", "url": PUBLIC_URL}, "schedule": {"cron": "0 3 * * *"}}
    ids = []
    for _ in range(ITEMS):
        resp = await client.post("/v1/jobs", json=spec, headers=headers)
        assert resp.status == 201, await resp.text()
        ids.append((await resp.json())["id"])
    job_id = uuid.UUID(ids[0])
    for action in ("pause", "resume") * ((ITEMS - 1) // 2):  # the create and these: ITEMS records
        assert (await client.post(f"/v1/jobs/{job_id}/{action}", headers=headers)).status == 200
    base = datetime(2026, 1, 1, tzinfo=UTC)
    run_ids = []
    for i in range(ITEMS):
        at = base + timedelta(minutes=i)
        run_ids.append(
            await db.fetchval(
                "INSERT INTO runs (job_id, shard, scheduled_for, attempt, started_at, finished_at, outcome)"
                " VALUES ($1, $2, $3, 1, $3, $4, 'failed') RETURNING run_id",
                job_id,
                shard_of(job_id),
                at,
                at + timedelta(seconds=1),
            )
        )
    hosts = [f"h{i}.example:443" for i in (0, 1, 2, 4)] + [LONG_HOST]
    await store.report_target_health(
        "w-" + uuid.uuid4().hex[:8],
        [TargetHealthReport(name, h, TargetState.HEALTHY, 8, None, 1, 0, 0) for h in hosts],
    )
    return Owner(name, headers, ids[0], run_ids)


async def _page(client: Client, path: str, headers: dict[str, str], cursor: str | None) -> dict[str, Any]:
    params = {"limit": "2", **({"cursor": cursor} if cursor is not None else {})}
    resp = await client.get(path, params=params, headers=headers)
    assert resp.status == 200, (path, await resp.text())
    body: dict[str, Any] = await resp.json()
    return body


async def _walk(client: Client, path: str, headers: dict[str, str]) -> tuple[list[Any], list[str]]:
    """Every item of a list, following next_cursor, and the cursors it was given."""
    items: list[Any] = []
    cursors: list[str] = []
    cursor: str | None = None
    while True:
        body = await _page(client, path, headers, cursor)
        items += body["items"]
        cursor = body["next_cursor"]
        if cursor is None:
            return items, cursors
        cursors.append(cursor)


async def _refused(client: Client, path: str, headers: dict[str, str], cursor: str) -> None:
    resp = await client.get(path, params={"cursor": cursor}, headers=headers)
    text = await resp.text()
    assert resp.status == 422, (path, cursor, text)
    error = (await resp.json())["error"]
    assert (error["code"], error["field"]) == ("invalid_cursor", "cursor"), (path, cursor)
    assert "pass next_cursor back unchanged" in error["message"]


def _key(item: dict[str, Any]) -> Any:
    if "seq" in item:  # a change record
        return item["seq"]
    return item.get("id") or item.get("host") or (item.get("job_id"), item["scheduled_for"])


async def test_paging_through_every_list_works_and_a_cursor_opens_on_every_api_process(
    client: Client, store: PostgresStore, db: asyncpg.Connection, pg_dsn: str
) -> None:
    owner = await new_owner(client, store, db)
    # A second API process of the installation: its own store, the same database, so the same key.
    other_store = await PostgresStore.open(ShardMap.single(pg_dsn), pool_size=2)
    try:
        async with serve(create_app(other_store, policy=AddressPolicy())) as other:
            for path in owner.lists():
                items, cursors = await _walk(client, path, owner.headers)
                assert len(items) == ITEMS and len({repr(_key(i)) for i in items}) == ITEMS, path
                assert len(cursors) == 2 and all(len(c) <= MAX_SEALED_CHARS for c in cursors)
                # Each page again, the first through one process and the rest through the other.
                second = await _page(other, path, owner.headers, cursors[0])
                assert second["items"] == items[2:4], path
                assert second["next_cursor"] not in (None, cursors[1])  # a fresh nonce each time
                third = await _page(client, path, owner.headers, second["next_cursor"])
                assert third == {"items": items[4:], "next_cursor": None}, path
    finally:
        await other_store.close()
    targets, cursors = await _walk(client, "/v1/targets", owner.headers)
    assert targets[3]["host"] == LONG_HOST and len(cursors[1]) > 1300  # the long one went through


async def test_another_owners_cursor_is_refused_on_every_list(
    client: Client, store: PostgresStore, db: asyncpg.Connection
) -> None:
    alice = await new_owner(client, store, db)
    bob = await new_owner(client, store, db)
    for alices_path, bobs_path in zip(alice.lists(), bob.lists(), strict=True):
        first = await _page(client, alices_path, alice.headers, None)
        assert first["next_cursor"] is not None
        await _refused(client, bobs_path, bob.headers, first["next_cursor"])
        # Alice's own cursor still works for her.
        assert (await _page(client, alices_path, alice.headers, first["next_cursor"]))["items"]


async def test_forged_cursors_are_422_on_every_list(
    client: Client, store: PostgresStore, db: asyncpg.Connection
) -> None:
    owner = await new_owner(client, store, db)
    first_job = await _page(client, "/v1/jobs", owner.headers, None)
    sealed = first_job["next_cursor"]
    real = base64.urlsafe_b64decode(sealed + "=" * (-len(sealed) % 4))
    flipped = bytes([real[0]]) + bytes([real[1] ^ 0x01]) + real[2:]
    forged = [
        encode_cursor((1 << 63).to_bytes(8, "big")),  # a run id past int8, as cursors were before
        encode_cursor((2**64 - 1).to_bytes(8, "big")),
        encode_cursor(owner.run_ids[2].to_bytes(8, "big")),  # a real position, from before the seal
        encode_cursor(uuid.UUID(owner.job_id).bytes),
        encode_cursor(b"h0.example:443"),
        encode_cursor(bytes(32)),
        base64.urlsafe_b64encode(flipped).decode().rstrip("="),
        sealed[:-2],
        sealed + "AA",
        "A" * (MAX_SEALED_CHARS + 4),
    ]
    forged += [encode_cursor(secrets.token_bytes(n)) for n in (29, 40, 51, 60, 72, 200)]
    for path in owner.lists():
        for cursor in forged:
            await _refused(client, path, owner.headers, cursor)


async def test_a_sealed_cursor_does_not_carry_the_run_id(
    client: Client, store: PostgresStore, db: asyncpg.Connection
) -> None:
    owner = await new_owner(client, store, db)
    seal = CursorSeal(await store.cursor_key())
    for path in (f"/v1/jobs/{owner.job_id}/runs", "/v1/runs"):
        cursor = (await _page(client, path, owner.headers, None))["next_cursor"]
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        # The page ended at the second newest run: that id is inside, sealed, and nowhere in sight.
        inner = seal.open(owner.name, cursor)
        assert inner is not None
        run_id = owner.run_ids[-2].to_bytes(8, "big")
        assert run_id in base64.urlsafe_b64decode(inner + "=" * (-len(inner) % 4)), path
        assert run_id not in raw and inner not in cursor and inner.encode() not in raw, path


class _KeyDown:
    """The real store, with a cursor key that cannot be read while ``down`` is set."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store
        self.down = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def cursor_key(self) -> bytes:
        if self.down:
            raise StorageUnavailable(
                "the job database is unavailable right now; nothing was changed, try again"
            )
        return await self._store.cursor_key()


async def test_a_key_that_cannot_be_read_is_a_503_and_is_read_again(
    client: Client, store: PostgresStore, db: asyncpg.Connection
) -> None:
    owner = await new_owner(client, store, db)
    flaky = _KeyDown(store)
    async with serve(create_app(cast(ApiStore, flaky), policy=AddressPolicy())) as c:
        # A list that fits one page needs no cursor, so no key.
        assert (await c.get("/v1/jobs", headers=owner.headers)).status == 200
        resp = await c.get("/v1/jobs", params={"limit": "2"}, headers=owner.headers)
        assert resp.status == 503 and (await resp.json())["error"]["code"] == "storage_unavailable"
        flaky.down = False
        items, _ = await _walk(c, "/v1/jobs", owner.headers)
        assert len(items) == ITEMS
