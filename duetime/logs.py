"""How every Duetime process writes its log: one format, chosen by ``DUETIME_LOG_FORMAT``.

``text`` (the default) is for a person at a terminal; ``json`` is one JSON object per line for a
log shipper (Loki, Elasticsearch, CloudWatch), with ``ts`` (RFC 3339, UTC), ``level``, ``logger``,
``msg`` and, while an HTTP request is being answered, its ``request_id``. The request id lives in a
context variable so that any log call made on behalf of a request, deep in a handler or in
storage, carries it without being handed it: an operator who has the ``X-Request-Id`` of a 500
finds its traceback by that id.

Every process configures logging through ``configure`` alone, children of a multi-process
``duetime run`` included, so the format cannot differ between them.
"""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Final, Literal, TextIO

LogFormat = Literal["text", "json"]
LOG_FORMATS: Final = ("text", "json")

request_id_var: ContextVar[str | None] = ContextVar("duetime_request_id", default=None)

TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s%(request_id_suffix)s"
ACCESS_LOGGER: Final = "duetime.access"

# Attributes every LogRecord has; anything else was passed in ``extra=`` and goes into the JSON.
_STANDARD_ATTRS: Final = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()
    | {"message", "asctime", "request_id", "request_id_suffix", "taskName"}
)


class RequestIdFilter(logging.Filter):
    """Stamps each record with the request id of the context it was logged in (or none)."""

    def filter(self, record: logging.LogRecord) -> bool:
        rid = request_id_var.get()
        record.request_id = rid
        record.request_id_suffix = f" request_id={rid}" if rid is not None else ""
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line; a traceback goes into ``exc`` as one string."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = getattr(record, "request_id", None)
        if rid is None:
            rid = request_id_var.get()
        if rid is not None:
            out["request_id"] = rid
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                out[key] = value if isinstance(value, str | int | float | bool | type(None)) else repr(value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False, default=repr)


def formatter_for(fmt: str) -> logging.Formatter:
    if fmt == "json":
        return JsonFormatter()
    return logging.Formatter(TEXT_FORMAT)


def configure(level: str, fmt: str = "text", *, stream: TextIO | None = None) -> None:
    """Make the root logger write ``fmt`` to ``stream`` (stderr) at ``level``, replacing whatever
    handlers were there, so calling it twice (or after a library's basicConfig) leaves one."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter_for(fmt))
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level)
