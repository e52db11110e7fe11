"""The disk-tail fault hits only what recovery may cut: the store must open again, cut the tail
and keep every entry up to the checkpoint's durable index. Damage recovery must refuse (in the
middle of the log, or at or below the durable index) would be a harness bug, not a fault."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from chaos.targets.dledger_disk import MODES, damage_tail
from dledger.log.store import LogStore, StoreConfig
from dledger.raft.entries import EntryBatch, EntryKind

CONFIG = StoreConfig(segment_bytes=64 * 1024, index_records_per_file=64)


def open_store(path: Path) -> LogStore:
    return LogStore.open(path, CONFIG, group="g", self_id="n0")


def write(store: LogStore, first: int, count: int) -> None:
    bodies = [f"0-{i}".encode() * 7 for i in range(first, first + count)]
    store.append(EntryBatch(first, [1] * count, [EntryKind.DATA.value] * count, bodies))
    store.flush()


def crashed_store(path: Path, durable: int, total: int) -> None:
    """`total` entries on disk, a checkpoint vouching for the first `durable`, then a crash."""
    store = open_store(path)
    write(store, 1, durable)
    store.write_checkpoint(durable, durable)
    if total > durable:
        write(store, durable + 1, total - durable)
    store.abandon()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(6))
def test_damaged_tail_is_cut_and_durable_entries_survive(
    tmp_path: Path, mode: str, seed: int
) -> None:
    crashed_store(tmp_path, durable=40, total=70)
    damage = damage_tail(tmp_path, mode, random.Random(seed))
    assert damage.mode == mode and damage.durable_index == 40
    assert damage.first_index_hit is not None and damage.first_index_hit > 40
    with open_store(tmp_path) as store:
        assert store.recovery.cut_bytes > 0
        assert 40 <= store.last_index < 70
        assert store.get(40).body == b"0-40" * 7
        assert store.last_index == damage.first_index_hit - 1


def test_with_nothing_past_the_durable_index_garbage_goes_after_the_end(tmp_path: Path) -> None:
    crashed_store(tmp_path, durable=30, total=30)
    damage = damage_tail(tmp_path, "truncate", random.Random(1))
    assert damage.mode == "garbage-after-end" and damage.entries_hit == 0
    with open_store(tmp_path) as store:
        assert store.recovery.cut_bytes == damage.length
        assert store.last_index == 30


def test_an_empty_store_is_left_alone(tmp_path: Path) -> None:
    assert damage_tail(tmp_path, "garbage", random.Random(0)).mode == "none"
