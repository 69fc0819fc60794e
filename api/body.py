"""Reading a request body as JSON strictly enough that nothing odd gets past the edge.

The standard parser is lenient in ways that later hurt: it keeps the last of duplicate keys (the
client meant one of them, we cannot know which), accepts ``NaN``/``Infinity`` (not JSON, and
PostgreSQL's ``jsonb`` refuses them), turns ``1e400`` into an infinite float, and decodes
``"\\ud800"`` to a lone surrogate that no UTF-8 encoder (nor ``jsonb``) can write. Each of those
is refused here with a 400 and a message, so no bad input can surface later as a 500. Values nested
deeper than ``MAX_DEPTH`` are refused (422) before any recursive encoder sees them. A NUL
character is valid JSON but cannot be stored in ``jsonb``, so it is refused as a 422 at its path.
"""

from __future__ import annotations

import json
import math
from typing import Any, Final

from aiohttp import web

from duetime.core.errors import InvalidRequest, MalformedRequest

_JSON_TYPES: Final = frozenset({"application/json", "application/merge-patch+json"})
# Deeper than any job needs; it keeps every recursive encoder and hasher downstream of the
# parser (json.dumps, the idempotency hash, asyncpg's codec) far from Python's recursion limit.
MAX_DEPTH: Final = 64


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise MalformedRequest(f"Duplicate key {key!r} in a JSON object.", code="malformed_json")
            seen.add(key)
    return obj


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise MalformedRequest(f"The number {text[:40]} is out of range.", code="malformed_json")
    return value


def _no_constants(text: str) -> Any:
    raise MalformedRequest(f"{text} is not valid JSON; send a number or null.", code="malformed_json")


_DECODER: Final = json.JSONDecoder(
    object_pairs_hook=_unique_object, parse_float=_finite_float, parse_constant=_no_constants
)


def require_json_content_type(request: web.Request) -> None:
    if request.content_type not in _JSON_TYPES:
        raise_unsupported_media_type()
    charset = request.charset
    if charset is not None and charset.lower() not in ("utf-8", "utf8"):
        raise_unsupported_media_type()


def raise_unsupported_media_type() -> None:
    raise web.HTTPUnsupportedMediaType(
        text="The body must be JSON, sent with Content-Type: application/json (UTF-8)."
    )


def parse_json(raw: bytes) -> Any:
    """The parsed body, or MalformedRequest (400) / InvalidRequest (422) saying what is wrong."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedRequest(
            f"The body is not valid UTF-8 (byte {exc.start}).", code="malformed_json"
        ) from None
    if text.startswith("\ufeff"):
        raise MalformedRequest(
            "The body starts with a byte order mark; send plain UTF-8.", code="malformed_json"
        )
    if not text.strip():
        raise MalformedRequest("The body is empty; send a JSON object.", code="malformed_json")
    try:
        value = _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise MalformedRequest(
            f"Malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}.", code="malformed_json"
        ) from None
    except RecursionError:
        raise _too_deep(None) from None
    except ValueError as exc:  # e.g. an integer literal with more digits than Python will convert
        raise MalformedRequest(f"Malformed JSON: {exc}.", code="malformed_json") from None
    # Only an escape can produce a lone surrogate or a NUL from valid UTF-8 JSON, and only this
    # many brackets can nest this deep: the common body skips the walk entirely.
    escapes = "\\u" in text
    if escapes or text.count("[") + text.count("{") > MAX_DEPTH:
        _walk(value, check_strings=escapes)
    return value


def _walk(value: Any, *, check_strings: bool) -> None:
    """Walk iteratively (the depth is the client's choice): refuse deep nesting and bad strings."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        node, path, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth >= MAX_DEPTH:
                raise _too_deep(path or None)
            if isinstance(node, dict):
                for key, child in node.items():
                    if check_strings:
                        _check_text(key, path or "(root)")
                    stack.append((child, f"{path}.{key}" if path else key, depth + 1))
            else:
                stack.extend((child, f"{path}[{i}]", depth + 1) for i, child in enumerate(node))
        elif check_strings and isinstance(node, str):
            _check_text(node, path or "(root)")


def _too_deep(path: str | None) -> InvalidRequest:
    return InvalidRequest(
        f"JSON values may nest at most {MAX_DEPTH} levels deep.", code="nesting_too_deep", field=path
    )


def _check_text(text: str, path: str) -> None:
    if "\x00" in text:
        raise InvalidRequest("Strings may not contain the NUL character (\\u0000).", field=path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise MalformedRequest(
            "The JSON contains a lone surrogate escape (e.g. \\ud800), which is not a character.",
            code="malformed_json",
            field=path,
        ) from None
