"""Which header names a job's webhook target may not set: one rule for registration and calls.

Registration refuses these names (422 ``reserved_header``) and the worker drops them from a stored
job before a call; both read this module, so a name can never pass one check and be silently
dropped by the other. Reserved are the hop-by-hop headers (RFC 9110 §7.6.1), the ones that frame
the request (a job must not change the body's length, type or the Host it is routed by), and the
headers Duetime itself sends (``User-Agent``, ``Accept``, ``Idempotency-Key``, ``webhook-*``,
``Duetime-*``), which a job must not be able to forge or replace. docs/targets.md lists the same
names ("Reserved headers"); tests/pure/test_one_rule.py holds the two lists equal.
"""

from __future__ import annotations

from typing import Final

RESERVED_HEADERS: Final = frozenset(
    {
        "host",
        "content-length",
        "content-type",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "upgrade",
        "expect",
        "idempotency-key",
        "user-agent",
        "accept",
    }
)
RESERVED_HEADER_PREFIXES: Final = ("webhook-", "duetime-")


def is_reserved_header(name: str) -> bool:
    """True for a name (any letter case) that Duetime or the HTTP client sets, never a job."""
    lower = name.lower()
    return lower in RESERVED_HEADERS or lower.startswith(RESERVED_HEADER_PREFIXES)
