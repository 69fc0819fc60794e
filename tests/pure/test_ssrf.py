"""The SSRF guard, judged on a catalogue of hostile spellings and on real loopback listeners.

The canary test is the one that matters most: it points every loopback spelling at live TCP
listeners and proves no byte ever reached them, with a positive control showing the listeners
would have counted a connection.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address
from typing import Any

import pytest

from duetime.core.errors import InvalidRequest, TargetNotAllowed
from duetime.core.ssrf import (
    AddressPolicy,
    ResolutionFailed,
    check_url,
    check_webhook_url,
    normalize_host,
    parse_host_literal,
    refusal_reason,
    resolve_checked,
)

STRICT = AddressPolicy()

# Every spelling a resolver (glibc inet_aton, IDNA, URL parsers) reads as a loopback address.
LOOPBACK_V4_SPELLINGS = [
    "127.0.0.1",
    "127.1",
    "127.0.1",
    "127.000.000.001",
    "0x7f.1",
    "0x7F.0.0.1",
    "0x7f.0x0.0x0.0x1",
    "0x7f000001",
    "2130706433",
    "0177.0.0.1",
    "0177.1",
    "017700000001",
    "127.0.0.1.",
    "127.255.255.254",
    "%31%32%37.0.0.1",
    "１２７。０。０。１",
    "127。0。0。1",
    "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
    "[0:0:0:0:0:ffff:127.0.0.1]",
    "[::127.0.0.1]",
    "[64:ff9b::7f00:1]",
    "[2002:7f00:1::]",
]
LOOPBACK_V6_SPELLINGS = ["[::1]", "[0:0:0:0:0:0:0:1]", "[0000::0001]", "[::1%25lo]"]
LOOPBACK_NAMES = [
    "localhost",
    "LOCALHOST",
    "localhost.",
    "foo.localhost",
    "a.b.localhost",
    "localhost.localdomain",
    "ip6-localhost",
    "ｌｏｃａｌｈｏｓｔ",
    "local\u00adhost",
]

OTHER_REFUSED = [
    "10.0.0.1",
    "10.255.255.255",
    "012.0.0.1",
    "172.16.0.1",
    "172.31.255.254",
    "192.168.1.1",
    "0xc0a80101",
    "3232235777",
    "100.64.0.1",
    "100.127.255.255",
    "169.254.169.254",
    "0xa9fea9fe",
    "2852039166",
    "169.254.0.1",
    "100.100.100.200",
    "168.63.129.16",
    "224.0.0.1",
    "239.255.255.250",
    "0.0.0.0",
    "0",
    "0.1.2.3",
    "255.255.255.255",
    "240.0.0.1",
    "198.18.0.1",
    "198.19.255.255",
    "192.0.2.1",
    "198.51.100.7",
    "203.0.113.9",
    "192.0.0.8",
    "[::]",
    "[fd00:ec2::254]",
    "[fd12:3456::1]",
    "[fc00::1]",
    "[fe80::1]",
    "[fe80::1%25eth0]",
    "[fec0::1]",
    "[ff02::1]",
    "[::ffff:10.0.0.1]",
    "[::ffff:169.254.169.254]",
    "[64:ff9b::a00:1]",
    "[64:ff9b:1::1]",
    "[2002:a00:1::]",
    "[2002:c0a8:101::1]",
    "[2001:db8::1]",
    "[2001::1]",
    "[100::1]",
    "metadata",
    "metadata.google.internal",
    "db.internal",
    "printer.local",
    "router.home.arpa",
    "redis",
]

PUBLIC_LITERALS = [
    "8.8.8.8",
    "1.1.1.1",
    "0x08080808",
    "134744072",
    "[2606:4700::1111]",
    "[2001:4860:4860::8888]",
    "[::ffff:8.8.8.8]",
    "[64:ff9b::808:808]",
    "[2002:808:808::1]",
]


def test_catalogue_is_large_enough() -> None:
    refused = LOOPBACK_V4_SPELLINGS + LOOPBACK_V6_SPELLINGS + LOOPBACK_NAMES + OTHER_REFUSED
    assert len(set(refused)) == len(refused) >= 40


@pytest.mark.parametrize(
    "host", LOOPBACK_V4_SPELLINGS + LOOPBACK_V6_SPELLINGS + LOOPBACK_NAMES + OTHER_REFUSED
)
def test_check_url_refuses(host: str) -> None:
    with pytest.raises(TargetNotAllowed) as info:
        check_url(f"https://{host}/hook", STRICT)
    assert info.value.code == "target_not_allowed"
    assert info.value.field == "target.url"
    assert "DUETIME_WEBHOOK_ALLOW_PRIVATE" in info.value.message


@pytest.mark.parametrize(
    "host",
    [h for h in LOOPBACK_V4_SPELLINGS + LOOPBACK_V6_SPELLINGS + OTHER_REFUSED if parse_host_literal(h)],
)
def test_check_url_refuses_literals_with_port_and_path(host: str) -> None:
    with pytest.raises(TargetNotAllowed):
        check_url(f"http://{host}:8080/a/b?c=d", STRICT)


@pytest.mark.parametrize("host", PUBLIC_LITERALS)
def test_check_url_accepts_public_literals(host: str) -> None:
    check_url(f"https://{host}/hook", STRICT)


@pytest.mark.parametrize("host", PUBLIC_LITERALS)
async def test_check_webhook_url_accepts_public_literals_without_dns(
    host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = asyncio.get_running_loop()

    async def no_dns(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a literal must not be resolved")

    monkeypatch.setattr(loop, "getaddrinfo", no_dns)
    await check_webhook_url(f"https://{host}:443/x", STRICT)


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.1", "127.0.0.1"),
        ("127.0.1", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("017700000001", "127.0.0.1"),
        ("10.1", "10.0.0.1"),
        ("192.168.257", "192.168.1.1"),
        ("0300.0250.1.1", "192.168.1.1"),
        ("4294967295", "255.255.255.255"),
        ("127.0.0.1.", "127.0.0.1"),
        ("0000000000000000000000000000177.1", "127.0.0.1"),
        ("127.0.0.1 trailing", "127.0.0.1"),
        ("[::1]", "::1"),
        ("::1", "::1"),
        ("[fe80::1%25eth0]", "fe80::1"),
        ("fe80::1%eth0", "fe80::1"),
        ("[::ffff:127.0.0.1]", "::ffff:7f00:1"),
        ("８.８.８.８", "8.8.8.8"),
    ],
)
def test_parse_host_literal_reads_resolver_spellings(host: str, expected: str) -> None:
    assert parse_host_literal(host) == ip_address(expected)


@pytest.mark.parametrize(
    "host",
    [
        "example.com",
        "4294967296",
        "256.0.0.1",
        "1.256.0.1",
        "1.2.3.4.5",
        "08.0.0.1",
        "0x1g.0.0.1",
        "1..1",
        "",
        ".",
        "[not-v6]",
        "1.2.3.-4",
        "+1.2.3.4",
        "1_0.0.0.1",
        "١٢٧.0.0.1",
        "9" * 5000,
        "0x" + "f" * 5000,
    ],
)
def test_parse_host_literal_leaves_names_alone(host: str) -> None:
    assert parse_host_literal(host) is None


@pytest.mark.parametrize(
    ("address", "fragment"),
    [
        ("127.0.0.1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.20.0.1", "private"),
        ("192.168.0.1", "private"),
        ("100.64.0.1", "carrier-grade NAT"),
        ("169.254.1.1", "link-local"),
        ("169.254.169.254", "metadata"),
        ("100.100.100.200", "metadata"),
        ("224.0.0.251", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("255.255.255.255", "broadcast"),
        ("250.1.2.3", "reserved"),
        ("198.18.5.5", "benchmarking"),
        ("192.0.2.10", "documentation"),
        ("::", "unspecified"),
        ("::1", "loopback"),
        ("fd00:ec2::254", "metadata"),
        ("fd01::1", "unique local"),
        ("fe80::abcd", "link-local"),
        ("ff05::2", "multicast"),
        ("2001:db8:1::1", "documentation"),
        ("::ffff:192.168.0.1", "IPv4-mapped"),
        ("::10.0.0.1", "IPv4-compatible"),
        ("::8.8.8.8", "IPv4-compatible"),
        ("64:ff9b::a9fe:a9fe", "NAT64"),
        ("2002:a9fe:a9fe::", "6to4"),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"),
    ],
)
def test_refusal_reason_names_the_class(address: str, fragment: str) -> None:
    reason = refusal_reason(ip_address(address))
    assert reason is not None
    assert fragment.lower() in reason.lower()


@pytest.mark.parametrize(
    "address",
    ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700::1111", "2a00:1450:4001::200e", "::ffff:1.1.1.1"],
)
def test_refusal_reason_accepts_global_unicast(address: str) -> None:
    assert refusal_reason(ip_address(address)) is None


def test_scoped_ipv6_is_judged_without_its_zone() -> None:
    assert refusal_reason(IPv6Address("fe80::1%eth0")) is not None
    assert refusal_reason(IPv6Address("2606:4700::1111%eth0")) is None


# --- policy -----------------------------------------------------------------------------------


def test_allow_private_allows_everything() -> None:
    policy = AddressPolicy(allow_private=True)
    for host in LOOPBACK_V4_SPELLINGS + LOOPBACK_V6_SPELLINGS + LOOPBACK_NAMES + OTHER_REFUSED:
        check_url(f"http://{host}/", policy)


def test_allow_cidrs_opens_only_those_networks() -> None:
    policy = AddressPolicy(allow_cidrs=(IPv4Network("10.20.0.0/16"), IPv6Network("fd12::/16")))
    check_url("http://10.20.3.4/", policy)
    check_url("http://0x0a140304/", policy)  # the same address, spelled as hex
    check_url("http://[::ffff:10.20.3.4]/", policy)  # mapped IPv6 counts as its IPv4
    check_url("http://[fd12::5]/", policy)
    for host in ("10.21.0.1", "127.0.0.1", "[fd13::1]", "169.254.169.254", "localhost"):
        with pytest.raises(TargetNotAllowed):
            check_url(f"http://{host}/", policy)
    # with an allow-list, internal-looking names are left to resolution
    check_url("http://billing.internal/", policy)
    check_url("http://billing/", policy)


def test_allow_cidrs_with_loopback_opens_localhost_names() -> None:
    policy = AddressPolicy(allow_cidrs=(IPv4Network("127.0.0.0/8"),))
    check_url("http://localhost:9000/", policy)
    check_url("http://127.0.0.1:9000/", policy)
    with pytest.raises(TargetNotAllowed):
        check_url("http://[::1]:9000/", policy)


@pytest.mark.parametrize(
    ("env", "allow_private", "cidrs"),
    [
        ({}, False, ()),
        ({"DUETIME_WEBHOOK_ALLOW_PRIVATE": "1"}, True, ()),
        ({"DUETIME_WEBHOOK_ALLOW_PRIVATE": "true"}, True, ()),
        ({"DUETIME_WEBHOOK_ALLOW_PRIVATE": " TRUE "}, True, ()),
        ({"DUETIME_WEBHOOK_ALLOW_PRIVATE": "0"}, False, ()),
        ({"DUETIME_WEBHOOK_ALLOW_PRIVATE": "false"}, False, ()),
        ({"DUETIME_WEBHOOK_ALLOW_PRIVATE": ""}, False, ()),
        (
            {"DUETIME_WEBHOOK_ALLOW_CIDRS": "10.0.0.0/8, fd00::/8 ,,192.168.1.7"},
            False,
            (IPv4Network("10.0.0.0/8"), IPv6Network("fd00::/8"), IPv4Network("192.168.1.7/32")),
        ),
    ],
)
def test_policy_from_env(env: dict[str, str], allow_private: bool, cidrs: tuple[Any, ...]) -> None:
    policy = AddressPolicy.from_env(env)
    assert policy.allow_private is allow_private
    assert policy.allow_cidrs == cidrs


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"DUETIME_WEBHOOK_ALLOW_PRIVATE": "maybe"}, "DUETIME_WEBHOOK_ALLOW_PRIVATE"),
        ({"DUETIME_WEBHOOK_ALLOW_CIDRS": "10.0.0.0/33"}, "'10.0.0.0/33'"),
        ({"DUETIME_WEBHOOK_ALLOW_CIDRS": "10.0.0.1/8"}, "host bits"),
        ({"DUETIME_WEBHOOK_ALLOW_CIDRS": "intranet"}, "'intranet'"),
    ],
)
def test_policy_from_env_refuses_bad_settings(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        AddressPolicy.from_env(env)
    assert fragment in str(info.value)


# --- url shape --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "ftp://8.8.8.8/",
        "javascript:alert(1)",
        "http:///path",
        "http://8.8.8.8:99999/",
        "nonsense",
        "http://[::ffff:0x7f.1]/",
        "http://[::1/",
        "http://exa mple.com/",
        "http://exa%00mple.com/",
        "http://example.com;127.0.0.1/",
    ],
)
def test_check_url_fails_closed_on_unreadable_urls(url: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        check_url(url, STRICT)
    assert info.value.field == "target.url"


def test_userinfo_does_not_hide_the_real_host() -> None:
    with pytest.raises(TargetNotAllowed):
        check_url("http://example.com@127.0.0.1/", STRICT)
    with pytest.raises(TargetNotAllowed):
        check_url("http://8.8.8.8:80@[::1]:80/", STRICT)


# --- resolution -------------------------------------------------------------------------------


def _fake_getaddrinfo(answers: dict[str, list[str]]) -> Callable[..., Any]:
    async def getaddrinfo(host: str, port: int, **kwargs: Any) -> list[Any]:
        if host not in answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        infos = []
        for text in answers[host]:
            family = socket.AF_INET6 if ":" in text else socket.AF_INET
            sockaddr: tuple[Any, ...] = (text, port, 0, 0) if ":" in text else (text, port)
            infos.append((family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", sockaddr))
        return infos

    return getaddrinfo


async def test_resolve_checked_refuses_localhost_by_its_answers() -> None:
    """Here localhost really resolves to 127.0.0.1: the real resolver's answer is judged.

    Allowing only ::1 gets the name past the always-local name rule, so what refuses it is the
    127.0.0.1 answer from the system resolver.
    """
    with pytest.raises(TargetNotAllowed) as info:
        await resolve_checked("localhost", 80, STRICT)
    assert "local host" in info.value.message
    only_v6_loopback = AddressPolicy(allow_cidrs=(IPv6Network("::1/128"),))
    with pytest.raises(TargetNotAllowed) as info:
        await resolve_checked("localhost", 80, only_v6_loopback)
    assert "resolving to 127.0.0.1" in info.value.message


REFUSED_NAMES = [h for h in LOOPBACK_NAMES + OTHER_REFUSED if parse_host_literal(h) is None]


@pytest.mark.parametrize("name", REFUSED_NAMES)
@pytest.mark.parametrize("answer", ["127.0.0.1", "10.1.2.3", "169.254.169.254", "fd00:ec2::254"])
async def test_refused_names_are_also_refused_by_their_resolver_answers(
    name: str, answer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An allow-list holding only ::1 gets every name past the name rule (loopback names because
    ::1 is allowed, internal ones because a list exists), so the resolver's answer refuses it."""
    loop = asyncio.get_running_loop()
    monkeypatch.setattr(loop, "getaddrinfo", _fake_getaddrinfo({normalize_host(name): [answer]}))
    past_name_rule = AddressPolicy(allow_cidrs=(IPv6Network("::1/128"),))
    with pytest.raises(TargetNotAllowed) as info:
        await resolve_checked(name, 443, past_name_rule)
    assert f"resolving to {ip_address(answer)}" in info.value.message


