"""Small state files replaced atomically: meta, hardstate, checkpoint.

A reader sees either the old file or the new one, never a mix: the new content is written to
`<name>.tmp`, fsynced, renamed over `<name>`, and the directory is fsynced so the rename itself
survives a crash. The CRC catches what the rename cannot (a disk that corrupts a block).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import msgpack

from dledger import limits
from dledger.log.checksum import crc32
from dledger.log.errors import CorruptStateFile

# State file. Big-endian. Spec: docs/formats.md#state-files-meta-hardstate-checkpoint.
#  off len field    meaning
#    0   4 magic    per file: meta "DLMT", hardstate "DLHS", checkpoint "DLCK"
#    4   4 version  1
#    8   4 length   length n of the body
#   12   n body     a msgpack map
# 12+n   4 crc      CRC-32 of bytes 0 .. 11+n
PREFIX = struct.Struct(">4sII")
CRC = struct.Struct(">I")
VERSION = 1
META_MAGIC = b"DLMT"
HARDSTATE_MAGIC = b"DLHS"
CHECKPOINT_MAGIC = b"DLCK"
FILE_BYTES_MAX = PREFIX.size + limits.STATE_FILE_BODY_BYTES_MAX + CRC.size
TMP_SUFFIX = ".tmp"


def encode_state(magic: bytes, body: dict[str, Any]) -> bytes:
    assert len(magic) == 4, magic
    packed = msgpack.packb(body, use_bin_type=True)
    assert len(packed) <= limits.STATE_FILE_BODY_BYTES_MAX, len(packed)
    head = PREFIX.pack(magic, VERSION, len(packed)) + packed
    return head + CRC.pack(crc32(head))


def state_defect(data: bytes, magic: bytes) -> str | None:
    """Why `data` is not a valid state file with this magic, or None."""
    if len(data) < PREFIX.size + CRC.size:
        return f"{len(data)} bytes is shorter than an empty state file"
    got_magic, version, length = PREFIX.unpack_from(data)
    if got_magic != magic:
        return f"magic {got_magic!r}, expected {magic!r}"
    if version != VERSION:
        return f"version {version}, expected {VERSION}"
    end = PREFIX.size + length
    if len(data) != end + CRC.size:
        return f"file is {len(data)} bytes, its length field says {end + CRC.size}"
    (crc,) = CRC.unpack_from(data, end)
    if crc != crc32(data[:end]):
        return "crc mismatch"
    return None


def decode_state(data: bytes, magic: bytes, path: str) -> dict[str, Any]:
    """The body of a state file, after every check; CorruptStateFile names the failed one."""
    reason = state_defect(data, magic)
    if reason is not None:
        raise CorruptStateFile(path, reason)
    try:
        body = msgpack.unpackb(data[PREFIX.size : -CRC.size], raw=False)
    except Exception as err:  # msgpack raises several unrelated types on bad input
        raise CorruptStateFile(path, f"body is not msgpack: {err}") from err
    if not isinstance(body, dict):
        raise CorruptStateFile(path, f"body is a {type(body).__name__}, not a map")
    return body


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (files created, renamed, removed) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_state_file(path: Path, magic: bytes, body: dict[str, Any]) -> None:
    """Replace `path` atomically and durably with a state file holding `body`."""
    data = encode_state(magic, body)
    tmp = path.with_name(path.name + TMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_state_file(path: Path, magic: bytes) -> dict[str, Any] | None:
    """The body of the state file at `path`, or None when there is none.

    A leftover `<name>.tmp` is ignored: the rename never happened, so the old file (or no file)
    is the current state.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        data = os.read(fd, FILE_BYTES_MAX + 1)
    finally:
        os.close(fd)
    if len(data) > FILE_BYTES_MAX:
        raise CorruptStateFile(str(path), f"larger than {FILE_BYTES_MAX} bytes")
    return decode_state(data, magic, str(path))
