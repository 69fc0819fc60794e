"""The /v1 handlers: read the request, call the registry once, render the answer.

Handlers stay thin and raise ``core.errors`` for every failure; ``api.app``'s middleware turns
those into HTTP answers. Auth has already happened when a handler runs: the owner is in the
request under ``OWNER``. Every lookup is scoped by that owner, so another owner's job is simply
``NotFound``, indistinguishable from a job that never existed.
"""

from __future__ import annotations

import re
import time
import uuid
from datetime import datetime
from typing import Any, Final

from aiohttp import web

from duetime.api.body import parse_json, require_json_content_type
from duetime.api.cursors import SEALED_SHAPE, refused
from duetime.api.limits import JOBS_PER_TOKEN, OCCURRENCES_PER_TOKEN, JobBytesCap, JobCap, cost_of
from duetime.api.paging import PageCursors
from duetime.api.render import (
    backfill_to_json,
    changes_page_to_json,
    job_to_json,
    jobs_page_to_json,
    json_response,
    runs_page_to_json,
)
from duetime.api.server import sent_header
from duetime.core.changes import REASON_HEADER, ChangeBy, parse_reason
from duetime.core.codec import REDACTED, format_time, run_to_json, spec_to_json
from duetime.core.errors import Conflict, InvalidRequest, MalformedRequest, NotFound, TopicNotAllowed
from duetime.core.ids import parse_job_id
from duetime.core.labels import check_name, check_name_prefix, parse_bulk_request, parse_label_query
from duetime.core.model import (
    PLAIN_PAUSE,
    IntervalSchedule,
    Job,
    JobSpec,
    JobState,
    Outcome,
    QueueTarget,
    Target,
    WebhookTarget,
)
from duetime.core.ssrf import AddressPolicy, check_webhook_url
from duetime.core.topics import TOPIC_FIELD, TopicPolicy
from duetime.core.validation import (
    PAUSE_FIELDS,
    SpecLimits,
    canonical_body_hash,
    merge_patch,
    parse_backfill_range,
    parse_idempotency_key,
    parse_job_spec,
    parse_pause_fields,
    parse_pause_request,
    parse_replay_request,
    parse_time,
)
from duetime.core.weburl import same_origin
from duetime.storage.base import BulkAction, IdempotencyRequest, NameHolderChanged, Registry
from duetime.storage.dbclock import DB_CLOCK

OWNER: Final = web.RequestKey("owner", str)
# The id of the API key that made the request (its prefix): change records name it.
KEY_ID: Final = web.RequestKey("key_id", str)

DEFAULT_LIMIT: Final = 100
MAX_LIMIT: Final = 1000
_DIGITS: Final = re.compile(r"[0-9]{1,7}")
_STATES: Final = {s.value: s for s in JobState}
_PASSED_URLS_TTL_S: Final = 10.0
_PASSED_URLS_MAX: Final = 10_000
# PUT by name: how often to read the name's holder again when a concurrent PUT or cancel changed it
# between our read and our write. Each retry means another request won that race, so a few suffice.
_APPLY_ATTEMPTS: Final = 5


def _query(request: web.Request, name: str) -> str | None:
    """A query parameter, with an empty value meaning "not given" (``?state=&limit=`` is valid)."""
    value = request.query.get(name)
    return value if value else None


def limit_of(request: web.Request) -> int:
    """``limit``: 1 to ``MAX_LIMIT``, ``DEFAULT_LIMIT`` when not given (every list of /v1)."""
    text = _query(request, "limit")
    if text is None:
        return DEFAULT_LIMIT
    if _DIGITS.fullmatch(text) is None or not 1 <= int(text) <= MAX_LIMIT:
        raise InvalidRequest(
            f"limit must be an integer from 1 to {MAX_LIMIT}.", code="invalid_limit", field="limit"
        )
    return int(text)


def cursor_of(request: web.Request) -> str | None:
    """``cursor`` as sent, when it has the shape of a sealed cursor (base64url of a bounded
    length); ``PageCursors.open`` judges the rest, and the store's rules what is inside."""
    text = _query(request, "cursor")
    if text is not None and SEALED_SHAPE.fullmatch(text) is None:
        raise refused()
    return text


