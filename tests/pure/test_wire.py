"""The run path's wire formats round-trip: wheel entries and run-queue messages (runqueue.wire)."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
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
    [got] = wire.decode_runs(wire.encode_message(run, "engine-x")).runs
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
    [got] = wire.decode_runs(wire.encode_message(_run(text=row_text), "e")).runs
    assert got.run.spec.text == row_text
    assert got.run.spec.reuse(row_text) is got.run.spec.parsed  # the completion reuses its parse


def test_a_message_of_an_older_engine_without_the_parent_field_decodes() -> None:
    run = _run()
    fields = msgpack.unpackb(wire.encode_message(run, "old"), raw=False)[:12]
    [got] = wire.decode_runs(msgpack.packb(fields, use_bin_type=True)).runs
    assert got.run.parent_id is None and got.run == run


def _with_context(run: FencedRun) -> FencedRun:
    return replace(
        run,
        job_created_at=T - timedelta(days=3, microseconds=7),
        last_success_for=T - timedelta(hours=1),
        folded_from=T - timedelta(hours=5),
        spec_revision=4,
    )


@pytest.mark.parametrize("parent", [None, uuid.uuid4()])
def test_the_runs_context_travels_with_it_in_a_message_and_a_bundle(parent: uuid.UUID | None) -> None:
    run = _with_context(_run(parent))
    [got] = wire.decode_runs(wire.encode_message(run, "e")).runs
    assert got.run == run
    assert (got.run.job_created_at, got.run.last_success_for, got.run.folded_from) == (
        T - timedelta(days=3, microseconds=7),
        T - timedelta(hours=1),
        T - timedelta(hours=5),
    )
    runs = [_with_context(_on(2)), _on(2), replace(_with_context(_on(2, parent=parent)), folded_from=None)]
    assert [p.run for p in wire.decode_runs(wire.encode_runs(runs, "e")).runs] == runs


def test_a_message_of_an_engine_before_the_run_context_decodes_without_it() -> None:
    """Messages of the release before end with the parent field (format 1) or hold eleven fields
    a run (bundles): their runs decode with no context, and a worker of that release reads this
    release's messages by the fields it knows."""
    run = _with_context(_run(uuid.uuid4()))
    fields = msgpack.unpackb(wire.encode_message(run, "old"), raw=False)
    assert len(fields) == 17
    [got] = wire.decode_runs(msgpack.packb(fields[:13], use_bin_type=True)).runs
    assert got.run == replace(
        run, job_created_at=None, last_success_for=None, folded_from=None, spec_revision=None
    )
    # Without the API's spec version (an engine before 0018's), a run says the run path's own.
    assert got.run.spec_version == run.spec.version
    [with_context] = wire.decode_runs(msgpack.packb(fields[:16], use_bin_type=True)).runs
    assert with_context.run == replace(run, spec_revision=None)
    assert run.spec_version == 4
    bundle = msgpack.unpackb(wire.encode_runs([run, run], "old"), raw=False)
    old_bundle = [*bundle[:2], *(one[:11] for one in bundle[2:])]
    got_runs = wire.decode_runs(msgpack.packb(old_bundle, use_bin_type=True)).runs
    assert [p.run.folded_from for p in got_runs] == [None, None]
    # what the release before read of a message: format 1's first 13 fields, a bundle run's first 11
    assert (
        fields[:13]
        == msgpack.unpackb(
            wire.encode_message(
                replace(run, job_created_at=None, last_success_for=None, folded_from=None), "old"
            ),
            raw=False,
        )[:13]
    )


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
        wire.decode_runs(data)


def test_a_message_whose_spec_cannot_be_read_is_refused_at_decode_not_at_the_call() -> None:
    for bad in ("{not json", '{"target": {"type": "queue"}}'):
        fields = msgpack.unpackb(wire.encode_message(_run(), "e"), raw=False)
        fields[8] = bad
        with pytest.raises(ValueError, match="unreadable run message"):
            wire.decode_runs(msgpack.packb(fields, use_bin_type=True))


