"""Metadata snapshots: taken by a replica that rebuilt from a log cut by retention (then
complete), skipped by a complete one, whose state they would otherwise roll back."""

from __future__ import annotations

from pathlib import Path

from broker.entries import encode_meta
from broker.metadata import Metadata, TopicConfig
from broker.snapshots import snapshot_interval_ms
from broker.state import BrokerState, Geometry
from dledger.log.store import LogStore, StoreConfig
from dledger.raft.entries import EntryBatch, EntryKind

GEOMETRY = Geometry(cq_units_per_file=64, index_slots=64, index_items=256)


def batch(first: int, ops: list[dict[str, object]]) -> EntryBatch:
    bodies = [encode_meta(op) for op in ops]
    return EntryBatch(first, [1] * len(bodies), [EntryKind.DATA] * len(bodies), bodies)


def snapshot_of(topics: list[str], offset: int, as_of: int) -> dict[str, object]:
    m = Metadata()
    for t in topics:
        m.apply(Metadata.topic_op(TopicConfig(t, 4, 4)))
    m.apply(Metadata.offsets_op([(("g", "A", 0), offset, offset * 1000)]))
    return m.snapshot_op(as_of, at_ms=1_000)


def open_state(tmp_path: Path) -> tuple[LogStore, BrokerState]:
    store = LogStore.open(
        tmp_path / "s", StoreConfig(segment_bytes=1 << 20), group="g", self_id="n0"
    )
    return store, BrokerState(tmp_path / "s", store, GEOMETRY)


def test_a_rebuilding_replica_takes_the_snapshot_then_the_operations_after_it(
    tmp_path: Path,
) -> None:
    store, state = open_state(tmp_path)
    try:
        state.metadata_complete = False  # as after a rebuild from a log retention cut
        ops = [
            Metadata.offsets_op([(("g", "A", 0), 7, 7000)]),  # index 5: after the snapshot's as_of
            snapshot_of(["A", "Old"], offset=3, as_of=4),  # index 6
        ]
        state.apply(batch(5, ops))
        assert state.metadata_complete
        assert state.metadata.offsets[("g", "A", 0)] == 7  # not rolled back to 3
        assert set(state.metadata.topics) == {"A", "Old"}
        assert state.last_snapshot_at_ms == 1_000
    finally:
        state.close()
        store.close()


def test_a_complete_replica_skips_a_snapshot(tmp_path: Path) -> None:
    store, state = open_state(tmp_path)
    try:
        ops = [
            Metadata.topic_op(TopicConfig("A", 4, 4)),  # index 1
            Metadata.offsets_op([(("g", "A", 0), 3, 3000)]),  # index 2
            Metadata.offsets_op([(("g", "A", 0), 9, 9000)]),  # index 3, after the snapshot's as_of
            snapshot_of(["A"], offset=3, as_of=2),  # index 4, proposed before index 3 applied
        ]
        state.apply(batch(1, ops))
        assert state.metadata.offsets[("g", "A", 0)] == 9
        assert state.last_snapshot_at_ms == 1_000
    finally:
        state.close()
        store.close()


def test_snapshots_come_four_times_per_retention_period_and_at_least_hourly() -> None:
    assert snapshot_interval_ms(72.0) == 3_600_000
    assert snapshot_interval_ms(2.0) == 1_800_000
