"""The OpenAPI 3.1 description of /v1, built in code next to the handlers it describes.

Built rather than kept as a static file so the numeric limits come from the same ``SpecLimits``
the validator enforces, and so mypy sees it. ``tests/database/test_openapi.py`` checks that it
is a valid 3.1 document and names every /v1 route of the router; the schemathesis suite checks
that live answers conform to it, status codes included.
"""

from __future__ import annotations

from typing import Any, Final

from duetime._version import __version__
from duetime.core.changes import REASON_HEADER, REASON_MAX, ActorType, ChangeAction
from duetime.core.labels import LABEL_KEY_MAX, LABEL_KEY_PATTERN, LABEL_VALUE_MAX, LABELS_MAX, NAME_PATTERN
from duetime.core.validation import PAUSE_NOTE_MAX, SpecLimits

JsonObject = dict[str, Any]

_REF: Final = "#/components/schemas/"
_TIME: Final = {"type": "string", "format": "date-time"}
_OPT_TIME: Final = {"type": ["string", "null"], "format": "date-time"}
_LOCAL_DATE: Final = {"type": "string", "format": "date", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}
_EXCLUDE: Final = {
    "type": ["array", "null"],
    "maxItems": 1000,
    "default": [],
    "description": "Local dates (`YYYY-MM-DD`) or inclusive ranges on the schedule's wall clock (its "
    "`timezone`) on which no occurrence is due.",
    "items": {
        "oneOf": [
            _LOCAL_DATE,
            {
                "type": "object",
                "required": ["from", "to"],
                "additionalProperties": False,
                "properties": {"from": _LOCAL_DATE, "to": _LOCAL_DATE},
            },
        ]
    },
}


def _ref(name: str) -> JsonObject:
    return {"$ref": _REF + name}


def _error(description: str) -> JsonObject:
    return {"description": description, "content": {"application/json": {"schema": _ref("Error")}}}


def _json(description: str, schema: JsonObject, headers: JsonObject | None = None) -> JsonObject:
    answer: JsonObject = {"description": description, "content": {"application/json": {"schema": schema}}}
    if headers:
        answer["headers"] = headers
    return answer


_E400: Final = _error(
    "Malformed JSON (syntax, duplicate keys, NaN, invalid UTF-8) or a value of the wrong type."
)
_E401: Final = {
    **_error("No API key, or an unknown or revoked one."),
    "headers": {"WWW-Authenticate": {"schema": {"type": "string"}, "description": "Always `Bearer`."}},
}
_E404: Final = _error("No such job for this owner (another owner's job answers exactly like a missing one).")
_E409: Final = _error("The job's state does not allow this call.")
_E413: Final = _error("The request body is larger than 256 KiB.")
_E415: Final = _error("The body is not sent as `application/json`.")
_E422: Final = _error("Valid JSON with values that cannot be accepted; `field` names the culprit.")
_E503: Final = {
    **_error("The database cannot be reached; nothing was changed. Retry after a pause."),
    "headers": {"Retry-After": {"schema": {"type": "string"}}},
}
_E429: Final = {
    **_error(
        "This owner made more requests than the server's per-owner rate allows (`rate_limited`, "
        "DUETIME_API_OWNER_RATE; a request whose work grows with its input counts by its cost), or "
        "a schedule preview found the preview workers' queue full (`server_busy`) or this owner "
        "with its share of it in use (`rate_limited`); nothing was done. Retry after `Retry-After` "
        "seconds."
    ),
    "headers": {
        "Retry-After": {"schema": {"type": "string"}, "description": "Seconds to wait before retrying."}
    },
}
_E500: Final = _error(
    "A bug of ours (`internal_error`); the body's `request_id` (also in `X-Request-Id`) finds its log lines."
)

# Statuses every /v1 operation can answer, whatever it does: authentication (401) and the owner's
# rate limit (429) run before any handler, the database behind both can be unreachable (503), and
# a bug is a 500. Added to each operation by ``_with_common_statuses`` so no operation can lack them.
_COMMON_STATUSES: Final[dict[str, JsonObject]] = {"401": _E401, "429": _E429, "500": _E500, "503": _E503}
# Statuses every operation that takes a body can answer, before its handler reads the body.
_BODY_STATUSES: Final[dict[str, JsonObject]] = {"400": _E400, "413": _E413, "415": _E415, "422": _E422}


def _with_common_statuses(paths: JsonObject) -> JsonObject:
    """Every /v1 operation with the statuses any of them can answer (its own kept as they are)."""
    out: JsonObject = {}
    for path, item in paths.items():
        out[path] = {}
        for method, operation in item.items():
            extra = dict(_COMMON_STATUSES)
            if "requestBody" in operation:
                extra.update(_BODY_STATUSES)
            responses = {**extra, **operation["responses"]}
            out[path][method] = {**operation, "responses": dict(sorted(responses.items()))}
    return out


_NAME_PARAM: Final = {
    "name": "name",
    "in": "path",
    "required": True,
    "description": "The job's name; it may contain `/` (sent as is or as `%2F`).",
    "schema": {"type": "string", "pattern": NAME_PATTERN, "maxLength": 200},
}
_LABELS: Final = {
    "type": "object",
    "maxProperties": LABELS_MAX,
    "propertyNames": {"pattern": LABEL_KEY_PATTERN, "maxLength": LABEL_KEY_MAX},
    "additionalProperties": {"type": "string", "maxLength": LABEL_VALUE_MAX},
}

_JOB_ID_PARAM: Final = {
    "name": "job_id",
    "in": "path",
    "required": True,
    "description": "The job's id (a UUID). Any other string answers 404.",
    "schema": {"type": "string"},
}


def _page_params() -> list[JsonObject]:
    return [
        {
            "name": "limit",
            "in": "query",
            "required": False,
            "description": "Page size, 1 to 1000 (default 100). An empty value means the default.",
            "schema": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100},
        },
        {
            "name": "cursor",
            "in": "query",
            "required": False,
            "description": "`next_cursor` from the previous page, passed back unchanged by the same "
            "owner. Cursors are opaque and bound to the owner they were issued to; any other "
            "(another owner's, changed, or from before an upgrade) answers 422 `invalid_cursor`.",
            "schema": {"type": "string"},
        },
    ]


