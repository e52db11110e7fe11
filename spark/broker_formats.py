"""The broker's byte layouts, as the audit reads them: stored messages, metadata entries,
properties, ConsumeQueue units, IndexFiles and the broker-state checkpoint.

Re-stated from docs/formats.md on purpose, as spark/formats.py re-states the log's: the audit
must never read the broker's files through the code that wrote them (`remoting/`, `broker/`),
so a bug in that codec cannot hide itself by being repeated here. tests/spark/test_imports.py
checks that no spark module imports either package. Change this only when docs/formats.md
changes, and then check both against each other.

All integers are big-endian.
"""

from __future__ import annotations

import contextlib
import hashlib
import struct
import zlib
from typing import Any

import attrs
import numpy as np

from spark import formats

# --- what a log entry's body is (docs/formats.md#metadata-entry) ------------------------------
MESSAGE_MAGIC_V1 = 0xDAA320A7  # 1-byte topic length
MESSAGE_MAGIC_V2 = 0xDAA320AB  # 2-byte topic length
META_MAGIC = 0x424D4554  # "BMET": a metadata operation, in no ConsumeQueue
BODY_KIND_MESSAGE, BODY_KIND_META, BODY_KIND_OTHER = "message", "meta", "other"


def body_kind(body: bytes) -> str:
    """A DATA entry's body: a stored message, a metadata entry, or neither."""
    if len(body) < 8:
        return BODY_KIND_OTHER
    magic = int.from_bytes(body[4:8], "big")
    if magic in (MESSAGE_MAGIC_V1, MESSAGE_MAGIC_V2):
        return BODY_KIND_MESSAGE
    return BODY_KIND_META if magic == META_MAGIC else BODY_KIND_OTHER


# --- stored message (docs/formats.md#stored-message) ------------------------------------------
#  off len field                        (IPv4 hosts; an IPv6 host takes 20 bytes, not 8)
#    0   4 store_size
#    4   4 magic                         V1 0xDAA320A7, V2 0xDAA320AB
#    8   4 body_crc                      CRC-32 of the body & 0x7FFFFFFF
#   12   4 queue_id
#   16   4 flag
#   20   8 queue_offset
#   28   8 physical_offset               its entry's position + 44
#   36   4 sys_flag                      0x1 compressed, 0xC transaction type, 0x10/0x20 IPv6
#   40   8 born_timestamp
#   48   8 born_host                     address + port (int32)
#   56   8 store_timestamp
#   64   8 store_host                    address + port (int32): part of the offsetMsgId
#   72   4 reconsume_times
#   76   8 prepared_transaction_offset
#   84   4 body_length                   n
#   88   n body
#        1 topic_length                  (V2: 2 bytes)
#          topic
#        2 properties_length
#          properties
FIRST = struct.Struct(">iIiiiqqi")  # store_size .. sys_flag: 36 bytes
INT32, INT64, INT16 = struct.Struct(">i"), struct.Struct(">q"), struct.Struct(">h")
SYS_FLAG_COMPRESSED = 0x1
SYS_FLAG_TRANSACTION_MASK = 0xC
SYS_FLAG_ROLLBACK = 0xC
SYS_FLAG_BORN_V6, SYS_FLAG_STORE_V6 = 0x10, 0x20
PROPERTY_PAIR, PROPERTY_END = b"\x01", b"\x02"
SCHEDULE_TOPICS = frozenset({"SCHEDULE_TOPIC_XXXX", "rmq_sys_wheel_timer"})
HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
DUE_KEY = b"TIMER_OUT_MS"  # a schedule record's due time: its ConsumeQueue tag hash


@attrs.define
class BadRecord(Exception):
    """A body that says it is a stored message but does not parse as one."""

    reason: str

    def __str__(self) -> str:
        return self.reason


