"""Schedule preview over HTTP on the real database: it agrees with the engine's schedule math,
refuses exactly what POST /v1/jobs refuses, and a job's preview is what then fires."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from duetime.api.app import create_app
from duetime.app import Node
from duetime.core.codec import format_time
from duetime.core.jitter import jitter_ms, spread_ms
from duetime.core.model import CronSchedule, DstGap, DstOverlap
from duetime.core.schedule import describe_instant, first_occurrence, next_occurrence, occurrences
from duetime.core.ssrf import AddressPolicy
from duetime.storage.postgres import PostgresStore
from duetime.storage.shardmap import ShardMap
from tests.support.node import fast_settings, parse
from tests.support.receiver import Receiver

Client = TestClient[web.Request, web.Application]
QUEUE_TARGET = {"type": "queue", "broker": "redis", "topic": "preview-tests"}


@dataclass
class Api:
    client: Client
    store: PostgresStore
    headers: dict[str, str]

    async def post(self, path: str, body: Any, **headers: str) -> tuple[int, Any]:
        resp = await self.client.post(path, json=body, headers={**self.headers, **headers})
        return resp.status, await resp.json()

    async def get(self, path: str) -> tuple[int, Any]:
        resp = await self.client.get(path, headers=self.headers)
        return resp.status, await resp.json()


@pytest.fixture(scope="module")
async def api(pg_dsn: str) -> AsyncIterator[Api]:
    store = await PostgresStore.open(ShardMap.single(pg_dsn))
    app = create_app(store, policy=AddressPolicy())
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        key, _ = await store.create_api_key(f"preview-{uuid.uuid4().hex[:8]}")
        yield Api(client, store, {"Authorization": f"Bearer {key}"})
    await store.close()


# --- agreement with core.schedule -------------------------------------------------------------------

# (name, schedule JSON, from): each window holds a spring-forward or fall-back day of its zone.
DST_CASES = [
    ("berlin spring shift", {"cron": "30 2 * * *", "timezone": "Europe/Berlin"}, "2026-03-27T00:00:00Z"),
    (
        "berlin spring skip",
        {"cron": "30 2 * * *", "timezone": "Europe/Berlin", "dst_gap": "skip"},
        "2026-03-27T00:00:00Z",
    ),
    (
        "berlin every 20 min across the gap",
        {"cron": "*/20 1-3 * * *", "timezone": "Europe/Berlin"},
        "2026-03-29T00:00:00Z",
    ),
    ("berlin autumn first", {"cron": "30 2 * * *", "timezone": "Europe/Berlin"}, "2026-10-23T00:00:00Z"),
    (
        "berlin autumn both",
        {"cron": "*/30 2 * * *", "timezone": "Europe/Berlin", "dst_overlap": "both"},
        "2026-10-24T00:00:00Z",
    ),
    ("new york spring shift", {"cron": "30 2 * * *", "timezone": "America/New_York"}, "2026-03-06T00:00:00Z"),
    (
        "new york spring skip, 15 min",
        {"cron": "*/15 2 * * *", "timezone": "America/New_York", "dst_gap": "skip"},
        "2026-03-07T12:00:00Z",
    ),
    ("new york autumn first", {"cron": "30 1 * * *", "timezone": "America/New_York"}, "2026-10-30T00:00:00Z"),
    (
        "new york autumn both",
        {"cron": "30 1 * * *", "timezone": "America/New_York", "dst_overlap": "both"},
        "2026-10-30T00:00:00Z",
    ),
    (
        "new york seconds field, both",
        {"cron": "0 0,30 1 * * *", "timezone": "America/New_York", "dst_overlap": "both"},
        "2026-11-01T04:00:00Z",
    ),
    # Calendar forms name exactly the days clocks change: the last Sunday (Europe), the second
    # and first Sundays of March and November (United States).
    (
        "berlin last sundays, 0L, both",
        {"cron": "30 2 * * 0L", "timezone": "Europe/Berlin", "dst_overlap": "both"},
        "2026-03-01T00:00:00Z",
    ),
    (
        "new york second and first sundays, #",
        {"cron": "0,30 1,2 * 3,11 SUN#2,0#1", "timezone": "America/New_York", "dst_overlap": "both"},
        "2026-03-01T00:00:00Z",
    ),
    (
        "berlin last weekday and the 15th nearest",
        {"cron": "0 2 LW,15W * *", "timezone": "Europe/Berlin"},
        "2026-03-10T00:00:00Z",
    ),
]


def _model(schedule: dict[str, Any]) -> CronSchedule:
    return CronSchedule(
        cron=schedule["cron"],
        timezone=schedule["timezone"],
        dst_gap=DstGap(schedule.get("dst_gap", "shift")),
        dst_overlap=DstOverlap(schedule.get("dst_overlap", "first")),
    )


@pytest.mark.parametrize(("name", "schedule", "start"), DST_CASES, ids=[c[0] for c in DST_CASES])
async def test_preview_agrees_with_core_schedule_across_dst(
    api: Api, name: str, schedule: dict[str, Any], start: str
) -> None:
    count = 8
    status, body = await api.post(
        "/v1/schedules/preview", {"schedule": schedule, "count": count, "from": start}
    )
    assert status == 200, body
    model, after = _model(schedule), parse(start)
    expected = occurrences(model, after, count)
    assert [parse(i["at"]) for i in body["items"]] == expected
    # The engine's own chain (first occurrence, then next after each scheduled time) gives the same.
    chain = [first_occurrence(model, after)]
    while len(chain) < count:
        following = next_occurrence(model, chain[-1])  # type: ignore[arg-type]
        chain.append(following)
    assert chain == expected
    for item, instant in zip(body["items"], expected, strict=True):
        described = describe_instant(model, instant)
        assert item["local"] == described["local"]
        assert item["utc_offset"] == described["utc_offset"]
        assert item["abbreviation"] == described["abbreviation"]
        assert (item["dst"] == "gap_shifted") == described["shifted_from_gap"]
        assert (item["dst"] == "overlap_second") == described["second_pass"]
    assert body["timezone"] == schedule["timezone"]
    assert body["from"] == start
    assert body["has_more"] is True


async def test_calendar_forms_in_the_preview_and_their_refusals(api: Api) -> None:
    """The last Sunday of March is Berlin's spring-forward day: 02:30 does not exist then."""
    schedule = {"cron": "30 2 * * 0L", "timezone": "Europe/Berlin"}
    status, body = await api.post(
        "/v1/schedules/preview", {"schedule": schedule, "count": 2, "from": "2026-03-01T00:00:00Z"}
    )
    assert status == 200, body
    first, second = body["items"]
    assert (first["at"], first["local"], first["dst"]) == (
        "2026-03-29T01:00:00Z",
        "2026-03-29T03:00:00",
        "gap_shifted",
    )
    assert first["shifted_from"] == "2026-03-29T02:30:00"
    assert (second["at"], second["local"], second["dst"]) == (
        "2026-04-26T00:30:00Z",
        "2026-04-26T02:30:00",
        None,
    )
    job = await _create(api, {**schedule, "start_at": "2026-03-01T00:00:00Z"})
    assert job["schedule"]["cron"] == "30 2 * * 0L"

    for cron, fragment in (
        ("0 0 * * 1#6", "a month has at most five of each weekday"),
        ("0 L * * *", "hour field: 'L' (last)"),
        ("0 0 1-15W * *", "takes a single day, as in 15W"),
    ):
        status, refused = await api.post("/v1/jobs", {"target": QUEUE_TARGET, "schedule": {"cron": cron}})
        assert status == 422, refused
        assert refused["error"]["code"] == "invalid_cron" and refused["error"]["field"] == "schedule.cron"
        assert fragment in refused["error"]["message"], refused
    status, refused = await api.post(
        "/v1/jobs",
        {"target": QUEUE_TARGET, "schedule": {**schedule, "dst_gap": "skip", "cron": "30 2 * 3 0L"}},
    )
    assert status == 422 and refused["error"]["code"] == "cron_never_fires", refused
    assert "DST gap" in refused["error"]["message"]


