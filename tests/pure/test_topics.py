"""Queue topics: Duetime's own and the brokers' names are refused, and the operator's per-owner
rule keeps owners in their own streams (issue 17, item 1)."""

from __future__ import annotations

import pytest

from duetime.core.errors import InvalidRequest
from duetime.core.model import Broker
from duetime.core.topics import TopicPolicy, TopicRule, broker_refusal
from duetime.core.validation import parse_job_spec
from tests.pure.test_one_rule import NOW

NATS_REFUSED = [
    "duetime.runs.0",
    "duetime.runs",
    "DUETIME.RUNS.3",
    "_INBOX.abc",
    "_R_.x",
    "$JS.API.STREAM.LIST",
    "$SYS.REQ.SERVER.PING",
    "$KV.bucket.key",
    "$O.store.x",
    "$JSC.x",
]
NATS_SHAPES = ["a.*", "a.>", ">", "*", "a..b", ".a", "a."]
REDIS_REFUSED = [
    "__keyspace@0__:x",
    "__keyevent@0__:set",
    "__redis__:invalidate",
    "duetime:idem:k",
]


@pytest.mark.parametrize("topic", NATS_REFUSED)
def test_duetime_and_nats_internal_subjects_are_refused(topic: str) -> None:
    assert broker_refusal(Broker.NATS, topic) is not None
    spec = {
        "target": {"type": "queue", "broker": "nats", "topic": topic},
        "schedule": {"run_at": "2026-12-01T01:00:00Z"},
    }
    with pytest.raises(InvalidRequest) as info:
        parse_job_spec(spec, now=NOW)
    assert info.value.code == "topic_not_allowed", info.value.message
    assert info.value.field == "target.topic"


@pytest.mark.parametrize("topic", REDIS_REFUSED)
def test_duetime_and_redis_internal_keys_are_refused(topic: str) -> None:
    spec = {
        "target": {"type": "queue", "broker": "redis", "topic": topic},
        "schedule": {"run_at": "2026-12-01T01:00:00Z"},
    }
    with pytest.raises(InvalidRequest) as info:
        parse_job_spec(spec, now=NOW)
    assert info.value.code == "topic_not_allowed"


@pytest.mark.parametrize(
    ("broker", "topic"), [(Broker.NATS, "billing.invoices"), (Broker.REDIS, "jobs:stream")]
)
def test_ordinary_topics_pass(broker: Broker, topic: str) -> None:
    assert TopicPolicy().refusal(broker, topic, "acme") is None


def test_a_configured_run_queue_prefix_is_reserved_too() -> None:
    policy = TopicPolicy(reserved_subjects=("acme.sched",))
    assert policy.refusal(Broker.NATS, "acme.sched.3", "acme") is not None
    assert policy.refusal(Broker.NATS, "acme.schedules", "acme") is None


def test_owner_prefix_keeps_owners_apart() -> None:
    policy = TopicPolicy(rule=TopicRule.OWNER_PREFIX)
    assert policy.refusal(Broker.NATS, "alice.events", "alice") is None
    assert policy.refusal(Broker.NATS, "bob.events", "alice") is not None
    assert policy.refusal(Broker.REDIS, "alice.stream", "alice") is None
    assert policy.refusal(Broker.REDIS, "alicex.stream", "alice") is not None
    custom = TopicPolicy(rule=TopicRule.OWNER_PREFIX, prefix="tenants.{owner}.")
    assert custom.refusal(Broker.NATS, "tenants.alice.x", "alice") is None
    assert custom.refusal(Broker.NATS, "tenants.bob.x", "alice") is not None


def test_the_allowlist_names_topics_per_owner() -> None:
    policy = TopicPolicy(rule=TopicRule.ALLOWLIST, allowlist=("{owner}.*", "shared.alerts"))
    assert policy.refusal(Broker.NATS, "alice.x.y", "alice") is None
    assert policy.refusal(Broker.NATS, "shared.alerts", "bob") is None
    assert policy.refusal(Broker.NATS, "shared.alerts.more", "bob") is not None
    assert policy.refusal(Broker.NATS, "alice.x", "bob") is not None


@pytest.mark.parametrize("topic", NATS_SHAPES)
def test_wildcards_and_empty_tokens_are_refused_at_registration_and_at_publish(topic: str) -> None:
    spec = {
        "target": {"type": "queue", "broker": "nats", "topic": topic},
        "schedule": {"run_at": "2026-12-01T01:00:00Z"},
    }
    with pytest.raises(InvalidRequest):
        parse_job_spec(spec, now=NOW)
    assert TopicPolicy().refusal(Broker.NATS, topic, "acme") is not None


@pytest.mark.parametrize("topic", ["duetime.events", "duetime.runsx", "duetime.tests.x"])
def test_other_duetime_subjects_stay_usable(topic: str) -> None:
    assert TopicPolicy().refusal(Broker.NATS, topic, "acme") is None
