"""The worker's remembered URL verdict (``workers.webhook.judge_url``) is the guard's verdict.

``judge_url`` remembers, per (URL, policy), what ``check_url`` and the literal check say, so a
burst does not re-read the same URL before every call. These tests hold it to the guard's own
catalogue (tests/pure/test_ssrf.py): every spelling refused there is refused here, on the first
and on a remembered answer, and a URL's verdict under one policy never leaks into another.
"""

from __future__ import annotations

import ipaddress

import pytest

from duetime.core.model import Outcome
from duetime.core.ssrf import AddressPolicy, parse_host_literal
from duetime.workers.webhook import judge_url
from tests.pure.test_ssrf import (
    LOOPBACK_NAMES,
    LOOPBACK_V4_SPELLINGS,
    LOOPBACK_V6_SPELLINGS,
    OTHER_REFUSED,
    PUBLIC_LITERALS,
)

STRICT = AddressPolicy()
OPEN = AddressPolicy(allow_private=True)
REFUSED = LOOPBACK_V4_SPELLINGS + LOOPBACK_V6_SPELLINGS + LOOPBACK_NAMES + OTHER_REFUSED


@pytest.mark.parametrize("host", REFUSED)
def test_every_refused_spelling_stays_refused_when_remembered(host: str) -> None:
    url = f"http://{host}:8080/hook"
    for _ in range(2):  # the second answer comes from the cache
        judged = judge_url(url, STRICT)
        assert judged.refusal is not None
        assert (judged.refusal.outcome, judged.refusal.retryable) == (Outcome.FAILED, False)
        assert judged.refusal.error is not None
        assert judged.refusal.error.startswith(("target_not_allowed:", "invalid webhook URL"))


@pytest.mark.parametrize("host", [h for h in REFUSED if parse_host_literal(h) is not None])
def test_a_policy_does_not_inherit_another_policys_verdict(host: str) -> None:
    url = f"http://{host}:8081/hook"
    assert judge_url(url, OPEN).refusal is None
    assert judge_url(url, STRICT).refusal is not None
    assert judge_url(url, OPEN).refusal is None
    loopback_only = AddressPolicy(allow_cidrs=(ipaddress.ip_network("127.0.0.0/8"),))
    verdict = judge_url(url, loopback_only).refusal
    # Opening 127/8 opens the IPv4 loopback spellings (and their mapped forms), nothing else.
    assert (verdict is None) == (
        loopback_only.permits(parse_host_literal(host))  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("host", PUBLIC_LITERALS)
def test_public_literals_are_called(host: str) -> None:
    judged = judge_url(f"https://{host}/hook", STRICT)
    assert judged.refusal is None
    assert judged.url is not None
    assert not judged.resolve_literal