async def test_berlin_spring_forward_labels(api: Api) -> None:
    base = {"cron": "30 2 * * *", "timezone": "Europe/Berlin"}
    window = {"count": 3, "from": "2026-03-28T00:00:00Z"}
    _, shifted = await api.post("/v1/schedules/preview", {"schedule": base, **window})
    day = shifted["items"][1]
    assert day == {
        "at": "2026-03-29T01:00:00Z",
        "local": "2026-03-29T03:00:00",
        "utc_offset": "+02:00",
        "abbreviation": "CEST",
        "dst": "gap_shifted",
        "shifted_from": "2026-03-29T02:30:00",
    }
    assert shifted["skipped"] == []
    _, skipped = await api.post("/v1/schedules/preview", {"schedule": {**base, "dst_gap": "skip"}, **window})
    assert [i["at"] for i in skipped["items"]] == [
        "2026-03-28T01:30:00Z",
        "2026-03-30T00:30:00Z",
        "2026-03-31T00:30:00Z",
    ]
    assert all(i["dst"] is None for i in skipped["items"])
    assert skipped["skipped"] == [
        {
            "at": "2026-03-29T01:00:00Z",
            "local_from": "2026-03-29T02:00:00",
            "local_until": "2026-03-29T03:00:00",
            "first_skipped": "2026-03-29T02:30:00",
            "reason": "dst_gap_skip",
        }
    ]


