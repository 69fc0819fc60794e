"""``duetime jobs apply`` (JSON and YAML, --dry-run, --prune), ``jobs list --label`` and
``jobs bulk``, as an owner's deploy script runs them: the real CLI in a subprocess against a real
node on the real database."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from duetime.client import AsyncDuetimeClient
from tests.database.test_client import REPO, Served, served

__all__ = ["served"]  # the node fixture, shared with the client tests


async def cli(served: Served, key: str, *args: str) -> tuple[int, str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DUETIME_")}
    environ.update(DUETIME_URL=served.url, DUETIME_API_KEY=key)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "duetime",
        "jobs",
        *args,
        env=environ,
        cwd=str(REPO),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _jobs(served: Served, names: dict[str, int]) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "labels": {"team": "deploy", "tier": "t" + str(jitter)},
            "target": {"type": "webhook", "url": served.receiver.url + "/apply", "headers": {"X-Key": "k"}},
            "schedule": {"cron": "0 0 1 1 *", "timezone": "Europe/Berlin"},
            "jitter_s": jitter,
        }
        for name, jitter in names.items()
    ]


def _lines(out: str) -> list[tuple[str, str]]:
    """(what, name) of each line that reports a job."""
    return [tuple(line.split()[:2]) for line in out.strip().splitlines()[:-1]]  # type: ignore[misc]


@pytest.mark.parametrize("fmt", ["yaml", "json"])
async def test_apply_creates_updates_is_a_no_op_and_prunes(served: Served, tmp_path: Path, fmt: str) -> None:
    assert served.node.store is not None
    key, _ = await served.node.store.create_api_key(f"apply-{uuid.uuid4().hex[:8]}")
    path = tmp_path / f"jobs.{'yml' if fmt == 'yaml' else 'json'}"

    def write(names: dict[str, int]) -> None:
        jobs = _jobs(served, names)
        path.write_text(yaml.safe_dump(jobs) if fmt == "yaml" else json.dumps(jobs), encoding="utf-8")

    write({"etl/a": 1, "etl/b": 2, "etl/c": 3})
    code, out, err = await cli(served, key, "apply", str(path))
    assert code == 0, err
    assert sorted(_lines(out)) == [("created", "etl/a"), ("created", "etl/b"), ("created", "etl/c")]
    assert out.strip().splitlines()[-1] == "3 created, 0 updated, 0 unchanged, 0 cancelled"

    code, out, err = await cli(served, key, "apply", str(path))
    assert code == 0, err
    assert sorted(_lines(out)) == [("unchanged", "etl/a"), ("unchanged", "etl/b"), ("unchanged", "etl/c")]

    async with AsyncDuetimeClient(served.url, key) as client:
        before = {j.name: j for j in [j async for j in client.iter_jobs()]}
        # Not in the file and not named: left alone by --prune.
        unnamed = await client.create_job(_jobs(served, {"x": 0})[0] | {"name": None})

        write({"etl/a": 1, "etl/b": 5, "etl/d": 4})
        code, out, err = await cli(served, key, "apply", "--prune", "--dry-run", str(path))
        assert code == 0, err
        plan = out.strip().splitlines()
        assert sorted(tuple(line.split()[:3]) for line in plan[:-1]) == [
            ("would", "cancel", "etl/c"),
            ("would", "create", "etl/d"),
            ("would", "unchanged", "etl/a"),
            ("would", "update", "etl/b"),
        ]
        assert "(jitter_s, labels)" in next(line for line in plan if "etl/b" in line)
        assert plan[-1].endswith("(dry run: nothing changed)")
        after_dry = {j.name: j for j in [j async for j in client.iter_jobs()]}
        assert {n: j.updated_at for n, j in after_dry.items() if n in before} == {
            n: j.updated_at for n, j in before.items()
        }
        assert "etl/d" not in after_dry

        code, out, err = await cli(served, key, "apply", "--prune", str(path))
        assert code == 0, err
        assert sorted(_lines(out)) == [
            ("cancelled", "etl/c"),
            ("created", "etl/d"),
            ("unchanged", "etl/a"),
            ("updated", "etl/b"),
        ]
        now: dict[str | None, Any] = {}
        async for job in client.iter_jobs():
            now[job.name] = job
        assert now["etl/c"].state == "cancelled"
        assert now["etl/b"].jitter_s == 5 and now["etl/b"].labels == {"team": "deploy", "tier": "t5"}
        assert now["etl/a"].updated_at == before["etl/a"].updated_at
        assert now["etl/d"].state == "scheduled"
        assert (await client.get_job(unnamed.id)).state == "scheduled"
        # The header value is still the secret from the file (shown redacted).
        assert now["etl/b"].target["headers"] == {"X-Key": "<redacted>"}


async def test_apply_refuses_a_bad_file_before_sending_anything(served: Served, tmp_path: Path) -> None:
    assert served.node.store is not None
    key, _ = await served.node.store.create_api_key(f"apply-{uuid.uuid4().hex[:8]}")
    cases = {
        "dup.json": (json.dumps(_jobs(served, {"a": 1}) * 2), "twice"),
        "noname.json": (json.dumps([{"target": {}, "schedule": {}}]), "no name"),
        "obj.json": (json.dumps({"name": "a"}), "list of job specs"),
        "broken.yaml": ("- a: [", "not valid YAML"),
    }
    for file, (text, words) in cases.items():
        (tmp_path / file).write_text(text, encoding="utf-8")
        code, out, err = await cli(served, key, "apply", str(tmp_path / file))
        assert code == 2, (file, out, err)
        assert words in err, (file, err)
    async with AsyncDuetimeClient(served.url, key) as client:
        assert (await client.list_jobs()).items == []


async def test_cli_list_by_label_and_bulk(served: Served) -> None:
    assert served.node.store is not None
    key, _ = await served.node.store.create_api_key(f"bulk-{uuid.uuid4().hex[:8]}")
    async with AsyncDuetimeClient(served.url, key) as client:
        made = [
            await client.create_job(
                _jobs(served, {f"j{i}": 0})[0] | {"labels": {"team": "x", "n": str(i % 2)}}
            )
            for i in range(6)
        ]
        code, out, err = await cli(served, key, "list", "--label", "team=x", "--label", "n=1", "--all")
        assert code == 0, err
        assert sorted(j["id"] for j in json.loads(out)["items"]) == sorted(j.id for j in made[1::2])
        code, out, err = await cli(served, key, "bulk", "pause", "--label", "team=x")
        assert code == 0, err
        assert json.loads(out) == {"matched": 6, "changed": 6, "more": False, "calls": 1}
        assert {(await client.get_job(j.id)).state for j in made} == {"paused"}
        code, out, err = await cli(served, key, "bulk", "cancel", "--label", "n=0", "--state", "paused")
        assert code == 0 and json.loads(out)["changed"] == 3, err
        code, out, err = await cli(served, key, "bulk", "resume", "--label", "Bad=x")
        assert code == 1 and "invalid_label" in err  # the API refused it: the operation failed
        code, out, err = await cli(served, key, "bulk", "resume")
        assert code == 2 and "--label" in err


async def test_apply_of_every_schedules_and_retry_windows_is_a_no_op_the_second_time(
    served: Served, tmp_path: Path
) -> None:
    """An ``every`` schedule without ``start_at`` (its default is the time of the call) and a
    retry without ``max_duration_s``: the second apply, dry or real, finds nothing to change."""
    assert served.node.store is not None
    key, _ = await served.node.store.create_api_key(f"apply-every-{uuid.uuid4().hex[:8]}")
    path = tmp_path / "jobs.json"
    target = {"type": "webhook", "url": served.receiver.url + "/apply"}
    jobs = [
        {"name": "every/a", "target": target, "schedule": {"every": "90m", "exclude": ["2030-12-24"]}},
        {"name": "every/b", "target": target, "schedule": {"every": "7d"}, "retry": {"max_attempts": 3}},
        {
            "name": "cron/c",
            "target": target,
            "schedule": {"cron": "0 3 * * *"},
            "retry": {"max_duration_s": 600},
        },
    ]
    path.write_text(json.dumps(jobs), encoding="utf-8")
    code, out, err = await cli(served, key, "apply", str(path))
    assert code == 0, err
    assert out.strip().splitlines()[-1] == "3 created, 0 updated, 0 unchanged, 0 cancelled"
    await asyncio.sleep(1.1)  # a fresh default start_at would now be another second
    code, out, err = await cli(served, key, "apply", "--dry-run", str(path))
    assert code == 0, err
    assert all(line.split()[1] == "unchanged" for line in out.strip().splitlines()[:-1]), out
    code, out, err = await cli(served, key, "apply", str(path))
    assert code == 0, err
    assert out.strip().splitlines()[-1] == "0 created, 0 updated, 3 unchanged, 0 cancelled"
