"""Opening a store after a clean close or a crash: find the last valid entry, cut what follows
it, and refuse to cut what may not be cut (docs/formats.md#recovery, docs/log-store.md).

The walk starts after the checkpoint's durable index when the entry there checks out (it and
everything before it were fsynced), otherwise at the log start. It checks each entry's magic,
size, both CRCs, index, position and term against what the previous entry implies, and
rewrites the index record of every entry it passes. It ends at zeros (the end of written
data), at a missing segment, or at the first entry that fails. What comes after that point is
the torn tail of an interrupted write, and is cut (zeroed, later files removed), unless

- the failure is at or below the checkpoint's durable index: that entry was fsynced, so this
  is damage, not a torn write; or
- a valid entry follows it: an index record beyond the failure points at an entry that
  passes every check (docs/formats.md). Index records are written after their run's data
  and cleared before a truncation zeroes data, so a killed process never leaves one behind
  a hole; a power loss with a reordering disk cache can, in the unsynced tail, and then
  opening refuses although nothing acknowledged was lost (repair=True is safe there).

Then the store refuses to open with CorruptEntry naming the file, position and reason, and
`repair=True` cuts there anyway.
"""

from __future__ import annotations

import mmap

import attrs

from dledger import limits
from dledger.log.checksum import crc32
from dledger.log.entry import (
    BLANK_BYTES_MIN,
    BLANK_MAGIC,
    END_MAGIC,
    ENTRY_BYTES_MAX,
    ENTRY_MAGIC,
    HEADER,
    HEADER_CRC_BYTES,
    KINDS,
    MAGIC,
    blank_defect,
    check,
    decode_header,
    header_defect,
)
from dledger.log.errors import CorruptEntry
from dledger.log.index_file import RECORD, IndexFiles
from dledger.log.layout import segment_label
from dledger.log.segment import SegmentFiles, nonzero_end, zero
from dledger.raft.entries import LogStart


@attrs.frozen
class RecoveryReport:
    """What opening the store found and did; logged by the node at start."""

    clean_shutdown: bool  # no abort marker: the last run closed the store
    walked_from_index: int  # first index the walk checked
    entries_checked: int
    cut_bytes: int  # non-zero bytes removed after the last valid entry
    cut_entries: int  # entry headers (with a valid header CRC) among them
    index_records_rebuilt: int  # records rewritten because they were missing or disagreed
    index_records_cleared: int  # records past the last valid entry that were zeroed
    seconds: float = 0.0


@attrs.frozen
class Recovered:
    last_index: int
    last_term: int
    write_position: int  # where the next entry goes (before the blank-record rule)
    report: RecoveryReport


@attrs.define
class _End:
    """Where the walk stopped: position, the index an entry there would have, and why."""

    position: int
    index: int
    reason: str | None  # None: clean end of written data (zeros or no next segment)


def recover(
    segments: SegmentFiles,
    index: IndexFiles,
    start: LogStart,
    durable_index: int,
    *,
    clean_shutdown: bool,
    repair: bool,
) -> Recovered:
    """Bring segments and index to a consistent log; see the module docstring."""
    seg_bytes = segments.segment_bytes
    _remove_below_start(segments, index, start)
    walk_from = _trusted_end(segments, index, start, durable_index)
    if walk_from is None:
        walk_from = (start.position, start.prev.index + 1, start.prev.term)
    position, first_walked, prev_term = walk_from
    end, last_term, checked, rebuilt = _walk(segments, index, position, first_walked, prev_term)

    corrupt = _corruption(segments, index, end, durable_index)
    if corrupt is not None and not repair:
        raise corrupt

    base = segments.base_of(end.position)
    offset = end.position - base
    thorough = end.reason is not None or not clean_shutdown or repair
    cut_entries = _count_headers(segments, end.position) if thorough else 0
    cleared = _clear_index_after(index, end.index - 1)  # before the data, as truncation does
    cut_bytes = 0
    if base in segments and thorough:
        segment = segments.get(base)
        written_end = nonzero_end(segment.fd, offset, seg_bytes)
        if written_end > offset:
            zero(segment.mm, offset, written_end)
            cut_bytes += written_end - offset
    for later in [b for b in segments.bases if b > base]:
        if thorough:
            cut_bytes += nonzero_end(segments.get(later).fd, 0, seg_bytes)
        segments.delete(later)

    report = RecoveryReport(
        clean_shutdown=clean_shutdown,
        walked_from_index=first_walked,
        entries_checked=checked,
        cut_bytes=cut_bytes,
        cut_entries=cut_entries,
        index_records_rebuilt=rebuilt,
        index_records_cleared=cleared,
    )
    return Recovered(end.index - 1, last_term, end.position, report)


