"""The one retry layer's rules: full-jitter exponential backoff and which failures retry.

Pure: the random source and the clock are arguments, so tests pin both.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime

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


#: The error an occurrence fails with when its next attempt could not start inside max_duration_s.
WINDOW_EXCEEDED = "retry window exceeded"


def retry_after_s(status: int, header: str | None, now: datetime) -> float | None:
    """The wait a 429 or 503 answer asks for in its ``Retry-After`` (RFC 9110 §10.2.3), in
    seconds from ``now``: delta-seconds or an HTTP date. None for other statuses, no header, or a
    value that is neither; 0 for a date already past."""
    if status not in (429, 503) or header is None:
        return None
    text = header.strip()
    if text.isascii() and text.isdigit():
        return float(min(int(text), 10**9))
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP date is always GMT; a zoneless one is read as such
        when = when.replace(tzinfo=UTC)
    return max((when - now).total_seconds(), 0.0)


def _floor_s(policy: RetryPolicy, retry_after: float | None) -> float:
    """The least delay before the next attempt: the target's Retry-After, at most backoff_max_s."""
    return min(retry_after, policy.backoff_max_s) if retry_after else 0.0


def window_closed(policy: RetryPolicy, now: datetime, due: datetime, retry_after: float | None) -> bool:
    """Whether no next attempt can start within ``max_duration_s`` of the occurrence's due time
    (after the Retry-After wait, if any)."""
    if policy.max_duration_s is None:
        return False
    return now + timedelta(seconds=_floor_s(policy, retry_after)) > due + timedelta(
        seconds=policy.max_duration_s
    )


def plan_retry(
    policy: RetryPolicy,
    attempt: int,
    now: datetime,
    *,
    due: datetime,
    retry_after: float | None = None,
    rng: random.Random | None = None,
) -> datetime | None:
    """When attempt + 1 starts after attempt ``attempt`` failed, or None when it cannot start
    inside the retry window (the occurrence then fails with ``WINDOW_EXCEEDED``).

    The backoff draw is full jitter; a Retry-After raises it to at least that wait (capped at
    backoff_max_s, so a target cannot park a job for a day); a draw past the window's end is
    brought back to the end, so the last chance inside the window is still taken.
    """
    if window_closed(policy, now, due, retry_after):
        return None
    at = next_retry_at(policy, attempt, now, rng)
    floor = now + timedelta(seconds=_floor_s(policy, retry_after))
    at = max(at, floor)
    if policy.max_duration_s is not None:
        at = min(at, due + timedelta(seconds=policy.max_duration_s))
    return at


def status_is_retryable(status: int) -> bool:
    """408, 429 and 5xx retry; every other non-2xx fails the occurrence at once."""
    return status in (408, 429) or 500 <= status <= 599