def _schemas(limits: SpecLimits) -> JsonObject:
    header_map = {
        "type": "object",
        "maxProperties": limits.headers_max_count,
        "additionalProperties": {"type": "string", "maxLength": limits.header_value_max},
    }
    timeout_low, timeout_high = limits.timeout_s_range
    attempts_low, attempts_high = limits.max_attempts_range
    grace_low, grace_high = limits.misfire_grace_s_range
    jitter_low, jitter_high = limits.jitter_s_range
    spread_low, spread_high = limits.spread_s_range
    rate_low, rate_high = limits.flow_rate_range
    parallelism_low, parallelism_high = limits.flow_parallelism_range
    flow: JsonObject = {
        "type": "object",
        "required": ["key", "rate_per_s", "parallelism"],
        "additionalProperties": False,
        "description": "Flow control: all of the owner's jobs whose target names the same `key` share "
        "these limits across the whole cluster (within 10 %). Calls over them wait: they are not "
        "failed, use no attempt, and the wait shows in `lateness_ms`. Two owners' keys never mix. "
        'See docs/targets.md, "Flow control".',
        "properties": {
            "key": {
                "type": "string",
                "minLength": 1,
                "maxLength": limits.flow_key_max,
                "description": "Any printable text (no control or invisible formatting characters).",
            },
            "rate_per_s": {
                "type": "number",
                "minimum": rate_low,
                "maximum": rate_high,
                "description": "Calls started per second, for all the key's jobs together.",
            },
            "parallelism": {
                "type": "integer",
                "minimum": parallelism_low,
                "maximum": parallelism_high,
                "description": "Calls in flight at once, for all the key's jobs together.",
            },
        },
    }
    flow_in: JsonObject = {
        "oneOf": [{"type": "null"}, _ref("Flow")],
        "default": None,
        "description": "Optional flow control; `null` or left out: none.",
    }
    webhook_in: JsonObject = {
        "type": "object",
        "required": ["type", "url"],
        "additionalProperties": False,
        "properties": {
            "type": {"const": "webhook"},
            "url": {
                "type": "string",
                "maxLength": limits.url_max,
                "description": "http(s) URL; must resolve to a public address.",
            },
            "method": {"enum": ["POST", "PUT"], "default": "POST"},
            "headers": {**header_map, "description": "Sent with every call; shown as `<redacted>`."},
            "timeout_s": {"type": "integer", "minimum": timeout_low, "maximum": timeout_high, "default": 30},
            "flow": flow_in,
        },
    }
    queue_in: JsonObject = {
        "type": "object",
        "required": ["type", "broker", "topic"],
        "additionalProperties": False,
        "properties": {
            "type": {"const": "queue"},
            "broker": {"enum": ["nats", "redis"]},
            "topic": {"type": "string", "minLength": 1, "maxLength": limits.topic_max},
            "flow": flow_in,
        },
    }
    one_off: JsonObject = {
        "type": "object",
        "required": ["run_at"],
        "additionalProperties": False,
        "properties": {"run_at": {**_TIME, "description": "RFC 3339 with an offset; the past runs at once."}},
    }
    cron_in: JsonObject = {
        "type": "object",
        "required": ["cron"],
        "additionalProperties": False,
        "properties": {
            "cron": {
                "type": "string",
                "description": "5 fields, 6 with leading seconds, or @yearly/@annually/@monthly/"
                "@weekly/@daily/@midnight/@hourly. Day of month also takes `L` (the last day), `LW` "
                "(the last weekday) and `15W` (the weekday nearest the 15th, within the month); day of "
                "week `5L` (the last Friday) and `1#3` (the third Monday), with 0 or 7 = Sunday. "
                "See docs/scheduling.md.",
            },
            "timezone": {"type": "string", "default": "UTC", "description": "An IANA zone id."},
            "start_at": _OPT_TIME,
            "end_at": _OPT_TIME,
            "dst_gap": {"enum": ["shift", "skip"], "default": "shift"},
            "dst_overlap": {"enum": ["first", "both"], "default": "first"},
            "exclude": _EXCLUDE,
        },
    }
    every_in: JsonObject = {
        "type": "object",
        "required": ["every"],
        "additionalProperties": False,
        "properties": {
            "every": {
                "type": "string",
                "pattern": "^([0-9]+d)?([0-9]+h)?([0-9]+m)?([0-9]+s)?$",
                "description": "Integer parts `Nd`, `Nh`, `Nm`, `Ns` in that order (`90m`, `1h30m`, "
                "`7d`), 1 s to 366 days. Occurrences are `start_at + k × every` in exact elapsed time: "
                "daylight saving does not move them.",
            },
            "start_at": {
                **_OPT_TIME,
                "description": "The first occurrence; default: the creation time rounded down to the "
                "second (the job then runs at once).",
            },
            "end_at": _OPT_TIME,
            "timezone": {
                "type": "string",
                "default": "UTC",
                "description": "An IANA zone id: the wall clock `exclude` dates are read on.",
            },
            "exclude": _EXCLUDE,
        },
    }
    retry_in: JsonObject = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "max_attempts": {
                "type": "integer",
                "minimum": attempts_low,
                "maximum": attempts_high,
                "default": 5,
            },
            "backoff_initial_s": {"type": "number", "exclusiveMinimum": 0, "default": 1},
            "backoff_max_s": {"type": "number", "exclusiveMinimum": 0, "default": 600},
            "backoff_multiplier": {"type": "number", "exclusiveMinimum": 0, "default": 2.0},
            "max_duration_s": {
                "type": ["integer", "null"],
                "minimum": 1,
                "maximum": 2592000,
                "default": None,
                "description": "No attempt starts later than this after the occurrence was due; the "
                "occurrence then fails with error `retry window exceeded`. A 429 or 503 answer's "
                "`Retry-After` delays the next attempt to at least that, at most `backoff_max_s`.",
            },
        },
    }
    spec_properties: JsonObject = {
        "name": {
            "type": ["string", "null"],
            "maxLength": limits.name_max,
            "pattern": NAME_PATTERN,
            "description": "Unique per owner among jobs that are not cancelled (409 `name_taken`). "
            "A new or changed name may not be `.` or `..` nor hold a `/`-separated `.` or `..` "
            "segment (422 `invalid_name`).",
        },
        "labels": {
            **_LABELS,
            "default": {},
            "description": "Tags to select jobs by (`?label=` lists, bulk actions); a PATCH replaces "
            "the whole object.",
        },
        "target": {"oneOf": [_ref("WebhookTargetInput"), _ref("QueueTargetInput")]},
        "payload": {"description": f"Any JSON, at most {limits.payload_max_bytes} bytes encoded."},
        "schedule": {
            "oneOf": [_ref("OneOffSchedule"), _ref("CronScheduleInput"), _ref("EveryScheduleInput")]
        },
        "retry": _ref("RetryInput"),
        "misfire": {"enum": ["run_once", "run_all", "skip"], "default": "run_once"},
        "misfire_grace_s": {"type": "integer", "minimum": grace_low, "maximum": grace_high, "default": 60},
        "jitter_s": {
            "type": "integer",
            "minimum": jitter_low,
            "maximum": jitter_high,
            "default": 0,
            "description": "A start delay in [0, jitter_s] seconds, a different one for every "
            "occurrence (a hash of the job id and the occurrence).",
        },
        "spread_s": {
            "type": "integer",
            "minimum": spread_low,
            "maximum": spread_high,
            "default": 0,
            "description": "Stable spread: every occurrence is due at its nominal time plus one "
            "fixed offset in [0, spread_s) seconds derived from the job's id, the same every time. "
            "`Duetime-Scheduled-For` stays the nominal time; `next_run_at`, the preview's `due_at` "
            'and `lateness_ms` include the offset. See docs/scheduling.md, "Spread and jitter".',
        },
        "overlap": {
            "enum": ["allow", "skip", "buffer_one"],
            "default": "allow",
            "description": "A recurring job's occurrence that comes due while its previous run is "
            "still in flight: `allow` starts it on time beside the other, `skip` records it "
            "`skipped`, `buffer_one` runs one such occurrence right after the current run ends "
            "and skips the rest. Ignored for one-off jobs.",
        },
        "on_failure": {
            "oneOf": [{"type": "null"}, _ref("OnFailureInput")],
            "default": None,
            "description": "Where failure events go (`job.failing`, `job.paused`, "
            "`job.recovered`), signed like a run; see docs/targets.md for the event body.",
        },
        "pause_after_failures": {
            "type": ["integer", "null"],
            "minimum": 1,
            "maximum": 1000,
            "default": None,
            "description": "After this many consecutive failed occurrences the job moves to "
            "`paused`; `resume` resets the count.",
        },
    }
    on_failure_in: JsonObject = {
        "type": "object",
        "required": ["target"],
        "additionalProperties": False,
        "properties": {
            "target": {"oneOf": [_ref("WebhookTargetInput"), _ref("QueueTargetInput")]},
            "after": {
                "type": "integer",
                "minimum": 1,
                "maximum": 1000,
                "default": 1,
                "description": "`job.failing` is sent once the job has this many consecutive "
                "failed occurrences (an occurrence fails when its last attempt fails).",
            },
        },
    }
    job_spec: JsonObject = {
        "type": "object",
        "required": ["target", "schedule"],
        "additionalProperties": False,
        "properties": spec_properties,
    }
    job_patch: JsonObject = {
        "type": "object",
        "description": "A JSON merge patch (RFC 7396) of the job spec: objects merge, `null` removes "
        "a field (it returns to its default), anything else replaces. The merged spec must be valid.",
        "properties": {name: {} for name in spec_properties},
    }

    webhook_out: JsonObject = {
        "type": "object",
        "required": ["type", "url", "method", "headers", "timeout_s"],
        "additionalProperties": False,
        "properties": {
            "type": {"const": "webhook"},
            "url": {"type": "string"},
            "method": {"enum": ["POST", "PUT"]},
            "headers": {"type": "object", "additionalProperties": {"const": "<redacted>"}},
            "timeout_s": {"type": "integer"},
            "flow": {**_ref("Flow"), "description": "Shown only when the target has flow control."},
        },
    }
    queue_out: JsonObject = {
        "type": "object",
        "required": ["type", "broker", "topic"],
        "additionalProperties": False,
        "properties": {
            **queue_in["properties"],
            "flow": {**_ref("Flow"), "description": "Shown only when the target has flow control."},
        },
    }
    cron_out: JsonObject = {
        "type": "object",
        "required": ["cron", "timezone", "start_at", "end_at", "dst_gap", "dst_overlap", "exclude"],
        "additionalProperties": False,
        "properties": cron_in["properties"],
    }
    every_out: JsonObject = {
        "type": "object",
        "required": ["every", "start_at", "end_at", "timezone", "exclude"],
        "additionalProperties": False,
        "properties": every_in["properties"],
    }
    retry_out: JsonObject = {
        "type": "object",
        "required": [
            "max_attempts",
            "backoff_initial_s",
            "backoff_max_s",
            "backoff_multiplier",
            "max_duration_s",
        ],
        "additionalProperties": False,
        "properties": {
            "max_attempts": {"type": "integer"},
            "backoff_initial_s": {"type": "number"},
            "backoff_max_s": {"type": "number"},
            "backoff_multiplier": {"type": "number"},
            "max_duration_s": {"type": ["integer", "null"]},
        },
    }
    run: JsonObject = {
        "type": "object",
        "required": [
            "scheduled_for",
            "attempt",
            "started_at",
            "finished_at",
            "outcome",
            "status_code",
            "error",
            "lateness_ms",
            "spec_version",
        ],
        "additionalProperties": False,
        "properties": {
            "scheduled_for": {**_TIME, "description": "The nominal occurrence, before jitter."},
            "attempt": {"type": "integer", "minimum": 0},
            "started_at": _OPT_TIME,
            "finished_at": _OPT_TIME,
            "outcome": {"enum": ["succeeded", "failed", "timed_out", "lease_expired", "skipped"]},
            "status_code": {"type": ["integer", "null"]},
            "error": {"type": ["string", "null"]},
            "lateness_ms": {
                "type": ["integer", "null"],
                "description": "started_at − (scheduled_for + this occurrence's jitter).",
            },
            "spec_version": {
                "type": "integer",
                "minimum": 1,
                "description": "The job's spec_version this run ran under (a skipped occurrence: the "
                "one in force when it was skipped).",
            },
        },
    }
    on_failure_out: JsonObject = {
        "type": "object",
        "required": ["target", "after"],
        "additionalProperties": False,
        "properties": {
            "target": {"oneOf": [_ref("WebhookTarget"), _ref("QueueTarget")]},
            "after": {"type": "integer"},
        },
    }
    job: JsonObject = {
        "type": "object",
        "required": [
            "id",
            "owner",
            "name",
            "labels",
            "target",
            "payload",
            "schedule",
            "retry",
            "misfire",
            "misfire_grace_s",
            "jitter_s",
            "spread_s",
            "overlap",
            "on_failure",
            "pause_after_failures",
            "state",
            "next_run_at",
            "attempt",
            "created_at",
            "updated_at",
            "last_run",
            "spec_version",
            "paused",
        ],
        "additionalProperties": False,
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "owner": {"type": "string"},
            "name": {"type": ["string", "null"]},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "target": {"oneOf": [_ref("WebhookTarget"), _ref("QueueTarget")]},
            "payload": {},
            "schedule": {"oneOf": [_ref("OneOffSchedule"), _ref("CronSchedule"), _ref("EverySchedule")]},
            "retry": _ref("Retry"),
            "misfire": {"enum": ["run_once", "run_all", "skip"]},
            "misfire_grace_s": {"type": "integer"},
            "jitter_s": {"type": "integer"},
            "spread_s": {"type": "integer"},
            "overlap": {"enum": ["allow", "skip", "buffer_one"]},
            "on_failure": {"oneOf": [{"type": "null"}, _ref("OnFailure")]},
            "pause_after_failures": {"type": ["integer", "null"]},
            "state": {"enum": ["scheduled", "paused", "completed", "cancelled", "dead"]},
            "next_run_at": _OPT_TIME,
            "attempt": {"type": "integer", "minimum": 0},
            "created_at": _TIME,
            "updated_at": _TIME,
            "last_run": {"oneOf": [_ref("Run"), {"type": "null"}]},
            "spec_version": {
                "type": "integer",
                "minimum": 1,
                "description": "1 at create, one more for each change that altered the spec "
                "(GET /v1/jobs/{id}/changes lists them).",
            },
            "paused": {
                "oneOf": [{"type": "null"}, _ref("Paused")],
                "description": "While the job is paused: what its pause said; null otherwise.",
            },
        },
    }
    cursor: JsonObject = {
        "type": ["string", "null"],
        "description": "Opaque, for this owner only; null on the last page.",
    }
    backfill_in: JsonObject = {
        "type": "object",
        "required": ["from", "to"],
        "additionalProperties": False,
        "properties": {
            "from": {**_TIME, "description": "Inclusive."},
            "to": {
                **_TIME,
                "description": "Exclusive; occurrences after the request's time are not backfilled.",
            },
        },
    }
    backfill_out: JsonObject = {
        "type": "object",
        "required": ["job_id", "from", "to", "queued", "first", "last"],
        "additionalProperties": False,
        "properties": {
            "job_id": {"type": "string", "format": "uuid"},
            "from": _TIME,
            "to": _TIME,
            "queued": {"type": "integer", "minimum": 0, "maximum": limits.backfill_max_occurrences},
            "first": _OPT_TIME,
            "last": _OPT_TIME,
        },
    }
    schemas: JsonObject = {
        "JobSpec": job_spec,
        "JobPatch": job_patch,
        "WebhookTargetInput": webhook_in,
        "QueueTargetInput": queue_in,
        "OneOffSchedule": one_off,
        "CronScheduleInput": cron_in,
        "EveryScheduleInput": every_in,
        "RetryInput": retry_in,
        "OnFailureInput": on_failure_in,
        "OnFailure": on_failure_out,
        "WebhookTarget": webhook_out,
        "QueueTarget": queue_out,
        "Flow": flow,
        "CronSchedule": cron_out,
        "EverySchedule": every_out,
        "Retry": retry_out,
        "Run": run,
        "Job": job,
        "BulkRequest": {
            "type": "object",
            "required": ["labels"],
            "additionalProperties": False,
            "properties": _bulk_selector(),
        },
        "BulkResult": {
            "type": "object",
            "required": ["matched", "changed", "more"],
            "additionalProperties": False,
            "properties": {
                "matched": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "Jobs found that the action applies to.",
                },
                "changed": {"type": "integer", "minimum": 0, "description": "Jobs this call changed."},
                "more": {
                    "type": "boolean",
                    "description": "More jobs matched than one call takes; call again.",
                },
            },
        },
        "BackfillRequest": backfill_in,
        "ReplayRequest": {
            "type": "object",
            "required": ["scheduled_for"],
            "additionalProperties": False,
            "properties": {"scheduled_for": {**_TIME, "description": "The failed occurrence to run again."}},
        },
        "Backfill": backfill_out,
        "JobPage": {
            "type": "object",
            "required": ["items", "next_cursor"],
            "additionalProperties": False,
            "properties": {"items": {"type": "array", "items": _ref("Job")}, "next_cursor": cursor},
        },
        "OwnerRunPage": {
            "type": "object",
            "required": ["items", "next_cursor"],
            "additionalProperties": False,
            "properties": {
                "items": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": [*run["required"], "job_id"],
                        "additionalProperties": False,
                        "properties": {**run["properties"], "job_id": {"type": "string", "format": "uuid"}},
                    },
                },
                "next_cursor": cursor,
            },
        },
        "RunPage": {
            "type": "object",
            "required": ["items", "next_cursor"],
            "additionalProperties": False,
            "properties": {"items": {"type": "array", "items": _ref("Run")}, "next_cursor": cursor},
        },
        "Change": _change_schema(),
        "Paused": {
            "type": "object",
            "required": ["at", "note", "until", "actor"],
            "additionalProperties": False,
            "properties": {
                "at": {**_OPT_TIME, "description": "When it paused (null for a pause from before 0.3.0)."},
                "note": {"type": ["string", "null"]},
                "until": {**_OPT_TIME, "description": "When Duetime resumes it by itself; null: never."},
                "actor": {
                    "type": "object",
                    "required": ["type", "key_id"],
                    "additionalProperties": False,
                    "properties": {
                        "type": {"enum": [a.value for a in ActorType]},
                        "key_id": {"type": ["string", "null"]},
                    },
                },
            },
        },
        "PauseRequest": {
            "type": "object",
            "additionalProperties": False,
            "properties": _pause_fields(limits),
        },
        "BulkPauseRequest": {
            "type": "object",
            "required": ["labels"],
            "additionalProperties": False,
            "properties": {**_bulk_selector(), **_pause_fields(limits)},
        },
        "ChangePage": {
            "type": "object",
            "required": ["items", "next_cursor"],
            "additionalProperties": False,
            "properties": {"items": {"type": "array", "items": _ref("Change")}, "next_cursor": cursor},
        },
        "Target": _target_schema(),
        "TargetPage": {
            "type": "object",
            "required": ["items", "next_cursor"],
            "additionalProperties": False,
            "properties": {"items": {"type": "array", "items": _ref("Target")}, "next_cursor": cursor},
        },
        "Error": {
            "type": "object",
            "required": ["error"],
            "additionalProperties": False,
            "properties": {
                "error": {
                    "type": "object",
                    "required": ["code", "message"],
                    "additionalProperties": False,
                    "properties": {
                        "code": {"type": "string", "pattern": "^[a-z][a-z0-9_]*$"},
                        "message": {"type": "string"},
                        "field": {"type": "string"},
                        "request_id": {
                            "type": "string",
                            "description": "On a 5xx: the request's id, as in `X-Request-Id`.",
                        },
                    },
                }
            },
        },
    }
    schemas.update(_preview_schemas())
    return schemas