async def test_new_york_fall_back_labels(api: Api) -> None:
    base = {"cron": "30 1 * * *", "timezone": "America/New_York"}
    window = {"count": 3, "from": "2026-11-01T00:00:00Z"}
    _, both = await api.post("/v1/schedules/preview", {"schedule": {**base, "dst_overlap": "both"}, **window})
    assert [(i["at"], i["local"], i["utc_offset"], i["dst"]) for i in both["items"]] == [
        ("2026-11-01T05:30:00Z", "2026-11-01T01:30:00", "-04:00", "overlap_first"),
        ("2026-11-01T06:30:00Z", "2026-11-01T01:30:00", "-05:00", "overlap_second"),
        ("2026-11-02T06:30:00Z", "2026-11-02T01:30:00", "-05:00", None),
    ]
    _, first = await api.post("/v1/schedules/preview", {"schedule": base, **window})
    assert [(i["at"], i["dst"]) for i in first["items"]] == [
        ("2026-11-01T05:30:00Z", "overlap_first"),
        ("2026-11-02T06:30:00Z", None),
        ("2026-11-03T06:30:00Z", None),
    ]


async def test_bounded_schedule_ends_and_one_off_shows_its_run_at(api: Api) -> None:
    schedule = {"cron": "0 12 * * *", "timezone": "UTC", "end_at": "2099-01-03T12:00:00Z"}
    status, body = await api.post(
        "/v1/schedules/preview", {"schedule": schedule, "count": 100, "from": "2099-01-01T00:00:00Z"}
    )
    assert status == 200
    assert [i["at"] for i in body["items"]] == [
        "2099-01-01T12:00:00Z",
        "2099-01-02T12:00:00Z",
        "2099-01-03T12:00:00Z",
    ]
    assert body["has_more"] is False
    # A one-off in the past runs at once when a job is made with it, so the preview shows it.
    status, body = await api.post(
        "/v1/schedules/preview", {"schedule": {"run_at": "2020-05-01T10:00:00+02:00"}}
    )
    assert status == 200
    assert [i["at"] for i in body["items"]] == ["2020-05-01T08:00:00Z"]
    assert body["timezone"] == "UTC" and body["has_more"] is False


