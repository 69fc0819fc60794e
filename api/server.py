"""The HTTP server's own edge, below the application: time limits for slow clients, what the
parser's rejections write to the log, and the ``Server`` header.

A request the HTTP parser cannot read (a header longer than 8190 bytes, a malformed line) never
reaches Duetime's middleware: aiohttp answers 400 itself and logs the exception, with a traceback
whose message quotes the offending header. An ``Authorization`` header with a long tail put an
API key into the log at ERROR, and anyone could write one such traceback per request. The filter
here rewrites those records into one WARNING line that names the peer and the kind of rejection,
never a header value, and drops the traceback.

Header values as sent. HTTP parsers drop the spaces around a header's value, and so does
aiohttp's, in ``raw_headers`` too; the contract refuses an ``Idempotency-Key`` sent with leading
or trailing spaces (a key that differs from what the client thinks it sent). Each connection's
parser is wrapped (``_SentValues``) so that ``request.raw_headers`` carries that header's value
as it came over the wire, less the one space or tab that separates it from the colon.

The answer itself is Duetime's too: aiohttp's own 400 is ``text/plain`` and quotes the offending
line (an API key in an over-long or NUL-bearing ``Authorization`` header came back in the body,
next to aiohttp's name). ``api_runner`` builds a runner whose connections answer every parser
rejection with one fixed JSON body, ``malformed_request``, that echoes nothing of the request.

Time limits (settings ``DUETIME_HTTP_HEADER_TIMEOUT_S`` and ``DUETIME_HTTP_BODY_TIMEOUT_S``):
aiohttp's keep-alive timer runs from the moment a connection opens and again from the end of each
answer until a complete request head has arrived, so setting it to the header timeout closes a
connection that sends nothing, half its headers, or idles between requests. The body limit is
applied by the API's middleware around the body read.
"""

from __future__ import annotations

import logging
import re
from collections import deque
from typing import Any, Final

import aiohttp.web_response
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_server import Server

from duetime.api.errors import JSON_CONTENT_TYPE, error_body

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


# aiohttp's parser refuses a request with 400, 413 or 431 (and a few more); the answer names
# only the status, never what was sent.
_PARSER_REJECTION: Final = error_body("malformed_request", "The request could not be read.")


# Header names whose value ``raw_headers`` keeps exactly as sent (lower case).
SENT_AS_IS: Final = (b"idempotency-key",)
# A header line of one of those, anywhere in what a connection receives: from the line break
# before it to the end of its value (the line's own break must have arrived).
_SENT_LINE: Final = re.compile(rb"\n(idempotency-key):([^\r\n]*)(?=\r?\n)", re.IGNORECASE)
_MAX_CARRY: Final = 8200  # aiohttp's parser refuses a header line longer than 8190 bytes


class _SentValues:
    """A request parser's stand-in that keeps the values of ``SENT_AS_IS`` headers as sent.

    It reads every chunk a connection receives for such header lines (carrying an unfinished last
    line over to the next chunk), queues their values in order, and gives each parsed request's
    ``raw_headers`` the queued value in place of the trimmed one. The line pattern cannot occur in
    a JSON body outside a string, so a body can only put it where it makes the body invalid; a
    queued value that does not trim to the parsed one is taken as such noise, and the queue is
    dropped rather than misattributed.
    """

    __slots__ = ("_carry", "_parser", "_sent")

    def __init__(self, parser: Any) -> None:
        self._parser = parser
        self._carry = b""
        self._sent: deque[bytes] = deque()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parser, name)

    def feed_data(self, data: bytes) -> Any:
        text = self._carry + data if self._carry else data
        for match in _SENT_LINE.finditer(text):
            value = match.group(2)
            if value[:1] in (b" ", b"\t"):
                value = value[1:]  # the one space (or tab) that separates a value from the colon
            self._sent.append(value)
        self._carry = text[max(text.rfind(b"\n"), len(text) - _MAX_CARRY) :]
        messages, upgraded, tail = self._parser.feed_data(data)
        if self._sent:
            messages = [(self._as_sent(message), payload) for message, payload in messages]
        return messages, upgraded, tail

    def _as_sent(self, message: Any) -> Any:
        raw = getattr(message, "raw_headers", None)
        if raw is None or not any(name.lower() in SENT_AS_IS for name, _ in raw):
            return message
        headers = []
        for name, parsed in raw:
            value = parsed
            if name.lower() in SENT_AS_IS and self._sent:
                sent = self._sent.popleft()
                if sent.strip(b" \t") == parsed:
                    value = sent
                else:
                    self._sent.clear()
            headers.append((name, value))
        return message._replace(raw_headers=tuple(headers))


def sent_header(request: web.Request, name: str) -> str | None:
    """The first ``name`` header as it was sent (see ``_SentValues``), or None without one."""
    wanted = name.lower().encode("ascii")
    for key, value in request.raw_headers:
        if key.lower() == wanted:
            return value.decode("latin-1")
    return None


class _FixedParserAnswers(RequestHandler):
    """A connection whose answer to a request the parser refused is fixed JSON (the 5xx that
    aiohttp answers for a handler's own crash or timeout are left to aiohttp: the middleware
    already turns a handler's failure into the error body before it gets there), and whose
    parser keeps ``SENT_AS_IS`` header values as they were sent."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._parser = _SentValues(self._parser)  # type: ignore[assignment]  # same interface

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if not isinstance(exc, HttpProcessingError):
            return super().handle_error(request, status, exc, message)
        super().handle_error(request, status, exc, "")  # logs (through the filter above), checks
        answer = web.Response(status=status, body=_PARSER_REJECTION, content_type=JSON_CONTENT_TYPE)
        answer.force_close()
        return answer


class _Server(Server):
    def __call__(self) -> RequestHandler:
        return _FixedParserAnswers(self, loop=self._loop, **self._kwargs)


class ApiRunner(web.AppRunner):
    """``web.AppRunner`` whose connections give the fixed parser answer (aiohttp has no option
    for a connection class, so the server its runner makes is handed one)."""

    async def _make_server(self) -> Server:
        server = await super()._make_server()
        server.__class__ = _Server  # same state, one method more; aiohttp built it, we only serve
        return server


def api_runner(app: web.Application, *, header_timeout_s: float, **kwargs: Any) -> web.AppRunner:
    """The runner for the API (and the metrics port): the edge's time limits, log filter and fixed
    parser answers. ``kwargs`` go to ``web.AppRunner`` (``handle_signals``)."""
    return ApiRunner(app, access_log=None, **kwargs, **runner_options(header_timeout_s=header_timeout_s))
