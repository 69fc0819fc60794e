"""The TargetHealth port's contract (workers report, the API lists), for every store.

Reports count for two minutes and a worker's unrepeated ones go after ten; waiting that long is
not a test, so ``_age`` moves a worker's rows back in time, the one thing read past the ports
(a store's own table or dict). Everything asserted is read through ``list_targets``.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from duetime.core.errors import InvalidRequest
from duetime.core.model import TargetState
from duetime.storage.memory import MemoryStore
from duetime.storage.ports import TargetHealthReport, TargetView
from duetime.storage.postgres import PostgresStore
from duetime.storage.target_rules import LIVE_S, REPORT_BATCH, STALE_S
from tests.contract.conftest import Store, new_owner

HEALTHY, DEGRADED, BACKING_OFF = TargetState.HEALTHY, TargetState.DEGRADED, TargetState.BACKING_OFF
T1 = datetime(2030, 1, 1, 12, 0, 5, tzinfo=UTC)
T2 = datetime(2030, 1, 1, 12, 0, 9, tzinfo=UTC)


def worker() -> str:
    """Each case reports as workers of its own: the PostgreSQL databases are shared by cases."""
    return "w_" + uuid.uuid4().hex[:8]


def report(
    owner: str,
    host: str,
    state: TargetState = HEALTHY,
    *,
    limit: int = 8,
    until: datetime | None = None,
    counts: tuple[int, int, int] = (0, 0, 0),
) -> TargetHealthReport:
    calls, timeouts, errors = counts
    return TargetHealthReport(owner, host, state, limit, until, calls, timeouts, errors)


async def _age(store: Store, worker_id: str, seconds: float) -> None:
    """Make every row ``worker_id`` reported ``seconds`` older, as if it had stopped that long ago."""
    if isinstance(store, MemoryStore):
        for key, row in list(store._targets.items()):
            if key[2] == worker_id:
                store._targets[key] = replace(row, reported_at=row.reported_at - timedelta(seconds=seconds))
        return
    assert isinstance(store, PostgresStore)
    await store.home_pool.execute(
        "UPDATE target_health SET reported_at = reported_at - make_interval(secs => $2) WHERE worker = $1",
        worker_id,
        float(seconds),
    )


async def _row_count(store: Store, worker_id: str) -> int:
    """The rows ``worker_id`` has in the store, live or not."""
    if isinstance(store, MemoryStore):
        return sum(1 for key in store._targets if key[2] == worker_id)
    assert isinstance(store, PostgresStore)
    count: int = await store.home_pool.fetchval(
        "SELECT count(*) FROM target_health WHERE worker = $1", worker_id
    )
    return count


async def _everything(store: Store, owner: str, *, limit: int = 1000) -> list[TargetView]:
    seen: list[TargetView] = []
    cursor: str | None = None
    while True:
        page = await store.list_targets(owner, limit=limit, cursor=cursor)
        seen += page.items
        if page.next_cursor is None:
            return seen
        cursor = page.next_cursor


async def test_two_workers_views_of_a_host_add_up(store: Store) -> None:
    o, a, b, c = new_owner(), worker(), worker(), worker()
    await store.report_target_health(
        a, [report(o, "api.example.com:443", limit=8, counts=(10, 1, 0)), report(o, "b.example:80")]
    )
    await store.report_target_health(
        b, [report(o, "api.example.com:443", BACKING_OFF, limit=1, until=T1, counts=(5, 3, 2))]
    )
    # A degraded worker's back-off (none is meant, but say one came) is not the host's: only a
    # worker that says backing_off gives it one.
    await store.report_target_health(
        c, [report(o, "api.example.com:443", DEGRADED, limit=2, until=T2, counts=(1, 0, 1))]
    )
    page = await store.list_targets(o, limit=10, cursor=None)
    assert page.next_cursor is None
    assert page.items == [
        TargetView("api.example.com:443", BACKING_OFF, 11, T1, 16, 4, 3),
        TargetView("b.example:80", HEALTHY, 8, None, 0, 0, 0),
    ]
    # Without the worker backing off, the worst is degraded and there is no back-off at all.
    await store.report_target_health(b, [report(o, "api.example.com:443", limit=4, counts=(7, 0, 0))])
    [first, _] = (await store.list_targets(o, limit=10, cursor=None)).items
    assert first == TargetView("api.example.com:443", DEGRADED, 14, None, 18, 1, 1)


async def test_a_report_replaces_the_workers_last_one_and_the_last_of_a_pair_wins(store: Store) -> None:
    o, w = new_owner(), worker()
    await store.report_target_health(w, [report(o, "h:1", DEGRADED, limit=3, counts=(9, 9, 9))])
    await store.report_target_health(
        w,
        [
            report(o, "h:1", BACKING_OFF, limit=0, until=T1, counts=(1, 1, 1)),
            report(o, "h:1", HEALTHY, limit=5, counts=(2, 0, 0)),  # the same pair again: this one
        ],
    )
    assert (await store.list_targets(o, limit=10, cursor=None)).items == [
        TargetView("h:1", HEALTHY, 5, None, 2, 0, 0)
    ]


async def test_a_worker_that_stopped_no_longer_counts_and_its_rows_go(store: Store) -> None:
    o, live, stopped = new_owner(), worker(), worker()
    await store.report_target_health(live, [report(o, "h:443", limit=8, counts=(3, 0, 0))])
    await store.report_target_health(
        stopped,
        [report(o, "h:443", BACKING_OFF, limit=1, until=T1, counts=(4, 4, 0)), report(o, "gone:443")],
    )
    assert [v.state for v in await _everything(store, o)] == [HEALTHY, BACKING_OFF]
    await _age(store, stopped, LIVE_S + 1)
    # The stopped worker's back-off no longer holds the host, and its other host is gone.
    assert await _everything(store, o) == [TargetView("h:443", HEALTHY, 8, None, 3, 0, 0)]
    assert await _row_count(store, stopped) == 2  # kept for a while (an operator may look)
    # Its rows are deleted at its own next report once they are stale, except what it reports again.
    await _age(store, stopped, STALE_S)
    await store.report_target_health(stopped, [report(o, "h:443", DEGRADED, limit=2)])
    assert await _row_count(store, stopped) == 1
    assert await _everything(store, o) == [TargetView("h:443", DEGRADED, 10, None, 3, 0, 0)]
    # An empty report deletes too: a worker whose hosts all went quiet.
    await _age(store, stopped, STALE_S + 1)
    await store.report_target_health(stopped, [])
    assert await _row_count(store, stopped) == 0
    # A younger row is never deleted by a report.
    await store.report_target_health(live, [])
    assert await _row_count(store, live) == 1


async def test_owners_never_see_each_others_hosts(store: Store) -> None:
    mine, theirs, w = new_owner(), new_owner(), worker()
    await store.report_target_health(
        w,
        [
            report(mine, "shared.example:443", counts=(1, 0, 0)),
            report(theirs, "shared.example:443", BACKING_OFF, until=T1, counts=(50, 50, 0)),
            report(theirs, "theirs.example:443"),
        ],
    )
    assert await _everything(store, mine) == [TargetView("shared.example:443", HEALTHY, 8, None, 1, 0, 0)]
    assert [v.host for v in await _everything(store, theirs)] == ["shared.example:443", "theirs.example:443"]
    assert (await store.list_targets(new_owner(), limit=10, cursor=None)).items == []


async def test_pages_list_every_host_once_in_byte_order(store: Store) -> None:
    o, a, b = new_owner(), worker(), worker()
    # Byte order, whatever the database's collation: digits, upper case, '[', lower case.
    hosts = ["a.example:443", "B.example:443", "10.0.0.1:80", "[2001:db8::1]:8443", "b.example:443"]
    hosts += ["b.example:80", "z.example:443"]
    await store.report_target_health(a, [report(o, h) for h in hosts[:4]])
    await store.report_target_health(b, [report(o, h) for h in hosts[2:]])  # two hosts from both
    pages: list[list[str]] = []
    cursor: str | None = None
    while True:
        page = await store.list_targets(o, limit=3, cursor=cursor)
        pages.append([v.host for v in page.items])
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
        assert o not in cursor and "example" not in cursor  # opaque: not the host in clear
    assert pages == [
        ["10.0.0.1:80", "B.example:443", "[2001:db8::1]:8443"],
        ["a.example:443", "b.example:443", "b.example:80"],
        ["z.example:443"],
    ]
    assert [v.concurrency_limit for v in await _everything(store, o)] == [16, 8, 16, 8, 8, 8, 8]
    # A page that ends exactly at the last host says so: no cursor to an empty page.
    assert (await store.list_targets(o, limit=7, cursor=None)).next_cursor is None


async def test_thousands_of_reports_in_one_call(store: Store) -> None:
    o, w = new_owner(), worker()
    count = REPORT_BATCH + 500
    hosts = [f"h{i:05d}.example:443" for i in range(count)]
    await store.report_target_health(w, [report(o, h, counts=(i, 0, 0)) for i, h in enumerate(hosts)])
    listed = await _everything(store, o)
    assert [v.host for v in listed] == hosts
    assert [v.calls_5m for v in listed] == list(range(count))


@pytest.mark.parametrize(
    "cursor",
    [
        "!!!",  # not base64 at all (decoding would drop every character)
        "AAAA",  # NUL bytes: no host, and PostgreSQL refuses them in text
        "__________8",  # not UTF-8
        "YQ==",  # "a" with padding: not the form we issue
        "YQ!",  # "a" with a character base64 drops
        "Cg",  # a newline
        "YWFh" * 300,  # 900 bytes of host: longer than any cursor issued
    ],
)
async def test_a_cursor_we_did_not_issue_is_refused(store: Store, cursor: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        await store.list_targets(new_owner(), limit=10, cursor=cursor)
    assert (err.value.code, err.value.field) == ("invalid_cursor", "cursor")
