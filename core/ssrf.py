"""The SSRF guard: which addresses a webhook may reach, shared by registration and call time.

A webhook URL is the one place where an owner makes Duetime's own network identity do work for
them, so every URL is judged twice: by ``check_webhook_url`` when the job is registered or
patched (so the owner hears about a bad target at once), and by ``resolve_checked`` in the worker
right before each call (so a name that later starts resolving to an internal address, by DNS
rebinding or a changed record, is caught when it matters). The worker connects to one of the
addresses ``resolve_checked`` returned and never resolves the name a second time, which closes
the time-of-check/time-of-use gap.

Address classes are written out in tables here instead of leaning on ``ipaddress``'s
``is_private``/``is_global`` flags alone: those flags changed between Python patch releases, and
a security rule must not move with the interpreter. The flags are still consulted last, as a
catch-all for ranges the tables do not name.

Decisions (also in docs/api-errors.md):
- Names that are always local (``localhost`` and its spellings) are judged as loopback without
  asking DNS. Names that only make sense inside an operator's network (a single label such as
  ``redis``, and the suffixes ``.internal``, ``.local``, ``.localdomain``, ``.home.arpa``) are
  refused unless the operator allows private targets or configured an allow-list, in which case
  the resolved addresses decide.
- A name that does not resolve raises ``ResolutionFailed`` (``target_unresolvable``): the API
  ignores it at registration (the record may be created later; it is checked again at call time)
  and workers treat it as a retryable failure of that attempt.
"""

from __future__ import annotations

import asyncio
import re
import socket
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from ipaddress import (
    IPv4Address,
    IPv4Network,
    IPv6Address,
    IPv6Network,
    ip_address,
    ip_network,
)
from urllib.parse import unquote

from duetime.core.errors import DuetimeError, InvalidRequest, TargetNotAllowed
from duetime.core.weburl import URL_FIELD, split_webhook_url

IPAddress = IPv4Address | IPv6Address
IPNetwork = IPv4Network | IPv6Network

DEFAULT_RESOLVE_TIMEOUT_S = 5.0


class ResolutionFailed(DuetimeError):
    """The target's name did not resolve (now). Retryable at call time, ignored at registration."""

    code = "target_unresolvable"


@dataclass(frozen=True, slots=True)
class AddressPolicy:
    """What the operator allows beyond the public internet.

    ``allow_private`` opens every address (development, tests, a fully trusted network).
    ``allow_cidrs`` opens only the listed networks, e.g. one internal service subnet.
    """

    allow_private: bool = False
    allow_cidrs: tuple[IPNetwork, ...] = ()

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> AddressPolicy:
        """Read DUETIME_WEBHOOK_ALLOW_PRIVATE and DUETIME_WEBHOOK_ALLOW_CIDRS.

        Bad values raise ``ValueError`` at start-up: a typo in a security setting must stop the
        process, not silently fall back to a default.
        """
        raw_flag = environ.get("DUETIME_WEBHOOK_ALLOW_PRIVATE", "").strip().lower()
        if raw_flag in ("1", "true", "yes", "on"):
            allow_private = True
        elif raw_flag in ("", "0", "false", "no", "off"):
            allow_private = False
        else:
            raise ValueError(
                f"DUETIME_WEBHOOK_ALLOW_PRIVATE={raw_flag!r} is not a boolean; use 1/true or 0/false"
            )
        cidrs: list[IPNetwork] = []
        for item in environ.get("DUETIME_WEBHOOK_ALLOW_CIDRS", "").split(","):
            text = item.strip()
            if not text:
                continue
            try:
                cidrs.append(ip_network(text, strict=True))
            except ValueError as exc:
                raise ValueError(
                    f"DUETIME_WEBHOOK_ALLOW_CIDRS: {text!r} is not a network in CIDR form "
                    f"(write e.g. 10.20.0.0/16 or fd12:3456::/48, with no host bits set): {exc}"
                ) from None
        return cls(allow_private=allow_private, allow_cidrs=tuple(cidrs))

    def permits(self, ip: IPAddress) -> bool:
        """True when the operator opened this address; an IPv4-mapped IPv6 counts as its IPv4."""
        if self.allow_private:
            return True
        candidates: list[IPAddress] = [_unscoped(ip)]
        embedded = _mapped_v4(ip)
        if embedded is not None:
            candidates.append(embedded)
        return any(c in net for c in candidates for net in self.allow_cidrs)


