"""The one retry layer's rules: full-jitter exponential backoff and which failures retry.

Pure: the random source and the clock are arguments, so tests pin both.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from duetime.core.model import RetryPolicy

_SYSTEM_RANDOM = random.SystemRandom()


def backoff_ceiling_s(policy: RetryPolicy, attempt: int) -> float:
    """min(max, initial × multiplier^(attempt-1)) for the delay before attempt + 1."""
    exponent = max(attempt - 1, 0)
    try:
        ceiling = policy.backoff_initial_s * (policy.backoff_multiplier**exponent)
    except OverflowError:
        ceiling = policy.backoff_max_s
    return min(policy.backoff_max_s, ceiling)


def next_retry_at(
    policy: RetryPolicy, attempt: int, now: datetime, rng: random.Random | None = None
) -> datetime:
    """When attempt + 1 is due after attempt ``attempt`` failed: a uniform draw in [0, ceiling]."""
    draw = (rng or _SYSTEM_RANDOM).uniform(0.0, backoff_ceiling_s(policy, attempt))
    return now + timedelta(seconds=draw)


def status_is_retryable(status: int) -> bool:
    """408, 429 and 5xx retry; every other non-2xx fails the occurrence at once."""
    return status in (408, 429) or 500 <= status <= 599
