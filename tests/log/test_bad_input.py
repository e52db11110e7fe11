"""Bad input gets a named error with a message a user can act on, and the store stays
usable afterwards."""

from __future__ import annotations

from pathlib import Path

import pytest

from dledger import limits
from dledger.log.errors import (
    BelowFirstIndex,
    Compacted,
    EntryTooLarge,
    IndexOutOfRange,
    StoreMismatch,
)
from dledger.log.store import LogStore, StoreConfig
from dledger.raft.entries import EntryBatch, EntryId, LogStart
from tests.log.helpers import GROUP, SELF_ID, SMALL, TINY, batch_of, body, open_store


def test_entry_over_the_maximum_writes_nothing(tmp_path: Path) -> None:
    config = StoreConfig(segment_bytes=8 * limits.MiB)
    with open_store(tmp_path, config) as store:
        store.append(batch_of(1, 1, 2))
        position = store.next_position
        huge = bytes(limits.ENTRY_BODY_BYTES_MAX + 1)
        with pytest.raises(EntryTooLarge) as info:
            store.append(EntryBatch(3, [1, 1], [0, 0], [b"fine", huge]))
        assert (info.value.size, info.value.limit) == (len(huge), limits.ENTRY_BODY_BYTES_MAX)
        assert str(info.value) == (
            f"entry body of {len(huge)} bytes exceeds the limit of "
            f"{limits.ENTRY_BODY_BYTES_MAX} bytes"
        )
        assert (store.last_index, store.next_position) == (2, position)
        store.append(EntryBatch(3, [1], [0], [bytes(limits.ENTRY_BODY_BYTES_MAX)]))  # the max fits
        assert store.get(3).body == bytes(limits.ENTRY_BODY_BYTES_MAX)
        assert store.flush() == 3


def test_small_segments_bound_the_entry_size(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        limit = TINY.segment_bytes - limits.ENTRY_HEADER_BYTES - 8
        assert store.body_bytes_max == limit
        with pytest.raises(EntryTooLarge):
            store.append(EntryBatch(1, [1], [0], [bytes(limit + 1)]))
        store.append(EntryBatch(1, [1], [0], [bytes(limit)]))


def test_get_beyond_the_end(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        store.append(batch_of(1, 1, 3))
        with pytest.raises(IndexOutOfRange) as info:
            store.get(4)
        assert (info.value.index, info.value.first_index, info.value.last_index) == (4, 1, 3)
        assert str(info.value) == "index 4 is not in the log: it holds indexes 1 to 3"
        with pytest.raises(IndexOutOfRange):
            store.read(2, 9, 1000)
        with pytest.raises(IndexOutOfRange):
            store.read(3, 2, 1000)
        store.append(batch_of(4, 1, 1))
        assert store.get(4).body == body(4, 1)


def test_get_in_an_empty_log(tmp_path: Path) -> None:
    with open_store(tmp_path) as store, pytest.raises(IndexOutOfRange, match="no entries"):
        store.get(1)


def test_truncate_below_the_first_index(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        store.reset(LogStart(EntryId(10, 2), 0))
        store.append(batch_of(11, 2, 3))
        store.truncate_after(10)  # the lowest allowed: drops everything retained
        assert store.last_index == 10
        with pytest.raises(BelowFirstIndex) as info:
            store.truncate_after(9)
        assert str(info.value) == (
            "cannot truncate after index 9: the log starts at index 11, "
            "so the lowest index to truncate after is 10"
        )
        store.append(batch_of(11, 3, 2))
        assert store.get(12).body == body(12, 3)


def test_read_of_a_compacted_index(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        store.reset(LogStart(EntryId(10, 2), 0))
        store.append(batch_of(11, 2, 1))
        with pytest.raises(Compacted) as info:
            store.get(7)
        assert str(info.value) == "index 7 is compacted; first available index is 11"
        with pytest.raises(Compacted):
            store.read(10, 11, 100)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"group": "other"}, "group"),
        ({"self_id": "n9"}, "self_id"),
        ({"config": SMALL}, "segment_bytes"),
        ({"config": StoreConfig(4096, 16)}, "index_records_per_file"),
    ],
)
def test_opening_someone_elses_store(tmp_path: Path, kwargs: dict, field: str) -> None:
    open_store(tmp_path).close()
    args: dict = {"group": GROUP, "self_id": SELF_ID, "config": TINY} | kwargs
    with pytest.raises(StoreMismatch) as info:
        LogStore.open(tmp_path, args.pop("config"), **args)
    assert info.value.field == field
    assert str(info.value).startswith(f"store was created with {field}=")
    open_store(tmp_path).close()  # and the right owner still opens it


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"segment_bytes": 1024}, "segment_bytes must be at least 4096, got 1024"),
        ({"index_records_per_file": 0}, "index_records_per_file must be at least 1"),
        ({"flush_interval_ms": 0}, "flush_interval_ms must be at least 1"),
    ],
)
def test_config_is_validated(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StoreConfig(**kwargs)


def test_disk_full_mid_batch_leaves_the_log_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC creating the next segment part way through a batch: nothing of it stays."""
    import errno

    from dledger.log import segment

    with open_store(tmp_path) as store:
        store.append(batch_of(1, 1, 2, size=1000))
        position = store.next_position
        real_create = segment.Segment.create

        def full(*args: object, **kwargs: object) -> segment.Segment:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(segment.Segment, "create", full)
        with pytest.raises(OSError, match="No space left"):
            store.append(batch_of(3, 1, 6, size=1000))  # needs a new segment after two
        assert (store.last_index, store.next_position) == (2, position)
        with pytest.raises(IndexOutOfRange):
            store.get(3)
        monkeypatch.setattr(segment.Segment, "create", real_create)
        store.append(batch_of(3, 2, 6, size=1000))
        assert [store.get(i).body for i in range(3, 9)] == [body(i, 2, 1000) for i in range(3, 9)]
    with open_store(tmp_path) as store:
        assert store.last_index == 8 and store.get(3).body == body(3, 2, 1000)