def _bulk_selector() -> JsonObject:
    return {
        "labels": {
            **_LABELS,
            "minProperties": 1,
            "description": "The jobs that carry every pair; at least one (422 `selector_required`).",
        },
        "state": {
            "enum": ["scheduled", "paused", "completed", "cancelled", "dead"],
            "description": "Only jobs in this state as well.",
        },
    }


def _pause_fields(limits: SpecLimits) -> JsonObject:
    return {
        "note": {
            "type": ["string", "null"],
            "maxLength": PAUSE_NOTE_MAX,
            "description": "Shown in the Job's `paused` while it is paused.",
        },
        "until": {
            **_OPT_TIME,
            "description": "Duetime resumes the job itself at this time (within a second or so), "
            "applying its misfire policy as a resume does, and records an `auto_resume`. In the "
            f"future and at most {limits.run_at_horizon_days} days ahead, else 422 `invalid_until`.",
        },
    }


def _change_schema() -> JsonObject:
    """One record of a job's change history (core/changes.py)."""
    return {
        "type": "object",
        "required": ["seq", "at", "actor", "action", "reason", "spec_version", "diff"],
        "additionalProperties": False,
        "properties": {
            "seq": {"type": "integer", "minimum": 1, "description": "1, 2, … per job, in order."},
            "at": _TIME,
            "actor": {
                "type": "object",
                "required": ["type", "key_id"],
                "additionalProperties": False,
                "properties": {
                    "type": {"enum": [a.value for a in ActorType]},
                    "key_id": {
                        "type": ["string", "null"],
                        "description": "The id (prefix) of the API key that made the change, as "
                        "`duetime keys list` shows it; null for Duetime's own changes.",
                    },
                },
            },
            "action": {"enum": [a.value for a in ChangeAction]},
            "reason": {
                "type": ["string", "null"],
                "description": f"The call's `{REASON_HEADER}` header; for Duetime's own changes, why.",
            },
            "spec_version": {
                "type": "integer",
                "minimum": 1,
                "description": "The job's spec_version after the change.",
            },
            "diff": {
                "type": "object",
                "description": "Every spec field the change altered, by its JSON Pointer into the spec "
                "(`/schedule/cron`; `~1` for a `/` in a key), as `{from, to}`; a field one side lacks is "
                'null there. A create lists the whole spec under `""`; pause, resume, trigger, '
                "backfill, replay and cancel list nothing. Header values read `<redacted>`.",
                "additionalProperties": {
                    "type": "object",
                    "required": ["from", "to"],
                    "additionalProperties": False,
                    "properties": {"from": {}, "to": {}},
                },
            },
        },
    }