# --- address classes -------------------------------------------------------------------------

_V4_TABLE: tuple[tuple[IPv4Network, str], ...] = tuple(
    (IPv4Network(net), reason)
    for net, reason in (
        ("169.254.169.254/32", "a cloud metadata address (AWS, GCP, Azure, OpenStack)"),
        ("169.254.170.2/32", "a cloud metadata address (AWS ECS task metadata)"),
        ("100.100.100.200/32", "a cloud metadata address (Alibaba Cloud)"),
        ("168.63.129.16/32", "a cloud host address (Azure WireServer)"),
        ("255.255.255.255/32", "the broadcast address"),
        ("0.0.0.0/8", "an unspecified / 'this network' address (0.0.0.0 reaches the local host)"),
        ("10.0.0.0/8", "a private address (RFC 1918)"),
        ("100.64.0.0/10", "a carrier-grade NAT shared address (RFC 6598)"),
        ("127.0.0.0/8", "a loopback address"),
        ("169.254.0.0/16", "a link-local address"),
        ("172.16.0.0/12", "a private address (RFC 1918)"),
        ("192.0.0.0/24", "an IETF protocol assignment address (RFC 6890)"),
        ("192.0.2.0/24", "a documentation address (TEST-NET-1)"),
        ("192.31.196.0/24", "an AS112 service address"),
        ("192.52.193.0/24", "an AMT relay address"),
        ("192.88.99.0/24", "a deprecated 6to4 relay anycast address"),
        ("192.168.0.0/16", "a private address (RFC 1918)"),
        ("192.175.48.0/24", "an AS112 service address"),
        ("198.18.0.0/15", "a benchmarking address (RFC 2544)"),
        ("198.51.100.0/24", "a documentation address (TEST-NET-2)"),
        ("203.0.113.0/24", "a documentation address (TEST-NET-3)"),
        ("224.0.0.0/4", "a multicast address"),
        ("240.0.0.0/4", "a reserved address"),
    )
)

# Special-purpose IPv6 blocks (the IANA registry) inside or beside global unicast, for messages;
# anything outside 2000::/3 is refused whether it is named here or not (the allow-list).
_V6_TABLE: tuple[tuple[IPv6Network, str], ...] = tuple(
    (IPv6Network(net), reason)
    for net, reason in (
        ("fd00:ec2::254/128", "a cloud metadata address (AWS IPv6)"),
        ("::/128", "the unspecified address"),
        ("::1/128", "a loopback address"),
        ("100::/64", "a discard-only address (RFC 6666)"),
        ("2001::/23", "an IETF protocol assignment address (RFC 2928)"),
        ("2001:db8::/32", "a documentation address"),
        ("2620:4f:8000::/48", "an AS112 service address"),
        ("3fff::/20", "a documentation address"),
        ("5f00::/16", "a segment routing SID address (RFC 9602)"),
        ("fc00::/7", "a unique local (private) address"),
        ("fe80::/10", "a link-local address"),
        ("fec0::/10", "a deprecated site-local address"),
        ("ff00::/8", "a multicast address"),
        ("::/8", "a reserved address (::/8)"),
    )
)
_GLOBAL_UNICAST = IPv6Network("2000::/3")
_UNSPECIFIED = IPv6Address("::")
_LOOPBACK_V6 = IPv6Address("::1")

# The IPv6 forms that carry an IPv4 address: (network, name, routes to that IPv4 on the internet).
# Each is judged by the IPv4 address it carries; the forms that do not reach that address over
# the internet (IPv4-translated, -compatible, local-use NAT64, Teredo) stay refused even with a
# public IPv4 inside, because they are outside the global unicast allow-list.
_MAPPED = IPv6Network("::ffff:0:0/96")
_TRANSLATED = IPv6Network("::ffff:0:0:0/96")
_IPV4_COMPAT = IPv6Network("::/96")
_NAT64 = IPv6Network("64:ff9b::/96")
_NAT64_LOCAL = IPv6Network("64:ff9b:1::/48")
_SIXTOFOUR = IPv6Network("2002::/16")
_TEREDO = IPv6Network("2001::/32")


