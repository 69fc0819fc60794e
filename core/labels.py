"""How an owner names and tags jobs: the grammar of ``name``, ``labels`` and label selectors.

Names address a job (``PUT /v1/jobs/by-name/{name}``), so they must survive a URL path and a
shell unchanged: ASCII letters, digits and ``._-/:``, never starting with ``/`` (which would read
as an empty path segment). Label keys follow the Kubernetes label-key habit (lower case, starting
and ending with a letter or digit) so that selectors written for one system read the same here.

Pure: raises ``core.errors`` only, imports no I/O library. ``core.validation`` calls these for the
job spec; the API calls ``parse_selector``/``parse_label_query`` for lists and bulk actions.
"""

from __future__ import annotations

import re
from typing import Final

from duetime.core.errors import InvalidRequest, MalformedRequest
from duetime.core.model import JobState

NAME_MAX: Final = 200
LABELS_MAX: Final = 32
LABEL_KEY_MAX: Final = 63
LABEL_VALUE_MAX: Final = 200

NAME_PATTERN: Final = r"^[A-Za-z0-9._:-][A-Za-z0-9._/:-]{0,199}$"
LABEL_KEY_PATTERN: Final = r"^[a-z0-9](?:[a-z0-9._/-]{0,61}[a-z0-9])?$"
_NAME: Final = re.compile(NAME_PATTERN.strip("^$"))
_LABEL_KEY: Final = re.compile(LABEL_KEY_PATTERN.strip("^$"))
_NAME_CHARS: Final = re.compile(r"[A-Za-z0-9._/:-]*")


def _invalid(field: str, message: str, code: str = "invalid_value") -> InvalidRequest:
    return InvalidRequest(message, code=code, field=field)


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "a string" if isinstance(value, str) else type(value).__name__


def check_name(name: str, field: str = "name") -> str:
    """A job name as the contract allows it; the message says which rule it broke."""
    if not name:
        raise _invalid(field, f"{field} must not be empty; omit it or send null for a job without a name")
    if len(name) > NAME_MAX:
        raise _invalid(field, f"{field} is {len(name)} characters long; at most {NAME_MAX}")
    if name.startswith("/"):
        raise _invalid(field, f"{field} must not start with '/'")
    if _NAME.fullmatch(name) is None:
        bad = next((c for c in name if _NAME_CHARS.fullmatch(c) is None), "?")
        shown = repr(bad) if bad.isprintable() else f"U+{ord(bad):04X}"
        raise _invalid(
            field,
            f"{field} may hold only ASCII letters, digits and . _ - / : (found {shown}); "
            "for example billing/nightly-report",
        )
    return name


def refuse_dot_segments(name: str, field: str = "name") -> str:
    """A new name (a create, a rename) may not be ``.`` or ``..`` nor hold such a ``/``-separated
    segment: by-name URLs would resolve it (``a/../b`` is ``b`` to many clients and proxies), so
    the job could not be addressed by its name. Jobs named so before the rule keep their name."""
    if any(segment in (".", "..") for segment in name.split("/")):
        shown = name if len(name) <= 64 else name[:64] + "…"
        raise _invalid(
            field,
            f"{field} {shown!r} has a '.' or '..' segment; a name may not be . or .. nor hold "
            "/./ or /../ (dots inside a segment, as in v1.2 or .hidden, are fine)",
            "invalid_name",
        )
    return name


