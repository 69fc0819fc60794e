"""The run path's wire formats round-trip: wheel entries and run-queue messages (runqueue.wire)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from duetime.core import codec
from duetime.core.model import Broker, JobSpec, OneOffSchedule, QueueTarget
from duetime.core.runpath import FencedRun, RunSpec
from duetime.engine import wheel
from duetime.runqueue import wire

T = datetime(2026, 12, 1, 0, 0, 0, 123456, tzinfo=UTC)

instants = st.datetimes(
    min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
)


@given(
    due_ms=st.integers(-(2**63), 2**63 - 1),
    token=st.integers(-(2**63), 2**63 - 1),
    scheduled_for=instants,
    shard=st.integers(0, 255),
    lane=st.integers(0, 0xFFFF),
)
def test_an_entry_round_trips_and_its_prefix_and_lane_read_without_unpacking(
    due_ms: int, token: int, scheduled_for: datetime, shard: int, lane: int
) -> None:
    job_id = uuid.uuid4()
    entry = wire.pack_entry(due_ms, job_id, token, scheduled_for, shard, lane)
    assert len(entry) == wire.ENTRY_SIZE == 43
    e = wire.unpack_entry(entry)
    assert (e.due_ms, e.job_id, e.lease_token, e.scheduled_for, e.shard, e.lane) == (
        due_ms,
        job_id,
        token,
        scheduled_for,
        shard,
        lane,
    )
    assert wire.entry_due_ms(entry) == due_ms
    assert wire.entry_lane(entry) == lane
    assert wire.entry_shard(entry) == shard


def test_entries_sort_by_their_due_instant_and_the_wheel_reads_the_same_prefix() -> None:
    dues = [5, 1_700_000_000_000, 0, 2, 1_700_000_000_001]
    entries = [wire.pack_entry(d, uuid.uuid4(), 1, T, 0) for d in dues]
    # The wheel sorts by the raw prefix (big-endian): the byte order is the due order.
    assert [wire.entry_due_ms(e) for e in sorted(entries, key=lambda e: e[:8])] == sorted(dues)
    # The wheel slots entries by the codec's prefix, not a copy of its format.
    assert wheel.ENTRY_HEADER is wire.DUE_PREFIX
    assert [wheel.entry_due_ms(e) for e in entries] == dues


def test_time_conversions_are_exact_to_the_microsecond() -> None:
    for moment in (T, T + timedelta(microseconds=1), datetime(1970, 1, 1, tzinfo=UTC)):
        assert wire.from_us(wire.to_us(moment)) == moment
    assert wire.to_ms(T.replace(microsecond=0)) == wire.to_us(T.replace(microsecond=0)) // 1000


def test_a_due_time_between_milliseconds_is_kept_as_the_next_one() -> None:
    """The wheel fires an entry when the clock's millisecond reaches its due one: a due time
    rounded down fired up to a millisecond early."""
    for us in (1, 668, 999):
        due = T.replace(microsecond=839_000 + us)
        ms = wire.to_ms(due)
        assert ms * 1000 >= wire.to_us(due), "never fired before it is due"
        assert ms * 1000 - wire.to_us(due) < 1000, "and at most a millisecond after"
    exact = T.replace(microsecond=839_000)
    assert wire.to_ms(exact) * 1000 == wire.to_us(exact)


def _run(parent: uuid.UUID | None = None, text: str | None = None) -> FencedRun:
    spec = JobSpec(target=QueueTarget(Broker.REDIS, "t"), schedule=OneOffSchedule(T), payload={"n": 2**70})
    return FencedRun(
        job_id=uuid.uuid4(),
        shard=7,
        owner="alice",
        lease_token=42,
        scheduled_for=T,
        due_at=T + timedelta(milliseconds=250),
        attempt=3,
        spec=RunSpec(text, 5) if text is not None else RunSpec.of(spec, 5),
        run_kind="manual",
        parent_id=parent,
    )


@pytest.mark.parametrize("parent", [None, uuid.uuid4()])
def test_a_message_round_trips_with_its_publisher(parent: uuid.UUID | None) -> None:
    run = _run(parent)
    got = wire.decode_message(wire.encode_message(run, "engine-x"))
    assert got.publisher == "engine-x"
    assert got.run == run
    assert got.run.public_id == (parent or run.job_id)
    # The spec arrives as the very text the fence read, parsed once, wide integers intact.
    assert got.run.spec.text == run.spec.text
    assert got.run.spec.parsed == run.spec.parsed
    assert got.run.spec.parsed.payload == {"n": 2**70}


def test_the_spec_text_is_the_rows_own_text_not_a_re_encoding() -> None:
    spec = JobSpec(target=QueueTarget(Broker.NATS, "t"), schedule=OneOffSchedule(T))
    row_text = json.dumps(codec.spec_to_json(spec), indent=1)  # jsonb::text spells it its own way
    got = wire.decode_message(wire.encode_message(_run(text=row_text), "e"))
    assert got.run.spec.text == row_text
    assert got.run.spec.reuse(row_text) is got.run.spec.parsed  # the completion reuses its parse


def test_a_message_of_an_older_engine_without_the_parent_field_decodes() -> None:
    run = _run()
    fields = msgpack.unpackb(wire.encode_message(run, "old"), raw=False)[:12]
    got = wire.decode_message(msgpack.packb(fields, use_bin_type=True))
    assert got.run.parent_id is None and got.run == run


@pytest.mark.parametrize(
    "data",
    [
        b"not msgpack \xc1",
        msgpack.packb({"a": 1}),
        msgpack.packb([2, b"x"]),  # another format
        msgpack.packb([1, b"short", 0, "o", 1, 0, 0, 1, "{}", 1, "scheduled", "e"]),  # bad uuid
    ],
)
def test_anything_else_is_refused_as_unreadable(data: bytes) -> None:
    with pytest.raises(ValueError, match="unreadable run message"):
        wire.decode_message(data)


def test_a_message_whose_spec_cannot_be_read_is_refused_at_decode_not_at_the_call() -> None:
    for bad in ("{not json", '{"target": {"type": "queue"}}'):
        fields = msgpack.unpackb(wire.encode_message(_run(), "e"), raw=False)
        fields[8] = bad
        with pytest.raises(ValueError, match="unreadable run message"):
            wire.decode_message(msgpack.packb(fields, use_bin_type=True))