@dataclass(frozen=True, slots=True)
class EmbeddedV4:
    """An IPv4 address an IPv6 address carries, the form's name, and whether it reaches it."""

    form: str  # with its article, for a message: "an IPv4-mapped"
    addresses: tuple[IPv4Address, ...]
    routable: bool


def embedded_v4(ip: IPv6Address) -> EmbeddedV4 | None:
    """The IPv4 address(es) inside ``ip`` when it is one of the embedding forms, else None.

    Teredo carries two: the server (bits 32-63) and the client (the last 32 bits, XORed with
    all ones); both are judged. Local-use NAT64 (RFC 8215) is read with the /96 layout of
    RFC 6052, the one operators use.
    """
    low = IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in _MAPPED:
        return EmbeddedV4("an IPv4-mapped", (low,), True)
    if ip in _TRANSLATED:
        return EmbeddedV4("an IPv4-translated", (low,), False)
    if ip in _IPV4_COMPAT:
        return EmbeddedV4("an IPv4-compatible", (low,), False)
    if ip in _NAT64:
        return EmbeddedV4("a NAT64", (low,), True)
    if ip in _NAT64_LOCAL:
        return EmbeddedV4("a local-use NAT64", (low,), False)
    if ip in _SIXTOFOUR:
        return EmbeddedV4("a 6to4", (IPv4Address((int(ip) >> 80) & 0xFFFFFFFF),), True)
    if ip in _TEREDO:
        server = IPv4Address((int(ip) >> 64) & 0xFFFFFFFF)
        client = IPv4Address(~int(ip) & 0xFFFFFFFF)
        return EmbeddedV4("a Teredo", (client, server), False)
    return None


def _unscoped(ip: IPAddress) -> IPAddress:
    if isinstance(ip, IPv6Address) and ip.scope_id:
        return IPv6Address(ip.packed)
    return ip


def _mapped_v4(ip: IPAddress) -> IPv4Address | None:
    """The IPv4 address an IPv6 address stands for on the wire, when it is a plain mapping."""
    if isinstance(ip, IPv6Address):
        return ip.ipv4_mapped
    return None


def _v4_reason(ip: IPv4Address) -> str | None:
    for net, reason in _V4_TABLE:
        if ip in net:
            return reason
    if not ip.is_global:
        return "not a globally routable address"
    return None


def _v6_reason(ip: IPv6Address) -> str | None:
    if ip == _UNSPECIFIED:  # :: and ::1 lie in ::/96 but are not IPv4-compatible forms
        return "the unspecified address"
    if ip == _LOOPBACK_V6:
        return "a loopback address"
    embedded = embedded_v4(ip)
    if embedded is not None:
        for v4 in embedded.addresses:
            inner = _v4_reason(v4)
            if inner is not None:
                return f"{embedded.form} form of {v4}, {inner}"
        if embedded.routable:
            return None
        return f"{embedded.form} address, which does not reach {embedded.addresses[0]} over the internet"
    for net, reason in _V6_TABLE:
        if ip in net:
            return reason
    if ip not in _GLOBAL_UNICAST:
        return "outside the global unicast range 2000::/3"
    return None


def refusal_reason(ip: IPAddress) -> str | None:
    """Why a webhook may not reach ``ip`` (a phrase for a message), or None for global unicast.

    IPv6 is judged by an allow-list: global unicast (2000::/3) minus the special-purpose blocks.
    Every form that carries an IPv4 address (mapped, translated, compatible, NAT64 and local-use
    NAT64, 6to4, Teredo's server and XORed client) is judged by the address it carries first, so
    the message names where the packets would end up.
    """
    ip = _unscoped(ip)
    if isinstance(ip, IPv4Address):
        return _v4_reason(ip)
    return _v6_reason(ip)


# --- host spellings ---------------------------------------------------------------------------

_INET_PART = re.compile(r"(0[xX][0-9a-fA-F]*|0[0-7]*|[1-9][0-9]*)")
_DOT_VARIANTS = str.maketrans({"\u3002": ".", "\uff0e": ".", "\uff61": "."})