@pytest.mark.parametrize(
    "answers",
    [
        ["127.0.0.1"],
        ["::1"],
        ["10.0.0.7"],
        ["169.254.169.254"],
        ["fd00:ec2::254"],
        ["::ffff:192.168.0.1"],
        ["93.184.216.34", "127.0.0.1"],  # rebinding: one good answer cannot carry a bad one
        ["2606:4700::1111", "fe80::1%eth0"],
    ],
)
async def test_resolve_checked_refuses_any_bad_answer(
    answers: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = asyncio.get_running_loop()
    monkeypatch.setattr(loop, "getaddrinfo", _fake_getaddrinfo({"hook.example.com": answers}))
    with pytest.raises(TargetNotAllowed):
        await resolve_checked("hook.example.com", 443, STRICT)
    with pytest.raises(TargetNotAllowed):
        await check_webhook_url("https://hook.example.com/x", STRICT)


async def test_resolve_checked_returns_the_checked_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()
    answers = ["93.184.216.34", "2606:4700::1111", "93.184.216.34"]
    monkeypatch.setattr(loop, "getaddrinfo", _fake_getaddrinfo({"hook.example.com": answers}))
    result = await resolve_checked("hook.example.com", 443, STRICT)
    assert result == [IPv4Address("93.184.216.34"), IPv6Address("2606:4700::1111")]
    await check_webhook_url("https://hook.example.com/x", STRICT)


async def test_resolve_checked_honours_allow_cidrs(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()
    monkeypatch.setattr(loop, "getaddrinfo", _fake_getaddrinfo({"svc.corp.example": ["10.20.1.1"]}))
    policy = AddressPolicy(allow_cidrs=(IPv4Network("10.20.0.0/16"),))
    assert await resolve_checked("svc.corp.example", 80, policy) == [IPv4Address("10.20.1.1")]
    with pytest.raises(TargetNotAllowed):
        await resolve_checked("svc.corp.example", 80, STRICT)


async def test_unresolvable_name_is_distinct_and_ignored_at_registration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    monkeypatch.setattr(loop, "getaddrinfo", _fake_getaddrinfo({}))
    with pytest.raises(ResolutionFailed) as info:
        await resolve_checked("not-yet.example.com", 443, STRICT)
    assert info.value.code == "target_unresolvable"
    assert not isinstance(info.value, TargetNotAllowed)
    await check_webhook_url("https://not-yet.example.com/", STRICT)


async def test_slow_resolution_times_out_as_unresolvable(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()

    async def hang(*args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(3600)

    monkeypatch.setattr(loop, "getaddrinfo", hang)
    with pytest.raises(ResolutionFailed):
        await resolve_checked("slow.example.com", 443, STRICT, timeout_s=0.05)


async def test_resolve_checked_judges_literals_without_dns(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()
    monkeypatch.setattr(loop, "getaddrinfo", _fake_getaddrinfo({}))
    assert await resolve_checked("[2606:4700::1111]", 443, STRICT) == [IPv6Address("2606:4700::1111")]
    with pytest.raises(TargetNotAllowed):
        await resolve_checked("0x7f.1", 443, STRICT)


# --- canary listeners -------------------------------------------------------------------------


@dataclass
class Canary:
    host: str
    port: int
    server: asyncio.Server
    connections: list[object] = field(default_factory=list)
    connected: asyncio.Event = field(default_factory=asyncio.Event)


async def _start_canary(host: str) -> Canary | None:
    canary: list[Canary] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        canary[0].connections.append(writer.get_extra_info("peername"))
        canary[0].connected.set()
        writer.close()

    try:
        server = await asyncio.start_server(on_connect, host, 0)
    except OSError:
        return None
    port = server.sockets[0].getsockname()[1]
    canary.append(Canary(host=host, port=port, server=server))
    return canary[0]


@pytest.fixture
async def canaries() -> AsyncIterator[tuple[Canary, Canary | None]]:
    v4 = await _start_canary("127.0.0.1")
    assert v4 is not None
    v6 = await _start_canary("::1")
    yield v4, v6
    for canary in (v4, v6):
        if canary is not None:
            canary.server.close()
            await canary.server.wait_closed()


async def test_canary_listeners_see_no_connection(canaries: tuple[Canary, Canary | None]) -> None:
    v4, v6 = canaries
    attempts = [(host, v4) for host in LOOPBACK_V4_SPELLINGS + LOOPBACK_NAMES]
    if v6 is not None:
        attempts += [(host, v6) for host in LOOPBACK_V6_SPELLINGS]
    for host, canary in attempts:
        for scheme in ("http", "https"):
            with pytest.raises(TargetNotAllowed):
                await check_webhook_url(f"{scheme}://{host}:{canary.port}/hook", STRICT)
        with pytest.raises(TargetNotAllowed):
            await resolve_checked(host, canary.port, STRICT)
    await asyncio.sleep(0.05)
    assert v4.connections == []
    if v6 is not None:
        assert v6.connections == []

    # Positive control: with private targets allowed, the checked addresses do reach the
    # listener, so the zero above means "refused", not "the canary was deaf".
    open_policy = AddressPolicy(allow_private=True)
    await check_webhook_url(f"http://localhost:{v4.port}/hook", open_policy)
    addresses = await resolve_checked("127.1", v4.port, open_policy)
    assert addresses == [IPv4Address("127.0.0.1")]
    _reader, writer = await asyncio.open_connection(str(addresses[0]), v4.port)
    writer.close()
    await writer.wait_closed()
    async with asyncio.timeout(10):
        await v4.connected.wait()
    assert len(v4.connections) == 1


# --- IPv6: an allow-list, and every form that carries an IPv4 address (issue 17, item 4) --------

# Bad IPv4 addresses a probe would try to reach through an IPv6 spelling.
_BAD_V4 = ["127.0.0.1", "10.0.0.1", "169.254.169.254", "192.168.1.1", "100.64.0.1", "0.0.0.0"]


def _teredo(server: str, client: str) -> IPv6Address:
    """2001:0:<server>:<flags>:<port ^ 0xffff>:<client ^ 0xffffffff> (RFC 4380)."""
    value = (0x2001 << 112) | (int(IPv4Address(server)) << 64) | (0xFFFF << 32)
    return IPv6Address(value | (int(IPv4Address(client)) ^ 0xFFFFFFFF))


def _embed(form: str, v4: str) -> IPv6Address:
    n = int(IPv4Address(v4))
    if form == "mapped":
        return IPv6Address((0xFFFF << 32) | n)
    if form == "translated":
        return IPv6Address((0xFFFF << 48) | n)
    if form == "compatible":
        return IPv6Address(n)
    if form == "nat64":
        return IPv6Address((0x64FF9B << 96) | n)
    if form == "nat64-local":
        return IPv6Address((0x64FF9B0001 << 80) | n)
    if form == "6to4":
        return IPv6Address((0x2002 << 112) | (n << 80) | 1)
    if form == "teredo":
        return _teredo("65.54.227.120", v4)
    raise AssertionError(form)


EMBEDDED_FORMS = ["mapped", "translated", "compatible", "nat64", "nat64-local", "6to4", "teredo"]


@pytest.mark.parametrize("form", EMBEDDED_FORMS)
@pytest.mark.parametrize("v4", _BAD_V4)
def test_every_embedded_ipv4_form_is_judged_by_its_ipv4(form: str, v4: str) -> None:
    ip = _embed(form, v4)
    reason = refusal_reason(ip)
    inner = refusal_reason(IPv4Address(v4))
    assert reason is not None and inner is not None, (ip, reason)
    if ip != IPv6Address("::"):  # ::0.0.0.0 is the unspecified address itself
        assert inner in reason, (ip, reason)
    with pytest.raises(TargetNotAllowed):
        check_url(f"http://[{ip}]/", STRICT)


@pytest.mark.parametrize("form", ["mapped", "nat64", "6to4"])
def test_embedded_forms_that_route_to_a_public_ipv4_are_allowed(form: str) -> None:
    assert refusal_reason(_embed(form, "8.8.8.8")) is None


@pytest.mark.parametrize("form", ["translated", "compatible", "nat64-local", "teredo"])
def test_embedded_forms_outside_global_unicast_stay_refused_with_a_public_ipv4(form: str) -> None:
    assert refusal_reason(_embed(form, "8.8.8.8")) is not None


def test_teredo_is_judged_by_its_xored_client_address() -> None:
    ip = _teredo("65.54.227.120", "127.0.0.1")
    reason = refusal_reason(ip)
    assert reason is not None and "loopback" in reason and "Teredo" in reason


@pytest.mark.parametrize(
    "host",
    [
        "[::ffff:0:127.0.0.1]",
        "[::ffff:0:169.254.169.254]",
        "[::ffff:0:10.0.0.1]",
        "[::ffff:0:7f00:1]",
        "[1::]",
        "[1::1]",
        "[::2]",
        "[100::1]",
        "[400::1]",
        "[4000::1]",
        "[e000::1]",
        "[2001:2::1]",
        "[2001:10::1]",
        "[2620:4f:8000::1]",
        "[5f00::1]",
    ],
)
def test_ipv6_outside_global_unicast_is_refused(host: str) -> None:
    with pytest.raises(TargetNotAllowed):
        check_url(f"http://{host}/", STRICT)


@pytest.mark.parametrize("address", ["2606:4700::1111", "2a00:1450:4001::200e", "2001:4860:4860::8888"])
def test_ordinary_global_unicast_ipv6_is_allowed(address: str) -> None:
    assert refusal_reason(IPv6Address(address)) is None
