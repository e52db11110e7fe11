"""Reading entries by index: the index record says where, the entry header confirms it.

Every read re-checks what the writer asserted (both CRCs, and that index, term, position, size
and kind agree with the index record), so a byte that rots after recovery is reported as
CorruptEntry instead of being served. Bodies come back as bytes copies: a memoryview into a
mapping would stop the mapping from being closed (BufferError) while anyone holds it.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterator
from operator import itemgetter

import attrs

from dledger import limits
from dledger.log.checksum import crc32
from dledger.log.entry import ENTRY_MAGIC, decode_header, header_defect
from dledger.log.errors import CorruptEntry
from dledger.log.index_file import RECORD, IndexFile, IndexFiles
from dledger.log.layout import index_label, segment_label
from dledger.log.segment import SegmentFiles
from dledger.raft.entries import EntryBatch

RECORDS_PER_READ = 1024  # index records fetched at once by a range read
Record = tuple[int, int, int, int, int, int]  # position, index, term, size, kind, reserved


@attrs.frozen
class StoredEntry:
    """One entry as stored: where it is and what it holds."""

    index: int
    term: int
    kind: int
    position: int
    size: int  # header + body bytes
    body: bytes


class EntryReader:
    def __init__(self, segments: SegmentFiles, index: IndexFiles) -> None:
        self._segments = segments
        self._index = index

    def record(self, index: int) -> Record:
        """The index record for `index` (which the caller knows the log holds), checked."""
        file = self._index_file(index)
        record: Record = file.record(index)
        self._check_record(file, index, record)
        return record

    def _index_file(self, index: int) -> IndexFile:
        """The index file holding `index`; CorruptEntry when it is missing."""
        file = self._index.find(index)
        if file is None:
            raise CorruptEntry(
                self._index_label(index), 0, f"index file for index {index} is missing"
            )
        return file

    def _index_label(self, index: int) -> str:
        return index_label(self._index.first_of(index))

    def _check_record(self, file: IndexFile, index: int, record: Record) -> None:
        if record[1] != index or record[3] < limits.ENTRY_HEADER_BYTES:
            reason = f"index record for index {index} holds index {record[1]}, size {record[3]}"
            raise CorruptEntry(file.label, record[0], reason)

    def _chunks(self, lo: int, hi: int) -> Iterator[tuple[IndexFile, int, list[Record]]]:
        """Records lo..hi, unchecked, a chunk at a time: (its file, its first index, records)."""
        index = lo
        while index <= hi:
            file = self._index_file(index)
            stop = min(hi, file.last, index + RECORDS_PER_READ - 1)
            start = file.offset(index)
            yield (
                file,
                index,
                list(RECORD.iter_unpack(file.mm[start : file.offset(stop) + RECORD.size])),
            )
            index = stop + 1

    def records(self, lo: int, hi: int) -> Iterator[Record]:
        """Checked records lo..hi, fetched a chunk at a time."""
        for file, index, chunk in self._chunks(lo, hi):
            for k, record in enumerate(chunk):
                self._check_record(file, index + k, record)
                yield record

    def first_index_from(self, position: int, first_index: int, last_index: int) -> int:
        """The first index in first_index..last_index whose entry starts at or after
        `position` (last_index + 1 if none): positions grow with indexes, so a binary search
        over index records."""
        lo, hi = first_index, last_index + 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.record(mid)[0] >= position:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def get(self, index: int) -> StoredEntry:
        record = self.record(index)
        return StoredEntry(index, record[2], record[4], record[0], record[3], self._body(record))

    def at(self, position: int, first_index: int, last_index: int) -> StoredEntry:
        """The entry that starts at byte `position`, checked as `get` checks it (its header
        names an index first_index..last_index whose record points back here). What a
        reader holding positions (the broker's ConsumeQueue) asks for."""
        seg_bytes = self._segments.segment_bytes
        base = position - position % seg_bytes
        offset = position - base
        if base not in self._segments or offset + limits.ENTRY_HEADER_BYTES > seg_bytes:
            raise CorruptEntry(segment_label(base), position, "no entry can start here")
        header = decode_header(self._segments.get(base).mm, offset)
        if header.magic != ENTRY_MAGIC or not first_index <= header.index <= last_index:
            why = f"no entry of index {first_index}..{last_index} starts here"
            raise CorruptEntry(segment_label(base), position, why)
        if self.record(header.index)[0] != position:
            why = f"the entry here names index {header.index}, whose record points elsewhere"
            raise CorruptEntry(segment_label(base), position, why)
        return self.get(header.index)

    def positions(self, lo: int, hi: int) -> list[int]:
        """The byte positions of entries lo..hi, from the index records. Every replica asks
        this for every applied batch, so the records are checked column by column (C-level
        maps); a chunk that fails is read again record by record for the error."""
        positions: list[int] = []
        for file, index, chunk in self._chunks(lo, hi):
            if (
                list(map(itemgetter(1), chunk)) != list(range(index, index + len(chunk)))
                or min(map(itemgetter(3), chunk)) < limits.ENTRY_HEADER_BYTES
            ):
                for k, record in enumerate(chunk):
                    self._check_record(file, index + k, record)  # raises for the first bad one
            positions += map(itemgetter(0), chunk)
        return positions

    def read(self, lo: int, hi: int, bytes_max: int) -> EntryBatch:
        terms: list[int] = []
        kinds: list[int] = []
        payloads: list[bytes] = []
        total = 0
        for record in self.records(lo, hi):
            body_bytes = record[3] - limits.ENTRY_HEADER_BYTES
            if payloads and total + body_bytes > bytes_max:
                break
            total += body_bytes
            payloads.append(self._body(record))
            terms.append(record[2])
            kinds.append(record[4])
        return EntryBatch(lo, terms, kinds, payloads)

    def read_meta(self, lo: int, hi: int) -> tuple[list[int], list[int], list[int]]:
        """(terms, kinds, sizes) of entries lo..hi from the index records alone: what a reader
        that needs no bodies (an applier of the standalone server) asks for. Records are read
        as arrays of big-endian words of three widths and sliced in C; each run's first and
        last index fields are checked."""
        terms: list[int] = []
        kinds: list[int] = []
        sizes: list[int] = []
        index = lo
        while index <= hi:
            file = self._index_file(index)
            stop = min(hi, file.last)
            raw = file.mm[file.offset(index) : file.offset(stop) + RECORD.size]
            words, halves, shorts = array("q", raw), array("I", raw), array("H", raw)
            if sys.byteorder == "little":  # the records are big-endian
                words.byteswap()
                halves.byteswap()
                shorts.byteswap()
            if words[1] != index or words[-3] != stop:
                raise CorruptEntry(
                    file.label, words[0], f"index records {index}..{stop} are not in order"
                )
            terms.extend(words[2::4])  # a record is 4 words: position, index, term, the rest
            sizes.extend(halves[6::8])  # ... 8 uint32s: size is the 7th
            kinds.extend(shorts[14::16])  # ... 16 uint16s: kind is the 15th
            index = stop + 1
        return terms, kinds, sizes

    def _body(self, record: Record) -> bytes:
        """The body of the entry `record` points at, after every check."""
        position, index, term, size, kind, _ = record
        seg_bytes = self._segments.segment_bytes
        base = position - position % seg_bytes
        if base not in self._segments:
            raise CorruptEntry(segment_label(base), position, f"segment missing for index {index}")
        offset = position - base
        if offset + size > seg_bytes:
            why = f"index record size {size} runs past the segment"
            raise CorruptEntry(segment_label(base), position, why)
        mm = self._segments.get(base).mm
        header = decode_header(mm, offset)
        reason = header_defect(mm, offset, header)
        if reason is None and (header.size, header.index, header.term, header.position) != (
            size,
            index,
            term,
            position,
        ):
            reason = (
                f"entry header says index {header.index} term {header.term} size {header.size} "
                f"at {header.position}; index record says {index}/{term}/{size} at {position}"
            )
        if reason is None and header.kind != kind:
            reason = f"entry kind {header.kind}, index record says {kind}"
        if reason is not None:
            raise CorruptEntry(segment_label(base), position, reason)
        body = mm[offset + limits.ENTRY_HEADER_BYTES : offset + size]
        if crc32(body) != header.body_crc:
            raise CorruptEntry(segment_label(base), position, "body crc mismatch")
        return body
