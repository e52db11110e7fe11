"""RocketMQ's IndexFile (docs/formats.md#indexfile): messages by key, for queryMsgByKey/ById.

    <root>/index/00000000000000004096    named by the physical offset of its first message

A file is a header, a hash table of slots and an array of items; each item links to the item
that held its slot before, so a slot heads a chain of the keys hashing to it, newest first.
Keys are indexed as RocketMQ does: `topic#UNIQ_KEY`, then `topic#k` for each space-separated
KEYS entry; rolled-back transactional messages are not indexed.

Deterministic naming (a deviation): RocketMQ names an IndexFile by the wall-clock time at which
the broker created it (yyyyMMddHHmmssSSS). Replicas create their files at different moments, so
that name would differ between replicas of the same log. Here a file is created by the put of its
first item and named by that message's physical offset (20 digits, as the ConsumeQueue and the
log's segments), which is a pure function of the replicated log, and it is also where a rebuild
has to start reading the log to recreate the file. Every other byte is a function of the
sequence of puts: a new file's header starts zeroed (RocketMQ seeds it with the previous file's
end, which also skews the first item's time), and a message's items never straddle two files
(a file too full for all of a message's keys is rolled first), so rebuilding from a file's
name gives the same bytes as the incremental puts did. That is also how a crash is repaired:
the file being written at the last checkpoint is deleted and re-indexed from its name.

Files are created sparse at full size (420,000,040 bytes by default) and mapped.
"""

from __future__ import annotations

import functools
import mmap
import struct
from collections.abc import Iterable
from pathlib import Path

from broker import limits, mapped_file
from broker.errors import CorruptIndexFile
from broker.native import native
from remoting import properties as props
from remoting import stored_message
from remoting.tag_hash import index_key_hash, index_key_hash_utf8

# IndexFile. Big-endian. Spec: docs/formats.md#indexfile; change both or neither.
# Header, at 0:
#  off len field              meaning
#    0   8 begin_timestamp    store timestamp (ms) of the first item's message
#    8   8 end_timestamp      store timestamp (ms) of the last item's message
#   16   8 begin_phy_offset   physical offset of the first item's message (= the file name)
#   24   8 end_phy_offset     physical offset of the last item's message
#   32   4 hash_slot_count    slots in use
#   36   4 index_count        1 + items in use (item 0 is never used: 0 means "no item")
# Slots, at 40: slot_count x int32, the number of the newest item whose key hash maps to the
# slot (key_hash % slot_count), 0 for none.
# Items, at 40 + 4 * slot_count: item_count x 20 bytes, item k at 40 + 4*slot_count + 20*k:
#    0   4 key_hash           abs(Java hashCode of "topic#key")
#    4   8 phy_offset         physical offset of the message
#   12   4 time_diff          (store timestamp - begin_timestamp) // 1000, in seconds, >= 0
#   16   4 prev_index         the item that held this slot before, 0 for none
HEADER = struct.Struct(">qqqqii")
SLOT = struct.Struct(">i")
ITEM = struct.Struct(">iqii")
assert HEADER.size == limits.INDEX_HEADER_BYTES
assert SLOT.size == limits.INDEX_SLOT_BYTES and ITEM.size == limits.INDEX_ITEM_BYTES
# bound methods and sizes for the put done for every key of every message on every replica
_SLOTS_AT, _SLOT_BYTES, _ITEM_BYTES = HEADER.size, SLOT.size, ITEM.size
_unpack_slot, _pack_slot, _pack_item = SLOT.unpack_from, SLOT.pack_into, ITEM.pack_into
INDEX_DIR = "index"
TIME_DIFF_MAX_S = (1 << 31) - 1
TRANSACTION_TYPE_MASK = 0xC  # sys_flag bits 2-3: 0 none, 4 prepared, 8 commit, 12 rollback
TRANSACTION_ROLLBACK = 0xC
TIMESTAMP_MAX_MS = (1 << 63) - 1


# an item of `dispatch_native.scan`, native byte order: key hash, the message's item count on its
# first item (else 0), physical offset, store timestamp
NATIVE_ITEM = struct.Struct("=IIqq")
ITEM_BYTES = NATIVE_ITEM.size