def _inet_aton(text: str) -> IPv4Address | None:
    """The IPv4 address a C resolver's inet_aton would read from ``text``, or None.

    inet_aton takes 1 to 4 parts, each decimal, octal (leading 0) or hex (0x); the last part
    fills all the remaining bytes, so ``127.1`` is 127.0.0.1 and ``2130706433`` is too.
    """
    parts = text.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    values: list[int] = []
    for part in parts:
        if not _INET_PART.fullmatch(part):
            return None
        if part[:2] in ("0x", "0X"):
            digits, base = part[2:], 16
        elif len(part) > 1 and part[0] == "0":
            digits, base = part[1:], 8
        else:
            digits, base = part, 10
        digits = digits.lstrip("0") or "0"
        if len(digits) > 12:  # far beyond 2**32 in any base; also keeps int() cheap
            return None
        values.append(int(digits, base))
    *head, last = values
    if any(v > 0xFF for v in head):
        return None
    if last >= 1 << (8 * (4 - len(head))):
        return None
    number = last
    for index, value in enumerate(head):
        number |= value << (8 * (3 - index))
    return IPv4Address(number)


def normalize_host(host: str) -> str:
    """The host as a resolver will see it: percent-decoded, NFKC-folded, lower case, ASCII dots.

    Full-width digits and ideographic full stops are folded first, because IDNA processing turns
    ``１２７。０。０。１`` into ``127.0.0.1`` before any resolver sees it.
    """
    text = unquote(host)
    text = unicodedata.normalize("NFKC", text).translate(_DOT_VARIANTS).lower()
    if text.startswith("[") and text.endswith("]"):
        return text[1:-1]
    if not text.isascii():
        # IDNA maps some characters to nothing (soft hyphen, zero-width joiner): fold them too.
        try:
            folded = text.encode("idna").decode("ascii")
        except UnicodeError:
            return text
        text = folded
    return text


def parse_host_literal(host: str) -> IPAddress | None:
    """The address ``host`` spells in any form a resolver treats as a literal, else None.

    Covers bracketed and bare IPv6 (with a zone id, which is dropped), dotted quads, and every
    inet_aton form (``2130706433``, ``0x7f000001``, ``0x7f.1``, ``0177.0.0.1``, ``127.1``),
    with or without one trailing dot. As glibc's inet_aton does, anything after the first space
    is ignored.
    """
    text = normalize_host(host)
    if not text:
        return None
    if ":" in text:
        address, _, _zone = text.partition("%")
        try:
            return IPv6Address(address)
        except ValueError:
            return None
    text = text.split(None, 1)[0] if text.strip() else ""
    if text.endswith("."):
        text = text[:-1]
    if not text:
        return None
    return _inet_aton(text)


