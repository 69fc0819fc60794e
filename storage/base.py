"""The storage seam's old module name: everything here now lives in ``storage.ports``.

Kept as a re-export so the API modules that import the registry's records from here (and the
changes other branches are making to them right now) keep working unchanged; new code imports
``duetime.storage.ports``.
"""

from duetime.storage.ports import (
    Backfill,
    BulkAction,
    BulkResult,
    IdempotencyRequest,
    NameHolderChanged,
    Page,
    Registry,
)

__all__ = [
    "Backfill",
    "BulkAction",
    "BulkResult",
    "IdempotencyRequest",
    "NameHolderChanged",
    "Page",
    "Registry",
]