async def test_a_step_past_its_range_is_accepted_and_the_preview_warns(api: Api) -> None:
    """Vixie cron reads ``9-12/5`` as September alone; so do we, and the preview says so."""
    schedule = {"cron": "0 19-23/5 1 9-12/5 7", "timezone": "UTC"}
    status, body = await api.post(
        "/v1/schedules/preview", {"schedule": schedule, "count": 3, "from": "2099-01-01T00:00:00Z"}
    )
    assert status == 200, body
    # day 1 or a Sunday (both day fields restricted), of September, at 19:00
    assert [i["at"] for i in body["items"]] == [
        "2099-09-01T19:00:00Z",
        "2099-09-06T19:00:00Z",
        "2099-09-13T19:00:00Z",
    ]
    assert len(body["warnings"]) == 2
    assert "hour field: step 5 in '19-23/5'" in body["warnings"][0]
    assert "month field: step 5 in '9-12/5'" in body["warnings"][1]
    status, body = await api.post("/v1/schedules/preview", {"schedule": {"cron": "*/15 * * * *"}})
    assert status == 200 and body["warnings"] == []
    status, job = await api.post(
        "/v1/jobs", {"target": QUEUE_TARGET, "schedule": {"cron": "56-59/4 * * * *"}}
    )
    assert status == 201, job
    assert job["schedule"]["cron"] == "56-59/4 * * * *"
    assert parse(job["next_run_at"]).minute == 56


async def test_count_defaults_to_ten_and_from_to_now(api: Api) -> None:
    before = datetime.now(UTC)
    status, body = await api.post("/v1/schedules/preview", {"schedule": {"cron": "* * * * *"}})
    assert status == 200
    assert len(body["items"]) == 10
    assert before - timedelta(seconds=1) <= parse(body["from"]) <= datetime.now(UTC)
    assert parse(body["items"][0]["at"]) > parse(body["from"])


# --- validation: exactly as POST /v1/jobs ---------------------------------------------------------

BAD_SCHEDULES: list[Any] = [
    "every day",
    {},
    {"cron": 5},
    {"cron": "61 * * * *"},
    {"cron": "* * * *"},
    {"cron": "0 0 30 2 *"},
    {"cron": "* * * * *", "timezone": "EST"},
    {"cron": "* * * * *", "timezone": "Mars/Olympus"},
    {"cron": "* * * * *", "timezone": "+05:30"},
    {"cron": "* * * * *", "dst_gap": "later"},
    {"cron": "* * * * *", "dst_overlap": 2},
    {"cron": "* * * * *", "bogus": 1},
    {"cron": "* * * * *", "run_at": "2030-01-01T00:00:00Z"},
    {"cron": "* * * * *", "end_at": "2001-01-01T00:00:00Z"},
    {"cron": "* * * * *", "start_at": "2030-01-02T00:00:00Z", "end_at": "2030-01-01T00:00:00Z"},
    {"run_at": "2030-01-01T00:00:00"},
    {"run_at": "2030-02-30T00:00:00Z"},
    {"run_at": "2999-01-01T00:00:00Z"},
    {"run_at": "2030-01-01T00:00:00Z", "timezone": "UTC"},
]


@pytest.mark.parametrize("schedule", BAD_SCHEDULES, ids=[str(s)[:40] for s in BAD_SCHEDULES])
async def test_a_bad_schedule_is_refused_exactly_as_post_jobs_refuses_it(api: Api, schedule: Any) -> None:
    job_status, job_error = await api.post("/v1/jobs", {"target": QUEUE_TARGET, "schedule": schedule})
    preview_status, preview_error = await api.post("/v1/schedules/preview", {"schedule": schedule})
    assert job_status in (400, 422), job_error
    assert (preview_status, preview_error) == (job_status, job_error)
    assert job_error["error"]["field"].startswith("schedule")


async def test_missing_schedule_is_refused_like_post_jobs(api: Api) -> None:
    _, job_error = await api.post("/v1/jobs", {"target": QUEUE_TARGET})
    status, error = await api.post("/v1/schedules/preview", {"count": 3})
    assert (status, error) == (422, job_error)
    assert error["error"] == {"code": "missing_field", "message": "schedule is required", "field": "schedule"}


