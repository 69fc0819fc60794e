"""The contract headers a target receives, and the Standard Webhooks signature over them.

Kept apart from the HTTP client, in the pure core, so the exact bytes we sign are defined in one
place and a receiver (``duetime.receiver``, and our own tests) can use ``verify_signature`` with
the standard library alone: a client-only install of Duetime has no aiohttp. The signing
scheme is Standard Webhooks v1 (https://www.standardwebhooks.com): an HMAC-SHA256 over
``"{webhook-id}.{webhook-timestamp}.{body}"`` keyed with the base64-decoded secret after
``whsec_``. ``webhook-id`` is the Idempotency-Key, so it is stable across retries and
redeliveries of one occurrence, which is what the specification asks of it.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import json
import secrets
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from duetime.core.codec import format_time

SECRET_PREFIX = "whsec_"
SIGNATURE_VERSION = "v1"

IDEMPOTENCY_KEY = "Idempotency-Key"
JOB_ID = "Duetime-Job-Id"
SCHEDULED_FOR = "Duetime-Scheduled-For"
ATTEMPT = "Duetime-Attempt"
FENCING_TOKEN = "Duetime-Fencing-Token"
# A failure event (core/failures.py) carries its type; a run's calls never carry it.
EVENT = "Duetime-Event"
# The run's context (core.runpath.RunContext): every call of a run carries the first, the others
# when they have a value.
SPEC_VERSION = "Duetime-Spec-Version"
PREVIOUS_SCHEDULED_FOR = "Duetime-Previous-Scheduled-For"
LAST_SUCCESS_SCHEDULED_FOR = "Duetime-Last-Success-Scheduled-For"
FOLDED_COUNT = "Duetime-Folded-Count"
FOLDED_FROM = "Duetime-Folded-From"
WEBHOOK_ID = "webhook-id"
WEBHOOK_TIMESTAMP = "webhook-timestamp"
WEBHOOK_SIGNATURE = "webhook-signature"

CONTRACT_HEADERS: frozenset[str] = frozenset(
    h.lower()
    for h in (
        IDEMPOTENCY_KEY,
        JOB_ID,
        SCHEDULED_FOR,
        ATTEMPT,
        FENCING_TOKEN,
        EVENT,
        SPEC_VERSION,
        PREVIOUS_SCHEDULED_FOR,
        LAST_SUCCESS_SCHEDULED_FOR,
        FOLDED_COUNT,
        FOLDED_FROM,
        WEBHOOK_ID,
        WEBHOOK_TIMESTAMP,
        WEBHOOK_SIGNATURE,
    )
)


def format_occurrence(scheduled_for: datetime) -> str:
    """The one spelling of an occurrence in every header, so the key never differs by format."""
    if scheduled_for.tzinfo is None:
        raise ValueError("scheduled_for must be an aware datetime")
    return format_time(scheduled_for)


def idempotency_key(job_id: str, scheduled_for: datetime) -> str:
    """``<job id>:<nominal occurrence>``: the same on every attempt and redelivery of an occurrence."""
    return f"{job_id}:{format_occurrence(scheduled_for)}"


def delivery_key(job_id: str, scheduled_for: datetime, event: str | None = None) -> str:
    """The Idempotency-Key and ``webhook-id`` of a call: a run's ``<job id>:<occurrence>``, and
    a failure event's ``<job id>:<occurrence>:<type>`` (each event of an occurrence its own)."""
    key = idempotency_key(job_id, scheduled_for)
    return key if event is None else f"{key}:{event}"


