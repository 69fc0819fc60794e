"""format_time's fast spelling is the strftime one it replaced, for every instant."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from duetime.core.codec import format_time, parse_time


def _reference(value: datetime) -> str:
    value = value.astimezone(UTC)
    if value.microsecond:
        return value.strftime("%Y-%m-%dT%H:%M:%S.%f").rstrip("0") + "Z"
    return value.strftime("%Y-%m-%dT%H:%M:%S") + "Z"


@given(
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)),
    st.integers(min_value=-14 * 60, max_value=14 * 60),
)
def test_format_time_spells_every_instant_as_before(value: datetime, offset_min: int) -> None:
    local = value.astimezone(timezone(timedelta(minutes=offset_min)))
    assert format_time(value) == _reference(value)
    assert format_time(local) == _reference(local)
    if value.year >= 1000:  # strftime's unpadded years never parsed back; nothing stores them
        assert parse_time(format_time(local)) == value


def test_fractions_lose_trailing_zeros_only() -> None:
    assert format_time(datetime(2026, 12, 1, tzinfo=UTC)) == "2026-12-01T00:00:00Z"
    assert format_time(datetime(2026, 12, 1, 0, 0, 0, 120000, tzinfo=UTC)) == "2026-12-01T00:00:00.12Z"
