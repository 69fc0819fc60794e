"""Owners' API keys listed, and their webhook signing secrets rotated, in the home database.

A rotation keeps the old secret for a grace period instead of replacing it outright: receivers
verify with whichever secret they hold, and every webhook of the grace is signed under both, so a
receiver fleet can move to the new secret one instance at a time.
"""

from __future__ import annotations

from duetime.core.errors import NotFound
from duetime.storage.ports import ApiKeyInfo, SecretRotation, SigningKeys
from duetime.storage.postgres.pools import StoreBase, translated
from duetime.storage.queries import Q


class KeysPart(StoreBase):
    """Listing API keys and rotating signing secrets: the operator's half of the owners table."""

    async def rotate_signing_secret(self, owner: str, grace_s: float) -> SecretRotation:
        """A new secret for ``owner``; the old one keeps signing for ``grace_s`` seconds."""
        from duetime.core.signing import new_signing_secret

        async with translated():
            row = await self.home_pool.fetchrow(
                Q["rotate_signing_secret"], owner, new_signing_secret(), grace_s
            )
        if row is None:
            raise NotFound(f"no owner {owner!r}: make one with `duetime keys create --owner {owner}`")
        return SecretRotation(
            owner=owner,
            signing_secret=row["signing_secret"],
            previous_valid_until=row["previous_valid_until"],
        )

    async def signing_keys(self, owner: str) -> SigningKeys | None:
        """The owner's current secret and, with its end, the previous one (None: no such owner)."""
        async with translated():
            row = await self.home_pool.fetchrow(Q["signing_keys"], owner)
        if row is None:
            return None
        return SigningKeys(
            current=row["signing_secret"],
            previous=row["previous_signing_secret"],
            previous_valid_until=row["previous_valid_until"],
        )

    async def list_api_keys(self, owner: str | None = None, *, revoked: bool = False) -> list[ApiKeyInfo]:
        async with translated():
            rows = await self.home_pool.fetch(Q["list_api_keys"], owner, revoked)
        return [
            ApiKeyInfo(
                prefix=r["key_prefix"],
                owner=r["owner"],
                created_at=r["created_at"],
                revoked_at=r["revoked_at"],
            )
            for r in rows
        ]