def _state(request: web.Request) -> JobState | None:
    text = _query(request, "state")
    if text is None:
        return None
    state = _STATES.get(text)
    if state is None:
        raise InvalidRequest(
            f"state must be one of {', '.join(_STATES)}.", code="invalid_state", field="state"
        )
    return state


def job_id_of(request: web.Request) -> uuid.UUID:
    """A malformed id answers 404 like a missing job: ids are opaque to clients."""
    text = request.match_info["job_id"]
    job_id = parse_job_id(text)
    if job_id is None:
        # Worded as storage words a missing job, so the two answers cannot be told apart.
        shown = text if len(text) <= 64 else text[:64] + "…"
        raise NotFound(f"no job {shown}", ident=shown)
    return job_id


def name_of(request: web.Request, *, for_write: bool) -> str:
    """The ``{name}`` of a by-name URL. A name no job can have is a 404 to a read (nothing has it)
    and a 422 to a PUT (it cannot be created)."""
    text = request.match_info["name"]
    try:
        return check_name(text)
    except InvalidRequest:
        if for_write:
            raise
        shown = text if len(text) <= 64 else text[:64] + "…"
        raise NotFound(f"no job named {shown}", ident=shown) from None


def change_by(request: web.Request) -> ChangeBy:
    """Who asks for a change, for its record: the request's key, and its ``Duetime-Reason``
    (422 ``invalid_reason`` before anything is changed when the reason is not acceptable)."""
    return ChangeBy(key_id=request.get(KEY_ID), reason=parse_reason(request.headers.get(REASON_HEADER)))


async def _json_body(request: web.Request) -> Any:
    require_json_content_type(request)
    return parse_json(await request.read())


def _restore_redacted_headers(merged: dict[str, Any], current: JobSpec) -> None:
    """``_restore_target_headers`` for the job's target and its ``on_failure`` target."""
    _restore_target_headers(merged, current.target, "target")
    on_failure = merged.get("on_failure")
    if isinstance(on_failure, dict) and current.on_failure is not None:
        _restore_target_headers(on_failure, current.on_failure.target, "on_failure.target")


def _restore_target_headers(merged: dict[str, Any], current_target: Target, at: str) -> None:
    """Keep a header's secret when a PATCH sends back the ``<redacted>`` placeholder we showed,
    as long as the URL keeps its origin (scheme, host, port); a move elsewhere must resend it.

    A client that GETs a job, edits its target and PATCHes it back would otherwise have to know
    every secret again. Only names the job already has (in any letter case) are restored; the
    placeholder under a new name reaches the validator, which refuses it (422 invalid_header).
    """
    if not isinstance(current_target, WebhookTarget):
        return
    target = merged.get("target")
    if not isinstance(target, dict):
        return
    headers = target.get("headers")
    if not isinstance(headers, dict):
        return
    known = {name.lower(): value for name, value in current_target.headers.items()}
    url = target.get("url")
    moved = not isinstance(url, str) or not same_origin(url, current_target.url)
    for name, value in headers.items():
        if value == REDACTED and name.lower() in known:
            if moved:
                # A stored secret was meant for one origin; following the URL elsewhere would let
                # a leaked API key redirect the job and harvest the secret.
                raise InvalidRequest(
                    f"{at}.headers.{name} is the redacted placeholder, but {at}.url now calls "
                    "another origin (scheme, host or port) than the stored one; resend the secret "
                    "values of every header when you move a webhook",
                    code="invalid_header",
                    field=f"{at}.headers.{name}",
                )
            headers[name] = known[name.lower()]


def _keep_interval_start(merged: dict[str, Any], current: JobSpec) -> None:
    """An ``every`` schedule sent to PUT by name without ``start_at`` keeps the stored one.

    Its ``start_at`` defaults to the time of the call, so without this every repeat of the same
    PUT (a deploy script's ``jobs apply``) would move the schedule's grid and count as a change,
    never a no-op. A body that gives ``start_at`` sets it as given.
    """
    if not isinstance(current.schedule, IntervalSchedule):
        return
    schedule = merged.get("schedule")
    if isinstance(schedule, dict) and "every" in schedule and "start_at" not in schedule:
        merged["schedule"] = {**schedule, "start_at": format_time(current.schedule.start_at)}