@attrs.frozen
class Message:
    """The fields of a stored message the broker checks need."""

    store_size: int
    queue_id: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    store_timestamp_ms: int
    store_host: bytes  # address + port, as in the offsetMsgId
    topic: str
    properties: bytes
    body: bytes  # as stored (compressed when sys_flag says so)

    @property
    def offset_msg_id(self) -> str:
        """Store host address + port + physical offset, upper-case hex (docs: Message ids)."""
        return (self.store_host + INT64.pack(self.physical_offset)).hex().upper()

    def prop(self, key: bytes) -> bytes | None:
        return find_property(self.properties, key)

    def tag_hash(self) -> int:
        """What its ConsumeQueue unit must hold: the due time in the schedule topics, else the
        Java hashCode of TAGS (0 without)."""
        if self.topic in SCHEDULE_TOPICS:
            due = self.prop(DUE_KEY)
            return int(due) if due is not None and due.isdigit() and len(due) <= 18 else 0
        tags = self.prop(b"TAGS")
        return 0 if tags is None else java_hash(tags.decode(errors="replace"))

    def index_keys(self) -> list[str]:
        """The IndexFile keys it is put under: topic#UNIQ_KEY, then topic#k for each KEYS
        entry; none for a rolled-back transactional message."""
        if self.sys_flag & SYS_FLAG_TRANSACTION_MASK == SYS_FLAG_ROLLBACK:
            return []
        uniq, keys = self.prop(b"UNIQ_KEY"), self.prop(b"KEYS")
        out = [] if uniq is None else [f"{self.topic}#{uniq.decode(errors='replace')}"]
        if keys is not None:
            out += [f"{self.topic}#{k}" for k in keys.decode(errors="replace").split(" ") if k]
        return out

    def body_digest(self) -> bytes:
        """SHA-256 of the body as the producer sent it (decompressed when stored compressed;
        an undecompressable body is hashed as stored)."""
        body = self.body
        if self.sys_flag & SYS_FLAG_COMPRESSED:
            with contextlib.suppress(zlib.error):
                body = zlib.decompress(body)
        return hashlib.sha256(body).digest()


def read_message(body: bytes) -> Message:
    """A stored message; raises BadRecord when a length runs outside the record or the fields
    do not end at its size. The body CRC is not checked: the entry's CRC covers the bytes."""
    if len(body) < FIRST.size:
        raise BadRecord(f"{len(body)} bytes is shorter than a message's fixed fields")
    size, magic, _crc, queue_id, _flag, queue_offset, physical_offset, sys_flag = FIRST.unpack_from(
        body
    )
    if size != len(body):
        raise BadRecord(f"store_size {size} but the entry's body is {len(body)} bytes")
    born_host = 20 if sys_flag & SYS_FLAG_BORN_V6 else 8
    store_host = 20 if sys_flag & SYS_FLAG_STORE_V6 else 8
    at = FIRST.size + 8 + born_host  # past born_timestamp and born_host
    if at + 8 + store_host + 4 + 8 + 4 > size:
        raise BadRecord("fixed fields run past the record")
    store_ts = INT64.unpack_from(body, at)[0]
    host = body[at + 8 : at + 8 + store_host]
    at += 8 + store_host + 4 + 8
    body_length = INT32.unpack_from(body, at)[0]
    at += 4
    if body_length < 0 or at + body_length > size:
        raise BadRecord(f"body length {body_length} runs past the record")
    payload = body[at : at + body_length]
    at += body_length
    width = 1 if magic == MESSAGE_MAGIC_V1 else 2
    if at + width > size:
        raise BadRecord("topic length runs past the record")
    topic_length = body[at] if width == 1 else INT16.unpack_from(body, at)[0]
    at += width
    if topic_length < 0 or at + topic_length + 2 > size:
        raise BadRecord(f"topic length {topic_length} runs past the record")
    topic = body[at : at + topic_length].decode(errors="replace")
    at += topic_length
    props_length = INT16.unpack_from(body, at)[0]
    at += 2
    if props_length < 0 or at + props_length != size:
        raise BadRecord(f"properties length {props_length}: the fields do not end at {size}")
    return Message(
        size,
        queue_id,
        queue_offset,
        physical_offset,
        sys_flag,
        store_ts,
        host,
        topic,
        body[at:],
        payload,
    )


