"""Bearer keys to owners, with a short-lived cache so the request path makes no auth query.

Registering must sustain thousands of requests a second; a database probe per request for the key
would double the work of every create. Each key's answer (an owner, or "unknown") is kept for
``ttl_s`` seconds, so a revoked key keeps working for at most that long on each API process. That
window is the price of the cache and is documented in docs/api.md. While the home database cannot
be read, a known key's answer is used for up to ``stale_s`` past its TTL (an hour).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections.abc import Callable
from typing import Final

from duetime.core.errors import StorageUnavailable, Unauthorized
from duetime.storage.base import Registry

# A key we issue is URL-safe printable ASCII; anything else cannot be ours and must never reach
# the database driver (non-ASCII text from a header could not even be encoded).
_KEY_SHAPE: Final = re.compile(r"[\x21-\x7e]{1,512}")
_MAX_ENTRIES: Final = 100_000


def bearer_key(header: str | None) -> str:
    """The key from an ``Authorization: Bearer <key>`` header, or Unauthorized."""
    if not header:
        raise Unauthorized("Send your API key as 'Authorization: Bearer <key>'.")
    scheme, _, key = header.strip().partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        raise Unauthorized("The Authorization header must be 'Bearer <key>'.")
    if _KEY_SHAPE.fullmatch(key) is None:
        raise Unauthorized("Unknown or revoked API key.")
    return key


class KeyCache:
    """key → owner (or None for an unknown key) for ``ttl_s`` seconds; one lookup per key at once.

    Unknown keys are cached too, so a client hammering with a bad key costs one query per TTL. The
    cache is indexed by a digest of the key so clear keys do not linger in the process's memory.
    """

    def __init__(
        self,
        registry: Registry,
        *,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = _MAX_ENTRIES,
        stale_s: float = 3600.0,
    ) -> None:
        self._registry = registry
        self._ttl_s = ttl_s
        self._stale_s = stale_s
        self._clock = clock
        self._max_entries = max_entries
        # digest -> (owner or None, fresh until, read at)
        self._entries: dict[bytes, tuple[str | None, float, float]] = {}
        self._inflight: dict[bytes, asyncio.Future[str | None]] = {}

    async def owner_for(self, key: str) -> str:
        """The key's owner, or Unauthorized; StorageUnavailable when the lookup cannot be made."""
        digest = hashlib.sha256(key.encode()).digest()
        now = self._clock()
        entry = self._entries.get(digest)
        if entry is not None and entry[1] > now:
            owner = entry[0]
        else:
            try:
                owner = await self._lookup(digest, key)
            except StorageUnavailable:
                # The home database is away: a key this process saw lately still names its owner
                # (nobody can revoke it meanwhile: revoking writes to that database), so requests
                # that need only the job's own primary go on. Unknown keys are not served stale.
                if entry is None or entry[0] is None or now - entry[2] > self._ttl_s + self._stale_s:
                    raise
                self._entries[digest] = (entry[0], now + min(5.0, self._ttl_s), entry[2])
                owner = entry[0]
        if owner is None:
            raise Unauthorized("Unknown or revoked API key.")
        return owner

    async def _lookup(self, digest: bytes, key: str) -> str | None:
        pending = self._inflight.get(digest)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._inflight[digest] = future
        try:
            owner = await self._registry.owner_for_key(key)
        except Exception as exc:
            future.set_exception(exc)
            future.exception()  # marks it retrieved: no "exception never retrieved" log without waiters
            raise
        except asyncio.CancelledError:
            # The leading request went away; its waiters did not, and must not be cancelled by it.
            future.set_exception(StorageUnavailable("The key lookup was interrupted; retry."))
            future.exception()
            raise
        else:
            future.set_result(owner)
            self._store(digest, owner)
            return owner
        finally:
            del self._inflight[digest]

    def _store(self, digest: bytes, owner: str | None) -> None:
        now = self._clock()
        if len(self._entries) >= self._max_entries:
            self._entries = {d: e for d, e in self._entries.items() if e[1] > now}
            if len(self._entries) >= self._max_entries:
                self._entries.clear()
        self._entries[digest] = (owner, now + self._ttl_s, now)
