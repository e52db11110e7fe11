"""Queue locks of orderly consumers, decided as lock entries are applied: one client per
queue and group, free again LOCK_EXPIRY_MS after its last renewal, carried by checkpoints and
snapshots (so a new leader holds the same table)."""

from __future__ import annotations

from broker.metadata import LOCK_EXPIRY_MS, Metadata

Q0, Q1 = ("T", "broker-a", 0), ("T", "broker-a", 1)


def test_one_client_per_queue_until_its_lock_expires() -> None:
    m = Metadata()
    m.apply(Metadata.lock_op("g", "A", [Q0, Q1], at_ms=1_000))
    assert m.held_by("g", "A", [Q0, Q1]) == [Q0, Q1]
    m.apply(Metadata.lock_op("g", "B", [Q0], at_ms=1_000 + LOCK_EXPIRY_MS))  # not yet expired
    assert m.held_by("g", "B", [Q0]) == []
    m.apply(Metadata.lock_op("g", "A", [Q1], at_ms=30_000))  # A renews only Q1
    m.apply(Metadata.lock_op("g", "B", [Q0, Q1], at_ms=1_001 + LOCK_EXPIRY_MS))
    assert m.held_by("g", "B", [Q0, Q1]) == [Q0]  # Q0 expired, Q1 was renewed
    assert m.held_by("g", "A", [Q1]) == [Q1]


def test_other_groups_are_independent_and_only_the_holder_unlocks() -> None:
    m = Metadata()
    m.apply(Metadata.lock_op("g", "A", [Q0], at_ms=1))
    m.apply(Metadata.lock_op("h", "B", [Q0], at_ms=2))
    assert m.held_by("h", "B", [Q0]) == [Q0]
    m.apply(Metadata.unlock_op("g", "B", [Q0]))  # not B's in group g
    assert m.held_by("g", "A", [Q0]) == [Q0]
    m.apply(Metadata.unlock_op("g", "A", [Q0]))
    m.apply(Metadata.lock_op("g", "C", [Q0], at_ms=3))
    assert m.held_by("g", "C", [Q0]) == [Q0]


def test_locks_survive_a_checkpoint_or_snapshot_round_trip() -> None:
    m = Metadata()
    m.apply(Metadata.lock_op("g", "A", [Q0], at_ms=5))
    restored = Metadata()
    restored.restore(m.state())
    restored.apply(Metadata.lock_op("g", "B", [Q0], at_ms=6))
    assert restored.held_by("g", "A", [Q0]) == [Q0]
