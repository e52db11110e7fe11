"""RocketMQ's ConsumeQueue (docs/formats.md#consumequeue): one queue's units, in files.

    <root>/consumequeue/<topic>/<queue_id>/00000000000000000000
                                           00000000000006000000   20-digit byte offset of unit 0

Unit k of the queue (queue offset k) sits at byte k * 20 of the queue's byte space; a file holds
`units_per_file` units (RocketMQ's default 300,000: 6,000,000 bytes) and is named by the byte
offset of its first unit. Files are created sparse at full size. A unit with size <= 0 or a
negative physical offset is not a unit: all zeros is "not written yet".

Every replica appends the same units in the same order, so the files are byte-identical. The
dispatcher owns the order: `append` asserts that queue offsets are contiguous (a bug otherwise).
Opening a queue recovers it: units after the first invalid one in the last file (a torn or
zero-filled tail) are zeroed, and empty trailing files removed. Units carry no CRC, so that
cannot catch a unit torn after its size field; after a crash the dispatcher cuts each queue back
to what its checkpoint covered (`truncate_after`) and re-derives the rest from the log.
`truncate_from_position` binary-searches the physical offsets: it is for a cut log under intact
units, not for torn ones.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import attrs

from broker import limits, mapped_file
from broker.errors import BadQueueName, CorruptConsumeQueue, QueueOffsetOutOfRange

# ConsumeQueue unit. Big-endian. Spec: docs/formats.md#consumequeue; change both or neither.
#  off len field            meaning
#    0   8 physical_offset  position of the stored message in the log (>= 0)
#    8   4 size             store_size of the stored message (> 0; 0 means "not written")
#   12   8 tag_hash         remoting.tag_hash.tags_code(TAGS), or a delivery time for delays
UNIT = struct.Struct(">qiq")
assert UNIT.size == limits.CQ_UNIT_BYTES == 20
ZERO_UNIT = bytes(UNIT.size)
CONSUME_QUEUE_DIR = "consumequeue"
TOPIC_NAME = re.compile(r"^[%|a-zA-Z0-9_-]{1,127}$")  # RocketMQ's Validators.topic rules
READ_CHUNK_BYTES = 64 * 1024  # recovery reads a file's head this much at a time


@attrs.define
class FlushPlan:
    """Files to sync, then mappings (of rolled files) to close after their sync."""

    sync: list[Path]
    close: list[mmap.mmap]


def run_flush(plan: FlushPlan) -> None:
    """Blocking: carry out a FlushPlan (any thread; the plan's mappings are its own now).
    The GIL is free while the disk works (mapped_file.sync)."""
    for path in dict.fromkeys(plan.sync):
        mapped_file.sync(path)
    for mm in plan.close:
        mm.close()


class Unit(NamedTuple):
    physical_offset: int
    size: int
    tag_hash: int


def _valid(physical_offset: int, size: int) -> bool:
    return size > 0 and physical_offset >= 0


class ConsumeQueue:
    """One queue's files. Not thread-safe; the dispatcher and readers share one trio thread."""

    def __init__(self, directory: Path, units_per_file: int) -> None:
        """Use ConsumeQueue.open."""
        assert units_per_file >= 1, units_per_file
        self.directory = directory
        self.units_per_file = units_per_file
        self.file_bytes = units_per_file * UNIT.size
        self._starts: list[int] = []  # queue offset of each file's unit 0, ascending
        self._min = 0  # first unit held
        self._max = 0  # one past the last unit held
        self._any_start = True  # no unit yet: the first append may start at any queue offset
        self._write: mmap.mmap | None = None  # the last file, mapped
        self._write_start = -1
        self._dirty: list[tuple[mmap.mmap, int]] = []  # mappings written, with their starts
        self._unsynced = False  # the last file written since the last flush plan named it

    @classmethod
    def open(
        cls, directory: Path, units_per_file: int = limits.CQ_UNITS_PER_FILE_DEFAULT
    ) -> ConsumeQueue:
        """Open (or create) the queue in `directory`, recovering its tail."""
        directory.mkdir(parents=True, exist_ok=True)
        queue = cls(directory, units_per_file)
        queue._recover()
        return queue

    # --- reading --------------------------------------------------------------------------------

    @property
    def min_queue_offset(self) -> int:
        """The first queue offset held (equals max_queue_offset when the queue is empty)."""
        return self._min

    @property
    def max_queue_offset(self) -> int:
        """One past the last queue offset held: the next append's queue offset."""
        return self._max

    def get(self, queue_offset: int) -> Unit:
        """The unit at `queue_offset`; raises QueueOffsetOutOfRange."""
        units = self.read(queue_offset, 1)
        return units[0]

    def read(self, queue_offset: int, count_max: int) -> list[Unit]:
        """Up to `count_max` units from `queue_offset` on (fewer at the end of the queue).
        Raises QueueOffsetOutOfRange when `queue_offset` itself is not held."""
        if not self._min <= queue_offset < self._max:
            raise QueueOffsetOutOfRange(queue_offset, self._min, self._max)
        end = min(self._max, queue_offset + max(count_max, 0))
        units: list[Unit] = []
        while queue_offset < end:
            start = queue_offset - queue_offset % self.units_per_file
            stop = min(end, start + self.units_per_file)
            data = self._read_bytes(start, queue_offset - start, stop - queue_offset)
            units.extend(map(Unit._make, UNIT.iter_unpack(data)))
            queue_offset = stop
        return units

    def _read_bytes(self, start: int, first: int, count: int) -> bytes:
        at, length = first * UNIT.size, count * UNIT.size
        if start == self._write_start and self._write is not None:
            return self._write[at : at + length]
        with open(self._path(start), "rb") as f:
            data = os.pread(f.fileno(), length, at)
        if len(data) != length:
            raise CorruptConsumeQueue(str(self._path(start)), start + first, "file is short")
        return data

    # --- writing --------------------------------------------------------------------------------

    def append(self, queue_offset: int, physical_offset: int, size: int, tag_hash: int) -> None:
        """Add the unit for `queue_offset`, which must be max_queue_offset (or anything >= 0 for
        a queue that never held a unit)."""
        if queue_offset != self._max:
            assert self._any_start and queue_offset >= self._max, (
                f"queue offset {queue_offset} appended to {self.directory}, expected {self._max}"
            )
            if self._starts:  # emptied by retention: what is kept holds no readable unit
                self.flush()
                while self._starts:
                    self._drop_last_file()
            self._min = self._max = queue_offset
        assert size > 0 and physical_offset >= 0, (physical_offset, size)
        write, index = self._writable(queue_offset)
        UNIT.pack_into(write, index * UNIT.size, physical_offset, size, tag_hash)
        self._max = queue_offset + 1
        self._any_start = False
        self._unsynced = True

    def append_units(self, queue_offset: int, units: bytes) -> None:
        """`append` for each unit of `units` (packed as UNIT), of consecutive queue offsets from
        `queue_offset` on: one slice written per file instead of a pack per unit."""
        count = len(units) // UNIT.size
        done = 0
        if count and queue_offset != self._max:  # the first one by append, which checks it
            self.append(queue_offset, *UNIT.unpack_from(units, 0))
            done = 1
        while done < count:
            offset = queue_offset + done
            write, index = self._writable(offset)
            step = min(count - done, self.units_per_file - index)
            write[index * UNIT.size : (index + step) * UNIT.size] = units[
                done * UNIT.size : (done + step) * UNIT.size
            ]
            done += step
            self._max = offset + step
            self._any_start = False
            self._unsynced = True

    def _writable(self, queue_offset: int) -> tuple[mmap.mmap, int]:
        """The mapped file that holds `queue_offset` (rolled to a new one if it is past the
        file being written) and the unit's number within it."""
        write = self._write
        index = queue_offset - self._write_start
        if write is None or not 0 <= index < self.units_per_file:
            write = self._roll(queue_offset - queue_offset % self.units_per_file)
            index = queue_offset - self._write_start
        return write, index

    def _roll(self, start: int) -> mmap.mmap:
        assert not self._starts or start == self._starts[-1] + self.units_per_file, start
        if self._write is not None:
            self._dirty.append((self._write, self._write_start))  # synced, closed by flush()
        self._write = mapped_file.create(self._path(start), self.file_bytes)
        self._write_start = start
        self._starts.append(start)
        return self._write

    def flush(self) -> None:
        """Write every appended unit to disk."""
        run_flush(self.flush_plan())

    def flush_plan(self) -> FlushPlan:
        """What a flush must write (and the rolled files it may then close), taken on the
        thread that appends; `run_flush` may then run in a worker thread while appends go on."""
        plan = FlushPlan([], [])
        for mm, start in self._dirty:
            plan.sync.append(self._path(start))
            if mm is not self._write and mm not in plan.close:
                plan.close.append(mm)
        self._dirty = []
        if self._write is not None and self._unsynced:  # a queue not written needs no sync
            plan.sync.append(self._path(self._write_start))
            self._unsynced = False
        return plan

    def close(self) -> None:
        self.flush()
        if self._write is not None:
            self._write.close()
            self._write = None
            self._write_start = -1

    # --- cutting --------------------------------------------------------------------------------

    def truncate_after(self, queue_offset: int) -> None:
        """Drop every unit after `queue_offset` (the log below them was truncated); the next
        append is queue_offset + 1. Dropped units are zeroed, files holding none deleted."""
        keep_end = max(queue_offset + 1, 0)
        if keep_end >= self._max:
            return
        self.flush()
        if keep_end <= self._min:
            while self._starts:
                self._drop_last_file()
        else:
            while self._starts[-1] >= keep_end:
                self._drop_last_file()
            self._open_last()
            assert self._write is not None
            at = (keep_end - self._write_start) * UNIT.size
            self._write[at:] = bytes(len(self._write) - at)
            self._dirty.append((self._write, self._write_start))
        self._max = keep_end
        self._min = min(self._min, keep_end)
        self._any_start = False

    def truncate_from_position(self, physical_offset: int) -> None:
        """Drop every unit whose physical offset is >= `physical_offset` (the log was cut
        there)."""
        low, high = self._min, self._max  # units are in ascending physical offset
        while low < high:
            mid = (low + high) // 2
            if self.get(mid).physical_offset >= physical_offset:
                high = mid
            else:
                low = mid + 1
        self.truncate_after(low - 1)

    def delete_before_position(self, physical_offset: int) -> int:
        """The log below `physical_offset` is gone (retention): the queue now starts at its
        first unit at or after it, as RocketMQ's correctMinOffset moves minLogicOffset, and the
        files all of whose units lie below are deleted (never the last). Returns how many files
        went."""
        low, high = self._min, self._max  # units are in ascending physical offset
        while low < high:
            mid = (low + high) // 2
            if self.get(mid).physical_offset >= physical_offset:
                high = mid
            else:
                low = mid + 1
        deleted = self.delete_before(low)
        self._min = max(self._min, low)
        if self._min == self._max:
            # Empty: the next message may come at a higher queue offset (this replica's log
            # restarted past messages it never held, DLedger's follower reset).
            self._any_start = True
        return deleted

    def delete_before(self, queue_offset: int) -> int:
        """Delete the files all of whose units are below `queue_offset`, never the last one
        (retention). Returns how many files went."""
        deleted = 0
        while len(self._starts) > 1 and self._starts[0] + self.units_per_file <= queue_offset:
            self._path(self._starts.pop(0)).unlink()
            deleted += 1
        if deleted:
            self._min = self._starts[0]
        return deleted

    def _drop_last_file(self) -> None:
        start = self._starts.pop()
        if start == self._write_start and self._write is not None:
            self._write.close()
            self._write, self._write_start = None, -1
        self._path(start).unlink()

    def _open_last(self) -> None:
        start = self._starts[-1]
        if self._write_start != start:
            if self._write is not None:
                self._write.close()
            self._write = mapped_file.open_existing(self._path(start), self.file_bytes)
            self._write_start = start

    # --- recovery -------------------------------------------------------------------------------

    def _path(self, start: int) -> Path:
        return self.directory / mapped_file.file_name(start * UNIT.size)

    def _recover(self) -> None:
        for number in mapped_file.list_numbered(self.directory):
            path = self.directory / mapped_file.file_name(number)
            if number % self.file_bytes:
                raise CorruptConsumeQueue(
                    str(path), number // UNIT.size, f"name is not a multiple of {self.file_bytes}"
                )
            if path.stat().st_size != self.file_bytes:
                raise CorruptConsumeQueue(
                    str(path), number // UNIT.size, f"size is not {self.file_bytes} bytes"
                )
            start = number // UNIT.size
            if self._starts and start != self._starts[-1] + self.units_per_file:
                raise CorruptConsumeQueue(str(path), start, "a file is missing before this one")
            self._starts.append(start)
        while self._starts:
            first, end = self._scan_last()
            if end > first:
                self._min = self._head() if len(self._starts) > 1 else first
                self._max = end
                self._any_start = False
                self._open_last()
                assert self._write is not None
                at = (end - self._write_start) * UNIT.size
                if self._write[at:].strip(b"\0"):
                    self._write[at:] = bytes(len(self._write) - at)  # cut the torn tail
                    self._dirty.append((self._write, self._write_start))
                return
            self._path(self._starts.pop()).unlink()  # nothing valid in it: as if never created
        self._min = self._max = 0

    def _scan_last(self) -> tuple[int, int]:
        """(first unit, one past the last valid unit) of the last file. Leading zero units are
        skipped only in the queue's first file (a queue may start mid-file)."""
        start = self._starts[-1]
        with open(self._path(start), "rb") as f:
            data = f.read()
        written = len(data.rstrip(b"\0"))
        written += -written % UNIT.size
        first = 0
        if len(self._starts) == 1:
            while (
                first * UNIT.size < written
                and data[first * UNIT.size : (first + 1) * UNIT.size] == ZERO_UNIT
            ):
                first += 1
        end = first
        for physical_offset, size, _ in UNIT.iter_unpack(data[first * UNIT.size : written]):
            if not _valid(physical_offset, size):
                break
            end += 1
        return start + first, start + end

    def _head(self) -> int:
        """The first unit of the queue's first file (files after the first have no leading
        zeros: units are appended contiguously)."""
        start = self._starts[0]
        with open(self._path(start), "rb") as f:
            at = 0
            while chunk := f.read(READ_CHUNK_BYTES):
                for k in range(0, len(chunk), UNIT.size):
                    if chunk[k : k + UNIT.size] != ZERO_UNIT:
                        return start + (at + k) // UNIT.size
                at += len(chunk)
        return start + self.units_per_file


class ConsumeQueueSet:
    """Every ConsumeQueue under one broker store root: <root>/consumequeue/<topic>/<queue_id>/."""

    def __init__(self, root: Path, units_per_file: int = limits.CQ_UNITS_PER_FILE_DEFAULT) -> None:
        self.directory = root / CONSUME_QUEUE_DIR
        self.units_per_file = units_per_file
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}

    @classmethod
    def open(
        cls, root: Path, units_per_file: int = limits.CQ_UNITS_PER_FILE_DEFAULT
    ) -> ConsumeQueueSet:
        """Open every queue found under `root` (recovering each)."""
        queues = cls(root, units_per_file)
        queues.directory.mkdir(parents=True, exist_ok=True)
        for topic_dir in sorted(queues.directory.iterdir()):
            if not topic_dir.is_dir() or not TOPIC_NAME.match(topic_dir.name):
                continue
            for queue_dir in sorted(topic_dir.iterdir()):
                if queue_dir.is_dir() and queue_dir.name.isdigit() and queue_dir.name.isascii():
                    queues.queue(topic_dir.name, int(queue_dir.name))
        return queues

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The queue for (topic, queue_id), created on first use; raises BadQueueName."""
        queue = self._queues.get((topic, queue_id))
        if queue is None:
            if not TOPIC_NAME.match(topic):
                raise BadQueueName(topic, queue_id, "topic is not 1-127 of [%|a-zA-Z0-9_-]")
            if queue_id < 0:
                raise BadQueueName(topic, queue_id, "queue id is negative")
            path = self.directory / topic / str(queue_id)
            queue = ConsumeQueue.open(path, self.units_per_file)
            self._queues[(topic, queue_id)] = queue
        return queue

    def find(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """The queue if it exists (no file is created)."""
        return self._queues.get((topic, queue_id))

    def __iter__(self) -> Iterator[tuple[str, int, ConsumeQueue]]:
        for (topic, queue_id), queue in sorted(self._queues.items()):
            yield topic, queue_id, queue

    def truncate_from_position(self, physical_offset: int) -> None:
        """Drop, in every queue, the units of messages at or after `physical_offset`."""
        for queue in self._queues.values():
            queue.truncate_from_position(physical_offset)

    def delete_before_position(self, physical_offset: int) -> int:
        """Retention in every queue (ConsumeQueue.delete_before_position); files deleted."""
        return sum(q.delete_before_position(physical_offset) for q in self._queues.values())

    def flush(self) -> None:
        run_flush(self.flush_plan())

    def flush_plan(self) -> FlushPlan:
        plan = FlushPlan([], [])
        for queue in self._queues.values():
            part = queue.flush_plan()
            plan.sync += part.sync
            plan.close += part.close
        return plan

    def close(self) -> None:
        for queue in self._queues.values():
            queue.close()
        self._queues.clear()

    def __enter__(self) -> ConsumeQueueSet:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