def _target_schema() -> JsonObject:
    count: JsonObject = {"type": "integer", "minimum": 0}
    return {
        "type": "object",
        "required": ["host", "state", "concurrency_limit", "backoff_until", "last_5m"],
        "additionalProperties": False,
        "description": "One host of the owner's webhook jobs, as the live workers see it together.",
        "properties": {
            "host": {"type": "string", "description": "`host:port` (an IPv6 address in brackets)."},
            "state": {
                "enum": ["healthy", "degraded", "backing_off"],
                "description": "The worst any worker reports: `degraded`, fewer calls at once (its "
                "calls time out or are refused); `backing_off`, none until `backoff_until`, then one "
                "probe at a time. Runs held back are delayed, not failed.",
            },
            "concurrency_limit": {
                **count,
                "description": "Calls to the host at once, the sum over the workers.",
            },
            "backoff_until": {
                **_OPT_TIME,
                "description": "The latest end of a back-off among the workers backing off; null "
                "when none is.",
            },
            "last_5m": {
                "type": "object",
                "required": ["calls", "timeouts", "errors"],
                "additionalProperties": False,
                "description": "The owner's calls to the host over the last five minutes, all workers.",
                "properties": {"calls": count, "timeouts": count, "errors": count},
            },
        },
    }


def _preview_schemas() -> JsonObject:
    """Schedule preview (docs/preview.md): what a schedule or a job will fire next."""
    wall = {"type": "string", "description": "Naive wall-clock time in the zone, ISO 8601, no offset."}
    item: JsonObject = {
        "type": "object",
        "required": ["at", "local", "utc_offset", "abbreviation", "dst"],
        "additionalProperties": False,
        "properties": {
            "at": {**_TIME, "description": "The occurrence (the run's `scheduled_for`), UTC."},
            "local": wall,
            "utc_offset": {"type": "string", "description": "The zone's UTC offset then, e.g. `+02:00`."},
            "abbreviation": {"type": ["string", "null"], "description": "E.g. `CEST`, as tzdata names it."},
            "dst": {
                "enum": ["gap_shifted", "overlap_first", "overlap_second", None],
                "description": "`gap_shifted`: the wall time did not exist (spring forward) and "
                "`dst_gap: shift` moved the run to the first instant after the gap; `overlap_first` / "
                "`overlap_second`: the wall time occurs twice that day and this is its first / second "
                "pass (a second pass runs only with `dst_overlap: both`).",
            },
            "shifted_from": {**wall, "description": "For `gap_shifted`: the nominal wall time it replaces."},
            "due_at": {
                **_TIME,
                "description": "Job previews only: when the first attempt is due, the job's spread "
                "and jitter included (the `next_run_at` the job shows for that occurrence).",
            },
        },
    }
    skipped: JsonObject = {
        "type": "object",
        "required": ["at", "local_from", "local_until", "first_skipped", "reason"],
        "additionalProperties": False,
        "properties": {
            "at": {**_TIME, "description": "The spring-forward instant."},
            "local_from": {**wall, "description": "The missing wall-clock range starts here…"},
            "local_until": {**wall, "description": "…and ends here (exclusive)."},
            "first_skipped": {"type": ["string", "null"], "description": "The first wall time dropped."},
            "reason": {"const": "dst_gap_skip"},
        },
    }
    preview: JsonObject = {
        "type": "object",
        "required": [
            "timezone",
            "from",
            "items",
            "has_more",
            "truncated",
            "resume_from",
            "skipped",
            "excluded",
            "warnings",
        ],
        "additionalProperties": False,
        "properties": {
            "job_id": {"type": "string", "format": "uuid", "description": "Job previews only."},
            "state": {
                "enum": ["scheduled", "paused", "completed", "cancelled", "dead"],
                "description": "Job previews only; a cancelled, completed or dead job lists no items.",
            },
            "spread_ms": {
                "type": "integer",
                "minimum": 0,
                "description": "Job previews only: the job's fixed offset (`spread_s`) in milliseconds, "
                "added to every item's `due_at`; 0 without a spread.",
            },
            "timezone": {"type": "string"},
            "from": _TIME,
            "items": {"type": "array", "maxItems": 100, "items": _ref("PreviewItem")},
            "has_more": {"type": "boolean", "description": "Whether another occurrence follows the last."},
            "truncated": {
                "type": "boolean",
                "description": "The preview reached the server's cap on one preview's work (a cron "
                "that fires once in years, previewed over centuries) and lists fewer occurrences "
                "than asked (`has_more` is then true); a warning says so.",
            },
            "resume_from": {
                **_OPT_TIME,
                "description": "When truncated: the `from` of a next request that lists the "
                "occurrences after the last item; null otherwise.",
            },
            "skipped": {
                "type": "array",
                "items": _ref("PreviewSkipped"),
                "description": "Spring-forward gaps in the previewed window whose wall times "
                "`dst_gap: skip` drops.",
            },
            "excluded": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["at", "local", "utc_offset", "reason"],
                    "additionalProperties": False,
                    "properties": {
                        "at": {**_TIME, "description": "The occurrence `exclude` drops."},
                        "local": wall,
                        "utc_offset": {"type": "string"},
                        "reason": {"const": "excluded_date"},
                    },
                },
                "description": "Occurrences in the previewed window whose local date is excluded.",
            },
            "warnings": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Remarks on a valid schedule that may not mean what was meant, e.g. a "
                "cron step larger than its range (`56-59/4` selects minute 56 only, as in Vixie cron).",
            },
        },
    }
    request: JsonObject = {
        "type": "object",
        "required": ["schedule"],
        "additionalProperties": False,
        "properties": {
            "schedule": {
                "oneOf": [_ref("OneOffSchedule"), _ref("CronScheduleInput"), _ref("EveryScheduleInput")]
            },
            "count": {"type": "integer", "minimum": 1, "maximum": 100, "default": 10},
            "from": {**_OPT_TIME, "description": "Preview a job created at this instant (default: now)."},
        },
    }
    return {
        "PreviewRequest": request,
        "Preview": preview,
        "PreviewItem": item,
        "PreviewSkipped": skipped,
    }


