"""Rules both stores of the ``TargetHealth`` port apply the same way (PostgreSQL and the in-memory
store): how long a worker's report counts, when it is deleted, how several workers' views of one
host add up, and what a page cursor of ``GET /v1/targets`` is. One copy, so the stores cannot
answer differently.

Every worker reports what it sees of each host every few seconds (workers/health.py); a report
is the worker's view *now*, so one that was not repeated soon is worth nothing. A report counts
for ``LIVE_S``: a worker that stopped (crashed, scaled down, lost its database) drops out of the
list within two minutes instead of pinning a host at ``backing_off`` forever. Its rows are kept a
little longer, for an operator reading the table, and then deleted: by the worker's own next
report (``STALE_S``, the worker's hosts that went quiet) or, for a worker that never comes back
(a pod name of an earlier deployment), by the maintenance service (``PURGE_S``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from duetime.core.model import TargetState
from duetime.storage.ports import TargetHealthReport
from duetime.storage.registry_rules import decode_text_cursor, encode_text_cursor

#: Seconds a report counts in ``list_targets``.
LIVE_S: Final = 120.0
#: Seconds after which a worker's report it did not repeat is deleted at its next report.
STALE_S: Final = 600.0
#: Seconds after which any report is deleted by the maintenance service (engine/retention.py).
PURGE_S: Final = 3600.0
#: Reports written per statement: a worker may hand thousands (every owner's every host).
REPORT_BATCH: Final = 2000
#: Bytes of a host a cursor may carry: what the API's 1024 cursor characters hold, far above a
#: DNS name (253) with an IPv6 literal's brackets and a port.
CURSOR_MAX_BYTES: Final = 768

#: How bad a state is: a host's state in the list is the worst any live worker reports.
SEVERITY: Final = {TargetState.HEALTHY: 0, TargetState.DEGRADED: 1, TargetState.BACKING_OFF: 2}


def worst(states: Iterable[TargetState]) -> TargetState:
    """The worst of several workers' states (``backing_off`` > ``degraded`` > ``healthy``)."""
    return max(states, key=SEVERITY.__getitem__)


def latest_per_pair(reports: Sequence[TargetHealthReport]) -> list[TargetHealthReport]:
    """One report per (owner, host), the last one given, in (owner, host) order.

    A batch that names a pair twice would make PostgreSQL's upsert fail ("cannot affect row a
    second time"); the order makes concurrent writers lock rows in one order.
    """
    latest = {(r.owner, r.host): r for r in reports}
    return [latest[pair] for pair in sorted(latest)]


def target_cursor(cursor: str | None) -> str:
    """The host a page starts after (``""``, before every host, for the first page)."""
    return decode_text_cursor(cursor, max_bytes=CURSOR_MAX_BYTES) if cursor else ""


def encode_target_cursor(host: str) -> str:
    return encode_text_cursor(host)
