"""RocketMQ's stored-message record (docs/formats.md#stored-message): codec, patch, fast reads.

Each message is one record, the body of one log entry; a pull returns these bytes as they are,
so any RocketMQ client decodes them. `encode`/`pack` write V1 (magic 0xDAA320A7, 1-byte topic
length); `decode` also reads V2 (0xDAA320AB, 2-byte topic length). Hosts are IPv4 unless the
sysFlag bits BORN_HOST_V6_FLAG / STORE_HOST_V6_FLAG say IPv6 (client-cpp 1.2.x reads every
host as IPv4, so the broker should store IPv4 hosts only); the fast readers handle both.

The dispatcher reads every message with `read_dispatch` (one struct unpack and two slices), and
a replica sets the queue offset and physical offset of an encoded record with `patch_offsets`.
"""

from __future__ import annotations

import functools
import mmap
import socket
import struct
from typing import Any, NamedTuple

import attrs
from isal.isal_zlib import crc32  # as dledger/log/checksum.py: ISA-L, zlib's CRC-32

from remoting import limits
from remoting import properties as props
from remoting.errors import CorruptMessage, MessageTooLarge, PropertiesTooLong, TopicTooLong

# Stored message, V1 magic, IPv4 hosts. Big-endian. Spec: docs/formats.md#stored-message;
# change both or neither. IPv6 hosts are 16 + 4 bytes each and shift everything after them.
#  off len field                         meaning
#    0   4 store_size                    the whole record, in bytes
#    4   4 magic                         MAGIC_V1 0xDAA320A7 (V2 0xDAA320AB: 2-byte topic length)
#    8   4 body_crc                      crc32(body) & 0x7FFFFFFF
#   12   4 queue_id
#   16   4 flag                          the user's flag from the send
#   20   8 queue_offset                  index in the ConsumeQueue (patched by patch_offsets)
#   28   8 physical_offset               position of this record in the log (patched too)
#   36   4 sys_flag                      compression, transaction type, IPv6 host bits
#   40   8 born_timestamp                ms, the producer's clock
#   48   8 born_host                     IPv4 address (4) + port (int32)
#   56   8 store_timestamp               ms, the leader's clock when it accepted the message
#   64   8 store_host                    IPv4 address (4) + port (int32): what clients reach
#   72   4 reconsume_times
#   76   8 prepared_transaction_offset   0 unless transactional
#   84   4 body_length                   n
#   88   n body
# 88+n   1 topic_length                  t (V2: 2 bytes)
#        t topic                         UTF-8
#        2 properties_length             p, int16, <= 32767
#        p properties                    key \x01 value \x02 ... (remoting/properties.py)
# store_size = 91 + n + t + p (V1, IPv4 hosts)
MAGIC_V1 = 0xDAA320A7
MAGIC_V2 = 0xDAA320AB
BORN_HOST_V6_FLAG = 0x10
STORE_HOST_V6_FLAG = 0x20

SIZE_AT = 0
MAGIC_AT = 4
BODY_CRC_AT = 8
QUEUE_ID_AT = 12
FLAG_AT = 16
QUEUE_OFFSET_AT = 20
PHYSICAL_OFFSET_AT = 28
SYS_FLAG_AT = 36
BORN_TIMESTAMP_AT = 40
BORN_HOST_AT = 48
STORE_TIMESTAMP_AT = 56  # with an IPv4 born host; 68 with an IPv6 one

BODY_CRC_MASK = 0x7FFFFFFF
INT32 = struct.Struct(">i")
INT64 = struct.Struct(">q")
INT16 = struct.Struct(">h")
SIZE_MAGIC = struct.Struct(">iI")
OFFSETS = struct.Struct(">qq")  # queue_offset, physical_offset: adjacent, patched together
assert OFFSETS.size == PHYSICAL_OFFSET_AT + 8 - QUEUE_OFFSET_AT


def _fixed(born_ip_bytes: int, store_ip_bytes: int) -> struct.Struct:
    """Bytes 0 .. body_length of a record with the given host address sizes."""
    return struct.Struct(f">iIIiiqqiq{born_ip_bytes}siq{store_ip_bytes}siiqi")


# Indexed by sys_flag's two host bits: (flag & 0x30) >> 4.
FIXED = (_fixed(4, 4), _fixed(16, 4), _fixed(4, 16), _fixed(16, 16))
FIXED_V4 = FIXED[0]
assert FIXED_V4.size == 88
assert FIXED_V4.size + 1 + 2 == 91  # the smallest V1 record: no body, topic or properties

Buffer = bytes | bytearray | memoryview | mmap.mmap
Host = tuple[str, int]  # (address text, port)


@attrs.frozen
class StoredMessage:
    """Every field of one stored record, decoded."""

    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    born_timestamp_ms: int
    born_host: Host
    store_timestamp_ms: int
    store_host: Host
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    topic: str
    properties: dict[str, str]