def _action(op_id: str, summary: str, ok: JsonObject, *, conflict: bool) -> JsonObject:
    responses: JsonObject = {**ok, "401": _E401, "404": _E404, "503": _E503}
    if conflict:
        responses["409"] = _E409
    return {
        "operationId": op_id,
        "summary": summary,
        "parameters": [_JOB_ID_PARAM],
        "responses": dict(sorted(responses.items())),
    }


def build_openapi(limits: SpecLimits) -> JsonObject:
    job_ok = _json("The job.", _ref("Job"))
    body = {"required": True}
    spec_body = {
        **body,
        "content": {"application/json": {"schema": _ref("JobSpec")}},
    }
    patch_body = {
        **body,
        "content": {
            "application/json": {"schema": _ref("JobPatch")},
            "application/merge-patch+json": {"schema": _ref("JobPatch")},
        },
    }
    location = {"Location": {"schema": {"type": "string"}, "description": "`/v1/jobs/{id}`."}}
    paths: JsonObject = {
        "/v1/jobs": {
            "post": {
                "operationId": "create_job",
                "summary": "Register a job.",
                "parameters": [
                    {
                        "name": "Idempotency-Key",
                        "in": "header",
                        "required": False,
                        "description": "1-255 printable ASCII characters, no space or tab at either end "
                        "as sent (422 `invalid_idempotency_key`; the header is read as it arrived, not as "
                        "HTTP parsers trim it), once (two answer 400 `duplicate_header`). The same owner "
                        "sending the same key and the same body again gets the original job back (200); "
                        "the same key with a different body answers 422 `idempotency_key_reused`. Kept at "
                        "least 24 hours.",
                        "schema": {"type": "string", "minLength": 1, "maxLength": 255},
                    }
                ],
                "requestBody": spec_body,
                "responses": {
                    "200": _json(
                        "An Idempotency-Key replay: the job the key first made.", _ref("Job"), location
                    ),
                    "201": _json("Created.", _ref("Job"), location),
                    "400": _E400,
                    "401": _E401,
                    "409": _error(_LIMITS_409["create_job"]),
                    "413": _E413,
                    "415": _E415,
                    "422": _E422,
                    "503": _E503,
                },
            },
            "get": {
                "operationId": "list_jobs",
                "summary": "List the owner's jobs in a stable order (by id), one page at a time.",
                "parameters": [
                    {
                        "name": "state",
                        "in": "query",
                        "required": False,
                        "description": "Only jobs in this state. An empty value means all.",
                        "schema": {"enum": ["scheduled", "paused", "completed", "cancelled", "dead"]},
                    },
                    {
                        "name": "label",
                        "in": "query",
                        "required": False,
                        "description": "`KEY=VALUE`, URL-encoded; repeat it for several (all must match).",
                        "style": "form",
                        "explode": True,
                        "schema": {"type": "array", "maxItems": LABELS_MAX, "items": {"type": "string"}},
                    },
                    {
                        "name": "name_prefix",
                        "in": "query",
                        "required": False,
                        "description": "Only jobs whose name starts with this.",
                        "schema": {"type": "string", "maxLength": 200},
                    },
                    *_page_params(),
                ],
                "responses": {
                    "200": _json("A page of jobs.", _ref("JobPage")),
                    "401": _E401,
                    "422": _E422,
                    "503": _E503,
                },
            },
        },
        "/v1/jobs/{job_id}": {
            "get": _action("get_job", "Read one job.", {"200": job_ok}, conflict=False),
            "patch": {
                "operationId": "update_job",
                "summary": "Change a job with a JSON merge patch; a schedule change recomputes next_run_at.",
                "parameters": [_JOB_ID_PARAM],
                "requestBody": patch_body,
                "responses": {
                    "200": job_ok,
                    "400": _E400,
                    "401": _E401,
                    "404": _E404,
                    "409": _error(
                        "The job is cancelled or completed, or the new name is held by another job."
                    ),
                    "413": _E413,
                    "415": _E415,
                    "422": _E422,
                    "503": _E503,
                },
            },
            "delete": _action(
                "cancel_job",
                "Cancel a job: no run starts after the answer. Repeating it is harmless.",
                {"200": _json("The job, now cancelled.", _ref("Job"))},
                conflict=False,
            ),
        },
        "/v1/jobs/{job_id}/pause": {
            "post": {
                **_action(
                    "pause_job",
                    'Pause a job: no run starts while paused. With `{"note", "until"}`: the note is '
                    "shown while paused, and Duetime resumes the job at `until`. Pausing a paused "
                    "job changes nothing (resume it first to pause it anew).",
                    {
                        "200": _json("The job, now paused.", _ref("Job")),
                        "400": _E400,
                        "413": _E413,
                        "415": _E415,
                        "422": _E422,
                    },
                    conflict=True,
                ),
                "requestBody": {
                    "required": False,
                    "content": {"application/json": {"schema": _ref("PauseRequest")}},
                },
            }
        },
        "/v1/jobs/{job_id}/resume": {
            "post": _action(
                "resume_job",
                "Resume a paused job; missed occurrences follow its misfire policy.",
                {"200": job_ok},
                conflict=True,
            )
        },
        "/v1/jobs/{job_id}/trigger": {
            "post": _action(
                "trigger_job",
                "Queue one extra run now, besides the schedule (a scheduled job only).",
                {"202": _json("Accepted; the job as it is now.", _ref("Job"))},
                conflict=True,
            )
        },
        "/v1/jobs/{job_id}/replay": {
            "post": {
                **_action(
                    "replay_job",
                    "Without a body: send a dead job back to scheduled with its attempts reset; it "
                    'runs now. With `{"scheduled_for"}`: one failed occurrence of a recurring job '
                    "runs once more with its own Idempotency-Key, following the job's `overlap` as a "
                    "backfilled run does (202; 409 `occurrence_not_failed` when its last attempt did "
                    "not fail, `too_many_replays` when DUETIME_MAX_PENDING_TRIGGERS replayed or "
                    "backfilled runs already wait).",
                    {
                        "200": job_ok,
                        "202": _json("Accepted: the occurrence runs now; the job as it is.", _ref("Job")),
                        "400": _E400,
                        "413": _E413,
                        "415": _E415,
                        "422": _E422,
                    },
                    conflict=True,
                ),
                "requestBody": {
                    "required": False,
                    "content": {"application/json": {"schema": _ref("ReplayRequest")}},
                },
            }
        },
        "/v1/jobs/{job_id}/backfill": {
            "post": {
                "operationId": "backfill_job",
                "summary": "Run every occurrence of a recurring job in [from, to) again, each with its "
                f"own scheduled_for and Idempotency-Key; at most {limits.backfill_max_occurrences} "
                "at a time, paced, honouring the job's overlap policy (see docs/api.md).",
                "parameters": [_JOB_ID_PARAM],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("BackfillRequest")}},
                },
                "responses": {
                    "202": _json("Accepted: how many occurrences were queued.", _ref("Backfill")),
                    "400": _E400,
                    "401": _E401,
                    "404": _E404,
                    "409": _E409,
                    "413": _E413,
                    "415": _E415,
                    "422": _E422,
                    "503": _E503,
                },
            }
        },
        "/v1/jobs/{job_id}/runs": {
            "get": {
                "operationId": "list_runs",
                "summary": "The job's run history, newest first, one page at a time.",
                "parameters": [_JOB_ID_PARAM, *_page_params()],
                "responses": {
                    "200": _json("A page of runs.", _ref("RunPage")),
                    "401": _E401,
                    "404": _E404,
                    "422": _E422,
                    "503": _E503,
                },
            }
        },
        "/v1/jobs/{job_id}/changes": {
            "get": {
                "operationId": "list_changes",
                "summary": "The job's change history, newest first, one page at a time: every change "
                "by its owner's calls and by Duetime itself, who made it, why, and how the spec moved.",
                "parameters": [_JOB_ID_PARAM, *_page_params()],
                "responses": {
                    "200": _json("A page of change records.", _ref("ChangePage")),
                    "401": _E401,
                    "404": _E404,
                    "422": _E422,
                    "503": _E503,
                },
            }
        },
        "/v1/runs": {
            "get": {
                "operationId": "list_owner_runs",
                "summary": "The owner's runs across all jobs, newest (by finished_at) first, each with "
                "its job_id: one view of what failed.",
                "parameters": [
                    {
                        "name": "outcome",
                        "in": "query",
                        "required": False,
                        "schema": {"enum": ["succeeded", "failed", "timed_out", "lease_expired", "skipped"]},
                    },
                    {
                        "name": "since",
                        "in": "query",
                        "required": False,
                        "description": "Only runs that finished at or after this RFC 3339 instant.",
                        "schema": _TIME,
                    },
                    *_page_params(),
                ],
                "responses": {
                    "200": _json("A page of runs, each with its job_id.", _ref("OwnerRunPage")),
                    "401": _E401,
                    "422": _E422,
                    "503": _E503,
                },
            }
        },
        "/v1/targets": {
            "get": {
                "operationId": "list_targets",
                "summary": "The hosts of the owner's webhook jobs as the workers see them (health, "
                "limit, back-off, the last five minutes' calls), in host order, one page at a time. "
                "Only reports of the last two minutes count: a worker that stopped drops out.",
                "parameters": _page_params(),
                "responses": {
                    "200": _json("A page of hosts.", _ref("TargetPage")),
                    "401": _E401,
                    "422": _E422,
                    "503": _E503,
                },
            }
        },
    }
    paths.update(_owner_scale_paths(spec_body, location))
    paths.update(_preview_paths())
    _add_edge_answers(paths)
    _add_reasons(paths)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Duetime API",
            "version": __version__,
            "description": "Register, change and inspect scheduled jobs. Errors share one body: "
            '`{"error": {"code", "message", "field"?, "request_id"?}}`. Every answer carries '
            "`X-Request-Id`. See docs/api.md.",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": _with_common_statuses(paths),
        "components": {
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API key from `duetime keys create`.",
                }
            },
            "schemas": _schemas(limits),
        },
    }