@pytest.mark.parametrize(
    ("body", "status", "code", "field"),
    [
        ({"schedule": {"cron": "* * * * *"}, "count": 0}, 422, "invalid_value", "count"),
        ({"schedule": {"cron": "* * * * *"}, "count": 101}, 422, "invalid_value", "count"),
        ({"schedule": {"cron": "* * * * *"}, "count": "5"}, 400, "wrong_type", "count"),
        ({"schedule": {"cron": "* * * * *"}, "count": 5.0}, 400, "wrong_type", "count"),
        ({"schedule": {"cron": "* * * * *"}, "count": True}, 400, "wrong_type", "count"),
        ({"schedule": {"cron": "* * * * *"}, "from": "yesterday"}, 422, "invalid_time", "from"),
        ({"schedule": {"cron": "* * * * *"}, "from": 1700000000}, 400, "wrong_type", "from"),
        ({"schedule": {"cron": "* * * * *"}, "form": "2030-01-01T00:00:00Z"}, 422, "unknown_field", "form"),
        ([{"cron": "* * * * *"}], 400, "wrong_type", None),
    ],
)
async def test_preview_body_errors(api: Api, body: Any, status: int, code: str, field: str | None) -> None:
    got_status, got = await api.post("/v1/schedules/preview", body)
    assert got_status == status, got
    assert got["error"]["code"] == code
    assert got["error"].get("field") == field


async def test_preview_needs_a_key_and_json(api: Api) -> None:
    resp = await api.client.post("/v1/schedules/preview", json={"schedule": {"cron": "* * * * *"}})
    assert resp.status == 401
    assert (await resp.json())["error"]["code"] == "unauthorized"
    assert resp.headers["WWW-Authenticate"] == "Bearer"
    resp = await api.client.post("/v1/schedules/preview", data="cron=*", headers=api.headers)
    assert resp.status == 415
    resp = await api.client.post(
        "/v1/schedules/preview",
        data=b'{"schedule": {"cron": "* * * * *"}, "count": 1, "count": 2}',
        headers={**api.headers, "Content-Type": "application/json"},
    )
    assert resp.status == 400
    assert (await resp.json())["error"]["code"] == "malformed_json"


# --- a job's preview --------------------------------------------------------------------------------


async def _create(api: Api, schedule: dict[str, Any], **extra: Any) -> dict[str, Any]:
    status, job = await api.post("/v1/jobs", {"target": QUEUE_TARGET, "schedule": schedule, **extra})
    assert status == 201, job
    return job  # type: ignore[no-any-return]


async def test_job_preview_carries_due_times_with_the_jobs_jitter(api: Api) -> None:
    job = await _create(api, {"cron": "0 9 * * 1-5", "timezone": "America/New_York"}, jitter_s=600)
    status, body = await api.get(f"/v1/jobs/{job['id']}/preview?count=5&from=2026-03-06T00:00:00Z")
    assert status == 200, body
    assert body["job_id"] == job["id"] and body["state"] == "scheduled"
    model = CronSchedule(cron="0 9 * * 1-5", timezone="America/New_York")
    expected = occurrences(model, parse("2026-03-06T00:00:00Z"), 5)
    assert [parse(i["at"]) for i in body["items"]] == expected
    for item, instant in zip(body["items"], expected, strict=True):
        delay = timedelta(milliseconds=jitter_ms(uuid.UUID(job["id"]), instant, 600))
        assert item["due_at"] == format_time(instant + delay)
        assert instant <= parse(item["due_at"]) <= instant + timedelta(seconds=600)
    # 9:00 on Monday 9 March is EDT, the Friday before it EST.
    assert [i["utc_offset"] for i in body["items"][:2]] == ["-05:00", "-04:00"]


async def test_job_preview_from_now_matches_next_run_at(api: Api) -> None:
    job = await _create(api, {"cron": "0 0 1 * *", "timezone": "Australia/Lord_Howe"})
    status, body = await api.get(f"/v1/jobs/{job['id']}/preview")
    assert status == 200
    assert len(body["items"]) == 10
    assert body["items"][0]["due_at"] == job["next_run_at"] == body["items"][0]["at"]
    assert {i["utc_offset"] for i in body["items"]} <= {"+10:30", "+11:00"}