# ---------------------------------------------------------------------------------- bundles


def _on(shard: int, text: str | None = None, parent: uuid.UUID | None = None) -> FencedRun:
    return replace(_run(parent, text), shard=shard)


@given(shards=st.lists(st.integers(0, 3), min_size=1, max_size=300))
def test_a_batch_goes_out_as_bundles_of_one_shard_each_run_once_in_order(shards: list[int]) -> None:
    runs = [_on(s) for s in shards]
    bundles = wire.bundles_of(runs)
    assert all(1 <= len(b) <= wire.BUNDLE_RUNS for b in bundles)
    assert all(len({r.shard for r in b}) == 1 for b in bundles)
    for shard in set(shards):  # each shard's runs keep their order, and only its last bundle is short
        mine = [b for b in bundles if b[0].shard == shard]
        assert [r for b in mine for r in b] == [r for r in runs if r.shard == shard]
        assert all(len(b) == wire.BUNDLE_RUNS for b in mine[:-1])
    assert len(bundles) == sum(-(-shards.count(s) // wire.BUNDLE_RUNS) for s in set(shards))


def test_a_bundle_holds_no_more_spec_text_than_its_bound_and_a_huge_spec_goes_alone() -> None:
    spec = JobSpec(target=QueueTarget(Broker.REDIS, "t"), schedule=OneOffSchedule(T), payload="x" * 50_000)
    big = RunSpec.of(spec, 1)
    runs = [replace(_on(3), spec=big) for _ in range(5)]
    huge = replace(_on(3), spec=RunSpec.of(replace(spec, payload="y" * 200_000), 1))
    bundles = wire.bundles_of([*runs, huge, _on(3)])
    assert [len(b) for b in bundles] == [2, 2, 1, 1, 1]
    assert bundles[3] == [huge]
    assert all(sum(len(r.spec.text) for r in b) <= wire.BUNDLE_SPEC_CHARS for b in bundles if len(b) > 1)


def test_a_bundle_round_trips_with_its_publisher_and_a_lone_run_stays_format_1() -> None:
    runs = [_on(5), _on(5, parent=uuid.uuid4()), _on(5)]
    got = wire.decode_runs(wire.encode_runs(runs, "engine-b"))
    assert got.unreadable == 0
    assert [p.run for p in got.runs] == runs
    assert {p.publisher for p in got.runs} == {"engine-b"}
    assert got.runs[1].run.spec.parsed.payload == {"n": 2**70}
    alone = wire.encode_runs(runs[:1], "engine-b")
    assert alone == wire.encode_message(runs[0], "engine-b")  # what workers of earlier releases read
    assert [p.run for p in wire.decode_runs(alone).runs] == runs[:1]


def test_an_unreadable_run_of_a_bundle_is_counted_and_the_others_kept() -> None:
    runs = [_on(1), _on(1), _on(1)]
    fields = msgpack.unpackb(wire.encode_runs(runs, "e"), raw=False)
    fields[3][7] = "{not json"  # the second run's spec
    got = wire.decode_runs(msgpack.packb(fields, use_bin_type=True))
    assert got.unreadable == 1
    assert [p.run for p in got.runs] == [runs[0], runs[2]]


@pytest.mark.parametrize(
    "data",
    [
        b"not msgpack \xc1",
        msgpack.packb({"a": 1}),
        msgpack.packb([2, "e"]),  # a bundle without runs
        msgpack.packb([2, b"x", []]),  # a bundle whose publisher is not text
        msgpack.packb([3, "e", []]),  # another format
    ],
)
def test_a_message_that_is_no_bundle_is_refused_as_unreadable(data: bytes) -> None:
    with pytest.raises(ValueError, match="unreadable run message"):
        wire.decode_runs(data)
