"""``POST /v1/schedules/preview`` and ``GET /v1/jobs/{id}/preview``: the HTTP side of
``core.preview``.

The preview's work grows with what the client sends (a sparse cron walks years per occurrence, a
far ``from`` probes years of a zone's offsets, excluded ranges are jumped one by one), so it is
bounded three ways: ``core.preview`` caps the search steps of one answer (a truncated answer says
so); the work runs in the API's worker processes (``api.cpupool``), never on the event loop that
serves every other owner and fires their jobs, with a bounded queue (429 when full); and its
measured cost is charged to the owner's rate limit (``api.limits``).
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timedelta
from typing import Any, Final

from aiohttp import web

from duetime.api.body import parse_json, require_json_content_type
from duetime.api.cpupool import CpuPool
from duetime.api.handlers import OWNER, job_id_of
from duetime.api.limits import cost_of
from duetime.api.render import json_response
from duetime.core.errors import InvalidRequest
from duetime.core.jitter import spread
from duetime.core.model import Job, JobState
from duetime.core.preview import (
    Preview,
    PreviewAnswer,
    PreviewedJob,
    PreviewJob,
    SchedulePreviewRequest,
    preview_to_json,
    run_preview,
    run_schedule_preview,
)
from duetime.core.validation import SpecLimits, parse_time
from duetime.storage.base import Registry
from duetime.storage.dbclock import DB_CLOCK

DEFAULT_COUNT: Final = 10
MAX_COUNT: Final = 100
# Only these states can still fire; a cancelled, completed or dead job previews no occurrence.
_LIVE_STATES: Final = frozenset({JobState.SCHEDULED, JobState.PAUSED})
_DIGITS: Final = re.compile(r"[0-9]{1,4}")
_MILLISECOND: Final = timedelta(milliseconds=1)


def _count_query(request: web.Request) -> int:
    text = request.query.get("count") or None
    if text is None:
        return DEFAULT_COUNT
    if _DIGITS.fullmatch(text) is None or not 1 <= int(text) <= MAX_COUNT:
        raise InvalidRequest(
            f"count must be an integer from 1 to {MAX_COUNT}.", code="invalid_count", field="count"
        )
    return int(text)


class PreviewApi:
    """``POST /v1/schedules/preview`` and ``GET /v1/jobs/{id}/preview``."""

    def __init__(self, registry: Registry, *, limits: SpecLimits, pool: CpuPool) -> None:
        self._registry = registry
        self._limits = limits
        self._pool = pool

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/schedules/preview", self.preview_schedule, name="preview_schedule"),
            web.get("/v1/jobs/{job_id}/preview", self.preview_job, name="preview_job", allow_head=False),
        ]

    def _charged(self, request: web.Request, answer: PreviewAnswer) -> dict[str, Any]:
        """The answer's body, its cost now on the request's account; a refusal is raised."""
        cost_of(request).work.spend(answer.steps)
        if answer.error is not None:
            raise answer.error
        assert answer.body is not None
        return answer.body

    async def preview_schedule(self, request: web.Request) -> web.Response:
        require_json_content_type(request)
        work = SchedulePreviewRequest(
            data=parse_json(await request.read()),
            now=DB_CLOCK.now(),
            limits=self._limits,
            max_count=MAX_COUNT,
            default_count=DEFAULT_COUNT,
        )
        answer = await self._pool.run(request[OWNER], run_schedule_preview, work)
        return json_response(self._charged(request, answer))

    async def preview_job(self, request: web.Request) -> web.Response:
        job_id = job_id_of(request)
        count = _count_query(request)
        raw_from = request.query.get("from") or None
        start = DB_CLOCK.now() if raw_from is None else parse_time(raw_from, "from")
        job = await self._registry.get_job(request[OWNER], job_id)
        offset = spread(job_id, job.spec)
        head = {"job_id": job.id, "state": job.state.value, "spread_ms": offset // _MILLISECOND}
        if job.state not in _LIVE_STATES:
            return json_response({**head, **_nothing(job, job_id, start)})
        work = PreviewJob(job.spec.schedule, start, count, PreviewedJob(job_id, job.spec))
        answer = await self._pool.run(request[OWNER], run_preview, work)
        return json_response({**head, **self._charged(request, answer)})


def _nothing(job: Job, job_id: uuid.UUID, start: datetime) -> dict[str, Any]:
    """A job that can no longer fire previews no occurrence: no work to send anywhere."""
    schedule = job.spec.schedule
    preview = Preview(schedule=schedule, start=start, items=[], has_more=False, skipped=[], excluded=[])
    return preview_to_json(preview, PreviewedJob(job_id, job.spec))