def _owner_scale_paths(spec_body: JsonObject, location: JsonObject) -> JsonObject:
    """Jobs by name (PUT applies a spec, as a deploy script does) and bulk actions by label."""
    job_ok = _json("The job.", _ref("Job"))
    bulk_body = {"required": True, "content": {"application/json": {"schema": _ref("BulkRequest")}}}

    def bulk(action: str, summary: str) -> JsonObject:
        body = bulk_body
        if action == "pause":
            body = {"required": True, "content": {"application/json": {"schema": _ref("BulkPauseRequest")}}}
        return {
            "post": {
                "operationId": f"bulk_{action}",
                "summary": summary,
                "requestBody": body,
                "responses": {
                    "200": _json("What the call did.", _ref("BulkResult")),
                    "400": _E400,
                    "401": _E401,
                    "413": _E413,
                    "415": _E415,
                    "422": _E422,
                    "429": _E429,
                    "503": _E503,
                },
            }
        }

    return {
        "/v1/jobs/by-name/{name}": {
            "put": {
                "operationId": "put_job_by_name",
                "summary": "Create the named job (201), or make it match the body as a PATCH of every "
                "field would (200, state unchanged); a body that changes nothing writes nothing.",
                "parameters": [_NAME_PARAM],
                "requestBody": spec_body,
                "responses": {
                    "200": _json("Updated, or already as the body says.", _ref("Job")),
                    "201": _json("Created.", _ref("Job"), location),
                    "400": _E400,
                    "401": _E401,
                    "404": _error(
                        "Only when a client removed a `.` or `..` name from the URL before sending it "
                        "(then the URL names no route); PUT never answers 404 for a name."
                    ),
                    "409": _error(_LIMITS_409["put_job_by_name"]),
                    "413": _E413,
                    "415": _E415,
                    "422": _error("Invalid values, or a body `name` that differs from the URL's."),
                    "429": _E429,
                    "503": _E503,
                },
            },
            "get": {
                "operationId": "get_job_by_name",
                "summary": "Read the job (not cancelled) that holds this name.",
                "parameters": [_NAME_PARAM],
                "responses": {"200": job_ok, "401": _E401, "404": _E404, "429": _E429, "503": _E503},
            },
        },
        "/v1/jobs/bulk/pause": bulk(
            "pause",
            "Pause the owner's scheduled jobs that carry every label; none of them starts a run "
            "after the answer. `note` and `until` are as for a single pause, for every job paused.",
        ),
        "/v1/jobs/bulk/resume": bulk("resume", "Resume the owner's paused jobs that carry every label."),
        "/v1/jobs/bulk/cancel": bulk(
            "cancel",
            "Cancel the owner's jobs (not cancelled yet) that carry every label; no run of them "
            "starts after the answer.",
        ),
    }


