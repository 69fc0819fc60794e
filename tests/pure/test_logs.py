"""The log formats and the request-id rule, without a server (the e2e test covers the processes)."""

from __future__ import annotations

import io
import json
import logging

import pytest

from duetime import logs
from duetime.api.request_id import accepted_request_id, new_request_id


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ("abc", True),
        ("a" * 128, True),
        ("a" * 129, False),
        ("", False),
        ("with space", True),
        ("tab\there", False),
        ("ünïcode", False),
        ("\x7f", False),
        (None, False),
    ],
)
def test_a_request_id_is_kept_only_when_1_to_128_printable_ascii(given: str | None, kept: bool) -> None:
    assert accepted_request_id(given) == (given if kept else None)


def test_new_request_ids_differ() -> None:
    assert len({new_request_id() for _ in range(100)}) == 100


def _logged(fmt: str, rid: str | None) -> str:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.formatter_for(fmt))
    handler.addFilter(logs.RequestIdFilter())
    logger = logging.getLogger("duetime.test_logs")
    logger.addHandler(handler)
    logger.propagate = False
    token = logs.request_id_var.set(rid)
    try:
        try:
            raise ValueError("boom")
        except ValueError:
            logger.error("failed %s", "here", exc_info=True, extra={"status": 500})
    finally:
        logs.request_id_var.reset(token)
        logger.removeHandler(handler)
        logger.propagate = True
    return out.getvalue()


def test_json_is_one_object_per_line_with_the_contract_fields() -> None:
    text = _logged("json", "rid-1")
    assert text.count("\n") == 1  # the traceback is inside the object, not on lines of its own
    record = json.loads(text)
    assert record["level"] == "ERROR" and record["logger"] == "duetime.test_logs"
    assert record["msg"] == "failed here" and record["request_id"] == "rid-1"
    assert record["ts"].endswith("Z") and "T" in record["ts"]
    assert record["status"] == 500
    assert "ValueError: boom" in record["exc"]


def test_json_without_a_request_has_no_request_id() -> None:
    assert "request_id" not in json.loads(_logged("json", None))


def test_text_names_the_request_at_the_end_of_the_line() -> None:
    first = _logged("text", "rid-2").splitlines()[0]
    assert first.endswith("ERROR duetime.test_logs: failed here request_id=rid-2")
