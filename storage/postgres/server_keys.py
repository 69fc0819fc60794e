"""The installation's own keys, kept in the home database (migration 0017).

Secrets that every process of one installation must share and that must outlive any process:
today the key that seals page cursors (``Registry.cursor_key``, used by api/cursors.py). A key is
made by whichever process asks first; processes asking at the same moment agree on one, because
each offers a random key with ``ON CONFLICT DO NOTHING`` and then reads what is there.
"""

from __future__ import annotations

import secrets
from typing import Final

import asyncpg

from duetime.core.errors import StorageUnavailable
from duetime.storage.postgres.pools import StoreBase, translated
from duetime.storage.queries import Q

#: The row of ``server_keys`` that holds the cursor key.
CURSOR_KEY: Final = "cursor"
#: Bytes of a key this store makes (256 bits; HMAC-SHA256 takes a key of a block's size well).
KEY_BYTES: Final = 32


class ServerKeysPart(StoreBase):
    """``Registry.cursor_key`` of ``PostgresStore``."""

    async def cursor_key(self) -> bytes:
        return await self._server_key(CURSOR_KEY)

    async def _server_key(self, name: str) -> bytes:
        try:
            async with translated():
                await self.home_pool.execute(Q["offer_server_key"], name, secrets.token_bytes(KEY_BYTES))
                value: bytes | None = await self.home_pool.fetchval(Q["server_key"], name)
        except asyncpg.UndefinedTableError as exc:
            raise StorageUnavailable(
                "the home database has no server_keys table yet (migration 0017): run "
                "`duetime migrate` with this release"
            ) from exc
        if value is None or len(value) != KEY_BYTES:
            # Only an operator's hand can get here (a deleted or shortened row between our two
            # statements); refuse rather than seal with a key other processes do not have.
            raise StorageUnavailable(
                f"the server key {name!r} in the home database's server_keys table is missing or not "
                f"{KEY_BYTES} bytes; delete the row and retry, and a new key is made"
            )
        return bytes(value)