# A NamedTuple made by tuple.__new__ skips the class's Python-level __new__: 100 ns, not 270
# (the dispatcher makes one per message on every replica)
new_tuple = tuple.__new__


class DispatchFields(NamedTuple):
    """What the dispatcher needs of every message, read without decoding body or properties."""

    size: int
    queue_id: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    store_timestamp_ms: int
    topic: str
    properties: bytes  # the raw properties string: look keys up with remoting.properties.find


@functools.lru_cache(maxsize=4096)  # a broker stores the same few client hosts over and over
def _host_bytes(host: Host, v6: bool) -> bytes:
    family = socket.AF_INET6 if v6 else socket.AF_INET
    try:
        return socket.inet_pton(family, host[0])
    except OSError:
        raise AssertionError(f"host {host[0]!r} does not match the sys_flag's IPv6 bit") from None


def _host(address: bytes, port: int) -> Host:
    family = socket.AF_INET if len(address) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, address), port


def encoded_size(
    body_bytes: int,
    topic_bytes: int,
    properties_bytes: int,
    sys_flag: int = 0,
    magic: int = MAGIC_V1,
) -> int:
    """The store_size of a record with these lengths."""
    topic_length_bytes = 1 if magic == MAGIC_V1 else 2
    fixed = FIXED[(sys_flag & 0x30) >> 4].size
    return fixed + body_bytes + topic_length_bytes + topic_bytes + 2 + properties_bytes


def pack(
    *,
    queue_id: int,
    flag: int,
    queue_offset: int,
    physical_offset: int,
    sys_flag: int,
    born_timestamp_ms: int,
    born_host: Host,
    store_timestamp_ms: int,
    store_host: Host,
    reconsume_times: int,
    prepared_transaction_offset: int,
    body: bytes,
    topic: str,
    properties_data: bytes,
    magic: int = MAGIC_V1,
) -> bytes:
    """One record from its fields, with the properties string as stored (a client's, unchanged).

    Raises TopicTooLong, PropertiesTooLong and MessageTooLarge (the record must fit in one
    log entry: STORED_MESSAGE_BYTES_MAX, RocketMQ's maxMessageSize).
    """
    packer = Packer(
        queue_id=queue_id,
        sys_flag=sys_flag,
        born_timestamp_ms=born_timestamp_ms,
        born_host=born_host,
        store_timestamp_ms=store_timestamp_ms,
        store_host=store_host,
        reconsume_times=reconsume_times,
        topic=topic,
        magic=magic,
    )
    return packer.pack(
        flag, body, properties_data, queue_offset, physical_offset, prepared_transaction_offset
    )


class Packer:
    """`pack` for records that share all but flag, body, properties and the offsets: the
    messages of one send request. What they share is encoded and checked once."""

    __slots__ = (
        "_born",
        "_born_ms",
        "_fixed",
        "_magic",
        "_overhead",
        "_queue_id",
        "_reconsume_times",
        "_store",
        "_store_ms",
        "_sys_flag",
        "_topic_part",
    )

    def __init__(
        self,
        *,
        queue_id: int,
        sys_flag: int,
        born_timestamp_ms: int,
        born_host: Host,
        store_timestamp_ms: int,
        store_host: Host,
        reconsume_times: int,
        topic: str,
        magic: int = MAGIC_V1,
    ) -> None:
        """Raises TopicTooLong."""
        assert magic in (MAGIC_V1, MAGIC_V2), magic
        topic_data = topic.encode()
        topic_max = limits.TOPIC_BYTES_MAX_V1 if magic == MAGIC_V1 else limits.TOPIC_BYTES_MAX_V2
        if len(topic_data) > topic_max:
            raise TopicTooLong(topic, len(topic_data), topic_max)
        length = bytes((len(topic_data),)) if magic == MAGIC_V1 else INT16.pack(len(topic_data))
        self._topic_part = length + topic_data
        self._overhead = encoded_size(0, len(topic_data), 0, sys_flag, magic)
        self._fixed = FIXED[(sys_flag & 0x30) >> 4]
        self._magic = magic
        self._queue_id = queue_id
        self._sys_flag = sys_flag
        self._born_ms = born_timestamp_ms
        self._born = (_host_bytes(born_host, bool(sys_flag & BORN_HOST_V6_FLAG)), born_host[1])
        self._store_ms = store_timestamp_ms
        self._store = (_host_bytes(store_host, bool(sys_flag & STORE_HOST_V6_FLAG)), store_host[1])
        self._reconsume_times = reconsume_times

    def pack(
        self,
        flag: int,
        body: bytes,
        properties_data: bytes,
        queue_offset: int = 0,
        physical_offset: int = 0,
        prepared_transaction_offset: int = 0,
    ) -> bytes:
        """One record. Raises PropertiesTooLong and MessageTooLarge."""
        properties_bytes = len(properties_data)
        if properties_bytes > limits.PROPERTIES_BYTES_MAX:
            raise PropertiesTooLong(properties_bytes, limits.PROPERTIES_BYTES_MAX)
        size = self._overhead + len(body) + properties_bytes
        if size > limits.STORED_MESSAGE_BYTES_MAX:
            raise MessageTooLarge(size, limits.STORED_MESSAGE_BYTES_MAX)
        born, store = self._born, self._store
        head = self._fixed.pack(
            size,
            self._magic,
            crc32(body) & BODY_CRC_MASK,
            self._queue_id,
            flag,
            queue_offset,
            physical_offset,
            self._sys_flag,
            self._born_ms,
            born[0],
            born[1],
            self._store_ms,
            store[0],
            store[1],
            self._reconsume_times,
            prepared_transaction_offset,
            len(body),
        )
        return b"".join(
            (head, body, self._topic_part, INT16.pack(properties_bytes), properties_data)
        )


