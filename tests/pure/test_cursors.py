"""Sealed page cursors (api/cursors.py, issue 32): opaque, bound to one owner, and refused whole.

The contract (api-v1.md, "Additions: limits found by the second probe"): every malformed cursor is
422 ``invalid_cursor``, never 5xx, and cursors reveal no counter shared between owners. The stores'
own cursors are raw keys (a run id is a per-database sequence all owners share); the seal is what
a client sees instead.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
import uuid
from datetime import UTC, datetime

import pytest

from duetime.api.cursors import (
    MAX_INNER_BYTES,
    MAX_SEALED_CHARS,
    NONCE_BYTES,
    SEALED_SHAPE,
    TAG_BYTES,
    CursorSeal,
)
from duetime.api.paging import PageCursors
from duetime.core.errors import InvalidRequest, StorageUnavailable
from duetime.storage.memory import MemoryStore
from duetime.storage.ports import Page
from duetime.storage.registry_rules import encode_cursor, encode_owner_runs_cursor

KEY = bytes(range(32))
SEAL = CursorSeal(KEY)
# What the stores issue: a run id (8 bytes), a job id (16), /v1/runs' 32 bytes, a host.
RUN_ID = 123_456_789
RUN_CURSOR = encode_cursor(RUN_ID.to_bytes(8, "big"))
OWNER_RUNS_CURSOR = encode_owner_runs_cursor(datetime(2030, 1, 1, tzinfo=UTC), uuid.UUID(int=7), RUN_ID)
INNERS = [
    RUN_CURSOR,
    encode_cursor(bytes(range(16))),
    OWNER_RUNS_CURSOR,
    encode_cursor(b"api.example.com:443"),
    "",
    "h\u00e9te.example:443",
    "x" * MAX_INNER_BYTES,
]


def _raw(sealed: str) -> bytes:
    return base64.urlsafe_b64decode(sealed + "=" * (-len(sealed) % 4))


def _text(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _refused(owner: str, cursor: str, seal: CursorSeal = SEAL) -> None:
    with pytest.raises(InvalidRequest) as err:
        seal.open(owner, cursor)
    assert (err.value.code, err.value.field) == ("invalid_cursor", "cursor"), cursor
    assert "pass next_cursor back unchanged" in err.value.message


@pytest.mark.parametrize("inner", INNERS, ids=range(len(INNERS)))
def test_a_sealed_cursor_opens_to_what_was_sealed(inner: str) -> None:
    sealed = SEAL.seal("alice", inner)
    assert sealed is not None
    assert SEALED_SHAPE.fullmatch(sealed) and len(sealed) <= MAX_SEALED_CHARS
    assert SEAL.open("alice", sealed) == inner
    # Another process of the installation (same key) opens it too.
    assert CursorSeal(KEY).open("alice", sealed) == inner


def test_no_cursor_is_no_cursor() -> None:
    assert SEAL.seal("alice", None) is None
    assert SEAL.open("alice", None) is None


def test_another_owners_cursor_is_refused() -> None:
    sealed = SEAL.seal("alice", RUN_CURSOR)
    assert sealed is not None
    for owner in ("bob", "Alice", "alice ", "alic", "alicee", ""):
        _refused(owner, sealed)


def test_another_installations_cursor_is_refused() -> None:
    sealed = CursorSeal(secrets.token_bytes(32)).seal("alice", RUN_CURSOR)
    assert sealed is not None
    _refused("alice", sealed)


def test_one_flipped_bit_anywhere_is_refused() -> None:
    sealed = SEAL.seal("alice", OWNER_RUNS_CURSOR)
    assert sealed is not None
    raw = _raw(sealed)
    for bit in range(len(raw) * 8):
        changed = bytearray(raw)
        changed[bit // 8] ^= 1 << (bit % 8)
        _refused("alice", _text(bytes(changed)))


def test_one_changed_character_anywhere_is_refused() -> None:
    """Also the last character, whose low bits base64 decoding would otherwise ignore."""
    sealed = SEAL.seal("alice", RUN_CURSOR)
    assert sealed is not None
    for i, char in enumerate(sealed):
        other = "B" if char == "A" else "A"
        _refused("alice", sealed[:i] + other + sealed[i + 1 :])


def test_cut_lengthened_or_reframed_cursors_are_refused() -> None:
    sealed = SEAL.seal("alice", RUN_CURSOR)
    assert sealed is not None
    raw = _raw(sealed)
    for cursor in (
        sealed[:-1],
        sealed[:-4],
        sealed + "A",
        sealed + "AAAA",
        sealed + "=",
        _text(raw[:-1]),
        _text(raw + b"\x00"),
        _text(bytes([2]) + raw[1:]),  # another version
        _text(raw[: 1 + NONCE_BYTES + TAG_BYTES - 1]),  # shorter than any seal
        "",
        "A" * (MAX_SEALED_CHARS + 4),
        " " + sealed,
    ):
        _refused("alice", cursor)


def test_the_other_base64_alphabet_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same bytes in standard base64 ('+' and '/') are not the cursor we issued. The nonce is
    pinned to all-ones bytes so the seal surely holds '_' characters: with a random nonce about one
    seal in six has neither '-' nor '_', and the "changed" text would be the cursor itself."""
    monkeypatch.setattr("duetime.api.cursors.secrets.token_bytes", lambda n: b"\xff" * n)
    sealed = SEAL.seal("alice", RUN_CURSOR)
    assert sealed is not None and "_" in sealed
    assert SEAL.open("alice", sealed) == RUN_CURSOR
    other = sealed.replace("-", "+").replace("_", "/")
    assert other != sealed
    _refused("alice", other)