# ``json.dumps`` with any argument but the defaults builds a new encoder on every call: half of
# its cost for a small payload (1.8 against 0.9 µs for ``null``, once per run of a burst). The
# same encoder, built once, writes the same bytes.
_json_encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def _one_shot_encoder() -> Callable[[Any], str] | None:
    """``_json_encoder.encode`` without rebuilding its C encoder per call, or None where the
    interpreter has no C encoder.

    ``JSONEncoder.encode`` makes a marker dict, a float formatter and a C encoder object for
    every payload before the C code runs (~2 µs of a webhook call). The C encoder it makes is
    built once here with the same settings, without the marker dict: a payload is parsed JSON
    and cannot refer to itself, the one case the markers catch (a cycle would end in
    ``RecursionError`` instead of ``ValueError``)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    enc = _json_encoder
    # (markers, default, str encoder, indent, key separator, item separator, sort_keys,
    # skipkeys, allow_nan): what JSONEncoder.iterencode passes for these settings.
    chunks = make(None, enc.default, json.encoder.encode_basestring, None, ":", ",", False, False, True)
    encode_str = json.encoder.encode_basestring

    def encode(payload: Any) -> str:
        if isinstance(payload, str):
            return encode_str(payload)
        return "".join(chunks(payload, 0))

    return encode


_encode_json: Callable[[Any], str] = _one_shot_encoder() or _json_encoder.encode


def encode_body(payload: Any) -> bytes:
    """Compact UTF-8 JSON: the exact bytes that are sent and signed (``None`` is ``null``)."""
    return _encode_json(payload).encode("utf-8")


def new_signing_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode("ascii")


@functools.lru_cache(maxsize=256)
def _secret_key(secret: str) -> bytes:
    """Accepts the secret with or without ``whsec_``, as the Standard Webhooks libraries do.

    Remembered per secret: a burst signs every call with its owner's same secret. A bad secret
    raises every time (exceptions are not cached)."""
    raw = secret.removeprefix(SECRET_PREFIX)
    try:
        key = base64.b64decode(raw, validate=True)
    except binascii.Error as exc:
        raise ValueError("signing secret is not valid base64 after 'whsec_'") from exc
    if not key:
        raise ValueError("signing secret is empty")
    return key


@functools.lru_cache(maxsize=256)
def _keyed_mac(secret: str) -> hmac.HMAC:
    """An HMAC-SHA256 that has taken ``secret``'s key and nothing else: each signature is a
    ``copy()`` of it, fed the message.

    Keying an HMAC (the padded key's two blocks, and OpenSSL 3's look-up of the algorithm that
    ``hmac.digest`` repeats on every call) was two thirds of a signature's cost: 4.6-6.9 against
    2.5 µs for a copy. Remembered per secret text, like the decoded key, so two secrets (two
    owners, or an owner's old and new one during a rotation) each have their own; the object is
    never fed and never leaves this module."""
    return hmac.new(_secret_key(secret), digestmod=hashlib.sha256)


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: ``v1,<base64 HMAC-SHA256>``."""
    mac = _keyed_mac(secret).copy()
    mac.update(f"{msg_id}.{timestamp}.".encode())
    mac.update(body)
    return f"{SIGNATURE_VERSION},{binascii.b2a_base64(mac.digest(), newline=False).decode('ascii')}"


def verify_signature(
    secret: str,
    headers: Mapping[str, str],
    body: bytes,
    tolerance_s: int = 300,
    now: datetime | None = None,
) -> bool:
    """Receiver side: True only for a fresh message signed with ``secret``.

    The timestamp window refuses replays of an old captured request; several space-separated
    signatures are accepted so a sender can sign with an old and a new secret during rotation.
    Header names are matched case-insensitively, as HTTP frameworks differ in how they spell them.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    msg_id = lowered.get(WEBHOOK_ID)
    ts_text = lowered.get(WEBHOOK_TIMESTAMP)
    sig_text = lowered.get(WEBHOOK_SIGNATURE)
    if not msg_id or not ts_text or not sig_text:
        return False
    try:
        timestamp = int(ts_text)
    except ValueError:
        return False
    current = (now or datetime.now(UTC)).timestamp()
    if abs(current - timestamp) > tolerance_s:
        return False
    expected = sign(secret, msg_id, timestamp, body).encode("ascii")
    found = False
    for candidate in sig_text.split(" "):
        # Compare every candidate (no early exit) so timing says nothing about which one matched.
        if hmac.compare_digest(candidate.encode("utf-8", "replace"), expected):
            found = True
    return found
