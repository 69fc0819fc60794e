"""The JSON the API answers with: jobs always redacted, times always ``format_time``.

Every job that leaves the process goes through ``job_to_json``, which asks the codec for the
redacted spec, so no handler can forget to hide a webhook's header values.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

from aiohttp import web

from duetime.api.errors import JSON_CONTENT_TYPE
from duetime.core.changes import Change
from duetime.core.codec import format_time, run_to_json, spec_to_json
from duetime.core.model import Job, Paused, Run
from duetime.storage.base import Backfill, Page
from duetime.storage.ports import TargetView


def job_to_json(job: Job) -> dict[str, Any]:
    body: dict[str, Any] = {"id": job.id, "owner": job.owner}
    body.update(spec_to_json(job.spec, redact=True))
    body["state"] = job.state.value
    body["next_run_at"] = None if job.next_run_at is None else format_time(job.next_run_at)
    body["attempt"] = job.attempt
    body["created_at"] = format_time(job.created_at)
    body["updated_at"] = format_time(job.updated_at)
    body["last_run"] = None if job.last_run is None else run_to_json(job.last_run)
    body["spec_version"] = job.spec_version
    body["paused"] = None if job.paused is None else paused_to_json(job.paused)
    return body


def paused_to_json(paused: Paused) -> dict[str, Any]:
    """The Job's ``paused`` object: when, the note, until when, and who paused it."""
    return {
        "at": None if paused.at is None else format_time(paused.at),
        "note": paused.note,
        "until": None if paused.until is None else format_time(paused.until),
        "actor": {"type": paused.actor.value, "key_id": paused.key_id},
    }


def jobs_page_to_json(page: Page[Job]) -> dict[str, Any]:
    return {"items": [job_to_json(job) for job in page.items], "next_cursor": page.next_cursor}


def runs_page_to_json(page: Page[Run]) -> dict[str, Any]:
    return {"items": [run_to_json(run) for run in page.items], "next_cursor": page.next_cursor}


def change_to_json(change: Change) -> dict[str, Any]:
    """A change record as the contract writes it (its diff holds no secret: core/changes.py)."""
    return {
        "seq": change.seq,
        "at": format_time(change.at),
        "actor": {"type": change.actor.value, "key_id": change.key_id},
        "action": change.action.value,
        "reason": change.reason,
        "spec_version": change.spec_version,
        "diff": change.diff,
    }


def changes_page_to_json(page: Page[Change]) -> dict[str, Any]:
    return {"items": [change_to_json(c) for c in page.items], "next_cursor": page.next_cursor}


def target_to_json(view: TargetView) -> dict[str, Any]:
    return {
        "host": view.host,
        "state": view.state.value,
        "concurrency_limit": view.concurrency_limit,
        "backoff_until": None if view.backoff_until is None else format_time(view.backoff_until),
        "last_5m": {"calls": view.calls_5m, "timeouts": view.timeouts_5m, "errors": view.errors_5m},
    }


def targets_page_to_json(page: Page[TargetView]) -> dict[str, Any]:
    return {"items": [target_to_json(view) for view in page.items], "next_cursor": page.next_cursor}


def backfill_to_json(job_id: uuid.UUID, start: datetime, end: datetime, result: Backfill) -> dict[str, Any]:
    return {
        "job_id": str(job_id),
        "from": format_time(start),
        "to": format_time(end),
        "queued": result.queued,
        "first": format_time(result.first) if result.first else None,
        "last": format_time(result.last) if result.last else None,
    }


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON. Input was checked for lone surrogates at the edge, so encoding cannot fail."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def json_response(value: Any, *, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=dumps(value), content_type=JSON_CONTENT_TYPE, headers=headers)