def _remove_below_start(segments: SegmentFiles, index: IndexFiles, start: LogStart) -> None:
    """Files wholly before the log start: retention or a reset updated meta, then crashed
    before it removed them."""
    start_base = segments.base_of(start.position)
    for base in [b for b in segments.bases if b < start_base]:
        segments.delete(base)
    first = start.prev.index + 1
    for file_first in [f for f in index.firsts if f + index.records_per_file <= first]:
        index.delete(file_first)


def _trusted_end(
    segments: SegmentFiles, index: IndexFiles, start: LogStart, durable_index: int
) -> tuple[int, int, int] | None:
    """(position after it, next index, its term) for the checkpoint's durable entry, when it
    and the index files before it check out; None means walk from the log start."""
    if durable_index <= start.prev.index:
        return None
    per_file = index.records_per_file
    for first in range(index.first_of(start.prev.index + 1), durable_index + 1, per_file):
        if first not in index:
            return None  # a lost index file: rebuild it with a full walk
    record = index.record(durable_index)
    if record is None:
        return None
    position, record_index, term, size, _kind, _ = record
    base = segments.base_of(position)
    if record_index != durable_index or size == 0 or position < start.position:
        return None
    if base not in segments:
        return None
    offset = position - base
    reason, header = check(
        segments.get(base).mm,
        offset,
        position=position,
        index=durable_index,
        room=segments.segment_bytes - offset,
    )
    if reason is not None or header is None or (header.term, header.size) != (term, size):
        return None
    return position + size, durable_index + 1, term


def _walk(
    segments: SegmentFiles, index: IndexFiles, position: int, next_index: int, prev_term: int
) -> tuple[_End, int, int, int]:
    """Check entries from `position` on; returns (where it ended, last term, entries checked,
    index records rewritten)."""
    seg_bytes = segments.segment_bytes
    checked = rebuilt = 0
    while True:
        base = position - position % seg_bytes
        if base not in segments:
            return _End(position, next_index, None), prev_term, checked, rebuilt
        mm = segments.get(base).mm
        offset, next_index, prev_term, n, r = _walk_valid(
            mm, base, position - base, index, next_index, prev_term
        )
        checked += n
        rebuilt += r
        position = base + offset
        end = _step_or_end(mm, base, offset, seg_bytes, next_index, prev_term)
        if end is not None:
            return end, prev_term, checked, rebuilt
        position = base + seg_bytes  # a valid blank record, or the segment is full


def _walk_valid(
    mm: mmap.mmap, base: int, offset: int, index: IndexFiles, next_index: int, prev_term: int
) -> tuple[int, int, int, int, int]:
    """The walk's hot loop: entries of one segment from `offset` while each passes every
    check (inlined: one unpack, two CRCs). Returns (offset of the first that does not, its
    index, previous term, entries checked, index records rewritten)."""
    seg_bytes = len(mm)
    unpack_header, unpack_record = HEADER.unpack_from, RECORD.unpack_from
    header_bytes, crc_bytes = limits.ENTRY_HEADER_BYTES, HEADER_CRC_BYTES
    checked = rebuilt = 0
    file_mm, file_first, file_last = mm, 0, -1  # file_last -1: replaced before first use
    while seg_bytes - offset >= header_bytes:
        magic, size, idx, term, pos, kind, reserved, body_crc, header_crc = unpack_header(
            mm, offset
        )
        end = offset + size
        if not (
            magic == ENTRY_MAGIC
            and idx == next_index
            and pos == base + offset
            and term > 0
            and prev_term <= term
            and header_bytes <= size <= ENTRY_BYTES_MAX
            and (end <= seg_bytes - BLANK_BYTES_MIN or end == seg_bytes)
            and kind in KINDS
            and reserved == 0
            and crc32(mm[offset : offset + crc_bytes]) == header_crc
            and crc32(mm[offset + header_bytes : end]) == body_crc
        ):
            break
        if idx > file_last:
            file, _ = index.get_or_create(idx)
            file_mm, file_first, file_last = file.mm, file.first, file.last
        slot = (idx - file_first) * RECORD.size
        record = (pos, idx, term, size, kind, 0)
        if unpack_record(file_mm, slot) != record:
            RECORD.pack_into(file_mm, slot, *record)
            rebuilt += 1
        checked += 1
        offset = end
        next_index += 1
        prev_term = term
    return offset, next_index, prev_term, checked, rebuilt


