"""The log entry and the blank record: their codecs and the checks a reader runs on them.

Encoding works on whole runs of entries with C-level `map` calls (struct packing, CRCs, one
`bytes.join`), so appending costs a handful of C calls per entry and no Python bytecode per
byte. Every reader re-checks what the writer asserted: magic, sizes, both CRCs, and the
index and position the entry must have where it is found.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Sequence
from itertools import repeat
from typing import NamedTuple

from dledger import limits
from dledger.log.checksum import crc32
from dledger.raft.entries import EntryKind

# Log entry. Big-endian. Spec: docs/formats.md#log-entry; change both or neither.
#  off len field       meaning
#    0   4 magic       ENTRY_MAGIC "DLE1" (the last byte is the format version)
#    4   4 size        header + body, in bytes (>= 44, <= 44 + 4 MiB)
#    8   8 index       Raft index, from 1
#   16   8 term        Raft term, >= 1
#   24   8 position    position of this entry (equals where it is found)
#   32   2 kind        0 DATA, 1 NOOP, 2 CONFIG (dledger.raft.entries.EntryKind)
#   34   2 reserved    0
#   36   4 body_crc    CRC-32 of the body
#   40   4 header_crc  CRC-32 of bytes 0-39, so it also guards body_crc
#   44     body
HEADER = struct.Struct(">IIqqqHHII")
HEADER_CRC_BYTES = 40  # the header CRC covers bytes 0-39
HEADER_COVERED = struct.Struct(">IIqqqHHI")  # bytes 0-39: what the entry encoder packs first
CRC = struct.Struct(">I")
ENTRY_MAGIC = 0x444C4531  # "DLE1"
assert HEADER.size == limits.ENTRY_HEADER_BYTES == 44
assert HEADER_COVERED.size == HEADER_CRC_BYTES == HEADER.size - CRC.size

# Blank record: fills a segment's tail so that no entry spans two segments.
#  off len field   meaning
#    0   4 magic   BLANK_MAGIC "BLNK"
#    4   4 size    bytes from this record to the segment's end (>= 8); the rest is zero
BLANK = struct.Struct(">II")
BLANK_MAGIC = 0x424C4E4B  # "BLNK"
BLANK_BYTES_MIN = BLANK.size  # so a segment tail of 1-7 bytes is never left
END_MAGIC = 0  # a magic of 0 marks the end of written data

ENTRY_BYTES_MAX = limits.ENTRY_HEADER_BYTES + limits.ENTRY_BODY_BYTES_MAX
WITH_HEADER = limits.ENTRY_HEADER_BYTES.__add__  # body length -> entry size, as a C-level map
KINDS = frozenset(kind.value for kind in EntryKind)
MAGIC = struct.Struct(">I")
Buffer = bytes | bytearray | memoryview | mmap.mmap  # what the checks read from


class Header(NamedTuple):
    """The 44 bytes before a body, as decoded (nothing checked yet)."""

    magic: int
    size: int
    index: int  # type: ignore[assignment]  # shadows tuple.index: the spec's name wins
    term: int
    position: int
    kind: int
    reserved: int
    body_crc: int
    header_crc: int


def encode_run(
    first_index: int,
    terms: Sequence[int],
    kinds: Sequence[int],
    payloads: Sequence[bytes],
    positions: Sequence[int],
    sizes: Sequence[int],
) -> bytes:
    """Consecutive entries, back to back, exactly as they lie in a segment.

    `positions` and `sizes` come from the caller's placement (it already needed them to split
    the batch at segment ends); every per-entry step here is a C-level map.
    """
    count = len(payloads)
    assert len(terms) == len(kinds) == len(positions) == len(sizes) == count
    covered = list(
        map(
            HEADER_COVERED.pack,
            repeat(ENTRY_MAGIC, count),
            sizes,
            range(first_index, first_index + count),
            terms,
            positions,
            kinds,
            repeat(0, count),
            map(crc32, payloads),
        )
    )
    # Interleave by extended-slice assignment (C loops) rather than chain(zip(...)).
    pieces: list[bytes] = [b""] * (3 * count)
    pieces[0::3] = covered
    pieces[1::3] = map(CRC.pack, map(crc32, covered))
    pieces[2::3] = payloads
    return b"".join(pieces)


def entry_pieces(
    index: int, term: int, position: int, kind: int, body: bytes
) -> tuple[bytes, bytes, bytes]:
    """One entry as its three pieces (header, header CRC, body): the single-entry append
    path writes them with one pwritev, the same bytes as encode_run without building a run."""
    size = HEADER.size + len(body)
    covered = HEADER_COVERED.pack(ENTRY_MAGIC, size, index, term, position, kind, 0, crc32(body))
    return covered, CRC.pack(crc32(covered)), body


def encode_entry(index: int, term: int, position: int, kind: int, body: bytes) -> bytes:
    """One entry; the store writes runs with encode_run, this is for tests and tools."""
    size = limits.ENTRY_HEADER_BYTES + len(body)
    return encode_run(index, [term], [kind], [body], [position], [size])


def encode_blank(size: int) -> bytes:
    """The 8 bytes that start a blank record of `size` bytes (the rest of it is zeros)."""
    assert size >= BLANK_BYTES_MIN, size
    return BLANK.pack(BLANK_MAGIC, size)


def decode_header(buf: Buffer, offset: int) -> Header:
    """The header at `offset`; the caller made sure 44 bytes are there."""
    return Header._make(HEADER.unpack_from(buf, offset))


def header_defect(buf: Buffer, offset: int, header: Header) -> str | None:
    """Why the header at `offset` is not a valid entry header on its own, or None."""
    if header.magic != ENTRY_MAGIC:
        return f"magic {header.magic:#010x} is not an entry's"
    if crc32(buf[offset : offset + HEADER_CRC_BYTES]) != header.header_crc:
        return "header crc mismatch"
    if not limits.ENTRY_HEADER_BYTES <= header.size <= ENTRY_BYTES_MAX:
        return f"size {header.size} is outside {limits.ENTRY_HEADER_BYTES}..{ENTRY_BYTES_MAX}"
    if header.index < 1 or header.term < 1:
        return f"index {header.index} or term {header.term} below 1"
    if header.kind not in KINDS:
        return f"unknown kind {header.kind}"
    if header.reserved != 0:
        return f"reserved field is {header.reserved}, not 0"
    return None


def check(
    buf: Buffer, offset: int, *, position: int, index: int | None, room: int
) -> tuple[str | None, Header | None]:
    """Check the entry at `offset` of `buf` completely: (reason it is bad or None, its header).

    `position` is where it lies in the log, `index` the index it must carry (None: any), `room`
    the bytes from `offset` to the end of its segment. The header comes back whenever its own
    CRC holds, even if a later check fails, so a caller can still trust its size.
    """
    if room < limits.ENTRY_HEADER_BYTES:
        return f"only {room} bytes left in the segment, less than a header", None
    header = decode_header(buf, offset)
    reason = header_defect(buf, offset, header)
    if reason is not None:
        return reason, None
    if header.size > room:
        return f"size {header.size} runs {header.size - room} bytes past the segment end", header
    if 0 < room - header.size < BLANK_BYTES_MIN:
        return f"leaves {room - header.size} bytes before the segment end", header
    if header.position != position:
        return f"position field {header.position}, found at {position}", header
    if index is not None and header.index != index:
        return f"index {header.index}, expected {index}", header
    body = buf[offset + limits.ENTRY_HEADER_BYTES : offset + header.size]
    if crc32(body) != header.body_crc:
        return "body crc mismatch", header
    return None, header


def blank_defect(buf: Buffer, offset: int, room: int) -> str | None:
    """Why the blank record at `offset` (magic already seen) is bad, or None."""
    if room < BLANK_BYTES_MIN:
        return f"blank record with only {room} bytes left in the segment"
    _, size = BLANK.unpack_from(buf, offset)
    if size != room:
        return f"blank record of {size} bytes, but {room} bytes are left in the segment"
    if bytes(buf[offset + BLANK_BYTES_MIN : offset + room]).rstrip(b"\0"):
        return "blank record is not zero after its size field"
    return None
