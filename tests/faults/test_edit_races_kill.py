"""An owner's edit racing a death (issue 27, observation 3): a call is in flight when the owner
replaces the job's schedule (PATCH, or PUT by name) or pauses or cancels it, and then the node
is SIGKILLed and comes back. The attempt whose outcome nobody recorded must be finished as what
was fenced: ``lease_expired`` for the occurrence that was called, and the owner's edit stands.

Before the fence remembered what it fenced (migration 0013), expiry read the attempt from the row
as the PATCH had left it: it recorded ``lease_expired`` for the new schedule's first occurrence,
which never ran, and retried that occurrence at once, hours before it was due (a call with
``Idempotency-Key <job>:<new first occurrence>``).

A real ``duetime run`` (API, engine and in-process workers) calls a target that answers after
40 s. The job is a 6-field cron that fires once an hour at a chosen second, so the one occurrence
in the test's window is the one in flight, and its overlap policy is skip, so no occurrence row
starts beside it. The node comes back under the same engine id (its restart step expires what it
had in flight) or, for one scenario, under a new one (the janitor rescues the lapsed lease).

Accounting, printed as one JSON line: lost (the fenced occurrence has no outcome), early (a call
before its occurrence was due), duplicates without a lapsed lease, stuck (the job still running
after the bound), and the checker's counts.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.faults.checker import Expected
from tests.faults.harness import NodeProc, Owner, account, node_env, owner_on, utc, whole_second
from tests.faults.recorder import RecorderProcess, parse_time
from tests.support.wait import until

pytestmark = pytest.mark.timeout(90)

# The target answers long after the kill: the call's outcome is never recorded.
SLOW_PATH = "/slow/40"
# After the restart's outcome is in the history: how long a retry of the wrong occurrence would
# take to reach the target (the retry's backoff is at most 1 s, the claim polls every 0.5 s, the
# fence and the call take milliseconds), twice over. Nothing may arrive in this window.
QUIET_S = 4.0

# scenario: (the owner's action while the call is in flight, the engine id the node comes back under)
SCENARIOS = {
    "patch": ("patch", "same"),
    "patch_janitor": ("patch", "new"),
    "put": ("put", "same"),
    "pause": ("pause", "same"),
    "cancel": ("cancel", "same"),
}


def _spec(name: str, url: str, cron: str) -> dict[str, Any]:
    return {
        "name": name,
        "target": {"type": "webhook", "url": url, "timeout_s": 60},
        "schedule": {"cron": cron, "timezone": "UTC"},
        "retry": {"max_attempts": 5, "backoff_initial_s": 0.2, "backoff_max_s": 1},
        "overlap": "skip",
    }


def _hours_ahead(hours: int) -> tuple[str, datetime]:
    """A daily 6-field cron ``hours`` ahead of now, and its first occurrence."""
    at = (datetime.now(UTC) + timedelta(hours=hours)).replace(second=0, microsecond=0)
    return f"0 {at.minute} {at.hour} * * *", at


async def _act(owner: Owner, job: dict[str, Any], action: str, url: str, new_cron: str) -> None:
    job_id, name = job["id"], job["name"]
    new_schedule = {"cron": new_cron, "timezone": "UTC"}
    if action == "patch":
        status, body = await owner.call("PATCH", f"/v1/jobs/{job_id}", {"schedule": new_schedule})
    elif action == "put":
        spec = _spec(name, url, new_cron)
        del spec["name"]
        status, body = await owner.call("PUT", f"/v1/jobs/by-name/{name}", spec)
    elif action == "pause":
        status, body = await owner.call("POST", f"/v1/jobs/{job_id}/pause")
    else:
        status, body = await owner.call("DELETE", f"/v1/jobs/{job_id}")
    assert status == 200, (action, status, body)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_an_edit_racing_a_kill_keeps_the_fenced_occurrence_and_the_edit(
    scenario: str, fault_db: str, recorder: RecorderProcess, tmp_path: Path
) -> None:
    action, comes_back = SCENARIOS[scenario]
    engine = f"edit-race-{uuid.uuid4().hex[:6]}"
    env = node_env(fault_db, DUETIME_DATA_DIR=str(tmp_path / "data"), DUETIME_ENGINE_ID=engine)
    node = NodeProc(env, "run", tmp_path / "node.log")
    spawned = [node]
    try:
        url = await node.ready()
        async with owner_on(url, fault_db) as owner:
            # Fires once an hour, at a second a few seconds from now: one occurrence in the window.
            fenced_for = whole_second(4)
            cron = f"{fenced_for.second} {fenced_for.minute} * * * *"
            job = await owner.create(_spec(f"edit-race-{scenario}", recorder.url + SLOW_PATH, cron))
            job_id = job["id"]
            [call] = await recorder.wait_for(1, within=30, prefix=SLOW_PATH)
            assert call.scheduled_for == fenced_for, call
            new_cron, new_first = _hours_ahead(2)
            await _act(owner, job, action, recorder.url + SLOW_PATH, new_cron)
            await node.kill()
            if comes_back == "new":
                env = {**env, "DUETIME_ENGINE_ID": f"{engine}-next"}
            node = NodeProc(env, "run", tmp_path / "node-next.log")
            spawned.append(node)
            owner.base = await node.ready()  # the API is the node's: a new port after the restart

            async def recorded() -> bool:
                return bool(await owner.runs(job_id))

            try:
                await until(recorded, within=30, what="the lapsed attempt's outcome in the history")
                stuck = 0
            except AssertionError:
                stuck = 1
            await asyncio.sleep(QUIET_S)  # a wrong retry would be called in here (see QUIET_S)
            status, after = await owner.call("GET", f"/v1/jobs/{job_id}")
            assert status == 200, after
            history = await owner.runs(job_id)
            report = await account(owner, recorder, [Expected(job_id, fenced_for)], job_ids=[job_id])
    finally:
        for proc in spawned:
            if proc.alive():
                await proc.stop()
    calls = [r for r in recorder.records() if r.job_id == job_id]
    early = [r for r in calls if r.arrived < r.scheduled_for]
    counts = report.counts()
    print(
        json.dumps(
            {
                "scenario": f"edit_races_kill[{scenario}]",
                "lost": counts["lost"],
                "early": len(early),
                "duplicates_unattributed": counts["duplicates_unattributed"],
                "stuck": stuck,
                "call_keys": [f"{r.key} attempt {r.attempt}" for r in calls],
                "history": [f"{h['scheduled_for']} attempt {h['attempt']} {h['outcome']}" for h in history],
                "next_run_at": after["next_run_at"],
                **{k: v for k, v in counts.items() if k not in ("lost", "early")},
            }
        )
    )
    assert not early, f"called before due: {[(r.key, utc(r.arrived)) for r in early]}"
    assert stuck == 0, "the lapsed attempt was never finished"
    assert [(parse_time(h["scheduled_for"]), h["attempt"], h["outcome"]) for h in history] == [
        (fenced_for, 1, "lease_expired")
    ], "one lease_expired row, for the occurrence that was fenced"
    assert report.ok, report.explain()
    assert [r.scheduled_for for r in calls] == [fenced_for], "one call: the fenced occurrence's"
    if action in ("patch", "put"):
        assert after["state"] == "scheduled" and parse_time(after["next_run_at"]) == new_first, after
    elif action == "pause":
        # The lapsed attempt is retried by policy, as a failed one would be: once resumed.
        assert after["state"] == "paused" and after["attempt"] == 1, after
    else:
        assert after["state"] == "cancelled" and after["next_run_at"] is None, after
