"""Index records are synced when due, not every flush round: a round fsyncs the data alone,
the checkpoint vouches only for entries whose records are synced too, and recovery rebuilds
the records a power loss took from the data (dledger/log/durability.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from dledger import limits
from dledger.log.flusher import Flusher
from dledger.log.store import LogStore
from tests.log.helpers import SMALL, append_one, batch_of, body, index_files, open_store

RECORD_BYTES = 32
NEVER_MS = 10**9  # an index sync interval no test outlives


def round_of(store: LogStore) -> tuple[int, bool]:
    """One flush round as the flusher makes it: (descriptors synced, whether it covered the
    index records)."""
    ticket = store.begin_flush()
    assert ticket is not None
    synced = len(ticket.fds)
    ticket.run()
    store.complete_flush(ticket)
    return synced, ticket.covers_index


def test_a_round_within_the_interval_syncs_the_data_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_store(tmp_path, SMALL) as store:
        store.append(batch_of(1, 1, 5))
        assert round_of(store) == (2, True)  # the first round: nothing synced the index yet
        monkeypatch.setattr(limits, "INDEX_SYNC_INTERVAL_MS", NEVER_MS)
        store.append(batch_of(6, 1, 3))
        assert round_of(store) == (1, False)  # the segment only
        assert store.durable_index == 8
        assert store.index_sync_pending and not store.has_data_dirty
        store.write_checkpoint(8, 8)
        assert store.read_checkpoint().durable_index == 5  # only what the records back
        monkeypatch.setattr(limits, "INDEX_SYNC_INTERVAL_MS", 0)
        store.append(batch_of(9, 1, 1))
        assert round_of(store) == (2, True)  # due: the index file goes along
        store.write_checkpoint(9, 9)
        assert store.read_checkpoint().durable_index == 9


def test_flush_takes_the_index_whatever_the_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_store(tmp_path, SMALL) as store:
        store.append(batch_of(1, 1, 5))
        round_of(store)
        monkeypatch.setattr(limits, "INDEX_SYNC_INTERVAL_MS", NEVER_MS)
        store.append(batch_of(6, 1, 3))
        assert store.flush() == 8
        assert not store.index_sync_pending
        store.write_checkpoint(8, 8)
        assert store.read_checkpoint().durable_index == 8


def test_records_lost_after_the_checkpoint_are_rebuilt_from_the_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A power loss after a data-only round: the data of 6..8 is on disk, their records are
    not. The checkpoint names 5, so recovery walks from 6 and writes the records again."""
    store = open_store(tmp_path, SMALL)
    store.append(batch_of(1, 1, 5))
    store.flush()
    monkeypatch.setattr(limits, "INDEX_SYNC_INTERVAL_MS", NEVER_MS)
    store.append(batch_of(6, 2, 3))
    assert round_of(store) == (1, False)
    store.write_checkpoint(8, 8)
    store.abandon()
    with open(index_files(tmp_path)[0], "r+b") as f:  # what the unsynced pages held is gone
        f.seek(5 * RECORD_BYTES)
        f.write(bytes(3 * RECORD_BYTES))
    with open_store(tmp_path, SMALL) as store:
        assert store.last_index == 8 and store.durable_index == 8
        assert store.recovery.walked_from_index == 6
        assert store.recovery.index_records_rebuilt == 3
        for index in range(1, 9):
            assert store.get(index).body == body(index, store.term_at(index))


def test_truncation_lowers_what_the_records_vouch_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_store(tmp_path, SMALL) as store:
        store.append(batch_of(1, 1, 8))
        store.flush()
        store.truncate_after(4)
        store.write_checkpoint(4, 4)
        assert store.read_checkpoint().durable_index == 4
        monkeypatch.setattr(limits, "INDEX_SYNC_INTERVAL_MS", NEVER_MS)
        store.append(batch_of(5, 2, 2))
        assert round_of(store) == (2, False)  # the truncation's cleared records go along
        store.write_checkpoint(6, 6)
        assert store.read_checkpoint().durable_index == 4


async def test_sync_flush_rounds_leave_the_index_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "INDEX_SYNC_INTERVAL_MS", NEVER_MS)
    with open_store(tmp_path, SMALL) as store:
        flusher = Flusher(store)
        async with trio.open_nursery() as nursery:
            await nursery.start(flusher.run)
            await flusher.wait_durable(append_one(store, flusher))  # it syncs the index too
            fsyncs = store.fsyncs
            for _ in range(4):
                await flusher.wait_durable(append_one(store, flusher))
            assert store.fsyncs - fsyncs == 4  # one fdatasync a round: the segment's
            assert store.index_sync_pending
            store.write_checkpoint(5, 5)
            assert store.read_checkpoint().durable_index == 1
            assert await flusher.flush_once() == 5  # an explicit round takes them
            assert not store.index_sync_pending
            store.write_checkpoint(5, 5)
            assert store.read_checkpoint().durable_index == 5
            nursery.cancel_scope.cancel()


async def test_an_idle_sync_flusher_syncs_what_rounds_left_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    monkeypatch.setattr(limits, "INDEX_SYNC_INTERVAL_MS", 60_000)
    with open_store(tmp_path, SMALL) as store:
        flusher = Flusher(store)
        async with trio.open_nursery() as nursery:
            await nursery.start(flusher.run)
            for _ in range(2):  # the first round takes the index, the second does not
                await flusher.wait_durable(append_one(store, flusher))
            assert store.index_sync_pending
            with trio.fail_after(3600):  # virtual seconds: the timer's round runs in a thread
                while store.index_sync_pending or store.read_checkpoint().durable_index < 2:
                    await trio.sleep(1)
                    store.write_checkpoint(2, 2)
            nursery.cancel_scope.cancel()
