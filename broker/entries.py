"""What a broker puts in a log entry's body: a stored message, or a metadata operation.

Both start with a 4-byte size and a 4-byte magic, so one read tells them apart:

- a message is RocketMQ's stored-message record (remoting/stored_message.py), magic 0xDAA320A7;
- a metadata operation (broker/metadata.py) is, big-endian (docs/formats.md#metadata-entry):

      off len field   meaning
        0   4 size    the whole body, in bytes
        4   4 magic   META_MAGIC 0x424D4554 ("BMET"; it is also the version)
        8   n op      msgpack map {"op": "topic"|"delete_topic"|"group"|..., ...}

The log entry around either already carries a CRC of the whole body.
"""

from __future__ import annotations

import enum
import struct
from typing import Any

import msgpack

from remoting.stored_message import MAGIC_V1, MAGIC_V2

SIZE_MAGIC = struct.Struct(">iI")
META_MAGIC = 0x424D4554


class EntryType(enum.Enum):
    MESSAGE = "message"
    META = "meta"
    UNKNOWN = "unknown"


def entry_type(body: bytes) -> EntryType:
    if len(body) < SIZE_MAGIC.size:
        return EntryType.UNKNOWN
    size, magic = SIZE_MAGIC.unpack_from(body)
    if size != len(body):
        return EntryType.UNKNOWN
    if magic in (MAGIC_V1, MAGIC_V2):
        return EntryType.MESSAGE
    if magic == META_MAGIC:
        return EntryType.META
    return EntryType.UNKNOWN


def encode_meta(op: dict[str, Any]) -> bytes:
    payload = msgpack.packb(op, use_bin_type=True)
    return SIZE_MAGIC.pack(SIZE_MAGIC.size + len(payload), META_MAGIC) + payload


def decode_meta(body: bytes) -> dict[str, Any] | None:
    """The operation in a metadata entry, or None when it does not decode to a map."""
    try:
        op = msgpack.unpackb(body[SIZE_MAGIC.size :], raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException):
        return None
    return op if isinstance(op, dict) else None


VOID_OP = "void"


def void_entry(size: int) -> bytes:
    """A metadata entry of exactly `size` bytes that changes nothing (op "void", padded):
    what the leader's shaper puts in place of a proposed message it must not store (a second
    delivery of a delayed message), since a proposal's payloads keep their lengths there."""
    for extra in ({}, {"n": 0}):  # the second form steps over sizes the first cannot hit
        op: dict[str, Any] = {"op": VOID_OP, **extra, "pad": b""}
        fixed = SIZE_MAGIC.size + len(msgpack.packb(op, use_bin_type=True)) - 2  # less bin8's
        for header in (2, 3, 5):  # msgpack bin8, bin16, bin32 headers
            pad = size - fixed - header
            if pad >= 0 and _bin_header_bytes(pad) == header:
                op["pad"] = bytes(pad)
                payload = msgpack.packb(op, use_bin_type=True)
                assert SIZE_MAGIC.size + len(payload) == size, (size, len(payload))
                return SIZE_MAGIC.pack(size, META_MAGIC) + payload
    raise AssertionError(f"no void entry of {size} bytes")  # sizes from 23 up all have one


def _bin_header_bytes(length: int) -> int:
    return 2 if length < 1 << 8 else 3 if length < 1 << 16 else 5