def encode(message: StoredMessage, magic: int = MAGIC_V1) -> bytes:
    """One record from a StoredMessage. Raises BadProperty and what pack raises."""
    fields = attrs.asdict(message, recurse=False)
    fields["properties_data"] = props.encode(fields.pop("properties"))
    return pack(**fields, magic=magic)


def patch_offsets(
    buf: bytearray | memoryview | mmap.mmap, at: int, queue_offset: int, physical_offset: int
) -> None:
    """Set queue_offset and physical_offset of the record at `at`, in place. The body CRC does
    not cover them, so nothing else changes."""
    OFFSETS.pack_into(buf, at + QUEUE_OFFSET_AT, queue_offset, physical_offset)


def _size_magic(buf: Buffer, at: int) -> tuple[int, int]:
    """store_size and magic of the record at `at`, after the checks every reader makes."""
    room = len(buf) - at
    if room < SIZE_MAGIC.size:
        raise CorruptMessage(at, f"only {room} bytes, less than a size and magic")
    size, magic = SIZE_MAGIC.unpack_from(buf, at)
    if magic != MAGIC_V1 and magic != MAGIC_V2:
        raise CorruptMessage(at, f"bad magic {magic:#010x}")
    if size < FIXED_V4.size + 3:
        raise CorruptMessage(at, f"size {size} is below the smallest record, {FIXED_V4.size + 3}")
    if size > room:
        raise CorruptMessage(at, f"size {size} runs {size - room} bytes past the buffer end")
    return size, magic


def read_size(buf: Buffer, at: int = 0) -> int:
    """store_size of the record at `at` (magic and bounds checked)."""
    return _size_magic(buf, at)[0]


def read_queue_id(buf: Buffer, at: int = 0) -> int:
    _size_magic(buf, at)
    return int(INT32.unpack_from(buf, at + QUEUE_ID_AT)[0])


def read_store_timestamp(buf: Buffer, at: int = 0) -> int:
    _size_magic(buf, at)
    born_v6 = INT32.unpack_from(buf, at + SYS_FLAG_AT)[0] & BORN_HOST_V6_FLAG
    return int(INT64.unpack_from(buf, at + STORE_TIMESTAMP_AT + (12 if born_v6 else 0))[0])


def read_topic(buf: Buffer, at: int = 0) -> str:
    return read_dispatch(buf, at).topic


def read_properties(buf: Buffer, at: int = 0) -> dict[str, str]:
    """The decoded properties of the record at `at`."""
    data = read_dispatch(buf, at).properties
    try:
        return props.decode(data)
    except UnicodeDecodeError:
        raise CorruptMessage(at, "properties are not UTF-8") from None


def read_tags(buf: Buffer, at: int = 0) -> str | None:
    """The TAGS property of the record at `at`, or None."""
    value = props.find(read_dispatch(buf, at).properties, b"TAGS")
    return None if value is None else value.decode(errors="replace")


def read_dispatch(buf: Buffer, at: int = 0) -> DispatchFields:
    """The fields the dispatcher needs, with magic and every length checked against the size
    (not the body CRC: the log entry's CRC already covers these bytes).

    Every replica reads every message with this, so the usual record (V1, IPv4 hosts, all
    lengths right) is read by one unpack and the checks inline; anything else, a damaged record
    included, goes to `read_dispatch_checked`, which raises the named error."""
    end = at + FIXED_V4.size
    if len(buf) >= end:
        f = FIXED_V4.unpack_from(buf, at)
        size = f[0]
        record_end = at + size
        body_end = end + f[16]
        if (
            f[1] == MAGIC_V1
            and not f[7] & 0x30
            and record_end <= len(buf)
            and f[16] >= 0
            and body_end + 3 <= record_end
        ):
            topic_at = body_end + 1
            props_at = topic_at + buf[body_end]
            if props_at + 2 <= record_end:
                fields_end = props_at + 2 + INT16.unpack_from(buf, props_at)[0]
                if fields_end == record_end:
                    try:
                        topic = bytes(buf[topic_at:props_at]).decode()
                    except UnicodeDecodeError:
                        return read_dispatch_checked(buf, at)  # which names the error
                    properties = bytes(buf[props_at + 2 : fields_end])
                    return new_tuple(
                        DispatchFields, (size, f[3], f[5], f[6], f[7], f[11], topic, properties)
                    )
    return read_dispatch_checked(buf, at)


