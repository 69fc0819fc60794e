"""The contract headers and the Standard Webhooks signature, byte for byte."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.core.delivery import Delivery
from duetime.core.model import WebhookTarget
from duetime.core.signing import (
    encode_body,
    idempotency_key,
    new_signing_secret,
    sign,
    verify_signature,
)
from duetime.workers.webhook import contract_headers

JOB = "0b5c3c1e-8d1f-4c7e-9a51-7f0e2a4b9d10"
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
NOW = datetime(2026, 12, 1, 0, 0, 3, tzinfo=UTC)


def _delivery(**overrides: object) -> Delivery:
    fields: dict[str, object] = {
        "job_id": JOB,
        "scheduled_for": datetime(2026, 12, 1, tzinfo=UTC),
        "attempt": 2,
        "fencing_token": 41,
        "owner": "acme",
        "signing_secret": SECRET,
        "payload": {"n": 1},
        "target": WebhookTarget(url="https://example.com/hook"),
    }
    fields.update(overrides)
    return Delivery(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("scheduled_for", "expected"),
    [
        (datetime(2026, 12, 1, tzinfo=UTC), f"{JOB}:2026-12-01T00:00:00Z"),
        (datetime(2026, 12, 1, 0, 0, 0, 500000, tzinfo=UTC), f"{JOB}:2026-12-01T00:00:00.5Z"),
        (datetime(2026, 12, 1, 0, 0, 0, 123456, tzinfo=UTC), f"{JOB}:2026-12-01T00:00:00.123456Z"),
        # Another offset is written as the same instant in UTC.
        (datetime(2026, 12, 1, 1, 0, tzinfo=timezone(timedelta(hours=1))), f"{JOB}:2026-12-01T00:00:00Z"),
    ],
)
def test_idempotency_key_format(scheduled_for: datetime, expected: str) -> None:
    assert idempotency_key(JOB, scheduled_for) == expected


def test_idempotency_key_refuses_naive_time() -> None:
    with pytest.raises(ValueError, match="aware"):
        idempotency_key(JOB, datetime(2026, 12, 1))


def test_body_is_compact_utf8_json() -> None:
    assert encode_body(None) == b"null"
    assert encode_body({"a": [1, 2], "b": "é"}) == '{"a":[1,2],"b":"é"}'.encode()


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(payload=_json_values)
def test_body_bytes_are_json_dumps_compact(payload: object) -> None:
    """The encoder built once writes exactly what ``json.dumps`` with the same settings did (the
    body is signed: a receiver that compares bytes must see no change)."""
    expected = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    assert encode_body(payload) == expected


def test_body_bytes_of_the_odd_values_are_json_dumps_too() -> None:
    """The encoder is built once without json's cycle markers: the values they do not concern
    are written as ``json.dumps`` writes them, over and over (nothing carried between calls)."""
    odd = [float("nan"), float("inf"), -0.0, 10**30, 1e16, "\u2028\x00é", [[], {}], {"a": {"b": [None]}}]
    for _ in range(2):
        for payload in odd:
            expected = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
            assert encode_body(payload) == expected


def test_new_secret_is_32_random_bytes() -> None:
    one, two = new_signing_secret(), new_signing_secret()
    assert one.startswith("whsec_")
    assert len(base64.b64decode(one.removeprefix("whsec_"), validate=True)) == 32
    assert one != two


def test_signature_matches_standard_webhooks_vector() -> None:
    # The reference vector published with the Standard Webhooks libraries.
    body = b'{"test": 2432232314}'
    assert sign(SECRET, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body) == (
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    )


def _one_shot(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The signature computed from nothing remembered: the key decoded and keyed for this call."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac.digest(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256)
    return "v1," + base64.b64encode(mac).decode("ascii")


@settings(max_examples=200, deadline=None)
@given(
    calls=st.lists(
        st.tuples(st.integers(0, 3), st.text(max_size=40), st.integers(0, 2**40), st.binary(max_size=300)),
        min_size=1,
        max_size=12,
    )
)
def test_remembered_keys_sign_as_a_one_shot_hmac_and_never_mix(
    calls: list[tuple[int, str, int, bytes]],
) -> None:
    """Each secret's keyed MAC is remembered and copied per signature: interleaved signatures
    under four secrets (four owners, or an owner's old and new one) each equal the one-shot HMAC
    under their own secret, and signing leaves nothing behind for the next one."""
    secrets = [new_signing_secret() for _ in range(4)]
    for which, msg_id, timestamp, body in calls:
        secret = secrets[which]
        assert sign(secret, msg_id, timestamp, body) == _one_shot(secret, msg_id, timestamp, body)
        assert sign(secret, msg_id, timestamp, body) == sign(secret, msg_id, timestamp, body)
    signatures = {sign(secret, "id", 1, b"x") for secret in secrets}
    assert len(signatures) == len(secrets)


def test_contract_headers() -> None:
    d = _delivery()
    body = encode_body(d.payload)
    headers = contract_headers(d, body, NOW)
    key = f"{JOB}:2026-12-01T00:00:00Z"
    assert headers["Idempotency-Key"] == key
    assert headers["Duetime-Job-Id"] == JOB
    assert headers["Duetime-Scheduled-For"] == "2026-12-01T00:00:00Z"
    assert headers["Duetime-Attempt"] == "2"
    assert headers["Duetime-Fencing-Token"] == "41"
    assert headers["webhook-id"] == key
    assert headers["webhook-timestamp"] == str(int(NOW.timestamp()))
    assert headers["webhook-signature"] == sign(SECRET, key, int(NOW.timestamp()), body)
    assert verify_signature(SECRET, headers, body, now=NOW)


def test_webhook_id_is_stable_across_attempts() -> None:
    first = contract_headers(_delivery(attempt=1), b"null", NOW)
    later = contract_headers(_delivery(attempt=3, fencing_token=99), b"null", NOW + timedelta(minutes=5))
    assert first["webhook-id"] == later["webhook-id"] == first["Idempotency-Key"]
    assert first["webhook-signature"] != later["webhook-signature"]


def _signed(body: bytes = b'{"n":1}') -> dict[str, str]:
    return contract_headers(_delivery(), body, NOW)


def test_verify_rejects_tampering_and_wrong_secret() -> None:
    headers = _signed()
    assert verify_signature(SECRET, headers, b'{"n":1}', now=NOW)
    assert not verify_signature(SECRET, headers, b'{"n":2}', now=NOW)
    assert not verify_signature(new_signing_secret(), headers, b'{"n":1}', now=NOW)
    forged_id = {**headers, "webhook-id": "other"}
    assert not verify_signature(SECRET, forged_id, b'{"n":1}', now=NOW)


def test_verify_tolerance_window_both_ways() -> None:
    headers = _signed()
    body = b'{"n":1}'
    assert verify_signature(SECRET, headers, body, now=NOW + timedelta(seconds=300))
    assert not verify_signature(SECRET, headers, body, now=NOW + timedelta(seconds=301))
    assert verify_signature(SECRET, headers, body, now=NOW - timedelta(seconds=300))
    assert not verify_signature(SECRET, headers, body, now=NOW - timedelta(seconds=301))
    assert verify_signature(SECRET, headers, body, tolerance_s=10, now=NOW + timedelta(seconds=10))
    assert not verify_signature(SECRET, headers, body, tolerance_s=10, now=NOW + timedelta(seconds=11))


def test_verify_accepts_one_valid_among_several_signatures() -> None:
    headers = _signed()
    good = headers["webhook-signature"]
    other = sign(new_signing_secret(), headers["webhook-id"], int(NOW.timestamp()), b'{"n":1}')
    several = {**headers, "webhook-signature": f"{other} v2,abc {good}"}
    assert verify_signature(SECRET, several, b'{"n":1}', now=NOW)
    only_bad = {**headers, "webhook-signature": f"{other} v2,abc"}
    assert not verify_signature(SECRET, only_bad, b'{"n":1}', now=NOW)


def test_verify_header_names_case_insensitive_and_missing_or_malformed() -> None:
    headers = {k.upper(): v for k, v in _signed().items()}
    assert verify_signature(SECRET, headers, b'{"n":1}', now=NOW)
    for name in ("WEBHOOK-ID", "WEBHOOK-TIMESTAMP", "WEBHOOK-SIGNATURE"):
        partial = {k: v for k, v in headers.items() if k != name}
        assert not verify_signature(SECRET, partial, b'{"n":1}', now=NOW)
    assert not verify_signature(SECRET, {**headers, "WEBHOOK-TIMESTAMP": "soon"}, b'{"n":1}', now=NOW)


def test_secret_without_prefix_is_accepted_and_garbage_refused() -> None:
    raw = SECRET.removeprefix("whsec_")
    assert sign(raw, "id", 1, b"x") == sign(SECRET, "id", 1, b"x")
    with pytest.raises(ValueError, match="base64"):
        sign("whsec_not base64!", "id", 1, b"x")
