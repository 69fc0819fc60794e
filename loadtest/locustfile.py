"""The API side of a midnight: owners registering jobs fast, a share of them due at the next round
minute, while they list their jobs and read histories.

    DUETIME_DATABASE_URL=postgresql://…/scratch DUETIME_REDIS_URL=redis://127.0.0.1:6379/0 \\
        duetime run &                                     # the system under test
    DUETIME_DATABASE_URL=postgresql://…/scratch \\
        locust -f loadtest/locustfile.py --host http://127.0.0.1:8080 \\
        --headless -u 50 -r 10 -t 30s --csv loadtest/out/locust

Each simulated user is an owner (``locust-0`` … ``locust-<N-1>``, N = DUETIME_LOCUST_OWNERS,
default 20; users beyond N share). Keys are made on first use with ``duetime keys create`` against
DUETIME_DATABASE_URL, or given ready-made as DUETIME_LOCUST_KEYS (comma-separated). Jobs target a
Redis stream (``duetime-locust``), so nothing leaves the machine when they come due; the server
needs DUETIME_REDIS_URL. ``--csv`` writes the summary that docs/performance.md quotes.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from locust import HttpUser, between, task

DUE_AT_ROUND_MINUTE = float(os.environ.get("DUETIME_LOCUST_ROUND_SHARE", "0.3"))
OWNERS = int(os.environ.get("DUETIME_LOCUST_OWNERS", "20"))
TOPIC = os.environ.get("DUETIME_LOCUST_TOPIC", "duetime-locust")

_keys: dict[str, str] = {}
_keys_lock = threading.Lock()
_user_numbers = itertools.count()


def _preset_keys() -> list[str]:
    raw = os.environ.get("DUETIME_LOCUST_KEYS", "")
    return [k.strip() for k in raw.split(",") if k.strip()]


def api_key_for(owner: str, index: int) -> str:
    """A key for ``owner``: a preset one, else one made with the CLI (once per owner)."""
    preset = _preset_keys()
    if preset:
        return preset[index % len(preset)]
    with _keys_lock:
        if owner not in _keys:
            out = subprocess.run(
                [sys.executable, "-m", "duetime", "keys", "create", "--owner", owner, "--json"],
                check=True,
                capture_output=True,
                text=True,
                timeout=60,
            )
            _keys[owner] = json.loads(out.stdout.strip().splitlines()[-1])["api_key"]
        return _keys[owner]


def next_round_minute(now: datetime) -> datetime:
    return now.replace(second=0, microsecond=0) + timedelta(minutes=1)


def job_body(now: datetime, rng: random.Random) -> dict[str, Any]:
    """A one-off job: a share due at the next round minute (the burst), the rest within a day."""
    if rng.random() < DUE_AT_ROUND_MINUTE:
        at = next_round_minute(now)
    else:
        at = (now + timedelta(seconds=rng.randint(120, 86400))).replace(microsecond=0)
    return {
        "name": "locust",
        "target": {"type": "queue", "broker": "redis", "topic": TOPIC},
        "payload": {"n": rng.randint(0, 1_000_000)},
        "schedule": {"run_at": at.strftime("%Y-%m-%dT%H:%M:%SZ")},
        "retry": {"max_attempts": 3},
    }


class Owner(HttpUser):
    """One owner of jobs, mostly registering, sometimes looking at what it has."""

    wait_time = between(0.0, 0.05)

    def on_start(self) -> None:
        n = next(_user_numbers)
        self.owner = f"locust-{n % OWNERS}"
        self.rng = random.Random(n)
        key = api_key_for(self.owner, n)
        self.client.headers.update({"Authorization": f"Bearer {key}"})
        self.job_ids: list[str] = []

    @task(6)
    def register(self) -> None:
        with self.client.post(
            "/v1/jobs", json=job_body(datetime.now(UTC), self.rng), name="POST /v1/jobs", catch_response=True
        ) as resp:
            if resp.status_code != 201:
                resp.failure(f"{resp.status_code}: {resp.text[:200]}")
                return
            self.job_ids.append(resp.json()["id"])
            if len(self.job_ids) > 1000:
                del self.job_ids[:500]

    @task(2)
    def list_jobs(self) -> None:
        self.client.get("/v1/jobs?limit=50", name="GET /v1/jobs")

    @task(2)
    def read_job(self) -> None:
        if self.job_ids:
            job_id = self.rng.choice(self.job_ids)
            self.client.get(f"/v1/jobs/{job_id}", name="GET /v1/jobs/{id}")

    @task(1)
    def read_history(self) -> None:
        if self.job_ids:
            job_id = self.rng.choice(self.job_ids)
            self.client.get(f"/v1/jobs/{job_id}/runs", name="GET /v1/jobs/{id}/runs")
