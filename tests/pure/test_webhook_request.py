"""The bytes of a webhook request, as ``workers.webhook`` builds them from a remembered head.

A target's request line, ``Host``, the client's and the job's headers are remembered per (URL,
method, job headers, policy) (``prepare``), and the contract's headers are written straight into
one string per call (``contract_head``). The reference is the form it replaced, kept as the
documented one: ``contract_headers`` and ``request_headers`` as a dict, ``traceparent`` set on it,
written by ``http1.encode_request``. Both must give the same bytes for every delivery, and what
is remembered must never carry one job's or one owner's values into another's call.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.core import signing, ssrf
from duetime.core.model import JobSpec, OneOffSchedule, Outcome, WebhookMethod, WebhookTarget
from duetime.core.runpath import Delivery, FencedRun, RunContext, RunSpec
from duetime.workers import http1, webhook
from duetime.workers.tracing import TRACEPARENT

OPEN = ssrf.AddressPolicy(allow_private=True)
NOW = datetime(2026, 12, 1, 0, 0, 3, 250000, tzinfo=UTC)
TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def reference(target: WebhookTarget, d: Delivery, body: bytes, now: datetime) -> bytes:
    """The request as ``webhook.call`` wrote it before the head was remembered."""
    headers = webhook.request_headers(target, webhook.contract_headers(d, body, now))
    if d.traceparent is not None:
        headers[TRACEPARENT] = d.traceparent
    judged = webhook.judge_url(target.url, OPEN)
    assert judged.url is not None
    endpoint = webhook.endpoint_of(judged.url)
    return http1.encode_request(target.method.value, endpoint, webhook._DEFAULT_HEAD, headers, body)


def built(target: WebhookTarget, d: Delivery, body: bytes, now: datetime) -> bytes:
    prepared = webhook.prepare(target, OPEN)
    assert prepared.judged.refusal is None and prepared.bad_header is None
    return webhook.request_bytes(prepared, target, d, body, now)


def delivery(target: WebhookTarget, **overrides: object) -> Delivery:
    fields: dict[str, object] = {
        "job_id": "0b5c3c1e-8d1f-4c7e-9a51-7f0e2a4b9d10",
        "scheduled_for": datetime(2026, 12, 1, tzinfo=UTC),
        "attempt": 1,
        "fencing_token": 41,
        "owner": "acme",
        "signing_secret": signing.new_signing_secret(),
        "payload": {"n": 1},
        "target": target,
    }
    fields.update(overrides)
    return Delivery(**fields)  # type: ignore[arg-type]


def header_lines(request: bytes) -> dict[str, str]:
    head = request.split(b"\r\n\r\n", 1)[0].decode()
    return dict(line.split(": ", 1) for line in head.split("\r\n")[1:])


_URLS = st.sampled_from(
    [
        "http://127.0.0.1:8080/hook",
        "https://example.com/a b?q=1&r=é#frag",
        "http://LOCALHOST:80/",
        "https://bücher.example/x",
        "http://[::1]:9000/v1/hooks?x",
    ]
)
_NAMES = st.sampled_from(
    ["X-Tenant", "Authorization", "traceparent", "Traceparent", "Content-Type", "duetime-attempt"]
)
# Any text but control characters, and a lone surrogate (left out of the bytes, as before).
_VALUES = st.text(alphabet=st.characters(blacklist_categories=["Cc"]), max_size=20) | st.just("a\ud800b")


_CASES = st.fixed_dictionaries(
    {
        "url": _URLS,
        "method": st.sampled_from(list(WebhookMethod)),
        "job_headers": st.dictionaries(_NAMES, _VALUES, max_size=4),
        "job_id": st.uuids().map(str),
        "micro": st.integers(0, 999_999),
        "attempt": st.integers(1, 1000),
        "token": st.integers(1, 2**62),
        "event": st.none() | st.sampled_from(["job.failing", "job.paused"]),
        "extra": st.integers(0, 2),
        "traceparent": st.none() | st.just(TRACE),
        "payload": st.none() | st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
        "seconds": st.integers(0, 10**6),
        "context": st.none()
        | st.builds(
            RunContext,
            spec_version=st.integers(1, 10**6),
            previous_for=st.none() | st.just(datetime(2026, 11, 30, tzinfo=UTC)),
            last_success_for=st.none() | st.just(datetime(2026, 11, 29, 0, 0, 0, 5, tzinfo=UTC)),
            folded_count=st.integers(1, 10**6),
            folded_from=st.none() | st.just(datetime(2026, 11, 28, tzinfo=UTC)),
        ),
    }
)


@settings(max_examples=200, deadline=None)
@given(case=_CASES)
def test_the_remembered_head_writes_the_bytes_the_header_dict_did(case: dict[str, Any]) -> None:
    target = WebhookTarget(url=case["url"], method=case["method"], headers=case["job_headers"])
    d = delivery(
        target,
        job_id=case["job_id"],
        scheduled_for=datetime(2026, 12, 1, 0, 0, 0, case["micro"], tzinfo=UTC),
        attempt=case["attempt"],
        fencing_token=case["token"],
        event=case["event"],
        extra_signing_secrets=tuple(signing.new_signing_secret() for _ in range(case["extra"])),
        traceparent=case["traceparent"],
        payload=case["payload"],
        context=case["context"],
    )
    body = signing.encode_body(case["payload"])
    now = NOW + timedelta(seconds=case["seconds"])
    assert built(target, d, body, now) == reference(target, d, body, now)


def test_a_job_whose_headers_change_sends_its_new_headers() -> None:
    """The head is remembered by the headers' values: the next call after a change carries the
    new ones (and a call with the old ones, e.g. a run fenced before the change, the old)."""
    url = "http://127.0.0.1:8080/hook"
    before = WebhookTarget(url=url, headers={"Authorization": "Bearer old", "X-A": "1"})
    after = WebhookTarget(url=url, headers={"Authorization": "Bearer new"})
    reordered = WebhookTarget(url=url, headers={"X-A": "1", "Authorization": "Bearer old"})
    put = replace(before, method=WebhookMethod.PUT)
    for target in (before, after, before, reordered, put):
        d = delivery(target)
        body = signing.encode_body(d.payload)
        request = built(target, d, body, NOW)
        assert request == reference(target, d, body, NOW)
        sent = header_lines(request)
        assert {k: sent[k] for k in target.headers} == target.headers
        assert "X-A" in sent if "X-A" in target.headers else "X-A" not in sent
        assert request.startswith(f"{target.method.value} /hook HTTP/1.1\r\n".encode())
    head = built(reordered, delivery(reordered), b"null", NOW).split(b"\r\n")
    assert head[4:6] == [b"X-A: 1", b"Authorization: Bearer old"]


def test_two_owners_on_one_target_each_sign_with_their_own_secret() -> None:
    target = WebhookTarget(url="http://127.0.0.1:8080/hook", headers={"X-Tenant": "shared"})
    owners = {name: signing.new_signing_secret() for name in ("alice", "bob", "carol")}
    body = b'{"n":1}'
    for _ in range(3):
        for name, secret in owners.items():
            d = delivery(target, owner=name, signing_secret=secret, job_id=str(uuid.uuid4()))
            sent = header_lines(built(target, d, body, NOW))
            assert signing.verify_signature(secret, sent, body, now=NOW)
            for other, other_secret in owners.items():
                if other != name:
                    assert not signing.verify_signature(other_secret, sent, body, now=NOW)


def test_a_bad_header_is_refused_even_beside_a_good_remembered_target() -> None:
    url = "http://127.0.0.1:8080/hook"
    good = webhook.prepare(WebhookTarget(url=url, headers={"X-A": "1"}), OPEN)
    bad = webhook.prepare(WebhookTarget(url=url, headers={"X-A": "1\r\nX-Injected: 1"}), OPEN)
    assert good.bad_header is None
    assert bad.bad_header is not None
    assert (bad.bad_header.outcome, bad.bad_header.retryable) == (Outcome.FAILED, False)
    assert bad.bad_header.error == "job header 'X-A' is not a valid HTTP header"


def test_a_refused_url_is_refused_whatever_the_headers() -> None:
    strict = ssrf.AddressPolicy()
    for headers in ({}, {"X-A": "1"}):
        prepared = webhook.prepare(WebhookTarget(url="http://127.0.0.1/hook", headers=headers), strict)
        assert prepared.judged.refusal is not None
        assert prepared.endpoint is None


def test_a_delivery_built_with_its_rotation_and_trace_is_the_copied_one() -> None:
    """``Delivery.of`` takes the extra secrets and the traceparent, so no caller copies the
    record to add them; what it builds is what the copy was."""
    target = WebhookTarget(url="http://127.0.0.1:8080/hook")
    spec = RunSpec.of(JobSpec(schedule=OneOffSchedule(NOW), target=target, payload={"n": 1}))
    run = FencedRun(
        job_id=uuid.uuid4(),
        shard=3,
        owner="acme",
        lease_token=9,
        scheduled_for=NOW,
        due_at=NOW,
        attempt=2,
        spec=spec,
        run_kind="one_off",
        parent_id=uuid.uuid4(),
    )
    built = Delivery.of(run, signing_secret="whsec_a", extra_signing_secrets=("whsec_b",), traceparent=TRACE)
    copied = replace(
        Delivery.of(run, signing_secret="whsec_a"), extra_signing_secrets=("whsec_b",), traceparent=TRACE
    )
    assert built == copied
    assert built.job_id == str(run.parent_id)


def test_each_status_gets_its_verdict_once_made() -> None:
    for status in (200, 204, 301, 404, 408, 429, 500, 503, 599):
        assert webhook.classify_status(status) is webhook.classify_status(status)
        assert webhook.classify_status(status) == webhook._status_verdict(status)


def test_a_runs_context_is_sent_between_the_token_and_the_signature() -> None:
    """A run's call carries its spec version always, the other context headers when they have a
    value (docs/targets.md); a failure event's call (no context) carries none of them."""
    target = WebhookTarget(url="http://127.0.0.1:8080/hook")
    body = b"null"
    plain = header_lines(built(target, delivery(target, context=RunContext(4)), body, NOW))
    assert plain["Duetime-Spec-Version"] == "4"
    assert not {"Duetime-Previous-Scheduled-For", "Duetime-Folded-Count"} & set(plain)
    full = RunContext(
        4,
        previous_for=datetime(2026, 11, 30, 23, tzinfo=UTC),
        last_success_for=datetime(2026, 11, 30, 22, tzinfo=UTC),
        folded_count=5,
        folded_from=datetime(2026, 11, 30, 18, 0, 0, 250000, tzinfo=UTC),
    )
    request = built(target, delivery(target, context=full), body, NOW)
    names = [line.split(": ", 1)[0] for line in request.split(b"\r\n\r\n")[0].decode().split("\r\n")[1:]]
    token = names.index("Duetime-Fencing-Token")
    assert names[token + 1 : token + 7] == [
        "Duetime-Spec-Version",
        "Duetime-Previous-Scheduled-For",
        "Duetime-Last-Success-Scheduled-For",
        "Duetime-Folded-Count",
        "Duetime-Folded-From",
        "webhook-id",
    ]
    sent = header_lines(request)
    assert sent["Duetime-Previous-Scheduled-For"] == "2026-11-30T23:00:00Z"
    assert sent["Duetime-Last-Success-Scheduled-For"] == "2026-11-30T22:00:00Z"
    assert (sent["Duetime-Folded-Count"], sent["Duetime-Folded-From"]) == ("5", "2026-11-30T18:00:00.25Z")
    event = header_lines(built(target, delivery(target, event="job.failing"), body, NOW))
    assert not [name for name in event if name in {n for n, _ in full.headers()}]