def test_forged_and_old_style_cursors_are_refused() -> None:
    """What a client could send instead: the stores' own cursors from before the seal (a run id of
    2^63, past int8), random bytes of every length a seal could have, text that is not base64."""
    forged = [
        encode_cursor((1 << 63).to_bytes(8, "big")),
        encode_cursor(b"\xff" * 8),
        RUN_CURSOR,
        encode_cursor(bytes(16)),
        OWNER_RUNS_CURSOR,
        "!!!",
        "not a cursor",
        "\u00e9t\u00e9",
        "x" * 2000,
    ]
    forged += [_text(secrets.token_bytes(n)) for n in range(0, 1 + NONCE_BYTES + TAG_BYTES + 64)]
    for cursor in forged:
        _refused("alice", cursor)


def test_the_inner_cursor_does_not_show_in_the_sealed_one() -> None:
    run_id = RUN_ID.to_bytes(8, "big")
    for _ in range(50):
        sealed = SEAL.seal("alice", RUN_CURSOR)
        assert sealed is not None
        assert RUN_CURSOR not in sealed
        raw = _raw(sealed)
        assert run_id not in raw and RUN_CURSOR.encode() not in raw


def test_two_seals_of_one_cursor_differ() -> None:
    seals = {SEAL.seal("alice", RUN_CURSOR) for _ in range(100)}
    assert len(seals) == 100


def test_the_lengths_are_bounded() -> None:
    with pytest.raises(ValueError, match="over"):
        SEAL.seal("alice", "x" * (MAX_INNER_BYTES + 1))
    with pytest.raises(ValueError, match="16 bytes"):
        CursorSeal(b"short")


# --------------------------------------------------------------------------- one key per process


class _CountedKey:
    """A store's ``cursor_key``, counted, slow enough for concurrent callers to meet."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.reads = 0

    async def __call__(self) -> bytes:
        self.reads += 1
        await asyncio.sleep(0.01)
        return await self.store.cursor_key()


async def test_the_key_is_read_once_and_only_when_a_cursor_is_needed() -> None:
    key = _CountedKey(MemoryStore())
    cursors = PageCursors(key)
    last: Page[int] = Page([1], None)
    assert await cursors.seal("alice", last) is last
    assert await cursors.open("alice", None) is None
    assert key.reads == 0  # a list whose first page is its last needs no key
    pages = await asyncio.gather(*(cursors.seal("alice", Page([1], RUN_CURSOR)) for _ in range(10)))
    assert key.reads == 1  # concurrent first requests share one read
    for page in pages:
        assert page.items == [1] and page.next_cursor != RUN_CURSOR
        assert page.next_cursor is not None
        assert await cursors.open("alice", page.next_cursor) == RUN_CURSOR
    assert key.reads == 1


async def test_a_failed_key_read_is_the_requests_answer_and_not_kept() -> None:
    store = MemoryStore()
    cursors = PageCursors(store.cursor_key)
    store.available = False
    with pytest.raises(StorageUnavailable):
        await cursors.seal("alice", Page([1], RUN_CURSOR))
    store.available = True
    page = await cursors.seal("alice", Page([1], RUN_CURSOR))
    assert page.next_cursor is not None
    assert await cursors.open("alice", page.next_cursor) == RUN_CURSOR