def find_property(data: bytes, key: bytes) -> bytes | None:
    """The value of `key` in `k \\x01 v \\x02 ...`, as leniently as RocketMQ reads it: the last
    occurrence wins, an empty value is absent, a pair without \\x01 is skipped."""
    found = None
    for pair in data.split(PROPERTY_END):
        name, sep, value = pair.partition(PROPERTY_PAIR)
        if sep and name == key:
            found = value or None
    return found


def java_hash(text: str) -> int:
    """Java's String.hashCode over UTF-16 code units, as a signed 32-bit int."""
    h = 0
    for unit in np.frombuffer(text.encode("utf-16-be"), dtype=">u2").tolist():
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def index_key_hash(key: str) -> int:
    """An IndexFile item's key hash: abs(hashCode), 0 for Integer.MIN_VALUE."""
    h = java_hash(key)
    return 0 if h == -(1 << 31) else abs(h)


# --- ConsumeQueue unit (docs/formats.md#consumequeue) -----------------------------------------
#  off len field            meaning
#    0   8 physical_offset  of the stored message, >= 0
#    8   4 size             its store_size, > 0 (0: not written)
#   12   8 tag_hash         hashCode of TAGS; the due time in the schedule topics
CQ_UNIT = np.dtype([("physical_offset", ">i8"), ("size", ">i4"), ("tag_hash", ">i8")])
CQ_UNIT_BYTES = 20
assert CQ_UNIT.itemsize == CQ_UNIT_BYTES
CQ_DIR = "consumequeue"

# --- IndexFile (docs/formats.md#indexfile) -----------------------------------------------------
#  header:  0 8 begin_timestamp, 8 8 end_timestamp, 16 8 begin_phy_offset, 24 8 end_phy_offset,
#          32 4 hash_slot_count, 36 4 index_count (1 + items in use)
#  slots:   slot_count x int32 at 40: the newest item of the slot, 0 for none
#  items:   item k at 40 + 4 * slot_count + 20 * k:
#           0 4 key_hash, 4 8 phy_offset, 12 4 time_diff (s), 16 4 prev_index
INDEX_HEADER = struct.Struct(">qqqqii")
INDEX_HEADER_BYTES = 40
INDEX_SLOT = np.dtype(">i4")
INDEX_ITEM = np.dtype(
    [("key_hash", ">i4"), ("phy_offset", ">i8"), ("time_diff", ">i4"), ("prev_index", ">i4")]
)
INDEX_ITEM_BYTES = 20
assert INDEX_HEADER.size == INDEX_HEADER_BYTES and INDEX_ITEM.itemsize == INDEX_ITEM_BYTES
INDEX_DIR = "index"
INDEX_SLOTS_DEFAULT, INDEX_ITEMS_DEFAULT = 5_000_000, 20_000_000  # RocketMQ's, as the broker's
TIME_DIFF_MAX_S = (1 << 31) - 1


def index_file_bytes(slots: int, items: int) -> int:
    return INDEX_HEADER_BYTES + 4 * slots + INDEX_ITEM_BYTES * items


@attrs.frozen
class IndexHeader:
    begin_timestamp_ms: int
    end_timestamp_ms: int
    begin_phy_offset: int
    end_phy_offset: int
    hash_slot_count: int
    index_count: int

    @classmethod
    def decode(cls, data: bytes) -> IndexHeader:
        return cls(*INDEX_HEADER.unpack_from(data))


# --- broker-state (docs/formats.md#broker-state-checkpoint) ----------------------------------
BROKER_STATE_FILE = "broker-state"
BROKER_STATE_MAGIC = b"BKST"


def decode_broker_state(data: bytes) -> dict[str, Any]:
    """The broker-state checkpoint's map (a state file with magic BKST); raises
    formats.BadStateFile."""
    body = formats.decode_state(data, BROKER_STATE_MAGIC)
    for key in ("applied_index", "queues", "index_end"):
        if key not in body:
            raise formats.BadStateFile(f"key {key!r} missing")
    return body
