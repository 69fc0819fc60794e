"""``core.changes``: the diff a change record keeps (JSON Pointers to leaves, JSON equality, no
secret ever) and the reason a call may give."""

from __future__ import annotations

from typing import Any

import pytest

from duetime.core import codec
from duetime.core.changes import creation_diff, parse_reason, pointer, spec_diff
from duetime.core.errors import InvalidRequest
from duetime.core.model import CronSchedule, JobSpec, OnFailure, WebhookTarget


def _spec(**kw: Any) -> dict[str, Any]:
    spec = JobSpec(
        target=WebhookTarget(url="https://a.example/h", headers={"Authorization": "Bearer one"}),
        schedule=CronSchedule(cron="0 * * * *", timezone="UTC"),
    )
    out = codec.spec_to_json(spec)
    out.update(kw)
    return out


def test_the_same_spec_has_no_diff_and_a_leaf_is_named_by_its_pointer() -> None:
    assert spec_diff(_spec(), _spec()) == {}
    new = _spec(schedule={"cron": "5 * * * *", "timezone": "UTC"})
    assert spec_diff(_spec(), new) == {
        "/schedule/cron": {"from": "0 * * * *", "to": "5 * * * *"},
        # Fields the stored schedule had and the new one lacks read null on the side that lacks
        # them (a null on both sides is no change).
        **{
            f"/schedule/{k}": {"from": v, "to": None}
            for k, v in _spec()["schedule"].items()
            if k not in ("cron", "timezone") and v is not None
        },
    }


def test_json_equality_is_strict_about_types() -> None:
    assert spec_diff(_spec(payload={"on": True}), _spec(payload={"on": 1})) == {
        "/payload/on": {"from": True, "to": 1}
    }
    assert spec_diff(_spec(payload=1), _spec(payload=1.0)) == {"/payload": {"from": 1, "to": 1.0}}
    # A list is one leaf.
    assert spec_diff(_spec(payload=[1, 2]), _spec(payload=[1, 3])) == {
        "/payload": {"from": [1, 2], "to": [1, 3]}
    }


def test_pointer_tokens_escape_tilde_and_slash() -> None:
    assert pointer(("labels", "team/a~b")) == "/labels/team~1a~0b"
    assert spec_diff(_spec(labels={"a/b": "1"}), _spec(labels={})) == {
        "/labels/a~1b": {"from": "1", "to": None}
    }


def test_secrets_never_reach_the_diff_wherever_they_are() -> None:
    rotated = _spec(target={**_spec()["target"], "headers": {"Authorization": "Bearer two"}})
    assert spec_diff(_spec(), rotated) == {
        "/target/headers/Authorization": {"from": "<redacted>", "to": "<redacted>"}
    }
    queue = {"type": "queue", "broker": "nats", "topic": "t"}
    moved = spec_diff(_spec(), _spec(target=queue))
    assert moved["/target/headers"] == {"from": {"Authorization": "<redacted>"}, "to": None}
    hook = codec.on_failure_to_json(
        OnFailure(target=WebhookTarget(url="https://b.example/f", headers={"X-K": "secret-2"}))
    )
    added = spec_diff(_spec(), _spec(on_failure=hook))
    assert added["/on_failure"]["to"]["target"]["headers"] == {"X-K": "<redacted>"}
    whole = creation_diff(_spec(on_failure=hook))
    assert whole[""]["to"]["target"]["headers"] == {"Authorization": "<redacted>"}
    assert whole[""]["to"]["on_failure"]["target"]["headers"] == {"X-K": "<redacted>"}
    for diff in (moved, added, whole):
        assert "Bearer one" not in repr(diff) and "secret-2" not in repr(diff)
    # The caller's dicts are left as they were.
    assert _spec(on_failure=hook)["on_failure"]["target"]["headers"] == {"X-K": "secret-2"}


@pytest.mark.parametrize("text", ["a" * 500, "Grüße ✓", "ok: with spaces, punctuation!"])
def test_a_printable_reason_of_500_characters_or_less_is_kept(text: str) -> None:
    assert parse_reason(text) == text


@pytest.mark.parametrize("text", [None, ""])
def test_no_reason_is_none(text: str | None) -> None:
    assert parse_reason(text) is None


@pytest.mark.parametrize("text", ["a" * 501, "tab\there", "line\nbreak", "bad \udcff byte"])
def test_anything_else_is_invalid_reason(text: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        parse_reason(text)
    assert (err.value.code, err.value.field) == ("invalid_reason", "Duetime-Reason")