_E400_EDGE: Final = {
    "description": "Malformed JSON or a value of the wrong type; or a repeated Authorization or "
    "Idempotency-Key header (`duplicate_header`) or query parameter (`duplicate_parameter`). "
    "A request the HTTP parser cannot read (a request line or a header over 8190 bytes, more "
    "than 128 headers, a NUL in a header) is answered `malformed_request` with a fixed "
    "message that echoes nothing of the request, and the connection is closed.",
    "content": {"application/json": {"schema": _ref("Error")}},
}
_E408: Final = _error(
    "The request body did not arrive in time (`request_timeout`); the connection is closed."
)
_LIMITS_409: Final = {
    "create_job": "The name is held by another job (`name_taken`, the message names it); or the "
    "owner is at a limit: `job_limit_reached` (active jobs) or `job_bytes_limit_reached` (stored "
    "bytes); or `concurrent_update`.",
    "put_job_by_name": "A change to a completed or dead job (as PATCH answers); or, when the PUT "
    "creates, the owner is at a limit: `job_limit_reached` or `job_bytes_limit_reached`; or "
    "`name_contended` (the job kept changing under concurrent requests: try again).",
    "trigger_job": "The job's state does not allow a trigger, or `too_many_triggers` wait already; "
    "or `concurrent_update`.",
}


