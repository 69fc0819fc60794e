"""What a worker needs for one attempt (``Delivery``) and what the attempt came to (``Verdict``).

Records only, shared by the webhook caller, the queue publisher, the dispatcher and the pool: kept
in the core so those modules depend on the records and not on each other (they used to import
one another in a circle around ``Delivery``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from duetime.core.model import Outcome, Target


@dataclass(frozen=True, slots=True)
class Delivery:
    job_id: str  # uuid string
    scheduled_for: datetime  # nominal occurrence (before jitter), aware UTC
    attempt: int  # 1-based
    fencing_token: int
    owner: str
    signing_secret: str  # the owner's secret, "whsec_<base64>"
    payload: Any  # JSON value (None → body "null")
    target: Target  # WebhookTarget | QueueTarget


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one call came to, before the dispatcher adds its timestamps."""

    outcome: Outcome
    retryable: bool
    status_code: int | None
    error: str | None
