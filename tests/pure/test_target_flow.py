"""``target.flow`` (issue 28): what an owner may send, what is refused and how, and that the
stored and shown JSON carries it only when set.

The contract (api-v1.md, "Additions: targets that misbehave"): an optional
``{"key": 1-100 characters, "rate_per_s": 0.01-10000, "parallelism": 1-10000}`` on webhook and
queue targets; a value out of range is 422 naming the field. Wrong JSON types are 400
``wrong_type`` as everywhere else in the spec (docs/api-errors.md).
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from duetime.core import codec
from duetime.core.errors import DuetimeError, InvalidRequest, MalformedRequest
from duetime.core.model import Broker, Flow, QueueTarget, WebhookTarget
from duetime.core.spectext import spec_from_text
from duetime.core.validation import SpecLimits, merge_patch, parse_job_spec

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
URL = "https://hooks.example.com/duetime"
FLOW = {"key": "billing-api", "rate_per_s": 5, "parallelism": 3}
DROP = object()


def webhook(flow: Any = FLOW) -> dict[str, Any]:
    return {
        "target": {"type": "webhook", "url": URL, "flow": copy.deepcopy(flow)},
        "schedule": {"cron": "*/5 * * * *"},
    }


def queue(flow: Any = FLOW) -> dict[str, Any]:
    return {
        "target": {
            "type": "queue",
            "broker": "nats",
            "topic": "billing.invoices",
            "flow": copy.deepcopy(flow),
        },
        "schedule": {"run_at": "2026-07-01T10:00:00Z"},
    }


def with_flow(**changes: Any) -> dict[str, Any]:
    """``FLOW`` with fields replaced (or removed with DROP)."""
    flow = dict(FLOW)
    for key, value in changes.items():
        if value is DROP:
            del flow[key]
        else:
            flow[key] = value
    return flow


BAD, INV = MalformedRequest, InvalidRequest
F = "target.flow"

REFUSED = [
    # --- the object itself
    pytest.param(webhook("billing"), BAD, "wrong_type", F, id="flow-string"),
    pytest.param(webhook([FLOW]), BAD, "wrong_type", F, id="flow-array"),
    pytest.param(webhook(5), BAD, "wrong_type", F, id="flow-number"),
    pytest.param(webhook(True), BAD, "wrong_type", F, id="flow-bool"),
    pytest.param(webhook(with_flow(burst=10)), INV, "unknown_field", f"{F}.burst", id="flow-unknown-field"),
    pytest.param(webhook(with_flow(rate=5)), INV, "unknown_field", f"{F}.rate", id="flow-typo-field"),
    pytest.param(queue(with_flow(limit=1)), INV, "unknown_field", f"{F}.limit", id="queue-flow-unknown"),
    pytest.param(webhook(with_flow(key=DROP)), INV, "missing_field", f"{F}.key", id="key-missing"),
    pytest.param(
        webhook(with_flow(rate_per_s=DROP)), INV, "missing_field", f"{F}.rate_per_s", id="rate-missing"
    ),
    pytest.param(
        webhook(with_flow(parallelism=DROP)),
        INV,
        "missing_field",
        f"{F}.parallelism",
        id="parallelism-missing",
    ),
    pytest.param(webhook({}), INV, "missing_field", f"{F}.key", id="flow-empty-object"),
    # --- key
    pytest.param(webhook(with_flow(key=7)), BAD, "wrong_type", f"{F}.key", id="key-number"),
    pytest.param(webhook(with_flow(key=None)), BAD, "wrong_type", f"{F}.key", id="key-null"),
    pytest.param(webhook(with_flow(key=["a"])), BAD, "wrong_type", f"{F}.key", id="key-array"),
    pytest.param(webhook(with_flow(key="")), INV, "invalid_value", f"{F}.key", id="key-empty"),
    pytest.param(webhook(with_flow(key="k" * 101)), INV, "invalid_value", f"{F}.key", id="key-101"),
    pytest.param(webhook(with_flow(key="a\nb")), INV, "invalid_value", f"{F}.key", id="key-newline"),
    pytest.param(webhook(with_flow(key="a\tb")), INV, "invalid_value", f"{F}.key", id="key-tab"),
    pytest.param(webhook(with_flow(key="a\x7fb")), INV, "invalid_value", f"{F}.key", id="key-del"),
    pytest.param(webhook(with_flow(key="a\x85b")), INV, "invalid_value", f"{F}.key", id="key-c1-control"),
    pytest.param(webhook(with_flow(key="a\u200bb")), INV, "invalid_value", f"{F}.key", id="key-zero-width"),
    pytest.param(webhook(with_flow(key="a\u2028b")), INV, "invalid_value", f"{F}.key", id="key-line-sep"),
    pytest.param(webhook(with_flow(key="a\x00b")), INV, "invalid_value", f"{F}.key", id="key-nul"),
    pytest.param(webhook(with_flow(key="a\ud800b")), INV, "invalid_value", f"{F}.key", id="key-surrogate"),
    # --- rate_per_s
    pytest.param(webhook(with_flow(rate_per_s="5")), BAD, "wrong_type", f"{F}.rate_per_s", id="rate-string"),
    pytest.param(webhook(with_flow(rate_per_s=True)), BAD, "wrong_type", f"{F}.rate_per_s", id="rate-bool"),
    pytest.param(webhook(with_flow(rate_per_s=None)), BAD, "wrong_type", f"{F}.rate_per_s", id="rate-null"),
    pytest.param(webhook(with_flow(rate_per_s={})), BAD, "wrong_type", f"{F}.rate_per_s", id="rate-object"),
    pytest.param(webhook(with_flow(rate_per_s=0)), INV, "invalid_value", f"{F}.rate_per_s", id="rate-0"),
    pytest.param(
        webhook(with_flow(rate_per_s=0.0099)), INV, "invalid_value", f"{F}.rate_per_s", id="rate-under-0.01"
    ),
    pytest.param(
        webhook(with_flow(rate_per_s=-5)), INV, "invalid_value", f"{F}.rate_per_s", id="rate-negative"
    ),
    pytest.param(
        webhook(with_flow(rate_per_s=10000.001)),
        INV,
        "invalid_value",
        f"{F}.rate_per_s",
        id="rate-over-10000",
    ),
    pytest.param(
        webhook(with_flow(rate_per_s=10**400)), INV, "invalid_value", f"{F}.rate_per_s", id="rate-huge-int"
    ),
    pytest.param(
        webhook(with_flow(rate_per_s=float("nan"))), INV, "invalid_value", f"{F}.rate_per_s", id="rate-nan"
    ),
    pytest.param(
        webhook(with_flow(rate_per_s=float("inf"))), INV, "invalid_value", f"{F}.rate_per_s", id="rate-inf"
    ),
    # --- parallelism
    pytest.param(
        webhook(with_flow(parallelism="3")), BAD, "wrong_type", f"{F}.parallelism", id="parallelism-string"
    ),
    pytest.param(
        webhook(with_flow(parallelism=True)), BAD, "wrong_type", f"{F}.parallelism", id="parallelism-bool"
    ),
    pytest.param(
        webhook(with_flow(parallelism=2.5)), BAD, "wrong_type", f"{F}.parallelism", id="parallelism-fraction"
    ),
    pytest.param(
        webhook(with_flow(parallelism=2.0)), BAD, "wrong_type", f"{F}.parallelism", id="parallelism-2.0"
    ),
    pytest.param(
        webhook(with_flow(parallelism=None)), BAD, "wrong_type", f"{F}.parallelism", id="parallelism-null"
    ),
    pytest.param(
        webhook(with_flow(parallelism=0)), INV, "invalid_value", f"{F}.parallelism", id="parallelism-0"
    ),
    pytest.param(
        webhook(with_flow(parallelism=-1)),
        INV,
        "invalid_value",
        f"{F}.parallelism",
        id="parallelism-negative",
    ),
    pytest.param(
        webhook(with_flow(parallelism=10001)),
        INV,
        "invalid_value",
        f"{F}.parallelism",
        id="parallelism-10001",
    ),
    pytest.param(
        queue(with_flow(parallelism=10001)), INV, "invalid_value", f"{F}.parallelism", id="queue-parallelism"
    ),
    # --- the failure events' target is a target like the job's own: the same rules, its own path
    pytest.param(
        {
            **webhook(None),
            "on_failure": {
                "target": {"type": "webhook", "url": URL, "flow": with_flow(rate_per_s=20000)},
            },
        },
        INV,
        "invalid_value",
        "on_failure.target.flow.rate_per_s",
        id="on-failure-rate",
    ),
    pytest.param(
        {
            **webhook(None),
            "on_failure": {
                "target": {"type": "queue", "broker": "redis", "topic": "t", "flow": with_flow(x=1)},
            },
        },
        INV,
        "unknown_field",
        "on_failure.target.flow.x",
        id="on-failure-unknown",
    ),
]


@pytest.mark.parametrize(("data", "exc_class", "code", "field"), REFUSED)
def test_bad_flows_are_refused_naming_the_field(
    data: Any, exc_class: type[DuetimeError], code: str, field: str
) -> None:
    with pytest.raises(DuetimeError) as info:
        parse_job_spec(data, now=NOW)
    error = info.value
    assert type(error) is exc_class, error.message
    assert (error.code, error.field) == (code, field), error.message
    assert field in error.message, error.message  # the message names what to fix


def test_messages_say_the_bounds() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_job_spec(webhook(with_flow(rate_per_s=0.001)), now=NOW)
    assert "0.01" in info.value.message and "10000" in info.value.message
    with pytest.raises(InvalidRequest) as info:
        parse_job_spec(webhook(with_flow(parallelism=0)), now=NOW)
    assert "from 1 to 10000" in info.value.message
    with pytest.raises(InvalidRequest) as info:
        parse_job_spec(webhook(with_flow(key="k" * 101)), now=NOW)
    assert "1 to 100 characters" in info.value.message
    with pytest.raises(InvalidRequest) as info:
        parse_job_spec(webhook(with_flow(rate=1)), now=NOW)
    assert "rate_per_s" in info.value.message  # the suggestion


@pytest.mark.parametrize(
    ("flow", "expected"),
    [
        (FLOW, Flow("billing-api", 5.0, 3)),
        (with_flow(key="k"), Flow("k", 5.0, 3)),
        (with_flow(key="k" * 100), Flow("k" * 100, 5.0, 3)),
        (with_flow(key="Zahlungen März 🧾 / EU"), Flow("Zahlungen März 🧾 / EU", 5.0, 3)),
        (with_flow(key=" spaced "), Flow(" spaced ", 5.0, 3)),
        (with_flow(rate_per_s=0.01), Flow("billing-api", 0.01, 3)),
        (with_flow(rate_per_s=10000), Flow("billing-api", 10000.0, 3)),
        (with_flow(rate_per_s=2.5), Flow("billing-api", 2.5, 3)),
        (with_flow(parallelism=1), Flow("billing-api", 5.0, 1)),
        (with_flow(parallelism=10000), Flow("billing-api", 5.0, 10000)),
        (None, None),
    ],
)
def test_good_flows_are_accepted_on_both_target_kinds(flow: Any, expected: Flow | None) -> None:
    spec = parse_job_spec(webhook(flow), now=NOW)
    assert isinstance(spec.target, WebhookTarget) and spec.target.flow == expected
    spec = parse_job_spec(queue(flow), now=NOW)
    assert spec.target == QueueTarget(Broker.NATS, "billing.invoices", flow=expected)
    if expected is not None:
        assert isinstance(spec.target.flow, Flow) and isinstance(spec.target.flow.rate_per_s, float)


def test_without_flow_the_target_has_none() -> None:
    data = webhook()
    del data["target"]["flow"]
    assert parse_job_spec(data, now=NOW).target.flow is None


def test_on_failure_target_takes_a_flow_too() -> None:
    data = {
        **webhook(None),
        "on_failure": {"target": {"type": "queue", "broker": "redis", "topic": "t", "flow": FLOW}},
    }
    spec = parse_job_spec(data, now=NOW)
    assert spec.on_failure is not None and spec.on_failure.target.flow == Flow("billing-api", 5.0, 3)


def test_the_limits_are_the_contract_numbers() -> None:
    limits = SpecLimits()
    assert limits.flow_key_max == 100
    assert limits.flow_rate_range == (0.01, 10000.0)
    assert limits.flow_parallelism_range == (1, 10000)


# --- the codec: stored and shown --------------------------------------------------------------


def test_a_flow_is_written_and_read_back() -> None:
    spec = parse_job_spec(webhook(), now=NOW)
    stored = codec.spec_to_json(spec)
    assert stored["target"]["flow"] == {"key": "billing-api", "rate_per_s": 5.0, "parallelism": 3}
    assert codec.spec_from_json(stored) == spec
    assert spec_from_text(json.dumps(stored)) == spec  # the run path's decoder sees it too
    shown = codec.spec_to_json(spec, redact=True)
    assert shown["target"]["flow"] == stored["target"]["flow"]
    # what the API shows (and a PATCH merges onto) is valid input that means the same spec
    assert parse_job_spec(shown, now=NOW) == spec


def test_no_flow_no_key_so_older_stored_specs_read_back_identically() -> None:
    for data in (webhook(), queue()):
        del data["target"]["flow"]
        spec = parse_job_spec(data, now=NOW)
        stored = codec.spec_to_json(spec)
        assert "flow" not in stored["target"]
        assert codec.spec_to_json(codec.spec_from_json(stored)) == stored
        assert codec.spec_to_json(spec_from_text(json.dumps(stored))) == stored


def test_on_failure_flow_is_stored_too() -> None:
    data = {
        **webhook(None),
        "on_failure": {"target": {"type": "webhook", "url": URL, "flow": FLOW}, "after": 2},
    }
    spec = parse_job_spec(data, now=NOW)
    stored = codec.spec_to_json(spec)
    assert stored["on_failure"]["target"]["flow"]["key"] == "billing-api"
    assert "flow" not in stored["target"]
    assert codec.spec_from_json(stored) == spec == spec_from_text(json.dumps(stored))


# --- PATCH: the target is replaced whole, so flow goes with it ----------------------------------


def test_a_patch_that_leaves_the_target_alone_keeps_the_flow() -> None:
    current = codec.spec_to_json(parse_job_spec(webhook(), now=NOW))
    merged = merge_patch(current, {"jitter_s": 5})
    assert parse_job_spec(merged, now=NOW).target.flow == Flow("billing-api", 5.0, 3)


def test_a_patch_of_the_target_sets_changes_or_drops_the_flow() -> None:
    current = codec.spec_to_json(parse_job_spec(webhook(None), now=NOW))
    target = {"type": "webhook", "url": URL, "flow": with_flow(parallelism=8)}
    merged = merge_patch(current, {"target": target})
    changed = parse_job_spec(merged, now=NOW)
    assert changed.target.flow == Flow("billing-api", 5.0, 8)
    dropped = merge_patch(codec.spec_to_json(changed), {"target": {"type": "webhook", "url": URL}})
    assert parse_job_spec(dropped, now=NOW).target.flow is None
    nulled = merge_patch(
        codec.spec_to_json(changed), {"target": {"type": "webhook", "url": URL, "flow": None}}
    )
    assert parse_job_spec(nulled, now=NOW).target.flow is None