def read_dispatch_checked(buf: Buffer, at: int = 0) -> DispatchFields:
    """read_dispatch for any record: each check on its own, a failed one raised by name."""
    size, magic = _size_magic(buf, at)
    sys_flag, fixed_size, f = _fixed_fields(buf, at, size)
    topic_data, props_at = _topic_at(buf, at, size, magic, at + fixed_size, f[16])
    props_data = _properties_at(buf, at, size, props_at)
    return DispatchFields(
        size, f[3], f[5], f[6], sys_flag, f[11], _text(topic_data, at, "topic"), props_data
    )


def _fixed_fields(buf: Buffer, at: int, size: int) -> tuple[int, int, tuple[Any, ...]]:
    """(sys_flag, bytes before the body, the fields up to body_length), size checked first."""
    sys_flag = INT32.unpack_from(buf, at + SYS_FLAG_AT)[0]
    fixed = FIXED[(sys_flag & 0x30) >> 4]
    if size < fixed.size + 3:
        raise CorruptMessage(
            at, f"size {size} is below the smallest record with these hosts, {fixed.size + 3}"
        )
    return sys_flag, fixed.size, fixed.unpack_from(buf, at)


def _topic_at(
    buf: Buffer, at: int, size: int, magic: int, body_at: int, body_length: int
) -> tuple[bytes, int]:
    """(topic bytes, where the properties length starts); checks lengths against the size."""
    end = at + size
    body_end = body_at + body_length
    if body_length < 0 or body_end + 1 > end:
        raise CorruptMessage(at, f"body length {body_length} runs past the record")
    if magic == MAGIC_V1:
        topic_length, topic_at = buf[body_end], body_end + 1
    else:
        if body_end + 2 > end:
            raise CorruptMessage(at, "topic length runs past the record")
        topic_length, topic_at = INT16.unpack_from(buf, body_end)[0], body_end + 2
    if topic_length < 0 or topic_at + topic_length + 2 > end:
        raise CorruptMessage(at, f"topic length {topic_length} runs past the record")
    return bytes(buf[topic_at : topic_at + topic_length]), topic_at + topic_length


def _properties_at(buf: Buffer, at: int, size: int, props_at: int) -> bytes:
    props_length = INT16.unpack_from(buf, props_at)[0]
    fields_end = props_at + 2 + props_length
    if props_length < 0 or fields_end > at + size:
        raise CorruptMessage(at, f"properties length {props_length} runs past the record")
    if fields_end != at + size:
        raise CorruptMessage(at, f"size {size} but the fields end at {fields_end - at}")
    return bytes(buf[props_at + 2 : fields_end])


def _text(data: bytes, at: int, what: str) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise CorruptMessage(at, f"{what} is not UTF-8") from None


def decode(buf: Buffer, at: int = 0) -> StoredMessage:
    """The record at `at`, every check made: magic, lengths against store_size, body CRC,
    UTF-8 of topic and properties. Raises CorruptMessage."""
    size, magic = _size_magic(buf, at)
    sys_flag, fixed_size, f = _fixed_fields(buf, at, size)
    body_at = at + fixed_size
    topic_data, props_at = _topic_at(buf, at, size, magic, body_at, f[16])
    props_data = _properties_at(buf, at, size, props_at)
    body = bytes(buf[body_at : body_at + f[16]])
    if crc32(body) & BODY_CRC_MASK != f[2]:
        raise CorruptMessage(at, "body crc mismatch")
    try:
        properties = props.decode(props_data)
    except UnicodeDecodeError:
        raise CorruptMessage(at, "properties are not UTF-8") from None
    return StoredMessage(
        queue_id=f[3],
        flag=f[4],
        queue_offset=f[5],
        physical_offset=f[6],
        sys_flag=sys_flag,
        born_timestamp_ms=f[8],
        born_host=_host(f[9], f[10]),
        store_timestamp_ms=f[11],
        store_host=_host(f[12], f[13]),
        reconsume_times=f[14],
        prepared_transaction_offset=f[15],
        body=body,
        topic=_text(topic_data, at, "topic"),
        properties=properties,
    )
