"""One reading of a webhook URL and one set of reserved headers, shared by registration, the
SSRF guard and the worker (issue 17, item 4): a string judged twice must be judged alike."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from duetime.core import signing
from duetime.core.errors import InvalidRequest, TargetNotAllowed
from duetime.core.headers import RESERVED_HEADER_PREFIXES, RESERVED_HEADERS, is_reserved_header
from duetime.core.model import WebhookMethod, WebhookTarget
from duetime.core.ssrf import AddressPolicy, check_url
from duetime.core.validation import parse_job_spec
from duetime.core.weburl import same_origin, split_webhook_url
from duetime.workers.webhook import request_headers

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def _spec(url: str, headers: dict[str, str] | None = None) -> object:
    target: dict[str, object] = {"type": "webhook", "url": url}
    if headers is not None:
        target["headers"] = headers
    return {"target": target, "schedule": {"run_at": "2026-12-01T01:00:00Z"}}


@pytest.mark.parametrize(
    "name",
    [
        *sorted(signing.CONTRACT_HEADERS),
        "Content-Type",
        "content-length",
        "Host",
        "Transfer-Encoding",
        "Connection",
        "TE",
        "Upgrade",
        "User-Agent",
        "accept",
    ],
)
def test_what_the_worker_drops_registration_refuses(name: str) -> None:
    assert is_reserved_header(name)
    with pytest.raises(InvalidRequest) as info:
        parse_job_spec(_spec("https://example.com/", {name: "x"}), now=NOW)
    assert info.value.code == "reserved_header"
    target = WebhookTarget(url="https://example.com/", method=WebhookMethod.POST, headers={name: "x"})
    sent = request_headers(target, {})
    assert [k for k in sent if k.lower() == name.lower() and sent[k] == "x"] == []


@pytest.mark.parametrize(
    "url",
    [
        "http://8.8.8.8:99999/",
        "http://8.8.8.8:0/",
        "http:///path",
        "http:8.8.8.8/",
        "http://[2606:4700::1111]x/",
        "ftp://8.8.8.8/",
    ],
)
def test_registration_and_the_guard_refuse_the_same_unreadable_urls(url: str) -> None:
    with pytest.raises(InvalidRequest) as at_registration:
        parse_job_spec(_spec(url), now=NOW)
    with pytest.raises(InvalidRequest) as at_call:
        check_url(url, AddressPolicy())
    assert at_registration.value.code == at_call.value.code == "invalid_url"


def test_the_guard_reads_the_host_after_the_userinfo() -> None:
    assert split_webhook_url("http://8.8.8.8:80@[::1]:81/").host == "[::1]"
    with pytest.raises(TargetNotAllowed):
        check_url("http://8.8.8.8:80@[::1]:81/", AddressPolicy())


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("https://example.com/a", "https://EXAMPLE.com./b?x=1", True),
        ("https://example.com/a", "https://example.com:443/a", True),
        ("http://example.com/a", "http://example.com:80/", True),
        ("https://example.com/a", "http://example.com/a", False),
        ("https://example.com/a", "https://example.org/a", False),
        ("https://example.com/a", "https://example.com:8443/a", False),
        ("https://example.com/a", "https://evil.example.com/a", False),
    ],
)
def test_same_origin(a: str, b: str, same: bool) -> None:
    assert same_origin(a, b) is same


def test_the_reserved_headers_of_docs_targets_md_are_the_code_s() -> None:
    """docs/targets.md lists the headers a job may not set, in its "Reserved headers" paragraph;
    that list and ``core.headers`` are one: a name the docs call Duetime's is refused, and the
    code refuses no name the docs do not list."""
    text = (Path(__file__).parents[2] / "docs" / "targets.md").read_text()
    paragraph = text[text.index("Reserved headers:") :].split("\n\n", 1)[0]
    listed = {name.lower() for name in re.findall(r"`([A-Za-z-]+\*?)`", paragraph)}
    assert listed == set(RESERVED_HEADERS) | {f"{prefix}*" for prefix in RESERVED_HEADER_PREFIXES}
    table = text[text.index("| header | example | meaning |") :].split("\n\n", 1)[0]
    sent = {name.lower() for name in re.findall(r"^\| `([A-Za-z-]+)`", table, flags=re.MULTILINE)}
    assert sent and all(is_reserved_header(name) for name in sent), sent