def parse_name(value: object) -> str | None:
    """The spec's ``name``: null, or a string in the name grammar."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise MalformedRequest(
            f"name must be a string or null, not {_type_name(value)}", code="wrong_type", field="name"
        )
    return check_name(value)


def check_label_key(key: str, field: str) -> str:
    if not 1 <= len(key) <= LABEL_KEY_MAX or _LABEL_KEY.fullmatch(key) is None:
        shown = key[:70]
        raise _invalid(
            field,
            f"label key {shown!r} is not valid: 1 to {LABEL_KEY_MAX} characters of a-z 0-9 . _ - /, "
            "starting and ending with a letter or digit (for example team or app.kubernetes.io/name)",
            "invalid_label",
        )
    return key


def check_label_value(value: str, field: str) -> str:
    if len(value) > LABEL_VALUE_MAX:
        raise _invalid(
            field, f"{field} is {len(value)} characters long; at most {LABEL_VALUE_MAX}", "invalid_label"
        )
    if "\x00" in value:
        raise _invalid(field, f"{field} must not contain NUL (\\u0000) characters", "invalid_label")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _invalid(
            field, f"{field} contains a lone UTF-16 surrogate; send valid Unicode text", "invalid_label"
        ) from None
    return value


def parse_labels(value: object, field: str = "labels", *, allow_empty: bool = True) -> dict[str, str]:
    """An object of at most 32 ``key: "value"`` pairs, in the label grammar."""
    if not isinstance(value, dict):
        raise MalformedRequest(
            f"{field} must be an object mapping label keys to string values, not {_type_name(value)}",
            code="wrong_type",
            field=field,
        )
    if len(value) > LABELS_MAX:
        raise _invalid(field, f"{field} has {len(value)} pairs; at most {LABELS_MAX}", "invalid_label")
    out: dict[str, str] = {}
    for key, raw in value.items():
        path = f"{field}.{key}"
        check_label_key(key, path)
        if not isinstance(raw, str):
            raise MalformedRequest(
                f"{path} must be a string, not {_type_name(raw)}", code="wrong_type", field=path
            )
        out[key] = check_label_value(raw, path)
    if not out and not allow_empty:
        raise _invalid(
            field,
            f'{field} must name at least one label pair, for example {{"team": "billing"}}',
            "selector_required",
        )
    return out


def parse_label_query(values: list[str]) -> dict[str, str]:
    """``?label=KEY=VALUE`` (repeatable, all must match) from a list URL; the value may be empty
    and may itself contain ``=`` (only the first one splits)."""
    out: dict[str, str] = {}
    for text in values:
        key, sep, value = text.partition("=")
        if not sep:
            raise _invalid(
                "label",
                f"label must be KEY=VALUE (URL-encoded), for example label=team%3Dbilling; got {text[:70]!r}",
                "invalid_label",
            )
        check_label_key(key, "label")
        check_label_value(value, "label")
        if key in out and out[key] != value:
            # Both cannot hold at once: say so rather than answer an always-empty list.
            raise _invalid(
                "label",
                f"label {key!r} is given twice with different values; a job has one value per key",
                "invalid_label",
            )
        out[key] = value
    if len(out) > LABELS_MAX:
        raise _invalid("label", f"at most {LABELS_MAX} label filters", "invalid_label")
    return out


def check_name_prefix(prefix: str) -> str:
    if len(prefix) > NAME_MAX or _NAME_CHARS.fullmatch(prefix) is None:
        raise _invalid(
            "name_prefix",
            f"name_prefix may hold only the characters of a name (ASCII letters, digits and . _ - / :), "
            f"at most {NAME_MAX}",
        )
    return prefix


BULK_FIELDS: Final = ("labels", "state")


def parse_bulk_request(data: object, *, also: tuple[str, ...] = ()) -> tuple[dict[str, str], JobState | None]:
    """The body of ``POST /v1/jobs/bulk/{pause,resume,cancel}``: a label selector of at least one
    pair (an empty one would act on every job of the owner: refused, ``selector_required``) and an
    optional state the jobs must be in as well. ``also``: fields the caller reads itself (a bulk
    pause's ``note`` and ``until``), allowed and left alone here."""
    if not isinstance(data, dict):
        raise MalformedRequest(
            f"the request body must be a JSON object, not {_type_name(data)}", code="wrong_type"
        )
    allowed = (*BULK_FIELDS, *also)
    for key in data:
        if key not in allowed:
            raise _invalid(
                str(key), f"unknown field {key!r}; allowed here: {', '.join(allowed)}", "unknown_field"
            )
    if "labels" not in data or data["labels"] is None or data["labels"] == {}:
        raise _invalid(
            "labels",
            "a bulk action needs a label selector with at least one pair, for example "
            '{"labels": {"team": "billing"}}; it never acts on every job at once',
            "selector_required",
        )
    labels = parse_labels(data["labels"], allow_empty=False)
    raw_state = data.get("state")
    if raw_state is None:
        return labels, None
    states = {s.value: s for s in JobState}
    if not isinstance(raw_state, str):
        raise MalformedRequest(
            f"state must be a string, not {_type_name(raw_state)}", code="wrong_type", field="state"
        )
    if raw_state not in states:
        raise _invalid("state", f"state must be one of {', '.join(states)}", "invalid_state")
    return labels, states[raw_state]
