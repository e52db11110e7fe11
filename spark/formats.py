"""The replicas' byte layouts, as the audit reads them: numpy dtypes and small decoders.

This module re-states docs/formats.md on purpose instead of importing dledger.log: the audit
must reach its answer without the code that wrote the data, so a bug in the writer's codec
cannot hide itself by being repeated in the reader. Change it only when docs/formats.md
changes, and then check both against each other.

All integers are big-endian; every CRC is zlib.crc32 (IEEE, initial value 0).
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import attrs
import msgpack
import numpy as np

KiB, MiB = 1 << 10, 1 << 20

# --- log entry (docs/formats.md#log-entry) ---------------------------------------------------
#  off len field       meaning
#    0   4 magic       ENTRY_MAGIC "DLE1" (the last byte is the version)
#    4   4 size        header + body, in bytes (>= 44, <= 44 + 4 MiB)
#    8   8 index       Raft index, from 1
#   16   8 term        Raft term, >= 1
#   24   8 position    position of this entry in the group's log (equals where it is found)
#   32   2 kind        0 DATA, 1 NOOP, 2 CONFIG
#   34   2 reserved    0
#   36   4 body_crc    CRC-32 of the body
#   40   4 header_crc  CRC-32 of bytes 0-39, so it also guards body_crc
#   44     body
ENTRY_MAGIC = 0x444C4531  # "DLE1"
BLANK_MAGIC = 0x424C4E4B  # "BLNK": fills a segment's tail; its size runs to the segment end
END_MAGIC = 0  # a magic of 0 marks the end of written data
ENTRY_HEADER_BYTES = 44
ENTRY_HEADER_CRC_BYTES = 40  # the header CRC covers bytes 0-39
ENTRY_BODY_BYTES_MAX = 4 * MiB
ENTRY_BYTES_MAX = ENTRY_HEADER_BYTES + ENTRY_BODY_BYTES_MAX
BLANK_BYTES_MIN = 8  # magic + size; a segment tail of 1-7 bytes is never left
ENTRY_KINDS = (0, 1, 2)  # DATA, NOOP, CONFIG

ENTRY_HEADER = np.dtype(
    [
        ("magic", ">u4"),
        ("size", ">u4"),
        ("index", ">i8"),
        ("term", ">i8"),
        ("position", ">i8"),
        ("kind", ">u2"),
        ("reserved", ">u2"),
        ("body_crc", ">u4"),
        ("header_crc", ">u4"),
    ]
)
assert ENTRY_HEADER.itemsize == ENTRY_HEADER_BYTES
assert struct.calcsize(">IIqqqHHII") == ENTRY_HEADER_BYTES  # the struct format formats.md names

# --- index file record (docs/formats.md#index-file) ----------------------------------------------
#  off len field     meaning
#    0   8 position  where the entry starts in the data segments
#    8   8 index     the entry's index (must equal the slot's index)
#   16   8 term      the entry's term
#   24   4 size      header + body; 0 means "not written"
#   28   2 kind      as in the entry header
#   30   2 reserved  0
INDEX_RECORD = np.dtype(
    [
        ("position", ">i8"),
        ("index", ">i8"),
        ("term", ">i8"),
        ("size", ">u4"),
        ("kind", ">u2"),
        ("reserved", ">u2"),
    ]
)
INDEX_RECORD_BYTES = 32
assert INDEX_RECORD.itemsize == INDEX_RECORD_BYTES

FILE_NAME_DIGITS = 20  # segment and index file names: 20 decimal digits


def file_name(number: int) -> str:
    """A segment's first position or an index file's first index, as its file name."""
    return f"{number:0{FILE_NAME_DIGITS}d}"


def index_file_first(index: int, records_per_file: int) -> int:
    """The name (first index) of the index file that holds `index`."""
    return ((index - 1) // records_per_file) * records_per_file + 1


# --- state files: meta, hardstate, checkpoint (docs/formats.md#state-files) ----------------------
#  off len field    meaning
#    0   4 magic    per file: meta "DLMT", hardstate "DLHS", checkpoint "DLCK"
#    4   4 version  1
#    8   4 length   length n of the body
#   12   n body     a msgpack map
# 12+n   4 crc      CRC-32 of bytes 0 .. 11+n
STATE_PREFIX = struct.Struct(">4sII")
STATE_CRC = struct.Struct(">I")
STATE_VERSION = 1
STATE_BODY_BYTES_MAX = 1 * MiB  # state files are small; anything bigger is not one of ours
META_MAGIC, HARDSTATE_MAGIC, CHECKPOINT_MAGIC = b"DLMT", b"DLHS", b"DLCK"


@attrs.define
class BadStateFile(Exception):
    """A state file that cannot be decoded; `reason` says which check failed."""

    reason: str

    def __str__(self) -> str:
        return self.reason


def decode_state(data: bytes, magic: bytes) -> dict[str, Any]:
    """The msgpack map of a state file, after checking magic, version, length and CRC."""
    if len(data) < STATE_PREFIX.size + STATE_CRC.size:
        raise BadStateFile(f"{len(data)} bytes is shorter than an empty state file")
    got_magic, version, length = STATE_PREFIX.unpack_from(data)
    if got_magic != magic:
        raise BadStateFile(f"magic {got_magic!r}, expected {magic!r}")
    if version != STATE_VERSION:
        raise BadStateFile(f"version {version}, expected {STATE_VERSION}")
    if length > STATE_BODY_BYTES_MAX:
        raise BadStateFile(f"body length {length} exceeds {STATE_BODY_BYTES_MAX}")
    end = STATE_PREFIX.size + length
    if len(data) != end + STATE_CRC.size:
        raise BadStateFile(f"file is {len(data)} bytes, body length says {end + STATE_CRC.size}")
    (crc,) = STATE_CRC.unpack_from(data, end)
    if crc != zlib.crc32(data[:end]):
        raise BadStateFile("crc mismatch")
    try:
        body = msgpack.unpackb(data[STATE_PREFIX.size : end], raw=False)
    except Exception as err:  # msgpack raises several unrelated types on bad input
        raise BadStateFile(f"body is not msgpack: {err}") from err
    if not isinstance(body, dict):
        raise BadStateFile(f"body is a {type(body).__name__}, expected a map")
    return body
