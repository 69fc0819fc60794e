"""The grammar of names, labels and label selectors (api-v1.md, "Additions: names, labels")."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from duetime.core.codec import spec_from_json, spec_to_json
from duetime.core.errors import InvalidRequest, MalformedRequest
from duetime.core.labels import parse_bulk_request, parse_label_query, parse_labels, parse_name
from duetime.core.model import JobState
from duetime.core.validation import merge_patch, parse_job_spec

NOW = datetime(2026, 12, 1, tzinfo=UTC)
BASE: dict[str, Any] = {
    "target": {"type": "queue", "broker": "nats", "topic": "t"},
    "schedule": {"cron": "@hourly"},
}


# "." is no longer among them: the second probe's contract refuses "." and ".." and any name with
# a "/./" or "/../" segment (422 invalid_name, tests/pure/test_validation.py); dots inside a segment
# are fine.
@pytest.mark.parametrize(
    "name",
    [
        "a",
        "billing/nightly-report",
        "x:y.z_w-1",
        "A" * 200,
        "9",
        "a/b/c",
        ".hidden",
        "v1.2/x",
        "team:db/backup",
    ],
)
def test_names_the_contract_allows(name: str) -> None:
    assert parse_name(name) == name
    assert parse_job_spec({**BASE, "name": name}, now=NOW).name == name


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("", "empty"),
        ("/leading", "start with '/'"),
        ("A" * 201, "at most 200"),
        ("with space", "' '"),
        ("tab\tname", "U+0009"),
        ("naïve", "'ï'"),
        ("a?b", "'?'"),
        ("a#b", "'#'"),
        ("100%", "'%'"),
    ],
)
def test_names_the_contract_refuses(name: str, words: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        parse_job_spec({**BASE, "name": name}, now=NOW)
    assert err.value.field == "name"
    assert words in err.value.message


def test_a_name_of_the_wrong_type_is_a_400() -> None:
    with pytest.raises(MalformedRequest):
        parse_job_spec({**BASE, "name": 5}, now=NOW)
    assert parse_job_spec({**BASE, "name": None}, now=NOW).name is None


def test_labels_default_to_empty_and_round_trip_through_the_codec() -> None:
    spec = parse_job_spec(BASE, now=NOW)
    assert spec.labels == {}
    labelled = parse_job_spec({**BASE, "labels": {"team": "billing", "app.io/tier": ""}}, now=NOW)
    assert labelled.labels == {"team": "billing", "app.io/tier": ""}
    assert spec_from_json(spec_to_json(labelled)) == labelled
    assert spec_to_json(labelled)["labels"] == {"team": "billing", "app.io/tier": ""}


def test_a_spec_stored_before_labels_existed_reads_as_no_labels() -> None:
    stored = spec_to_json(parse_job_spec(BASE, now=NOW))
    del stored["labels"]
    assert spec_from_json(stored).labels == {}


@pytest.mark.parametrize(
    "key", ["a", "team", "app.kubernetes.io/name", "a-b_c.d", "x" * 63, "0", "k8s/app-1"]
)
def test_label_keys_the_contract_allows(key: str) -> None:
    assert parse_labels({key: "v"}) == {key: "v"}


@pytest.mark.parametrize("key", ["", "Team", "-a", "a-", "a.", "/a", "a/", "x" * 64, "a b", "a=b", "ü"])
def test_label_keys_the_contract_refuses(key: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        parse_labels({key: "v"})
    assert err.value.code == "invalid_label"
    assert err.value.field == f"labels.{key}"


def test_label_values_and_counts() -> None:
    assert parse_labels({"k": "v" * 200}) == {"k": "v" * 200}
    with pytest.raises(InvalidRequest, match="at most 200"):
        parse_labels({"k": "v" * 201})
    with pytest.raises(MalformedRequest):
        parse_labels({"k": 1})
    with pytest.raises(MalformedRequest):
        parse_labels(["k"])
    assert len(parse_labels({f"k{i}": "v" for i in range(32)})) == 32
    with pytest.raises(InvalidRequest, match="at most 32"):
        parse_labels({f"k{i}": "v" for i in range(33)})
    with pytest.raises(InvalidRequest, match="NUL"):
        parse_labels({"k": "a\x00b"})


def test_a_patch_replaces_the_labels_whole() -> None:
    current = spec_to_json(parse_job_spec({**BASE, "labels": {"a": "1", "b": "2"}}, now=NOW))
    merged = merge_patch(current, {"labels": {"c": "3"}})
    assert parse_job_spec(merged, now=NOW).labels == {"c": "3"}
    assert parse_job_spec(merge_patch(current, {"labels": {}}), now=NOW).labels == {}
    assert parse_job_spec(merge_patch(current, {"jitter_s": 1}), now=NOW).labels == {"a": "1", "b": "2"}


def test_label_query_parameters() -> None:
    assert parse_label_query(["team=billing", "env=", "expr=a=b"]) == {
        "team": "billing",
        "env": "",
        "expr": "a=b",
    }
    assert parse_label_query(["team=x", "team=x"]) == {"team": "x"}
    with pytest.raises(InvalidRequest, match="KEY=VALUE"):
        parse_label_query(["team"])
    with pytest.raises(InvalidRequest, match="twice"):
        parse_label_query(["team=a", "team=b"])
    with pytest.raises(InvalidRequest):
        parse_label_query(["Team=a"])


def test_bulk_requests() -> None:
    assert parse_bulk_request({"labels": {"team": "a"}}) == ({"team": "a"}, None)
    assert parse_bulk_request({"labels": {"team": "a"}, "state": "paused"}) == (
        {"team": "a"},
        JobState.PAUSED,
    )
    bodies: list[dict[str, Any]] = [{}, {"labels": {}}, {"labels": None}, {"state": "paused"}]
    for body in bodies:
        with pytest.raises(InvalidRequest) as err:
            parse_bulk_request(body)
        assert err.value.code == "selector_required"
    with pytest.raises(InvalidRequest) as err:
        parse_bulk_request({"labels": {"a": "b"}, "state": "running"})
    assert err.value.code == "invalid_state"
    with pytest.raises(InvalidRequest) as err:
        parse_bulk_request({"labels": {"a": "b"}, "owner": "x"})
    assert err.value.code == "unknown_field"
    with pytest.raises(MalformedRequest):
        parse_bulk_request([])
