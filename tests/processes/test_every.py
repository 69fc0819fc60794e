"""Interval schedules and exclusions end to end on a real node: an ``every`` job fires exactly the
occurrences its preview lists, and a job whose days are excluded does not fire at all, while its
preview and next_run_at say where it goes on."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from tests.support.node import Owner, parse
from tests.support.receiver import Receiver


async def test_every_fires_exactly_as_the_preview_says(owner: Owner, receiver: Receiver) -> None:
    start = (datetime.now(UTC) + timedelta(seconds=2)).replace(microsecond=0)
    job = await owner.create(
        {
            "target": {"type": "webhook", "url": f"{receiver.url}/every"},
            "schedule": {"every": "2s", "start_at": start.strftime("%Y-%m-%dT%H:%M:%SZ")},
        }
    )
    assert job["schedule"] == {
        "every": "2s",
        "start_at": start.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "end_at": None,
        "timezone": "UTC",
        "exclude": [],
    }
    assert parse(job["next_run_at"]) == start
    status, preview = await owner.call("GET", f"/v1/jobs/{job['id']}/preview?count=4")
    assert status == 200, preview
    promised = [parse(item["at"]) for item in preview["items"]]
    assert promised == [start + timedelta(seconds=2 * k) for k in range(4)]
    calls = await receiver.wait_for("/every", 4, within=20)
    await owner.call("DELETE", f"/v1/jobs/{job['id']}")
    assert [parse(c.headers["Duetime-Scheduled-For"]) for c in calls[:4]] == promised
    for call in calls[:4]:
        assert call.arrived - parse(call.headers["Duetime-Scheduled-For"]) < timedelta(seconds=1)


async def test_excluded_days_do_not_fire_and_the_preview_lists_them(owner: Owner, receiver: Receiver) -> None:
    today = datetime.now(UTC).date()
    days = [today.isoformat(), (today + timedelta(days=1)).isoformat()]
    after = today + timedelta(days=2)
    jobs = {}
    for path, schedule in {
        "/every-excluded": {"every": "1s", "exclude": days},
        "/cron-excluded": {"cron": "* * * * * *", "exclude": [{"from": days[0], "to": days[1]}]},
    }.items():
        job = await owner.create(
            {"target": {"type": "webhook", "url": f"{receiver.url}{path}"}, "schedule": schedule}
        )
        jobs[path] = job
        # the first occurrence is on the first day not excluded
        assert parse(job["next_run_at"]).date() == after
        assert parse(job["next_run_at"]) == datetime(after.year, after.month, after.day, tzinfo=UTC)
        status, preview = await owner.call("GET", f"/v1/jobs/{job['id']}/preview?count=3")
        assert status == 200, preview
        assert next(parse(i["at"]) for i in preview["items"]) == parse(job["next_run_at"])
        assert len(preview["excluded"]) == 3  # the first occurrences it drops, from now on
        assert all(parse(e["at"]).date() in (today, today + timedelta(days=1)) for e in preview["excluded"])
        assert {e["reason"] for e in preview["excluded"]} == {"excluded_date"}
    await asyncio.sleep(4)
    for path, job in jobs.items():
        assert receiver.on(path) == [], path
        await owner.call("DELETE", f"/v1/jobs/{job['id']}")
