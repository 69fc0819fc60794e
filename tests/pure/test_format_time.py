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


def test_times_that_compare_equal_but_differ_by_fold_are_spelled_apart() -> None:
    """Spellings are remembered by instant: 02:30 in Berlin on the night clocks go back is two
    instants an hour apart, equal as datetimes (same zone, fold ignored), and each keeps its own."""
    from zoneinfo import ZoneInfo

    first = datetime(2026, 10, 25, 2, 30, tzinfo=ZoneInfo("Europe/Berlin"))
    second = first.replace(fold=1)
    assert first == second  # what a memo keyed by the value itself would trip over
    assert format_time(first) == "2026-10-25T00:30:00Z"
    assert format_time(second) == "2026-10-25T01:30:00Z"
    assert format_time(first) == "2026-10-25T00:30:00Z"  # and again, from the memo


def test_a_remembered_spelling_is_the_spelling() -> None:
    value = datetime(2026, 12, 2, 0, 0, 0, 500000, tzinfo=UTC)
    assert format_time(value) == format_time(value) == "2026-12-02T00:00:00.5Z"
    assert format_time(value.astimezone(timezone(timedelta(hours=5)))) == "2026-12-02T00:00:00.5Z"
