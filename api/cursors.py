"""Sealed page cursors: what a list's ``next_cursor`` is on the wire.

The stores page by raw keys (a job id, a run id, a finished time, a host: storage/registry_rules.py,
storage/target_rules.py). Handed out as they are, those keys say more than where a page ends: run
ids come from one sequence per database shared by every owner, so an owner who decodes the newest
cursor of ``GET /v1/runs`` now and then measures the whole platform's volume. A forged key is also
a way to reach corners of the stores' cursor parsing that no issued cursor would.

So the API seals every cursor it hands out and opens every cursor it is given, bound to the owner
(``api/paging.py`` does it for every list). A sealed cursor is encrypt-then-MAC, standard library
only:

    version (1 byte) ‖ nonce (12 random bytes) ‖ ciphertext ‖ tag (16 bytes), base64url, no padding

- subkeys for encryption and authentication are HMAC-SHA256 of the installation's key with
  distinct labels, so neither use can be turned against the other;
- the ciphertext is the inner cursor's UTF-8 XOR a keystream of HMAC-SHA256 blocks over
  (owner, nonce, block counter): a fresh nonce per cursor, so two seals of one inner cursor differ
  and nothing of the inner bytes shows;
- the tag is HMAC-SHA256 over (version, owner, nonce, ciphertext), truncated to 16 bytes and
  compared in constant time: a flipped bit, a forged cursor or another owner's cursor is refused
  before the store sees anything.

The owner is in the keystream and the tag, length-prefixed, so a cursor opens for the owner it was
sealed for and no other. Lengths are bounded on both sides (``MAX_INNER_BYTES``,
``MAX_SEALED_CHARS``): the work of one ``open`` is a few HMACs whatever a client sends.

Pure apart from the key it is given: the key itself is the store's (``Registry.cursor_key``), read
once per process by ``api/paging.py``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
from typing import Final

from duetime.core.errors import InvalidRequest

#: The first byte of every sealed cursor: a later format can be told apart (and refused here).
VERSION: Final = 1
#: Random bytes per cursor (96 bits: no two cursors of one installation share a nonce by chance).
NONCE_BYTES: Final = 12
#: Bytes of the tag kept (128 bits of HMAC-SHA256).
TAG_BYTES: Final = 16
#: The longest inner cursor a store issues: base64 of a target cursor's 768 bytes
#: (storage/target_rules.py ``CURSOR_MAX_BYTES``); the others are 22 to 43 characters.
MAX_INNER_BYTES: Final = 1024
_OVERHEAD: Final = 1 + NONCE_BYTES + TAG_BYTES
#: The longest sealed cursor: base64url (no padding) of the overhead and the longest inner cursor.
MAX_SEALED_CHARS: Final = -(-(_OVERHEAD + MAX_INNER_BYTES) * 4 // 3)
#: The shortest: an empty inner cursor.
MIN_SEALED_CHARS: Final = -(-_OVERHEAD * 4 // 3)
#: What a sealed cursor looks like on the wire (the base64url alphabet, bounded).
SEALED_SHAPE: Final = re.compile(f"[A-Za-z0-9_-]{{{MIN_SEALED_CHARS},{MAX_SEALED_CHARS}}}")

BAD_CURSOR: Final = (
    "cursor is not one this API issued for this key's owner; pass next_cursor back unchanged, "
    "or leave cursor out to list from the first page."
)

_BLOCK: Final = hashlib.sha256().digest_size
_ENCRYPT_LABEL: Final = b"duetime cursor v1: keystream"
_MAC_LABEL: Final = b"duetime cursor v1: tag"


def refused() -> InvalidRequest:
    """The one answer to every cursor that is not exactly one we sealed: 422 ``invalid_cursor``."""
    return InvalidRequest(BAD_CURSOR, code="invalid_cursor", field="cursor")


def _framed(owner: str) -> bytes:
    """The owner, length-prefixed: no (owner, nonce) pair reads as another."""
    raw = owner.encode()
    return len(raw).to_bytes(4, "big") + raw


class CursorSeal:
    """Seals inner cursors for an owner and opens them again, under one installation key."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError(f"a cursor key needs at least 16 bytes, got {len(key)}")
        self._encrypt_key = hmac.digest(key, _ENCRYPT_LABEL, "sha256")
        self._mac_key = hmac.digest(key, _MAC_LABEL, "sha256")

    def seal(self, owner: str, inner: str | None) -> str | None:
        """``inner`` (a store's cursor) sealed for ``owner``; None (the last page) stays None."""
        if inner is None:
            return None
        plain = inner.encode()
        if len(plain) > MAX_INNER_BYTES:
            # A store's cursors are bounded well below this; a longer one is a bug, not input.
            raise ValueError(f"an inner cursor of {len(plain)} bytes is over {MAX_INNER_BYTES}")
        who = _framed(owner)
        nonce = secrets.token_bytes(NONCE_BYTES)
        cipher = self._xor(who, nonce, plain)
        raw = bytes([VERSION]) + nonce + cipher
        raw += self._tag(who, raw)
        return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")

    def open(self, owner: str, outer: str | None) -> str | None:
        """The inner cursor ``seal(owner, …)`` made ``outer`` from; None stays None. Anything else
        (not base64url, another length, version or owner, one bit changed) is 422 ``invalid_cursor``."""
        if outer is None:
            return None
        if SEALED_SHAPE.fullmatch(outer) is None or len(outer) % 4 == 1:
            raise refused()
        try:
            raw = base64.urlsafe_b64decode(outer + "=" * (-len(outer) % 4))
        except (binascii.Error, ValueError):
            raise refused() from None
        # Trailing bits past the last byte must be zero, as seal writes them: one cursor, one text.
        if base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=") != outer or raw[0] != VERSION:
            raise refused()
        who = _framed(owner)
        body, tag = raw[:-TAG_BYTES], raw[-TAG_BYTES:]
        if not hmac.compare_digest(tag, self._tag(who, body)):
            raise refused()
        nonce = body[1 : 1 + NONCE_BYTES]
        try:
            return self._xor(who, nonce, body[1 + NONCE_BYTES :]).decode()
        except UnicodeDecodeError:  # authentic, so ours: never happens, but never a 500 either
            raise refused() from None

    def _tag(self, who: bytes, body: bytes) -> bytes:
        """The MAC of (version ‖ nonce ‖ ciphertext) for this owner; ``body`` starts with the
        version byte and the fixed-size nonce, so the split is unambiguous."""
        return hmac.digest(self._mac_key, body[:1] + who + body[1:], "sha256")[:TAG_BYTES]

    def _xor(self, who: bytes, nonce: bytes, data: bytes) -> bytes:
        """``data`` XOR the keystream of (owner, nonce): HMAC-SHA256 in counter mode."""
        prefix = who + nonce
        stream = b"".join(
            hmac.digest(self._encrypt_key, prefix + block.to_bytes(4, "big"), "sha256")
            for block in range(-(-len(data) // _BLOCK))
        )
        size = len(data)
        mixed = int.from_bytes(data, "big") ^ int.from_bytes(stream[:size], "big")
        return mixed.to_bytes(size, "big")