_LOOPBACK_NAMES = frozenset(
    {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback", "localhost6"}
)
_LOCAL_SUFFIXES = (".localhost",)
_INTERNAL_SUFFIXES = (".internal", ".local", ".localdomain", ".home.arpa", ".lan")
_HOST_NAME = re.compile(r"[a-z0-9_.-]+", re.ASCII)
_LOOPBACK_PROBES = (IPv4Address("127.0.0.1"), IPv6Address("::1"))


def _name_refusal(name: str, policy: AddressPolicy) -> str | None:
    """Why a host *name* is refused without asking DNS, or None to let resolution decide."""
    name = name.rstrip(".")
    if name in _LOOPBACK_NAMES or name.endswith(_LOCAL_SUFFIXES):
        if any(policy.permits(ip) for ip in _LOOPBACK_PROBES):
            return None
        return "a name that always means the local host (loopback)"
    if "." not in name or name.endswith(_INTERNAL_SUFFIXES):
        if policy.allow_cidrs:
            return None
        return "a name that only resolves inside a private network"
    return None


def _split_url(url: str) -> tuple[str, int]:
    """(host, port) of an http(s) URL, read by the one parser validation uses too."""
    parts = split_webhook_url(url, URL_FIELD)
    return parts.host, parts.port


def _refuse(host: str, reason: str) -> TargetNotAllowed:
    return TargetNotAllowed(
        f"target.url host {host!r} is {reason}; webhooks may only call public addresses. "
        "An operator can allow it with DUETIME_WEBHOOK_ALLOW_PRIVATE=1 or "
        "DUETIME_WEBHOOK_ALLOW_CIDRS.",
        field=URL_FIELD,
    )


def _check_host(host: str, policy: AddressPolicy) -> None:
    if policy.allow_private:
        return
    literal = parse_host_literal(host)
    if literal is not None:
        reason = refusal_reason(literal)
        if reason is not None and not policy.permits(literal):
            raise _refuse(host, reason)
        return
    name = normalize_host(host)
    if not _HOST_NAME.fullmatch(name):
        # Fail closed: a host that is neither a literal nor a plain DNS name (a broken IPv6
        # literal, stray punctuation) is something a resolver might read in ways we did not judge.
        raise InvalidRequest(
            f"target.url host {host[:80]!r} is not a valid host name or address",
            code="invalid_url",
            field=URL_FIELD,
        )
    reason = _name_refusal(name, policy)
    if reason is not None:
        raise _refuse(host, reason)


def check_url(url: str, policy: AddressPolicy) -> None:
    """Refuse, without DNS, a URL whose host is a disallowed literal or an always-local name.

    Raises ``TargetNotAllowed`` (422 ``target_not_allowed``), or ``InvalidRequest``
    (``invalid_url``) when no host can be read at all: failing closed.
    """
    host, _port = _split_url(url)
    _check_host(host, policy)


def judge_literal(host: str, policy: AddressPolicy) -> IPAddress | None:
    """The address ``host`` spells when it is a literal, judged without DNS; None for a name.

    Raises ``TargetNotAllowed`` for a literal the policy does not open. Pure (the host and the
    policy decide it), so a worker may remember the answer for a URL instead of re-reading it
    before every call; ``resolve_checked`` starts with it.
    """
    literal = parse_host_literal(host)
    if literal is None:
        return None
    literal = _unscoped(literal)
    reason = refusal_reason(literal)
    if reason is not None and not policy.permits(literal):
        raise _refuse(host, reason)
    return literal


async def resolve_checked(
    host: str,
    port: int,
    policy: AddressPolicy,
    *,
    timeout_s: float = DEFAULT_RESOLVE_TIMEOUT_S,
) -> list[IPAddress]:
    """Resolve ``host`` and return its addresses, refusing if ANY answer is disallowed.

    Refusing on any bad answer (not just the first) means a name that answers one public and
    one internal address cannot get the internal one past the check through connection
    fallback. The caller must connect to one of the returned addresses and not resolve again.
    Literals are judged without DNS, and always-local names before it.
    """
    literal = judge_literal(host, policy)
    if literal is not None:
        return [literal]
    name = normalize_host(host)
    name_reason = None if policy.allow_private else _name_refusal(name, policy)
    if name_reason is not None:
        raise _refuse(host, name_reason)
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout_s):
            infos = await loop.getaddrinfo(name, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError, TimeoutError) as exc:
        raise ResolutionFailed(
            f"target.url host {host!r} could not be resolved ({exc or 'timed out'}); "
            "check the name, or retry once its DNS record exists",
            field=URL_FIELD,
        ) from None
    addresses: list[IPAddress] = []
    for _family, _type, _proto, _canon, sockaddr in infos:
        text = str(sockaddr[0]).partition("%")[0]
        try:
            ip = ip_address(text)
        except ValueError:
            continue
        if ip not in addresses:
            addresses.append(ip)
    if not addresses:
        raise ResolutionFailed(f"target.url host {host!r} resolved to no usable address", field=URL_FIELD)
    for ip in addresses:
        reason = refusal_reason(ip)
        if reason is not None and not policy.permits(ip):
            raise _refuse(host, f"resolving to {ip}, {reason}")
    return addresses


async def check_webhook_url(url: str, policy: AddressPolicy) -> None:
    """The registration-time check: ``check_url`` plus a DNS check that tolerates no answer.

    An unresolvable name is let through (``ResolutionFailed`` is swallowed): a record may be
    created after the job, and workers check again before every call.
    """
    host, port = _split_url(url)
    _check_host(host, policy)
    if policy.allow_private:
        return
    try:
        await resolve_checked(host, port, policy)
    except ResolutionFailed:
        return