def _item_physical_offset(items: bytes, at: int) -> int:
    return int(NATIVE_ITEM.unpack_from(items, at * ITEM_BYTES)[2])


def file_bytes(slot_count: int, item_count: int) -> int:
    return HEADER.size + slot_count * SLOT.size + item_count * ITEM.size


@functools.lru_cache(maxsize=1024)  # a broker has few topics; every message names one
def _topic_bytes(topic: str) -> bytes:
    return topic.encode()


def index_keys(topic: str, keys: str | None, uniq_key: str | None) -> list[str]:
    """The keys a message is indexed under, in the order RocketMQ puts them."""
    result = [f"{topic}#{uniq_key}"] if uniq_key else []
    if keys:
        result.extend(f"{topic}#{key}" for key in keys.split(props.KEY_SEPARATOR) if key)
    return result


class IndexFile:
    """One file: put items, walk a key's chain."""

    def __init__(self, path: Path, mm: mmap.mmap, slot_count: int, item_count: int) -> None:
        """Use IndexFile.create or IndexFile.open."""
        self.path = path
        self.slot_count = slot_count
        self.item_count = item_count
        self._mm = mm
        self._items_at = HEADER.size + slot_count * SLOT.size
        (
            self.begin_timestamp_ms,
            self.end_timestamp_ms,
            self.begin_phy_offset,
            self.end_phy_offset,
            self.hash_slot_count,
            self.index_count,
        ) = HEADER.unpack_from(mm, 0)

    @classmethod
    def create(cls, path: Path, slot_count: int, item_count: int) -> IndexFile:
        mm = mapped_file.create(path, file_bytes(slot_count, item_count))
        HEADER.pack_into(mm, 0, 0, 0, 0, 0, 0, 1)
        return cls(path, mm, slot_count, item_count)

    @classmethod
    def open(cls, path: Path, slot_count: int, item_count: int) -> IndexFile:
        """An existing file, its header checked against its name and geometry."""
        size = file_bytes(slot_count, item_count)
        if path.stat().st_size != size:
            raise CorruptIndexFile(str(path), f"size {path.stat().st_size}, expected {size}")
        f = cls(path, mapped_file.open_existing(path, size), slot_count, item_count)
        reason = f._header_defect()
        if reason is not None:
            f.close()
            raise CorruptIndexFile(str(path), reason)
        return f

    def _header_defect(self) -> str | None:
        if not 1 <= self.index_count <= self.item_count:
            return f"index count {self.index_count} outside 1..{self.item_count}"
        if not 0 <= self.hash_slot_count <= min(self.slot_count, self.index_count - 1):
            return f"hash slot count {self.hash_slot_count} with {self.index_count - 1} items"
        if self.index_count > 1:
            name = mapped_file.parse_file_name(self.path.name)
            if name != self.begin_phy_offset:
                return f"begin physical offset {self.begin_phy_offset} is not the file's name"
            if self.end_phy_offset < self.begin_phy_offset:
                return f"end physical offset {self.end_phy_offset} below the begin"
        return None

    @property
    def room(self) -> int:
        """How many more items fit."""
        return self.item_count - self.index_count

    def put(self, key_hash: int, physical_offset: int, store_timestamp_ms: int) -> None:
        """Add one item for a key whose index_key_hash is `key_hash`; the caller made sure
        there is room."""
        number = self.index_count
        assert number < self.item_count, self.path
        mm = self._mm
        slot_at = _SLOTS_AT + (key_hash % self.slot_count) * _SLOT_BYTES
        prev = _unpack_slot(mm, slot_at)[0]
        if prev <= 0 or prev > number:
            prev = 0
            self.hash_slot_count += 1
        if number == 1:
            self.begin_timestamp_ms = store_timestamp_ms
            self.begin_phy_offset = physical_offset
        begin_ms = self.begin_timestamp_ms
        time_diff = (store_timestamp_ms - begin_ms) // 1000 if begin_ms > 0 else 0
        if not 0 <= time_diff <= TIME_DIFF_MAX_S:
            time_diff = 0 if time_diff < 0 else TIME_DIFF_MAX_S
        _pack_item(
            mm, self._items_at + number * _ITEM_BYTES, key_hash, physical_offset, time_diff, prev
        )
        _pack_slot(mm, slot_at, number)
        self.index_count = number + 1
        self.end_phy_offset = physical_offset
        self.end_timestamp_ms = store_timestamp_ms

    def put_items(self, items: bytes, at: int) -> int:
        """Put the items of whole messages from item `at` of `items` (the format of
        `dispatch_native.scan`), as `put` would one by one, skipping replays; returns the item
        at which it stopped: the end, or the first message that does not fit."""
        assert native is not None
        (
            at,
            self.index_count,
            self.hash_slot_count,
            self.begin_timestamp_ms,
            self.begin_phy_offset,
            self.end_timestamp_ms,
            self.end_phy_offset,
        ) = native.index_put(
            self._mm,
            items,
            at,
            self.slot_count,
            self.item_count,
            self.index_count,
            self.hash_slot_count,
            self.begin_timestamp_ms,
            self.begin_phy_offset,
            self.end_timestamp_ms,
            self.end_phy_offset,
        )
        return at

    def write_header(self) -> None:
        """The counts and bounds into the file's header (IndexStore.write_header says when)."""
        HEADER.pack_into(
            self._mm,
            0,
            self.begin_timestamp_ms,
            self.end_timestamp_ms,
            self.begin_phy_offset,
            self.end_phy_offset,
            self.hash_slot_count,
            self.index_count,
        )

    def time_matched(self, begin_ms: int, end_ms: int) -> bool:
        """Whether [begin_ms, end_ms] overlaps this file's time range (IndexFile.isTimeMatched)."""
        return (
            (begin_ms < self.begin_timestamp_ms and end_ms > self.end_timestamp_ms)
            or self.begin_timestamp_ms <= begin_ms <= self.end_timestamp_ms
            or self.begin_timestamp_ms <= end_ms <= self.end_timestamp_ms
        )

    def select(self, key: str, count_max: int, begin_ms: int, end_ms: int, into: list[int]) -> None:
        """Append to `into` the physical offsets of items with the key's hash and a time in
        [begin_ms, end_ms], newest first, until `into` holds count_max. Other keys with the same
        hash come back too (as in RocketMQ): the caller checks the messages' keys."""
        key_hash = index_key_hash(key)
        slot_at = HEADER.size + (key_hash % self.slot_count) * SLOT.size
        number = SLOT.unpack_from(self._mm, slot_at)[0]
        count = self.index_count
        if number <= 0 or number > count or count <= 1:
            return
        while len(into) < count_max:
            hash_read, physical_offset, time_diff, prev = ITEM.unpack_from(
                self._mm, self._items_at + number * ITEM.size
            )
            if time_diff < 0:
                return
            time_read = self.begin_timestamp_ms + time_diff * 1000
            if hash_read == key_hash and begin_ms <= time_read <= end_ms:
                into.append(physical_offset)
            if prev <= 0 or prev > count or prev == number or time_read < begin_ms:
                return
            number = prev

    def flush(self) -> None:
        mapped_file.sync(self.path)  # not self._mm.flush(), which holds the GIL (mapped_file)

    def close(self) -> None:
        self._mm.close()