def _add_edge_answers(paths: JsonObject) -> None:
    """Answers every /v1 operation can give before or around its handler beyond the common ones
    (``_with_common_statuses``): 400 for a repeated Authorization header or query parameter, 408
    for a stalled body (on operations that take one), and the owner limits' 409s on create and
    trigger."""
    for path, item in paths.items():
        if not path.startswith("/v1/"):
            continue
        for operation in item.values():
            responses = operation["responses"]
            responses["400"] = _E400_EDGE
            if "requestBody" in operation:
                responses["408"] = _E408
            limit_409 = _LIMITS_409.get(operation.get("operationId", ""))
            if limit_409 is not None:
                responses["409"] = _error(limit_409)
            operation["responses"] = dict(sorted(responses.items()))


# The calls that change a job: each takes a reason for its change record.
_CHANGING: Final = frozenset(
    {
        "create_job",
        "update_job",
        "put_job_by_name",
        "cancel_job",
        "pause_job",
        "resume_job",
        "trigger_job",
        "backfill_job",
        "replay_job",
        "bulk_pause",
        "bulk_resume",
        "bulk_cancel",
    }
)
_REASON_PARAM: Final = {
    "name": REASON_HEADER,
    "in": "header",
    "required": False,
    "description": f"Why this change is made: printable text of at most {REASON_MAX} characters "
    "(UTF-8), kept in the job's change record (GET /v1/jobs/{id}/changes). Longer, or with "
    "control characters: 422 `invalid_reason`. Send it once (twice: 400 `duplicate_header`).",
    "schema": {"type": "string", "maxLength": REASON_MAX},
}


def _add_reasons(paths: JsonObject) -> None:
    """Every operation that changes a job takes ``Duetime-Reason``, and can answer 422 for it."""
    for item in paths.values():
        for operation in item.values():
            if operation.get("operationId") not in _CHANGING:
                continue
            operation["parameters"] = [*operation.get("parameters", []), _REASON_PARAM]
            responses = operation["responses"]
            if "422" not in responses:
                responses["422"] = _error(
                    f"The `{REASON_HEADER}` header is not acceptable (`invalid_reason`)."
                )
            operation["responses"] = dict(sorted(responses.items()))


def _preview_paths() -> JsonObject:
    preview_ok = _json("The next occurrences.", _ref("Preview"))
    return {
        "/v1/schedules/preview": {
            "post": {
                "operationId": "preview_schedule",
                "summary": "The next occurrences of a schedule, as the engine would fire them; "
                "the schedule is validated exactly as in POST /v1/jobs.",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("PreviewRequest")}},
                },
                "responses": {
                    "200": preview_ok,
                    "400": _E400,
                    "401": _E401,
                    "413": _E413,
                    "415": _E415,
                    "422": _E422,
                    "503": _E503,
                },
            }
        },
        "/v1/jobs/{job_id}/preview": {
            "get": {
                "operationId": "preview_job",
                "summary": "The job's next occurrences, with when each is due (jitter included).",
                "parameters": [
                    _JOB_ID_PARAM,
                    {
                        "name": "count",
                        "in": "query",
                        "required": False,
                        "description": "How many, 1 to 100 (default 10).",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 10},
                    },
                    {
                        "name": "from",
                        "in": "query",
                        "required": False,
                        "description": "Preview from this RFC 3339 instant (default: now).",
                        "schema": {"type": "string", "format": "date-time"},
                    },
                ],
                "responses": {
                    "200": preview_ok,
                    "401": _E401,
                    "404": _E404,
                    "422": _E422,
                    "503": _E503,
                },
            }
        },
    }
