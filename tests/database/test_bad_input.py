"""The bad-input catalogue, over HTTP against the real API and database: each case answers its
4xx with the contract's error body, the right code, the field at fault and a message that says
what to do — never a 5xx, never a half-made job.

Categories already covered at the HTTP edge elsewhere are not repeated here:
``tests/database/test_api.py::MALFORMED`` (malformed JSON, NaN/Infinity, duplicate keys, lone
surrogates, invalid UTF-8, BOM, huge numbers, deep nesting), its Idempotency-Key shape cases
and its 413/415 cases; ``tests/pure/test_validation.py`` judges hundreds more specs without HTTP.
``test_the_catalogue_covers_every_category`` keeps the union honest.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from dataclasses import field as dc_field
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest

from duetime.api.cursors import CursorSeal
from duetime.storage.postgres import PostgresStore
from tests.support.fixtures import Client

URL = "https://1.1.1.1/hook"


def _last_sunday(year: int, month: int) -> date:
    d = date(year, month + 1, 1) - timedelta(days=1)
    return d - timedelta(days=(d.weekday() + 1) % 7)


# Next year's EU transitions (Europe/Berlin): 02:00-03:00 does not exist in March, 02:00-03:00
# happens twice in October. Computed so the catalogue never ages into the past.
YEAR = datetime.now(UTC).year + 1
SPRING = _last_sunday(YEAR, 3)
AUTUMN = _last_sunday(YEAR, 10)


def job(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "target": {"type": "webhook", "url": URL},
        "schedule": {"run_at": f"{YEAR}-06-01T00:00:00Z"},
    }
    spec.update(overrides)
    return spec


def cron(expr: str, **schedule: Any) -> dict[str, Any]:
    return job(schedule={"cron": expr, **schedule})


def hook(**target: Any) -> dict[str, Any]:
    return job(target={"type": "webhook", "url": URL, **target})


@dataclass(frozen=True)
class Case:
    id: str
    category: str
    body: Any  # a JSON value, or bytes sent as they are
    status: int
    code: str
    field: str | None
    says: str  # a fragment of the message that tells the client what to do
    method: str = "POST"
    # "{id}" is replaced by a real job of the owner, "{sealed:X}" by the store's cursor X sealed for
    # the owner as the API seals the cursors it issues (api/cursors.py): a forged cursor that
    # passes the seal, to reach the stores' own checks of what is inside.
    path: str = "/v1/jobs"
    headers: dict[str, str] = dc_field(default_factory=dict)


CASES = [
    # wrong types (400), booleans where integers belong
    Case("name-number", "wrong types", job(name=5), 400, "wrong_type", "name", "must be a string"),
    Case(
        "schedule-array", "wrong types", job(schedule=[]), 400, "wrong_type", "schedule", "must be an object"
    ),
    Case(
        "backoff-string",
        "wrong types",
        job(retry={"backoff_initial_s": "1"}),
        400,
        "wrong_type",
        "retry.backoff_initial_s",
        "must be a number",
    ),
    Case("body-array", "wrong types", [job()], 400, "wrong_type", None, "must be a JSON object"),
    Case(
        "patch-retry-null",
        "wrong types",
        {"retry": None},
        400,
        "wrong_type",
        "retry",
        "must be an object",
        method="PATCH",
        path="/v1/jobs/{id}",
    ),
    Case(
        "jitter-true",
        "booleans as integers",
        job(jitter_s=True),
        400,
        "wrong_type",
        "jitter_s",
        "not a boolean",
    ),
    Case(
        "attempts-false",
        "booleans as integers",
        job(retry={"max_attempts": False}),
        400,
        "wrong_type",
        "retry.max_attempts",
        "not a boolean",
    ),
    Case(
        "grace-true",
        "booleans as integers",
        job(misfire_grace_s=True),
        400,
        "wrong_type",
        "misfire_grace_s",
        "not a boolean",
    ),
    Case(
        "timeout-true",
        "booleans as integers",
        hook(timeout_s=True),
        400,
        "wrong_type",
        "target.timeout_s",
        "not a boolean",
    ),
    # NUL bytes (valid JSON, unstorable)
    Case("nul-name", "NUL bytes", job(name="a\x00b"), 422, "invalid_value", "name", "NUL"),
    Case(
        "nul-topic",
        "NUL bytes",
        job(target={"type": "queue", "broker": "nats", "topic": "a\x00b"}),
        422,
        "invalid_value",
        "target.topic",
        "NUL",
    ),
    Case("nul-payload-key", "NUL bytes", job(payload={"a\x00": 1}), 422, "invalid_value", "payload", "NUL"),
    # CR/LF and other header abuse
    Case(
        "crlf-header",
        "CR/LF in header values",
        hook(headers={"X-A": "v\r\nX-Injected: 1"}),
        422,
        "invalid_header",
        "target.headers.X-A",
        "must not contain CR or LF",
    ),
    Case(
        "lf-header",
        "CR/LF in header values",
        hook(headers={"X-A": "v\nq"}),
        422,
        "invalid_header",
        "target.headers.X-A",
        "must not contain CR or LF",
    ),
    Case(
        "space-header-name",
        "CR/LF in header values",
        hook(headers={"X A": "v"}),
        422,
        "invalid_header",
        "target.headers",
        "not a valid header name",
    ),
    Case(
        "reserved-header",
        "CR/LF in header values",
        hook(headers={"Idempotency-Key": "mine"}),
        422,
        "reserved_header",
        "target.headers.Idempotency-Key",
        "cannot be set by a job",
    ),
    Case(
        "reserved-user-agent",
        "CR/LF in header values",
        hook(headers={"User-Agent": "mine/1"}),
        422,
        "reserved_header",
        "target.headers.User-Agent",
        "cannot be set by a job",
    ),
    Case(
        "reserved-accept",
        "CR/LF in header values",
        hook(headers={"ACCEPT": "text/html"}),
        422,
        "reserved_header",
        "target.headers.ACCEPT",
        "cannot be set by a job",
    ),
    # unknown fields, at every level
    Case("unknown-top", "unknown fields", job(colour="red"), 422, "unknown_field", "colour", "allowed here"),
    Case(
        "typo-retry",
        "unknown fields",
        job(retry={"max_attempt": 3}),
        422,
        "unknown_field",
        "retry.max_attempt",
        "did you mean 'max_attempts'",
    ),
    Case(
        "unknown-schedule",
        "unknown fields",
        # ``every`` is a schedule kind since interval schedules: an unknown key is needed here.
        job(schedule={"run_at": f"{YEAR}-01-01T00:00:00Z", "repeat": "1h"}),
        422,
        "unknown_field",
        "schedule.repeat",
        "allowed here",
    ),
    Case(
        "unknown-patch",
        "unknown fields",
        {"colour": 1},
        422,
        "unknown_field",
        "colour",
        "allowed here",
        method="PATCH",
        path="/v1/jobs/{id}",
    ),
    # odd zones
    Case(
        "zone-mars",
        "odd zones",
        cron("0 3 * * *", timezone="Mars/Olympus"),
        422,
        "invalid_timezone",
        "schedule.timezone",
        "not a known IANA zone id",
    ),
    Case(
        "zone-offset",
        "odd zones",
        cron("0 3 * * *", timezone="UTC+2"),
        422,
        "invalid_timezone",
        "schedule.timezone",
        "Etc/GMT-5",
    ),
    Case(
        "zone-path",
        "odd zones",
        cron("0 3 * * *", timezone="../../etc/passwd"),
        422,
        "invalid_timezone",
        "schedule.timezone",
        "not an IANA zone id",
    ),
    Case(
        "zone-case",
        "odd zones",
        cron("0 3 * * *", timezone="europe/berlin"),
        422,
        "invalid_timezone",
        "schedule.timezone",
        "did you mean 'Europe/Berlin'",
    ),
    Case(
        "zone-empty",
        "odd zones",
        cron("0 3 * * *", timezone=""),
        422,
        "invalid_timezone",
        "schedule.timezone",
        "IANA zone id",
    ),
    # times: no offset, not a time, leap seconds, beyond the horizon, DST edges
    Case(
        "run-at-no-offset",
        "DST-edge times",
        job(schedule={"run_at": f"{YEAR}-01-01T00:00:00"}),
        422,
        "invalid_time",
        "schedule.run_at",
        "add Z or an offset",
    ),
    Case(
        "run-at-25h",
        "DST-edge times",
        job(schedule={"run_at": f"{YEAR}-01-01T25:00:00Z"}),
        422,
        "invalid_time",
        "schedule.run_at",
        "hour must be in 0..23",
    ),
    Case(
        "run-at-leap-second",
        "DST-edge times",
        job(schedule={"run_at": f"{YEAR}-06-30T23:59:60Z"}),
        422,
        "invalid_time",
        "schedule.run_at",
        "leap seconds",
    ),
    Case(
        "run-at-horizon",
        "DST-edge times",
        job(schedule={"run_at": "9999-12-31T23:59:59Z"}),
        422,
        "invalid_value",
        "schedule.run_at",
        "days ahead",
    ),
    Case(
        "start-at-local-in-gap",
        "DST-edge times",
        cron("30 2 * * *", timezone="Europe/Berlin", start_at=f"{SPRING}T02:30:00"),
        422,
        "invalid_time",
        "schedule.start_at",
        "add Z or an offset",
    ),
    Case(
        "only-in-the-gap-skipped",
        "DST-edge times",
        cron(
            f"30 2 {SPRING.day} 3 *",
            timezone="Europe/Berlin",
            dst_gap="skip",
            start_at=f"{SPRING - timedelta(days=1)}T00:00:00Z",
            end_at=f"{SPRING + timedelta(days=1)}T00:00:00Z",
        ),
        422,
        "cron_never_fires",
        "schedule.end_at",
        "no occurrence before end_at",
    ),
    Case(
        "dst-gap-unknown",
        "DST-edge times",
        cron("30 2 * * *", timezone="Europe/Berlin", dst_gap="later"),
        422,
        "invalid_value",
        "schedule.dst_gap",
        "one of shift | skip",
    ),
    Case(
        "dst-overlap-unknown",
        "DST-edge times",
        cron("30 2 * * *", timezone="Europe/Berlin", dst_overlap="second"),
        422,
        "invalid_value",
        "schedule.dst_overlap",
        "one of first | both",
    ),
    # cron: out of range, reversed, never firing, malformed
    Case(
        "cron-minute-60",
        "out-of-range cron",
        cron("60 * * * *"),
        422,
        "invalid_cron",
        "schedule.cron",
        "out of range 0-59",
    ),
    Case(
        "cron-hour-24",
        "out-of-range cron",
        cron("0 24 * * *"),
        422,
        "invalid_cron",
        "schedule.cron",
        "out of range 0-23",
    ),
    Case(
        "cron-dom-32",
        "out-of-range cron",
        cron("0 0 32 * *"),
        422,
        "invalid_cron",
        "schedule.cron",
        "out of range 1-31",
    ),
    Case(
        "cron-month-13",
        "out-of-range cron",
        cron("0 0 1 13 *"),
        422,
        "invalid_cron",
        "schedule.cron",
        "out of range 1-12",
    ),
    Case(
        "cron-dow-8",
        "out-of-range cron",
        cron("0 0 * * 8"),
        422,
        "invalid_cron",
        "schedule.cron",
        "out of range 0-7",
    ),
    Case(
        "cron-reversed",
        "reversed cron",
        cron("30-10 * * * *"),
        422,
        "invalid_cron",
        "schedule.cron",
        "write two ranges separated by ','",
    ),
    Case(
        "cron-step-0",
        "reversed cron",
        cron("*/0 * * * *"),
        422,
        "invalid_cron",
        "schedule.cron",
        "use a step of 1 or more",
    ),
    Case(
        "cron-feb-30",
        "never-firing cron",
        cron("0 0 30 2 *"),
        422,
        "cron_never_fires",
        "schedule.cron",
        "does not exist in Feb",
    ),
    Case(
        "cron-after-end",
        "never-firing cron",
        cron("0 0 1 1 *", start_at=f"{YEAR}-01-02T00:00:00Z", end_at=f"{YEAR}-12-31T00:00:00Z"),
        422,
        "cron_never_fires",
        "schedule.end_at",
        "no occurrence before end_at",
    ),
    Case(
        "cron-end-before-start",
        "never-firing cron",
        cron("0 * * * *", start_at=f"{YEAR}-01-02T00:00:00Z", end_at=f"{YEAR}-01-01T00:00:00Z"),
        422,
        "invalid_schedule",
        "schedule.end_at",
        "must be later than",
    ),
    Case(
        "cron-7-fields",
        "out-of-range cron",
        cron("* * * * * * *"),
        422,
        "invalid_cron",
        "schedule.cron",
        "expected 5 fields",
    ),
    Case(
        "cron-macro",
        "out-of-range cron",
        cron("@fortnightly"),
        422,
        "invalid_cron",
        "schedule.cron",
        "use one of @yearly",
    ),
    Case(
        "both-schedules",
        "out-of-range cron",
        job(schedule={"run_at": f"{YEAR}-01-01T00:00:00Z", "cron": "* * * * *"}),
        422,
        "invalid_schedule",
        "schedule",
        "exactly one of run_at",
    ),
    # forged cursors and huge limits
    Case(
        "cursor-garbage",
        "forged cursors",
        None,
        422,
        "invalid_cursor",
        "cursor",
        "pass next_cursor",
        method="GET",
        path="/v1/jobs?cursor=%25%25%25",
    ),
    Case(
        "cursor-non-ascii",
        "forged cursors",
        None,
        422,
        "invalid_cursor",
        "cursor",
        "pass next_cursor",
        method="GET",
        path="/v1/jobs?cursor=%C3%A9t%C3%A9",
    ),
    Case(
        "cursor-wrong-length",
        "forged cursors",
        None,
        422,
        "invalid_cursor",
        "cursor",
        "pass next_cursor",
        method="GET",
        path="/v1/jobs?cursor=AAAA",
    ),
    Case(
        "runs-cursor-above-int64",
        "forged cursors",
        None,
        422,
        "invalid_cursor",
        "cursor",
        "pass next_cursor from the previous page",  # the store's check, past the seal
        method="GET",
        path="/v1/jobs/{id}/runs?cursor={sealed:_____________w}",
    ),
    Case(
        "owner-runs-cursor-run-id-above-int64",
        "forged cursors",
        None,
        422,
        "invalid_cursor",
        "cursor",
        "pass next_cursor from the previous page",  # the store's check, past the seal
        method="GET",
        path="/v1/runs?cursor={sealed:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA__________8}",
    ),
    Case(
        "owner-runs-cursor-run-id-2-63",
        "forged cursors",
        None,
        422,
        "invalid_cursor",
        "cursor",
        "pass next_cursor from the previous page",  # the store's check, past the seal
        method="GET",
        path="/v1/runs?cursor={sealed:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAgAAAAAAAAAA}",
    ),
    Case(
        "owner-runs-cursor-time-out-of-range",
        "forged cursors",
        None,
        422,
        "invalid_cursor",
        "cursor",
        "pass next_cursor from the previous page",  # the store's check, past the seal
        method="GET",
        path="/v1/runs?cursor={sealed:f_________8AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA}",
    ),
    Case(
        "runs-cursor-above-int64-unsealed",
        "forged cursors",
        None,
        422,
        "invalid_cursor",
        "cursor",
        "pass next_cursor",
        method="GET",
        path="/v1/runs?cursor=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAgAAAAAAAAAA",
    ),
    Case(
        "runs-cursor-from-before-the-seal",
        "forged cursors",
        None,
        422,
        "invalid_cursor",
        "cursor",
        "pass next_cursor",
        method="GET",
        path="/v1/jobs/{id}/runs?cursor=AAAAAAAAAAE",
    ),
    Case(
        "runs-cursor-garbage",
        "forged cursors",
        None,
        422,
        "invalid_cursor",
        "cursor",
        "pass next_cursor",
        method="GET",
        path="/v1/jobs/{id}/runs?cursor=not*base64",
    ),
    Case(
        "limit-huge",
        "huge limits",
        None,
        422,
        "invalid_limit",
        "limit",
        "from 1 to 1000",
        method="GET",
        path="/v1/jobs?limit=1000000000000000000000000",
    ),
    Case(
        "limit-1001",
        "huge limits",
        None,
        422,
        "invalid_limit",
        "limit",
        "from 1 to 1000",
        method="GET",
        path="/v1/jobs?limit=1001",
    ),
    Case(
        "limit-exponent",
        "huge limits",
        None,
        422,
        "invalid_limit",
        "limit",
        "from 1 to 1000",
        method="GET",
        path="/v1/jobs?limit=1e3",
    ),
    Case(
        "limit-negative",
        "huge limits",
        None,
        422,
        "invalid_limit",
        "limit",
        "from 1 to 1000",
        method="GET",
        path="/v1/jobs?limit=-1",
    ),
    Case(
        "runs-limit-huge",
        "huge limits",
        None,
        422,
        "invalid_limit",
        "limit",
        "from 1 to 1000",
        method="GET",
        path="/v1/jobs/{id}/runs?limit=99999999999",
    ),
    Case(
        "timeout-huge",
        "huge limits",
        hook(timeout_s=10**30),
        422,
        "invalid_value",
        "target.timeout_s",
        "from 1 to 300",
    ),
    Case(
        "attempts-101",
        "huge limits",
        job(retry={"max_attempts": 101}),
        422,
        "invalid_value",
        "retry.max_attempts",
        "from 1 to 100",
    ),
    Case(
        "too-many-headers",
        "huge limits",
        hook(headers={f"X-{i}": "v" for i in range(60)}),
        422,
        "invalid_header",
        "target.headers",
        "at most 50",
    ),
    Case(
        "payload-too-large",
        "huge limits",
        job(payload="x" * 70_000),
        422,
        "payload_too_large",
        "payload",
        "Send a reference",
    ),
    # Idempotency-Key misuse (its shape is in test_api.py; here its reuse)
    Case(
        "idempotency-key-reused",
        "Idempotency-Key misuse",
        job(name="a-different-body"),
        422,
        "idempotency_key_reused",
        "Idempotency-Key",
        "use a new key",
        headers={"Idempotency-Key": "reused"},
    ),
    Case(
        "idempotency-key-too-long",
        "Idempotency-Key misuse",
        job(),
        422,
        "invalid_idempotency_key",
        "Idempotency-Key",
        "1 to 255 printable ASCII",
        headers={"Idempotency-Key": "k" * 256},
    ),
    Case(
        "state-unknown",
        "wrong types",
        None,
        422,
        "invalid_state",
        "state",
        "must be one of scheduled",
        method="GET",
        path="/v1/jobs?state=running",
    ),
]

REQUIRED_CATEGORIES = {
    "malformed JSON",
    "NaN",
    "duplicate keys",
    "wrong types",
    "booleans as integers",
    "NUL bytes",
    "lone surrogates",
    "CR/LF in header values",
    "unknown fields",
    "odd zones",
    "DST-edge times",
    "out-of-range cron",
    "reversed cron",
    "never-firing cron",
    "forged cursors",
    "huge limits",
    "Idempotency-Key misuse",
}


def test_the_catalogue_covers_every_category() -> None:
    from tests.database.test_api import MALFORMED

    elsewhere = {name for name, _ in MALFORMED}
    covered = {c.category for c in CASES}
    assert {"syntax", "NaN", "duplicate keys", "lone surrogate escape"} <= elsewhere
    covered |= {"malformed JSON", "NaN", "duplicate keys", "lone surrogates"}
    assert covered >= REQUIRED_CATEGORIES, REQUIRED_CATEGORIES - covered
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_bad_input_answers_its_4xx_with_a_useful_message(
    client: Client, store: PostgresStore, case: Case
) -> None:
    owner = f"bad-{uuid.uuid4().hex[:8]}"
    key, _ = await store.create_api_key(owner)
    auth = {"Authorization": f"Bearer {key}"}
    resp = await client.post("/v1/jobs", json=job(), headers={**auth, "Idempotency-Key": "reused"})
    assert resp.status == 201
    existing = await resp.json()
    path = case.path.replace("{id}", existing["id"])
    if "{sealed:" in path:
        seal = CursorSeal(await store.cursor_key())
        path = re.sub(r"\{sealed:([^}]*)\}", lambda m: seal.seal(owner, m.group(1)) or "", path)
    headers = {**auth, **case.headers}
    if case.body is None:
        resp = await client.request(case.method, path, headers=headers)
    else:
        resp = await client.request(case.method, path, json=case.body, headers=headers)
    text = await resp.text()
    assert resp.status == case.status, text
    assert resp.headers["Content-Type"].startswith("application/json")
    error = json.loads(text)["error"]
    assert error["code"] == case.code, error
    assert error.get("field") == case.field, error
    assert case.says in error["message"], error["message"]
    # Nothing was made or changed by a refused request.
    listed = await (await client.get("/v1/jobs", headers=auth)).json()
    assert listed["items"] == [existing]


async def test_dst_edges_that_are_valid_are_accepted_and_normalised(
    client: Client, store: PostgresStore
) -> None:
    """The other side of the DST cases: what a careful client sends is taken, and the answer says
    exactly when it will run (in UTC)."""
    key, _ = await store.create_api_key(f"dst-{uuid.uuid4().hex[:8]}")
    auth = {"Authorization": f"Bearer {key}"}
    window = {
        "start_at": f"{SPRING - timedelta(days=1)}T00:00:00Z",
        "end_at": f"{SPRING + timedelta(days=1)}T00:00:00Z",
    }
    autumn = {
        "start_at": f"{AUTUMN - timedelta(days=1)}T00:00:00Z",
        "end_at": f"{AUTUMN + timedelta(days=1)}T00:00:00Z",
    }
    cases = [
        # a wall time in the spring gap, given with its offset, is a real instant
        (job(schedule={"run_at": f"{SPRING}T02:30:00+01:00"}), f"{SPRING}T01:30:00Z"),
        # shift: the gap's 02:30 runs at the first valid instant after it, 03:00 CEST
        (cron(f"30 2 {SPRING.day} 3 *", timezone="Europe/Berlin", **window), f"{SPRING}T01:00:00Z"),
        # the repeated hour: its first 02:30 is still summer time
        (
            cron(f"30 2 {AUTUMN.day} 10 *", timezone="Europe/Berlin", dst_overlap="both", **autumn),
            f"{AUTUMN}T00:30:00Z",
        ),
    ]
    for spec, next_run_at in cases:
        resp = await client.post("/v1/jobs", json=spec, headers=auth)
        body = await resp.json()
        assert resp.status == 201, body
        assert body["next_run_at"] == next_run_at, (spec["schedule"], body["next_run_at"])
