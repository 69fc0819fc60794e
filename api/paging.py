"""Every list's cursors, sealed per owner with the installation's key (api/cursors.py).

The key is the store's (``Registry.cursor_key``): read at the first cursor this process seals or
opens, then kept for the life of the process; it never changes, so no later read is needed. A
store error while reading it is the request's answer (503 ``storage_unavailable`` for an outage)
and nothing is kept, so the next request reads again. A list whose first page is its last needs
no key at all: nothing to open, nothing to seal.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import TypeVar

from duetime.api.cursors import CursorSeal
from duetime.storage.ports import Page

T = TypeVar("T")


class PageCursors:
    """Opens the cursor a list request carries and seals the page's ``next_cursor``, for one owner."""

    def __init__(self, read_key: Callable[[], Awaitable[bytes]]) -> None:
        self._read_key = read_key
        self._seal: CursorSeal | None = None
        self._reading = asyncio.Lock()

    async def _sealer(self) -> CursorSeal:
        if self._seal is None:
            async with self._reading:  # concurrent first requests share one read
                if self._seal is None:
                    self._seal = CursorSeal(await self._read_key())
        return self._seal

    async def open(self, owner: str, cursor: str | None) -> str | None:
        """The store's cursor inside ``cursor`` (None: the first page); 422 ``invalid_cursor``
        for anything this installation did not seal for ``owner``."""
        if cursor is None:
            return None
        return (await self._sealer()).open(owner, cursor)

    async def seal(self, owner: str, page: Page[T]) -> Page[T]:
        """``page`` with its ``next_cursor`` sealed for ``owner``."""
        if page.next_cursor is None:
            return page
        sealed = (await self._sealer()).seal(owner, page.next_cursor)
        return dataclasses.replace(page, next_cursor=sealed)