def test_a_delivery_of_a_run_carries_the_context_its_fence_read() -> None:
    """``Delivery.of`` works the context out from the run as fenced: the spec version it runs
    under, the schedule's occurrence before (none for the job's first), the last success, and
    what a run_once run folded (counted by the schedule)."""
    from duetime.core.model import CronSchedule

    hourly = JobSpec(schedule=CronSchedule(cron="0 * * * *"), target=WebhookTarget(url="http://127.0.0.1/h"))
    created = datetime(2026, 11, 30, 20, 30, tzinfo=UTC)
    run = FencedRun(
        job_id=uuid.uuid4(),
        shard=0,
        owner="acme",
        lease_token=3,
        scheduled_for=datetime(2026, 12, 1, 2, tzinfo=UTC),
        due_at=datetime(2026, 12, 1, 2, tzinfo=UTC),
        attempt=1,
        spec=RunSpec.of(hourly, 6),
        run_kind="scheduled",
        job_created_at=created,
        last_success_for=datetime(2026, 11, 30, 22, tzinfo=UTC),
        folded_from=datetime(2026, 11, 30, 23, tzinfo=UTC),
    )
    assert Delivery.of(run, signing_secret="whsec_a").context == RunContext(
        6,
        previous_for=datetime(2026, 12, 1, 1, tzinfo=UTC),
        last_success_for=datetime(2026, 11, 30, 22, tzinfo=UTC),
        folded_count=3,  # 23:00, 00:00 and 01:00 were missed; the run is 02:00's
        folded_from=datetime(2026, 11, 30, 23, tzinfo=UTC),
    )
    first = replace(run, scheduled_for=datetime(2026, 11, 30, 21, tzinfo=UTC), folded_from=None)
    assert Delivery.of(first, signing_secret="whsec_a").context == RunContext(
        6, last_success_for=datetime(2026, 11, 30, 22, tzinfo=UTC)
    ), "the job's first occurrence has none before it"
    one_off = replace(run, spec=RunSpec.of(JobSpec(schedule=OneOffSchedule(NOW), target=hourly.target), 1))
    assert Delivery.of(one_off, signing_secret="whsec_a").context == RunContext(
        1, last_success_for=datetime(2026, 11, 30, 22, tzinfo=UTC)
    ), "a one-off has no occurrence before, and folds nothing"
