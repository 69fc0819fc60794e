"""A job's change history: what one change records (who, what, why, how the spec moved).

Every change of a job writes one record in the transaction of the change itself (issue 30, item
1), so the history never disagrees with the job: an owner's calls (create, update, replace,
pause, resume, cancel, trigger, backfill, replay, and each job a bulk call changed) and Duetime's
own (``auto_pause`` when ``pause_after_failures`` pauses a job, ``auto_resume`` at a pause's
``until``). Records are numbered per job from 1 (``seq``) and carry the job's ``spec_version``
after the change: 1 at create, one more for each change that altered the spec.

The ``diff`` is keyed by JSON Pointers (RFC 6901) into the spec as the API shows it, down to the
leaves of objects (a list is one leaf): ``{"/schedule/cron": {"from": "0 * * * *", "to": "5 * * *
*"}}``. A field one side lacks is ``null`` on that side. A create's diff is the whole spec under
the pointer to the whole document, ``""``. Header values of targets are secrets: the diff shows
that one changed, never what it was or became (``<redacted>``), so a secret is not copied into the
history at all.

Pure: the stores call these functions and keep the records; the API renders them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from duetime.core.codec import REDACTED
from duetime.core.errors import InvalidRequest
from duetime.core.model import ActorType

__all__ = [
    "AUTO_PAUSE_REASON",
    "AUTO_RESUME_REASON",
    "REASON_HEADER",
    "REASON_MAX",
    "UNNAMED",
    "ActorType",
    "Change",
    "ChangeAction",
    "ChangeBy",
    "creation_diff",
    "parse_reason",
    "pointer",
    "spec_diff",
]

#: The longest reason a call may carry (characters).
REASON_MAX: Final = 500
#: Where a call carries its reason.
REASON_HEADER: Final = "Duetime-Reason"


#: The reason Duetime gives for an ``auto_pause``, ``%s`` the count of failed occurrences (written
#: by the completion's statement with PostgreSQL's ``format``, by the in-memory store with ``%``).
AUTO_PAUSE_REASON: Final = "paused by pause_after_failures after %s consecutive failed occurrences"
#: The reason Duetime gives for an ``auto_resume``, ``{until}`` the pause's end as RFC 3339.
AUTO_RESUME_REASON: Final = "the pause until {until} ended"


class ChangeAction(enum.StrEnum):
    """What a change did (the record's ``action``)."""

    CREATE = "create"
    UPDATE = "update"  # PATCH
    REPLACE = "replace"  # PUT by name on an existing job
    PAUSE = "pause"
    RESUME = "resume"
    CANCEL = "cancel"
    TRIGGER = "trigger"
    BACKFILL = "backfill"
    REPLAY = "replay"
    AUTO_PAUSE = "auto_pause"  # pause_after_failures reached
    AUTO_RESUME = "auto_resume"  # a pause's ``until`` came


@dataclass(frozen=True, slots=True)
class ChangeBy:
    """Who asks for a change through the API, as the change record names them: the id of the API
    key that made the call (its prefix, as ``duetime keys list`` shows it) and the reason the
    call gave (``Duetime-Reason``). Both None: a call without either (a tool, a test)."""

    key_id: str | None = None
    reason: str | None = None


#: A change asked for with no key id and no reason.
UNNAMED: Final = ChangeBy()


@dataclass(frozen=True, slots=True)
class Change:
    """One change record of one job, as ``GET /v1/jobs/{id}/changes`` lists it."""

    seq: int
    at: datetime
    actor: ActorType
    key_id: str | None
    action: ChangeAction
    reason: str | None
    spec_version: int
    diff: dict[str, Any]


def parse_reason(value: str | None) -> str | None:
    """The ``Duetime-Reason`` header: printable text of at most ``REASON_MAX`` characters, else
    422 ``invalid_reason``. Absent or empty: no reason (None)."""
    if not value:
        return None
    if len(value) > REASON_MAX or not value.isprintable():
        # isprintable() refuses control characters (tabs, newlines) and the lone surrogates that
        # bytes which are not UTF-8 decode to.
        raise InvalidRequest(
            f"{REASON_HEADER} must be printable text (UTF-8, no control characters) of at most "
            f"{REASON_MAX} characters; this one has {len(value)} characters"
            + ("" if value.isprintable() else " and some that are not printable")
            + "; shorten it or leave the header out",
            code="invalid_reason",
            field=REASON_HEADER,
        )
    return value


# ---------------------------------------------------------------------- the spec's diff

# Where a spec (as JSON) keeps secrets: every value of these objects.
_SECRET_OBJECTS: Final = (("target", "headers"), ("on_failure", "target", "headers"))


def pointer(tokens: tuple[str, ...]) -> str:
    """The JSON Pointer (RFC 6901) of a path: ``~`` written ``~0`` and ``/`` written ``~1`` in
    each token (label keys may hold ``/``)."""
    return "".join("/" + t.replace("~", "~0").replace("/", "~1") for t in tokens)


def _same(a: Any, b: Any) -> bool:
    """JSON equality: ``true`` is not ``1`` and ``1`` is not ``1.0`` (Python's ``==`` says they are)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _walk(tokens: tuple[str, ...], old: Any, new: Any, out: dict[str, dict[str, Any]]) -> None:
    if _same(old, new):
        return
    if isinstance(old, dict) and isinstance(new, dict):
        for key in [*old, *(k for k in new if k not in old)]:
            _walk((*tokens, key), old.get(key), new.get(key), out)
        return
    out[pointer(tokens)] = {"from": _redacted(tokens, old), "to": _redacted(tokens, new)}


def _redact_inside(value: Any, rest: tuple[str, ...]) -> Any:
    """``value`` with the secrets object found under ``rest`` (a path below it) redacted."""
    if not isinstance(value, dict):
        return value
    if not rest:
        return {k: (REDACTED if v is not None else None) for k, v in value.items()}
    if rest[0] not in value:
        return value
    return {**value, rest[0]: _redact_inside(value[rest[0]], rest[1:])}


def _redacted(tokens: tuple[str, ...], value: Any) -> Any:
    """The value found at ``tokens`` with every secret in it or under it redacted."""
    if value is None:
        return None
    for where in _SECRET_OBJECTS:
        n = len(where)
        if len(tokens) == n + 1 and tokens[:n] == where:
            return REDACTED  # one header's value
        if len(tokens) <= n and where[: len(tokens)] == tokens:
            value = _redact_inside(value, where[len(tokens) :])
    return value


def spec_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Every leaf of the spec (as JSON) that differs between ``old`` and ``new``, by its JSON
    Pointer, secrets redacted; empty when the two are the same spec."""
    out: dict[str, dict[str, Any]] = {}
    _walk((), dict(old), dict(new), out)
    return out


def creation_diff(spec: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A create's diff: the whole spec (secrets redacted) as ``to`` of the whole document."""
    return {"": {"from": None, "to": _redacted((), dict(spec))}}