async def test_a_spread_job_round_trips_and_its_due_times_carry_the_offset(api: Api) -> None:
    """spread_s: one fixed offset per job, from its id, in [0, spread_s); next_run_at and the
    preview's due_at include it, the preview's ``at`` (the Scheduled-For) does not."""
    job = await _create(api, {"cron": "0 * * * *"}, spread_s=3600)
    assert job["spread_s"] == 3600 and job["jitter_s"] == 0
    status, fetched = await api.get(f"/v1/jobs/{job['id']}")
    assert status == 200 and fetched["spread_s"] == 3600
    offset = timedelta(milliseconds=spread_ms(uuid.UUID(job["id"]), 3600))
    assert timedelta(0) <= offset < timedelta(hours=1)
    next_run_at = parse(job["next_run_at"])
    nominal = next_run_at - offset
    assert nominal.minute == nominal.second == nominal.microsecond == 0  # an hour's start, moved
    created = parse(job["created_at"])
    assert created < next_run_at <= created + timedelta(hours=1)  # the first spread time after creation

    status, body = await api.get(f"/v1/jobs/{job['id']}/preview?count=3")
    assert status == 200, body
    assert body["spread_ms"] == offset // timedelta(milliseconds=1)
    assert [parse(i["at"]) for i in body["items"]] == [nominal + timedelta(hours=k) for k in range(3)]
    assert [parse(i["due_at"]) for i in body["items"]] == [next_run_at + timedelta(hours=k) for k in range(3)]
    assert body["items"][0]["due_at"] == job["next_run_at"]

    # The same offset from any 'from': the preview walks the job's moved timeline.
    later = format_time(nominal + timedelta(days=3, minutes=1))
    _, body = await api.get(f"/v1/jobs/{job['id']}/preview?count=2&from={later}")
    assert all(parse(i["due_at"]) - parse(i["at"]) == offset for i in body["items"])
    assert parse(body["items"][0]["due_at"]) > parse(later)

    # Out of range, and not a whole number: refused like jitter_s.
    for value, code in ((3601, 422), (-1, 422), ("5", 400), (1.5, 400)):
        status, refused = await api.post(
            "/v1/jobs", {"target": QUEUE_TARGET, "schedule": {"cron": "@hourly"}, "spread_s": value}
        )
        assert status == code and refused["error"]["field"] == "spread_s", refused

    # A job without it shows 0 and the schedule's own times.
    plain = await _create(api, {"cron": "0 * * * *"})
    assert plain["spread_s"] == 0 and parse(plain["next_run_at"]).minute == 0
    _, body = await api.get(f"/v1/jobs/{plain['id']}/preview?count=1")
    assert body["spread_ms"] == 0 and body["items"][0]["due_at"] == body["items"][0]["at"]


async def test_a_patch_of_spread_s_moves_next_run_at(api: Api) -> None:
    job = await _create(api, {"cron": "0 0 * * *"})
    resp = await api.client.patch(f"/v1/jobs/{job['id']}", json={"spread_s": 600}, headers=api.headers)
    patched = await resp.json()
    assert resp.status == 200 and patched["spread_s"] == 600, patched
    offset = timedelta(milliseconds=spread_ms(uuid.UUID(job["id"]), 600))
    assert parse(patched["next_run_at"]) - offset == parse(job["next_run_at"]) or (
        # created just before midnight: the moved first occurrence may be the one before
        parse(patched["next_run_at"]) - offset == parse(job["next_run_at"]) - timedelta(days=1)
    )