def _judge(request: web.Request, data: object, **kwargs: Any) -> JobSpec:
    """``parse_job_spec`` with the schedule search it does counted on the request's cost, twice:
    the store searches the schedule again for the first ``next_run_at`` when it writes the row."""
    work = cost_of(request).work
    before = work.spent
    try:
        return parse_job_spec(data, budget=work, **kwargs)
    finally:
        work.spend(work.spent - before)


class JobsApi:
    """The handlers, bound to one registry, address policy and set of limits."""

    def __init__(
        self,
        registry: Registry,
        *,
        policy: AddressPolicy,
        limits: SpecLimits,
        topics: TopicPolicy | None = None,
        bulk_max: int = 10_000,
        cursors: PageCursors,
        cap: JobCap | None = None,
        byte_cap: JobBytesCap | None = None,
    ) -> None:
        self._registry = registry
        self._cursors = cursors
        self._topics = topics if topics is not None else TopicPolicy()
        self._cap = cap
        self._byte_cap = byte_cap
        self._bulk_max = bulk_max
        self._policy = policy
        self._limits = limits
        # URL → until when its last SSRF check passed. Registration bursts name one URL thousands
        # of times a second; its DNS answer is not worth asking for each. Only passes are kept,
        # and only briefly: the worker checks every address again right before each call.
        self._passed_urls: dict[str, float] = {}

    def routes(self) -> list[web.RouteDef]:
        # The by-name and bulk routes come before /v1/jobs/{job_id}/…: a name may hold "/" (so
        # by-name/foo/pause is the job named "foo/pause"), and bulk/pause has the shape of
        # {job_id}/pause.
        return [
            web.post("/v1/jobs", self.create_job, name="create_job"),
            web.get("/v1/jobs", self.list_jobs, name="list_jobs", allow_head=False),
            web.put("/v1/jobs/by-name/{name:.+}", self.put_job_by_name, name="put_job_by_name"),
            web.get(
                "/v1/jobs/by-name/{name:.+}", self.get_job_by_name, name="get_job_by_name", allow_head=False
            ),
            web.post("/v1/jobs/bulk/pause", self.bulk_pause, name="bulk_pause"),
            web.post("/v1/jobs/bulk/resume", self.bulk_resume, name="bulk_resume"),
            web.post("/v1/jobs/bulk/cancel", self.bulk_cancel, name="bulk_cancel"),
            web.get("/v1/jobs/{job_id}", self.get_job, name="get_job", allow_head=False),
            web.patch("/v1/jobs/{job_id}", self.update_job, name="update_job"),
            web.delete("/v1/jobs/{job_id}", self.cancel_job, name="cancel_job"),
            web.post("/v1/jobs/{job_id}/pause", self.pause_job, name="pause_job"),
            web.post("/v1/jobs/{job_id}/resume", self.resume_job, name="resume_job"),
            web.post("/v1/jobs/{job_id}/trigger", self.trigger_job, name="trigger_job"),
            web.post("/v1/jobs/{job_id}/backfill", self.backfill_job, name="backfill_job"),
            web.post("/v1/jobs/{job_id}/replay", self.replay_job, name="replay_job"),
            web.get("/v1/jobs/{job_id}/runs", self.list_runs, name="list_runs", allow_head=False),
            web.get("/v1/jobs/{job_id}/changes", self.list_changes, name="list_changes", allow_head=False),
            web.get("/v1/runs", self.list_owner_runs, name="list_owner_runs", allow_head=False),
        ]

    async def _check_target(self, spec: JobSpec, owner: str, *, main: bool = True) -> None:
        """The targets' registration checks (topic policy, SSRF): the job's own (``main``) and
        its ``on_failure`` target's, whose errors name their own path."""
        if main:
            await self._check_one_target(spec.target, owner)
        if spec.on_failure is not None:
            try:
                await self._check_one_target(spec.on_failure.target, owner)
            except InvalidRequest as exc:
                field = None if exc.field is None else f"on_failure.{exc.field}"
                message = exc.message.replace("target.", "on_failure.target.", 1)
                raise type(exc)(message, code=exc.code, field=field) from None

    async def _check_one_target(self, target: Target, owner: str) -> None:
        if isinstance(target, QueueTarget):
            reason = self._topics.refusal(target.broker, target.topic, owner)
            if reason is not None:
                raise TopicNotAllowed(self._topics.message(target.topic, reason), field=TOPIC_FIELD)
            return
        url = target.url
        now = time.monotonic()
        if self._passed_urls.get(url, 0.0) > now:
            return
        await check_webhook_url(url, self._policy)
        if len(self._passed_urls) >= _PASSED_URLS_MAX:
            self._passed_urls = {u: t for u, t in self._passed_urls.items() if t > now}
            if len(self._passed_urls) >= _PASSED_URLS_MAX:
                self._passed_urls.clear()
        self._passed_urls[url] = now + _PASSED_URLS_TTL_S

    async def create_job(self, request: web.Request) -> web.Response:
        owner = request[OWNER]
        by = change_by(request)
        raw_key = sent_header(request, "Idempotency-Key")  # as sent: the parser trims spaces
        idempotency_key = None if raw_key is None else parse_idempotency_key(raw_key)
        data = await _json_body(request)
        spec = _judge(request, data, now=DB_CLOCK.now(), limits=self._limits)
        await self._check_target(spec, owner)
        idempotency = (
            None
            if idempotency_key is None
            else IdempotencyRequest(key=idempotency_key, body_hash=canonical_body_hash(data))
        )
        job, created = await self._registry.create_job(owner, spec, idempotency=idempotency, by=by)
        location = f"/v1/jobs/{job.id}"
        return json_response(job_to_json(job), status=201 if created else 200, headers={"Location": location})

    async def get_job(self, request: web.Request) -> web.Response:
        job = await self._registry.get_job(request[OWNER], job_id_of(request))
        return json_response(job_to_json(job))

    async def list_jobs(self, request: web.Request) -> web.Response:
        owner, state, limit, sent = request[OWNER], _state(request), limit_of(request), cursor_of(request)
        labels = parse_label_query([v for v in request.query.getall("label", []) if v])
        prefix = _query(request, "name_prefix")
        name_prefix = None if prefix is None else check_name_prefix(prefix)
        page = await self._registry.list_jobs(
            owner,
            state=state,
            limit=limit,
            cursor=await self._cursors.open(owner, sent),
            labels=labels or None,
            name_prefix=name_prefix,
        )
        return json_response(jobs_page_to_json(await self._cursors.seal(owner, page)))

    async def get_job_by_name(self, request: web.Request) -> web.Response:
        job = await self._registry.get_job_by_name(request[OWNER], name_of(request, for_write=False))
        return json_response(job_to_json(job))

    async def put_job_by_name(self, request: web.Request) -> web.Response:
        """Create the named job or make it match the body (a PATCH of every field).

        The spec is built against the holder we read (its redacted header values are kept, an
        unchanged schedule is judged as of its creation); storage checks under the name's lock
        that the holder is still that job, and we read again when it is not.
        """
        owner = request[OWNER]
        by = change_by(request)
        name = name_of(request, for_write=True)
        data = await _json_body(request)
        if not isinstance(data, dict):
            raise MalformedRequest("the request body must be a JSON object (a job spec)", code="wrong_type")
        if "name" in data and data["name"] != name:
            raise InvalidRequest(
                f"the body's name ({str(data['name'])[:64]!r}) differs from the name in the URL "
                f"({name!r}); leave name out of the body or make them equal",
                code="name_mismatch",
                field="name",
            )
        body = {**data, "name": name}
        for _ in range(_APPLY_ATTEMPTS):
            try:
                current: Job | None = await self._registry.get_job_by_name(owner, name)
            except NotFound:
                current = None
            now = DB_CLOCK.now()
            if current is None:
                spec = _judge(request, body, now=now, limits=self._limits)
                await self._check_target(spec, owner)
                # A PUT that creates counts against the owner's limits as a POST does.
                if self._cap is not None:
                    await self._cap.check(owner)
                if self._byte_cap is not None:
                    await self._byte_cap.check(owner)
            else:
                merged = dict(body)
                _restore_redacted_headers(merged, current.spec)
                _keep_interval_start(merged, current.spec)
                current_json = spec_to_json(current.spec)
                spec = self._spec_keeping_schedule(request, merged, current, now)
                new_json = spec_to_json(spec)
                if (
                    new_json["target"] != current_json["target"]
                    or new_json["on_failure"] != current_json["on_failure"]
                ):
                    await self._check_target(spec, owner, main=new_json["target"] != current_json["target"])
            try:
                job, created = await self._registry.apply_job(
                    owner, spec, expected_id=None if current is None else current.id, by=by
                )
            except NameHolderChanged:
                continue
            if created:
                if self._cap is not None:
                    self._cap.created(owner)
                if self._byte_cap is not None:
                    self._byte_cap.created(owner, len(await request.read()))
                return json_response(job_to_json(job), status=201, headers={"Location": f"/v1/jobs/{job.id}"})
            return json_response(job_to_json(job))
        raise Conflict(
            f"the job named {name!r} kept changing under concurrent requests; try again",
            code="name_contended",
        )

    def _spec_keeping_schedule(
        self, request: web.Request, body: dict[str, Any], current: Job, now: datetime
    ) -> JobSpec:
        """As PATCH does: a schedule the job already has is judged as of the job's creation (a
        bounded cron that has ended is not refused as "never fires" on a PUT that renames it)."""
        try:
            kept = _judge(
                request, body, now=current.created_at, limits=self._limits, keep_name=current.spec.name
            )
        except InvalidRequest:
            kept = None
        if kept is not None and kept.schedule == current.spec.schedule:
            return kept
        return _judge(request, body, now=now, limits=self._limits, keep_name=current.spec.name)

    async def _bulk(self, request: web.Request, action: BulkAction) -> web.Response:
        by = change_by(request)
        data = await _json_body(request)
        # A bulk pause says what a single one may (note, until) for every job it pauses.
        also = PAUSE_FIELDS if action == "pause" else ()
        labels, state = parse_bulk_request(data, also=also)
        pause = PLAIN_PAUSE
        if also:
            pause = parse_pause_fields(data, now=DB_CLOCK.now(), limits=self._limits)
        result = await self._registry.bulk_action(
            request[OWNER], action, labels, state=state, max_jobs=self._bulk_max, by=by, pause=pause
        )
        cost_of(request).tokens += result.matched / JOBS_PER_TOKEN
        return json_response({"matched": result.matched, "changed": result.changed, "more": result.more})

    async def bulk_pause(self, request: web.Request) -> web.Response:
        return await self._bulk(request, "pause")

    async def bulk_resume(self, request: web.Request) -> web.Response:
        return await self._bulk(request, "resume")

    async def bulk_cancel(self, request: web.Request) -> web.Response:
        return await self._bulk(request, "cancel")

    async def update_job(self, request: web.Request) -> web.Response:
        owner = request[OWNER]
        job_id = job_id_of(request)
        by = change_by(request)
        patch = await _json_body(request)
        current = await self._registry.get_job(owner, job_id)
        merged = merge_patch(spec_to_json(current.spec), patch)
        _restore_redacted_headers(merged, current.spec)
        # Time-dependent checks (an end_at already passed, the run_at horizon) judge a schedule
        # when it is set: an unchanged one is judged as of the job's creation, so renaming a job
        # whose bounded cron has just ended is not refused as "never fires".
        schedule_changed = isinstance(patch, dict) and "schedule" in patch
        anchor = DB_CLOCK.now() if schedule_changed else current.created_at
        spec = _judge(request, merged, now=anchor, limits=self._limits, keep_name=current.spec.name)
        if isinstance(patch, dict) and ("target" in patch or "on_failure" in patch):
            await self._check_target(spec, owner, main="target" in patch)
        job = await self._registry.update_job(owner, job_id, spec, by=by)
        return json_response(job_to_json(job))

    async def cancel_job(self, request: web.Request) -> web.Response:
        job_id, by = job_id_of(request), change_by(request)
        job = await self._registry.cancel_job(request[OWNER], job_id, by=by)
        return json_response(job_to_json(job))

    async def pause_job(self, request: web.Request) -> web.Response:
        """Without a body: paused until a resume. With ``{"note", "until"}``: the note is shown
        while paused, and Duetime resumes the job itself at ``until``."""
        job_id, by = job_id_of(request), change_by(request)
        body = await request.read()
        pause = PLAIN_PAUSE
        if body.strip():
            require_json_content_type(request)
            pause = parse_pause_request(parse_json(body), now=DB_CLOCK.now(), limits=self._limits)
        job = await self._registry.pause_job(request[OWNER], job_id, by=by, pause=pause)
        return json_response(job_to_json(job))

    async def resume_job(self, request: web.Request) -> web.Response:
        job_id, by = job_id_of(request), change_by(request)
        job = await self._registry.resume_job(request[OWNER], job_id, by=by)
        return json_response(job_to_json(job))

    async def trigger_job(self, request: web.Request) -> web.Response:
        job_id, by = job_id_of(request), change_by(request)
        job = await self._registry.trigger_job(
            request[OWNER], job_id, max_pending=self._limits.max_pending_triggers, by=by
        )
        return json_response(job_to_json(job), status=202)

    async def replay_job(self, request: web.Request) -> web.Response:
        """Without a body: a dead job back to scheduled. With ``{"scheduled_for"}``: one failed
        occurrence of a recurring job runs once more, now (202)."""
        owner, job_id, by = request[OWNER], job_id_of(request), change_by(request)
        body = await request.read()
        if body.strip():
            require_json_content_type(request)
            scheduled_for = parse_replay_request(parse_json(body))
            job = await self._registry.replay_occurrence(
                owner, job_id, scheduled_for, max_pending=self._limits.max_pending_triggers, by=by
            )
            return json_response(job_to_json(job), status=202)
        job = await self._registry.replay_job(owner, job_id, by=by)
        return json_response(job_to_json(job))

    async def backfill_job(self, request: web.Request) -> web.Response:
        owner, job_id, by = request[OWNER], job_id_of(request), change_by(request)
        start, end = parse_backfill_range(await _json_body(request))
        result = await self._registry.backfill_job(
            owner,
            job_id,
            start,
            end,
            max_occurrences=self._limits.backfill_max_occurrences,
            pace_per_s=self._limits.backfill_pace_per_s,
            by=by,
        )
        cost_of(request).tokens += result.queued / OCCURRENCES_PER_TOKEN
        return json_response(backfill_to_json(job_id, start, end, result), status=202)

    async def list_owner_runs(self, request: web.Request) -> web.Response:
        """The owner's runs across all jobs, newest first: one view of what failed."""
        outcome = request.query.get("outcome") or None
        if outcome is not None and outcome not in {o.value for o in Outcome}:
            raise InvalidRequest(
                f"outcome must be one of {', '.join(o.value for o in Outcome)}",
                code="invalid_value",
                field="outcome",
            )
        raw_since = request.query.get("since") or None
        since = None if raw_since is None else parse_time(raw_since, "since")
        owner, limit = request[OWNER], limit_of(request)
        cursor = await self._cursors.open(owner, cursor_of(request))
        page = await self._registry.list_owner_runs(
            owner, outcome=outcome, since=since, limit=limit, cursor=cursor
        )
        page = await self._cursors.seal(owner, page)
        return json_response(
            {
                "items": [{**run_to_json(r.run), "job_id": str(r.job_id)} for r in page.items],
                "next_cursor": page.next_cursor,
            }
        )

    async def list_runs(self, request: web.Request) -> web.Response:
        owner, job_id = request[OWNER], job_id_of(request)
        limit = limit_of(request)
        cursor = await self._cursors.open(owner, cursor_of(request))
        page = await self._registry.list_runs(owner, job_id, limit=limit, cursor=cursor)
        return json_response(runs_page_to_json(await self._cursors.seal(owner, page)))

    async def list_changes(self, request: web.Request) -> web.Response:
        """The job's change history, newest first: who changed what, when and why."""
        owner, job_id = request[OWNER], job_id_of(request)
        limit = limit_of(request)
        cursor = await self._cursors.open(owner, cursor_of(request))
        page = await self._registry.list_changes(owner, job_id, limit=limit, cursor=cursor)
        return json_response(changes_page_to_json(await self._cursors.seal(owner, page)))
