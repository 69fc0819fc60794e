"""The HTTP server's own edge, below the application: time limits for slow clients, what the
parser's rejections write to the log, and the ``Server`` header.

A request the HTTP parser cannot read (a header longer than 8190 bytes, a malformed line) never
reaches Duetime's middleware: aiohttp answers 400 itself and logs the exception, with a traceback
whose message quotes the offending header. An ``Authorization`` header with a long tail put an
API key into the log at ERROR, and anyone could write one such traceback per request. The filter
here rewrites those records into one WARNING line that names the peer and the kind of rejection,
never a header value, and drops the traceback.

Time limits (settings ``DUETIME_HTTP_HEADER_TIMEOUT_S`` and ``DUETIME_HTTP_BODY_TIMEOUT_S``):
aiohttp's keep-alive timer runs from the moment a connection opens and again from the end of each
answer until a complete request head has arrived, so setting it to the header timeout closes a
connection that sends nothing, half its headers, or idles between requests. The body limit is
applied by the API's middleware around the body read.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import aiohttp.web_response
from aiohttp.http_exceptions import HttpProcessingError

SERVER_HEADER: Final = "duetime"
# How long an answered request whose body was not read may keep sending before the connection is
# closed; aiohttp's default (10 s) would let a declared 10^12-byte body hold the socket that long.
LINGERING_S: Final = 1.0

parser_log = logging.getLogger("duetime.http")


class ParserRejectionFilter(logging.Filter):
    """One WARNING line, without values or traceback, for a request the HTTP parser refused."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        peer = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
        status = getattr(exc, "code", 400)
        record.msg = "rejected a request the HTTP parser could not read from %s: %s (answered %s)"
        record.args = (peer, type(exc).__name__, status)
        record.exc_info = None
        record.exc_text = None
        record.stack_info = None
        if record.levelno > logging.WARNING:
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


_FILTER: Final = ParserRejectionFilter()


def runner_options(*, header_timeout_s: float) -> dict[str, Any]:
    """Keyword arguments for ``web.AppRunner`` (handed on to each connection's protocol)."""
    if _FILTER not in parser_log.filters:
        parser_log.addFilter(_FILTER)
    # aiohttp writes ``Server: Python/3.x aiohttp/3.y`` on every answer, its own 400s included,
    # from this module-level default; naming versions only helps an attacker pick an exploit.
    aiohttp.web_response.SERVER_SOFTWARE = SERVER_HEADER  # type: ignore[attr-defined]
    return {
        "keepalive_timeout": header_timeout_s,
        "lingering_time": LINGERING_S,
        "logger": parser_log,
    }