class IndexStore:
    """Every IndexFile of a broker store: <root>/index/. Not thread-safe."""

    def __init__(self, directory: Path, slot_count: int, item_count: int) -> None:
        """Use IndexStore.open."""
        assert slot_count >= 1 and item_count >= 2, (slot_count, item_count)
        self.directory = directory
        self.slot_count = slot_count
        self.item_count = item_count
        self._files: list[IndexFile] = []  # ascending by name
        self._dirty: list[IndexFile] = []

    @classmethod
    def open(
        cls,
        root: Path,
        slot_count: int = limits.INDEX_SLOTS_DEFAULT,
        item_count: int = limits.INDEX_ITEMS_DEFAULT,
    ) -> IndexStore:
        """Open the index under `root`. A file with no item (created, never written) is
        deleted; one whose header does not hold together raises CorruptIndexFile."""
        store = cls(root / INDEX_DIR, slot_count, item_count)
        store.directory.mkdir(parents=True, exist_ok=True)
        for number in mapped_file.list_numbered(store.directory):
            path = store.directory / mapped_file.file_name(number)
            f = IndexFile.open(path, slot_count, item_count)
            if f.index_count <= 1:
                f.close()
                path.unlink()
                continue
            store._files.append(f)
        return store

    @property
    def file_names(self) -> list[str]:
        return [f.path.name for f in self._files]

    @property
    def end_phy_offset(self) -> int:
        """Physical offset of the last message indexed, -1 if none."""
        return self._files[-1].end_phy_offset if self._files else -1

    @property
    def end_timestamp_ms(self) -> int:
        """Store timestamp of the last message indexed, 0 if none (indexLastUpdateTimestamp)."""
        return self._files[-1].end_timestamp_ms if self._files else 0

    def index_message(
        self,
        topic: str,
        keys: str | None,
        uniq_key: str | None,
        physical_offset: int,
        store_timestamp_ms: int,
        sys_flag: int = 0,
    ) -> int:
        """Index one message (IndexService.buildIndex); returns the number of items put. A
        message at or before the last one indexed is skipped, so replaying the log is safe."""
        names = index_keys(topic, keys, uniq_key)
        if len(names) >= self.item_count:  # more keys than an empty file holds: the first ones
            names = names[: self.item_count - 1]
        return self._put(
            [index_key_hash(name) for name in names], physical_offset, store_timestamp_ms, sys_flag
        )

    def _put(
        self, key_hashes: list[int], physical_offset: int, store_timestamp_ms: int, sys_flag: int
    ) -> int:
        """One message's items, all in one file (a new one if the last has too little room);
        none for a message at or before the last one indexed (a replay) or a rolled-back half."""
        files = self._files
        last = files[-1] if files else None
        if (
            not key_hashes
            or (last is not None and physical_offset <= last.end_phy_offset)
            or sys_flag & TRANSACTION_TYPE_MASK == TRANSACTION_ROLLBACK
        ):
            return 0
        if last is None or last.room < len(key_hashes):
            last = self._create(physical_offset)
        for key_hash in key_hashes:
            last.put(key_hash, physical_offset, store_timestamp_ms)
        dirty = self._dirty
        if not dirty or dirty[-1] is not last:
            dirty.append(last)
        return len(key_hashes)

    def put_items(self, items: bytes) -> None:
        """Index messages from their items as `dispatch_native.scan` gives them: what
        `index_fields` does for each message, rolling files where a message does not fit."""
        total = len(items) // ITEM_BYTES
        at = 0
        while at < total:
            files = self._files
            if not files:
                self._create(_item_physical_offset(items, at))
            last = self._files[-1]
            count = last.index_count
            stopped = last.put_items(items, at)
            if last.index_count != count:
                dirty = self._dirty
                if not dirty or dirty[-1] is not last:
                    dirty.append(last)
            if stopped < total:  # that message does not fit: a new file from it on
                self._create(_item_physical_offset(items, stopped))
            at = stopped

    def index_record(self, buf: stored_message.Buffer, at: int = 0) -> int:
        """Index the stored message at `at` of `buf` (the rebuild's path)."""
        fields = stored_message.read_dispatch(buf, at)
        return self.index_fields(
            fields.topic,
            fields.physical_offset,
            fields.store_timestamp_ms,
            fields.sys_flag,
            props.table(fields.properties),
        )

    def index_fields(
        self,
        topic: str,
        physical_offset: int,
        store_timestamp_ms: int,
        sys_flag: int,
        properties: dict[bytes, bytes],
    ) -> int:
        """Index a message from the fields and the properties table (`props.table`) the
        dispatcher has already read."""
        keys = properties.get(b"KEYS")
        uniq = properties.get(b"UNIQ_KEY")
        if uniq and not keys:  # a message as clients send most: one item, hashed from bytes
            key_hash = index_key_hash_utf8(b"%b#%b" % (_topic_bytes(topic), uniq))
            return self._put([key_hash], physical_offset, store_timestamp_ms, sys_flag)
        return self.index_message(
            topic,
            keys.decode(errors="replace") if keys else None,
            uniq.decode(errors="replace") if uniq else None,
            physical_offset,
            store_timestamp_ms,
            sys_flag,
        )

    def write_header(self) -> None:
        """The last file's header brought up to date: once per applied batch of messages, not at
        every put as RocketMQ does (six fields packed per key of every message on every replica).
        The dispatcher calls it before it yields to the event loop, so a reader or a flush never
        sees a header behind its items; only a process killed in the middle of a batch leaves
        one behind, and a restart rebuilds the file being written at the last checkpoint anyway
        (truncate_from_position). A file that rolls over gets its last header as it does."""
        if self._files:
            self._files[-1].write_header()

    def _create(self, physical_offset: int) -> IndexFile:
        self.write_header()
        path = self.directory / mapped_file.file_name(physical_offset)
        f = IndexFile.create(path, self.slot_count, self.item_count)
        self._files.append(f)
        return f

    def query(
        self,
        topic: str,
        key: str,
        count_max: int,
        begin_ms: int = 0,
        end_ms: int = TIMESTAMP_MAX_MS,
    ) -> list[int]:
        """Physical offsets of messages indexed under topic#key with a store time in
        [begin_ms, end_ms], newest first, at most count_max (IndexService.queryOffset)."""
        count_max = min(count_max, limits.INDEX_QUERY_COUNT_MAX)
        name = f"{topic}#{key}"
        found: list[int] = []
        for f in reversed(self._files):
            if f.time_matched(begin_ms, end_ms):
                f.select(name, count_max, begin_ms, end_ms, found)
            if f.begin_timestamp_ms < begin_ms or len(found) >= count_max:
                break
        return found

    def truncate_from_position(self, physical_offset: int) -> int:
        """Forget the index from `physical_offset` on: the log was cut there, or `physical_offset` is the
        dispatcher's checkpoint (everything indexed below it was flushed) after a crash.

        Deletes every file that begins at or after `physical_offset` and the last file that begins
        before it: that file was being written at `physical_offset` and may have taken items after
        it, torn in any mix of header, slots and items (the format has no CRC), whatever its
        header now says. Files before it were rolled before `physical_offset` and are complete.
        Returns the physical offset from which the caller must index the log again (the first
        deleted file's name, at most `physical_offset`); re-indexing from there gives the bytes an
        uninterrupted run would have."""
        keep = len(self._files)
        while keep > 0 and self._files[keep - 1].begin_phy_offset >= physical_offset:
            keep -= 1
        keep = max(keep - 1, 0)
        restart = physical_offset
        for f in self._files[keep:]:
            restart = min(restart, f.begin_phy_offset)
            self._forget(f)
            f.path.unlink()
        del self._files[keep:]
        return restart

    def delete_before_position(self, physical_offset: int) -> int:
        """Delete the files whose every message lies below `physical_offset`, never the last one
        (retention, after the log's head was deleted). Returns how many files went."""
        deleted = 0
        while len(self._files) > 1 and self._files[0].end_phy_offset < physical_offset:
            f = self._files.pop(0)
            self._forget(f)
            f.path.unlink()
            deleted += 1
        return deleted

    def _forget(self, f: IndexFile) -> None:
        if f in self._dirty:
            self._dirty.remove(f)
        f.close()

    def flush(self) -> None:
        for f in self.flush_plan():
            f.flush()

    def flush_plan(self) -> list[IndexFile]:
        """The files a flush must write, taken on the thread that indexes (the flush itself
        may then run in a worker thread)."""
        self.write_header()
        dirty, self._dirty = self._dirty, []
        return dirty

    def close(self) -> None:
        self.flush()
        for f in self._files:
            f.close()
        self._files = []

    def __enter__(self) -> IndexStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def rebuild(
    root: Path,
    records: Iterable[tuple[stored_message.Buffer, int]],
    slot_count: int = limits.INDEX_SLOTS_DEFAULT,
    item_count: int = limits.INDEX_ITEMS_DEFAULT,
) -> IndexStore:
    """The index of `root` made again from the stored messages `records` ((buffer, at) pairs,
    in log order): every file is deleted unread (rebuilding is how a corrupt index is fixed),
    then each message indexed as the dispatcher does."""
    directory = root / INDEX_DIR
    if directory.is_dir():
        for number in mapped_file.list_numbered(directory):
            (directory / mapped_file.file_name(number)).unlink()
    store = IndexStore.open(root, slot_count, item_count)
    for buf, at in records:
        store.index_record(buf, at)
    store.flush()
    return store
