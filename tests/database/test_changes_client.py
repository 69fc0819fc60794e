"""Change history through the owners' client (sync and async) and ``duetime jobs`` (issue 30,
item 1): ``reason=`` on every changing call, ``changes()``/``iter_changes()``, ``spec_version`` on
jobs and runs, ``--reason`` on every changing command, ``jobs changes ID``, and ``jobs apply``
sending a reason of its own."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from duetime.cli import render_table
from duetime.client import AsyncDuetimeClient, DuetimeClient, ValidationError
from tests.database.test_apply_cli import cli
from tests.database.test_client import Served, _webhook_spec, duetime_jobs, served

__all__ = ["served"]  # the node fixture, shared with the client tests

GREETING = "Grüße from the deploy ✓"  # not Latin-1: the sync client must send it as UTF-8


def _sync_scenario(served: Served) -> None:
    client = DuetimeClient(served.url, served.key)
    job = client.create_job(_webhook_spec(served, "/changes-sync"), reason=GREETING)
    assert job.spec_version == 1
    assert client.update_job(job.id, {"jitter_s": 7}, reason="spread it").spec_version == 2
    client.pause_job(job.id, reason="maintenance")
    client.resume_job(job.id, reason="maintenance over")
    client.backfill_job(job.id, datetime(2024, 1, 1, tzinfo=UTC), "2025-01-02T00:00:00Z", reason="catch up")
    client.cancel_job(job.id, reason="retired")
    page = client.changes(job.id, limit=2)
    assert [c.action for c in page.items] == ["cancel", "backfill"] and page.next_cursor is not None
    every = list(client.iter_changes(job.id, page_size=2))
    assert [(c.seq, c.action, c.reason, c.spec_version) for c in every] == [
        (6, "cancel", "retired", 2),
        (5, "backfill", "catch up", 2),
        (4, "resume", "maintenance over", 2),
        (3, "pause", "maintenance", 2),
        (2, "update", "spread it", 2),
        (1, "create", GREETING, 1),
    ]
    assert every[4].diff == {"/jitter_s": {"from": 0, "to": 7}}
    assert {c.actor_type for c in every} == {"owner"} and {c.key_id for c in every} == {served.key[:10]}
    try:
        client.pause_job(job.id, reason="x" * 501)
    except ValidationError as exc:
        assert (exc.code, exc.field) == ("invalid_reason", "Duetime-Reason")
    else:
        raise AssertionError("a reason of 501 characters was taken")


async def test_the_sync_client_sends_reasons_and_reads_the_history(served: Served) -> None:
    await asyncio.to_thread(_sync_scenario, served)


async def test_the_async_client_sends_reasons_and_reads_the_history(served: Served) -> None:
    async with AsyncDuetimeClient(served.url, served.key, timeout_s=10) as client:
        labels = {"batch": uuid.uuid4().hex[:8]}
        job = await client.create_job(_webhook_spec(served, "/changes-async", labels=labels), reason=GREETING)
        await client.trigger_job(job.id, reason="now, please")
        await served.receiver.wait_for("/changes-async", 1)
        runs: list[Any] = []
        for _ in range(200):
            runs = [r async for r in client.iter_runs(job.id)]
            if runs:
                break
            await asyncio.sleep(0.05)
        assert runs and runs[0].spec_version == 1
        assert (await client.bulk_pause(labels, reason="freeze")).changed == 1
        assert (await client.bulk_resume(labels, reason="thaw")).changed == 1
        assert (await client.bulk_cancel(labels, reason="done")).changed == 1
        records = [c async for c in client.iter_changes(job.id, page_size=2)]
        assert [(c.action, c.reason) for c in records] == [
            ("cancel", "done"),
            ("resume", "thaw"),
            ("pause", "freeze"),
            ("trigger", "now, please"),
            ("create", GREETING),
        ]
        assert records[-1].diff[""]["to"]["labels"] == labels
        assert (await client.changes(job.id, limit=1)).items == records[:1]


async def test_cli_reason_and_jobs_changes(served: Served, tmp_path: Path) -> None:
    code, job, err = await duetime_jobs(
        served,
        "create",
        "--url",
        served.receiver.url + "/changes-cli",
        "--cron",
        "0 0 1 1 *",
        "--reason",
        GREETING,
    )
    assert code == 0, err
    job_id = job["id"]
    for args in (
        ("update", job_id, "--payload", '{"v": 2}', "--reason", "v2"),
        ("pause", job_id, "--reason", "paused by hand"),
        ("resume", job_id),
        ("trigger", job_id, "--reason", "once more"),
        (
            "backfill",
            job_id,
            "--from",
            "2024-01-01T00:00:00Z",
            "--to",
            "2025-01-02T00:00:00Z",
            "--reason",
            "bf",
        ),
        ("cancel", job_id, "--reason", "bye"),
    ):
        code, _, err = await duetime_jobs(served, *args)
        assert code == 0, (args, err)
    code, page, err = await duetime_jobs(served, "changes", job_id, "--all", "--limit", "2")
    assert code == 0, err
    assert [(c["action"], c["reason"]) for c in page["items"]] == [
        ("cancel", "bye"),
        ("backfill", "bf"),
        ("trigger", "once more"),
        ("resume", None),
        ("pause", "paused by hand"),
        ("update", "v2"),
        ("create", GREETING),
    ]
    assert page["items"][5]["diff"] == {"/payload": {"from": None, "to": {"v": 2}}}
    assert page["items"][0]["actor"] == {"type": "owner", "key_id": served.key[:10]}
    code, first, err = await duetime_jobs(served, "changes", job_id, "--limit", "1")
    assert code == 0 and first["items"] == page["items"][:1] and first["next_cursor"], err
    table = render_table(page)
    header, cancel, *_, create = table.splitlines()
    assert header.split() == ["SEQ", "AT", "ACTION", "ACTOR", "SPEC_VERSION", "REASON", "DIFF"]
    assert cancel.split()[:5] == ["7", page["items"][0]["at"], "cancel", served.key[:10], "2"]
    assert create.rstrip().endswith("(whole spec)")
    code, out, err = await duetime_jobs(served, "pause", job_id, "--reason", "x" * 501)
    assert code == 1 and "invalid_reason" in err, (out, err)


async def test_cli_bulk_and_apply_send_reasons(served: Served, tmp_path: Path) -> None:
    assert served.node.store is not None
    key, _ = await served.node.store.create_api_key(f"apply-{uuid.uuid4().hex[:8]}")
    spec = _webhook_spec(served, "/changes-apply", name="deploy/nightly", labels={"team": "deploy"})
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps([spec]), encoding="utf-8")
    code, out, err = await cli(served, key, "apply", str(path))
    assert code == 0, err
    path.write_text(json.dumps([{**spec, "jitter_s": 3}]), encoding="utf-8")
    code, out, err = await cli(served, key, "apply", "--reason", "release 7", str(path))
    assert code == 0, err
    code, out, err = await cli(served, key, "bulk", "pause", "--label", "team=deploy", "--reason", "freeze")
    assert code == 0 and json.loads(out)["changed"] == 1, err
    async with AsyncDuetimeClient(served.url, key) as client:
        job = await client.get_job_by_name("deploy/nightly")
        records = [(c.action, c.reason) async for c in client.iter_changes(job.id)]
    assert records == [
        ("pause", "freeze"),
        ("replace", "release 7"),
        ("create", "duetime jobs apply jobs.json"),
    ]


async def test_pause_with_a_note_until_a_time_through_the_client_and_the_cli(served: Served) -> None:
    """Issue 30, item 3: ``pause_job(note=, until=)``, ``bulk_pause(note=, until=)``, ``Job.paused``,
    and ``duetime jobs pause ID --note --until`` / ``jobs bulk pause --note --until``."""
    until = datetime.now(UTC).replace(microsecond=0) + timedelta(days=1)
    async with AsyncDuetimeClient(served.url, served.key, timeout_s=10) as client:
        job = await client.create_job(_webhook_spec(served, "/pause-client"))
        assert job.paused is None
        paused = await client.pause_job(job.id, note="upgrade", until=until, reason="OPS-9")
        assert paused.paused is not None and paused.paused["note"] == "upgrade"
        assert paused.paused["until"] == until.isoformat().replace("+00:00", "Z")
        assert (await client.resume_job(job.id)).paused is None
        labels = {"bulkpause": uuid.uuid4().hex[:8]}
        other = await client.create_job(_webhook_spec(served, "/pause-client", labels=labels))
        assert (await client.bulk_pause(labels, note="freeze", until=until)).changed == 1
        assert (await client.get_job(other.id)).paused["note"] == "freeze"  # type: ignore[index]
        records = [c async for c in client.iter_changes(job.id)]
        assert [(c.action, c.reason) for c in records][:2] == [("resume", None), ("pause", "OPS-9")]

    code, out, err = await duetime_jobs(
        served, "pause", job.id, "--note", "from the CLI", "--until", until.isoformat(), "--reason", "cli"
    )
    assert code == 0, err
    assert (out["paused"]["note"], out["paused"]["until"]) == (
        "from the CLI",
        until.isoformat().replace("+00:00", "Z"),
    )
    code, out, err = await duetime_jobs(served, "pause", other.id, "--until", "2020-01-01T00:00:00Z")
    assert code == 1 and "invalid_until" in err, (out, err)
    code, out, err = await duetime_jobs(
        served, "bulk", "resume", "--label", f"bulkpause={labels['bulkpause']}", "--note", "x"
    )
    assert code == 2 and "--note and --until go with bulk pause" in err, err
    code, out, err = await duetime_jobs(
        served, "bulk", "resume", "--label", f"bulkpause={labels['bulkpause']}"
    )
    assert code == 0 and out["changed"] == 1, err
    code, out, err = await duetime_jobs(
        served,
        "bulk",
        "pause",
        "--label",
        f"bulkpause={labels['bulkpause']}",
        "--note",
        "again",
        "--until",
        until.isoformat(),
    )
    assert code == 0 and out["changed"] == 1, err