async def test_paused_job_previews_and_finished_jobs_preview_nothing(api: Api) -> None:
    job = await _create(api, {"cron": "@hourly"})
    status, paused = await api.post(f"/v1/jobs/{job['id']}/pause", None)
    assert status == 200 and paused["state"] == "paused"
    _, body = await api.get(f"/v1/jobs/{job['id']}/preview?count=2")
    assert body["state"] == "paused" and len(body["items"]) == 2 and body["has_more"] is True
    await api.client.delete(f"/v1/jobs/{job['id']}", headers=api.headers)
    _, body = await api.get(f"/v1/jobs/{job['id']}/preview?count=2")
    assert (body["state"], body["items"], body["has_more"]) == ("cancelled", [], False)
    one_off = await _create(api, {"run_at": "2030-06-01T00:00:00+02:00"})
    _, body = await api.get(f"/v1/jobs/{one_off['id']}/preview")
    assert [i["at"] for i in body["items"]] == ["2030-05-31T22:00:00Z"] and body["has_more"] is False


async def test_job_preview_is_owner_scoped_and_validates_its_query(api: Api) -> None:
    job = await _create(api, {"cron": "@daily"})
    other_key, _ = await api.store.create_api_key(f"other-{uuid.uuid4().hex[:8]}")
    theirs = await api.client.get(
        f"/v1/jobs/{job['id']}/preview", headers={"Authorization": f"Bearer {other_key}"}
    )
    missing = await api.client.get(f"/v1/jobs/{uuid.uuid4()}/preview", headers=api.headers)
    garbage = await api.client.get("/v1/jobs/not-a-job/preview", headers=api.headers)
    for resp in (theirs, missing, garbage):
        assert resp.status == 404
        assert (await resp.json())["error"]["code"] == "not_found"
    for query, field in (
        ("count=0", "count"),
        ("count=101", "count"),
        ("count=x", "count"),
        ("from=soon", "from"),
    ):
        status, body = await api.get(f"/v1/jobs/{job['id']}/preview?{query}")
        assert status == 422, (query, body)
        assert body["error"]["field"] == field
    status, _ = await api.get(f"/v1/jobs/{job['id']}/preview?count=&from=")
    assert status == 200
    resp = await api.client.get(f"/v1/jobs/{job['id']}/preview")
    assert resp.status == 401


# --- what fires is what was previewed --------------------------------------------------------------


async def test_a_jobs_preview_is_what_the_engine_fires(pg_dsn: str) -> None:
    """Every two seconds, with jitter: the runs' Scheduled-For are the previewed instants, and each
    call arrives no earlier than the previewed due time."""
    receiver = Receiver()
    await receiver.start()
    node = Node(fast_settings(pg_dsn))
    await node.start()
    try:
        assert node.store is not None and node.url is not None
        key, _ = await node.store.create_api_key(f"fire-{uuid.uuid4().hex[:8]}")
        headers = {"Authorization": f"Bearer {key}"}
        async with aiohttp.ClientSession(headers=headers) as http:
            spec = {
                "target": {"type": "webhook", "url": receiver.url + "/fire"},
                "schedule": {"cron": "*/2 * * * * *"},
                "jitter_s": 1,
            }
            async with http.post(node.url + "/v1/jobs", json=spec) as resp:
                assert resp.status == 201
                job = await resp.json()
            async with http.get(node.url + f"/v1/jobs/{job['id']}/preview?count=3") as resp:
                preview = await resp.json()
            calls = await receiver.wait_for("/fire", 5, within=30)
            last = parse(preview["items"][-1]["at"])
            while parse(calls[-1].headers["Duetime-Scheduled-For"]) < last:
                calls = await receiver.wait_for("/fire", len(calls) + 1, within=10)
            fired = {c.headers["Duetime-Scheduled-For"]: c for c in calls}
            for item in preview["items"]:
                call = fired[item["at"]]
                assert call.arrived >= parse(item["due_at"]) - timedelta(milliseconds=50), (
                    item,
                    call.arrived,
                )
            async with http.delete(node.url + f"/v1/jobs/{job['id']}") as resp:
                assert resp.status == 200
    finally:
        await node.stop()
        await receiver.stop()
        await asyncio.sleep(0)