def _step_or_end(
    mm: mmap.mmap, base: int, offset: int, seg_bytes: int, next_index: int, prev_term: int
) -> _End | None:
    """At the first offset that is not a valid entry: None when the segment ends there
    validly (a blank record, or exactly full), else where and why the walk ends."""
    position = base + offset
    room = seg_bytes - offset
    if room == 0:
        return None
    if room < BLANK_BYTES_MIN or (
        room < limits.ENTRY_HEADER_BYTES and MAGIC.unpack_from(mm, offset)[0] != BLANK_MAGIC
    ):
        if not mm[offset:seg_bytes].rstrip(b"\0"):
            return _End(position, next_index, None)
        return _End(position, next_index, f"{room} bytes before the segment end hold no record")
    magic = MAGIC.unpack_from(mm, offset)[0]
    if magic == END_MAGIC:
        return _End(position, next_index, None)
    if magic == BLANK_MAGIC:
        reason = blank_defect(mm, offset, room)
        return None if reason is None else _End(position, next_index, reason)
    reason, header = check(mm, offset, position=position, index=next_index, room=room)
    if reason is None:
        assert header is not None and header.term < prev_term, (header, prev_term)
        reason = f"term {header.term} is below the previous entry's term {prev_term}"
    return _End(position, next_index, reason)


def _corruption(
    segments: SegmentFiles, index: IndexFiles, end: _End, durable_index: int
) -> CorruptEntry | None:
    """The error to refuse opening with, when what follows `end` may not be cut."""
    base = segments.base_of(end.position)
    label = segment_label(base)
    what = end.reason or f"no entry where index {end.index} should be"
    if base not in segments:
        what = f"segment {label} is missing"
    if end.index <= durable_index:
        reason = f"{what}; index {end.index} was durable per the checkpoint ({durable_index})"
        return CorruptEntry(label, end.position, reason)
    follower = _valid_by_index(segments, index, end.index)
    if follower is not None:
        found_index, found_position = follower
        reason = f"{what}; a valid entry follows (index {found_index} at {found_position})"
        return CorruptEntry(label, end.position, reason)
    return None


def _valid_at(
    segments: SegmentFiles, position: int, expected: int | None
) -> tuple[int, int] | None:
    base = segments.base_of(position)
    if base not in segments:
        return None
    offset = position - base
    room = segments.segment_bytes - offset
    reason, header = check(
        segments.get(base).mm, offset, position=position, index=expected, room=room
    )
    if reason is not None or header is None:
        return None
    return header.index, position


def _valid_by_index(
    segments: SegmentFiles, index: IndexFiles, from_index: int
) -> tuple[int, int] | None:
    """(index, position) of an entry passing every check that an index record at or after
    `from_index` points at.

    Only index records count, not entries found by scanning the data: a process killed in the
    middle of copying a run into the mapping can leave a hole followed by whole entries
    (memcpy need not copy front to back), but never an index record for them.
    """
    for first in [f for f in index.firsts if f + index.records_per_file > from_index]:
        file = index.find(first)
        assert file is not None
        lo = max(from_index, first)
        start = file.offset(lo)
        hi = nonzero_end(file.fd, start, file.records * RECORD.size)
        if hi <= start:
            continue
        hi = start + -(-(hi - start) // RECORD.size) * RECORD.size
        for k, record in enumerate(RECORD.iter_unpack(file.mm[start:hi])):
            position, record_index, _, size, _, _ = record
            if size == 0 or record_index != lo + k:
                continue
            found = _valid_at(segments, position, lo + k)
            if found is not None:
                return found
    return None


def _count_headers(segments: SegmentFiles, position: int) -> int:
    """How many entries with an intact header lie back to back from `position`: what a cut
    there drops (a torn entry counts when its header made it to disk)."""
    seg_bytes = segments.segment_bytes
    count = 0
    while True:
        base = position - position % seg_bytes
        offset = position - base
        room = seg_bytes - offset
        if base not in segments or room < BLANK_BYTES_MIN:
            return count
        mm = segments.get(base).mm
        magic = MAGIC.unpack_from(mm, offset)[0]
        if magic == BLANK_MAGIC and blank_defect(mm, offset, room) is None:
            position = base + seg_bytes
            continue
        if room < limits.ENTRY_HEADER_BYTES:
            return count
        header = decode_header(mm, offset)
        if header_defect(mm, offset, header) is not None or header.size > room:
            return count
        count += 1
        position += header.size


def _clear_index_after(index: IndexFiles, last_index: int) -> int:
    """Zero every record after `last_index`; returns how many non-zero records that took."""
    cleared = 0
    for first in [f for f in index.firsts if f > last_index]:
        file = index.find(first)
        assert file is not None
        cleared += -(-nonzero_end(file.fd, 0, file.records * RECORD.size) // RECORD.size)
        index.delete(first)
    file = index.find(last_index + 1)
    if file is not None:
        start = file.offset(last_index + 1)
        end = nonzero_end(file.fd, start, file.records * RECORD.size)
        if end > start:
            slots = -(-(end - start) // RECORD.size)
            zero(file.mm, start, start + slots * RECORD.size)
            cleared += slots
    return cleared
