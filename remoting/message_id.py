"""Message ids (docs/formats.md#message-ids): the broker's offsetMsgId and the client's UNIQ_KEY.

offsetMsgId = store host address + port (int32) + physical offset (int64), big-endian, printed
as upper-case hex: 32 digits for an IPv4 host, 56 for IPv6. It is a lookup key too (a query by
id reads the record at that physical offset), which is why our physical offset is a position in
the replicated log, the same on every replica.

UNIQ_KEY is RocketMQ's MessageClientIDSetter id, made by the client and carried in the
properties: client IP (4 or 16) + pid (int16) + a per-process int32 + milliseconds since the
start of the current month (int32) + a counter (int16), upper-case hex (32 or 56 digits). The
broker never parses it; the generator is for our client, with the clock and time zone injected.
"""

from __future__ import annotations

import datetime
import functools
import os
import socket
import struct
import time
from collections.abc import Callable, Sequence

import attrs

from remoting.errors import BadMessageId

Host = tuple[str, int]
_PORT_POSITION = struct.Struct(">iq")
_PORT = struct.Struct(">i")
_POSITION = struct.Struct(">q")
_SINCE_COUNTER = struct.Struct(">iH")  # a UNIQ_KEY's last fields: ms since month start, counter
_SINCE = struct.Struct(">i")
_UNIQ_TAIL = struct.Struct(">hiIH")  # pid, salt, ms since month start, counter
_HEX = frozenset("0123456789abcdefABCDEF")


def _hex_bytes(text: str, lengths: tuple[int, int]) -> bytes:
    if len(text) not in lengths:
        raise BadMessageId(text, f"{len(text)} characters, expected {lengths[0]} or {lengths[1]}")
    if not _HEX.issuperset(text):
        raise BadMessageId(text, "not hexadecimal")
    return bytes.fromhex(text)


def _packed_ip(address: str) -> bytes:
    """An IPv4 or IPv6 address as the 4 or 16 bytes message ids carry."""
    return socket.inet_pton(socket.AF_INET6 if ":" in address else socket.AF_INET, address)


@functools.lru_cache(maxsize=64)  # a broker has one store host; a client sees a few
def packed_host(store_host: Host) -> bytes:
    """The address (4 or 16 bytes) and port (int32) an offsetMsgId starts with, as a record
    stores a host too. Raises OSError for what is not an IP address."""
    address, port = store_host
    return _packed_ip(address) + _PORT.pack(port)


def offset_msg_id(store_host: Host, physical_offset: int) -> str:
    """The offsetMsgId of the record at `physical_offset` stored by `store_host`."""
    address, port = store_host
    return (_packed_ip(address) + _PORT_POSITION.pack(port, physical_offset)).hex().upper()


def offset_msg_ids(store_host: Host, physical_offsets: Sequence[int]) -> list[str]:
    """offset_msg_id of each record, all stored by `store_host`."""
    text = offset_msg_ids_text(store_host, physical_offsets)
    return text.split(",") if text else []


def offset_msg_ids_text(store_host: Host, physical_offsets: Sequence[int]) -> str:
    """ ",".join(offset_msg_ids(...)) (a batch's answer), made in C-level steps: the shared
    host and port packed once, every offset by one map, and one hex conversion that puts a
    comma after each id."""
    head = packed_host(store_host)
    if len(physical_offsets) == 1:  # one message, a send's usual answer
        return (head + _POSITION.pack(physical_offsets[0])).hex().upper()
    pieces = [head] * (2 * len(physical_offsets))
    pieces[1::2] = map(_POSITION.pack, physical_offsets)
    return b"".join(pieces).hex(",", len(head) + _POSITION.size).upper()


def parse_offset_msg_id(text: str) -> tuple[Host, int]:
    """(store host, physical offset) of an offsetMsgId; raises BadMessageId."""
    raw = _hex_bytes(text, (32, 56))
    ip_length = 4 if len(raw) == 16 else 16
    family = socket.AF_INET if ip_length == 4 else socket.AF_INET6
    port, physical_offset = _PORT_POSITION.unpack_from(raw, ip_length)
    if physical_offset < 0:
        raise BadMessageId(text, f"negative physical offset {physical_offset}")
    return (socket.inet_ntop(family, raw[:ip_length]), port), physical_offset


def month_start_ms(now_ms: int, tz: datetime.tzinfo) -> int:
    """Milliseconds since the epoch at the first instant of the month holding `now_ms` in `tz`."""
    now = datetime.datetime.fromtimestamp(now_ms // 1000, tz)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return int(start.timestamp()) * 1000


def _previous_month_start_ms(start_ms: int, tz: datetime.tzinfo) -> int:
    return month_start_ms(start_ms - 1, tz)


@attrs.frozen
class UniqId:
    """The fields of a UNIQ_KEY."""

    ip: str
    pid: int  # int16, as Java's (short) UtilAll.getPid()
    salt: int  # int32; Java uses its class loader's hashCode
    since_month_start_ms: int
    counter: int  # uint16


def parse_uniq_id(text: str) -> UniqId:
    """The fields of a UNIQ_KEY; raises BadMessageId."""
    raw = _hex_bytes(text, (32, 56))
    ip_length = 4 if len(raw) == 16 else 16
    family = socket.AF_INET if ip_length == 4 else socket.AF_INET6
    pid, salt, since_ms, counter = _UNIQ_TAIL.unpack_from(raw, ip_length)
    return UniqId(socket.inet_ntop(family, raw[:ip_length]), pid, salt, since_ms, counter)


def uniq_id_time_ms(text: str, now_ms: int, tz: datetime.tzinfo = datetime.UTC) -> int:
    """When the UNIQ_KEY was made, as MessageClientIDSetter.getNearlyTimeFromID reads it: the
    id holds only the time since a month start, taken as this month's unless that would be at
    or after `now_ms`, then last month's. `tz` must be the generator's."""
    since_ms = parse_uniq_id(text).since_month_start_ms
    start = month_start_ms(now_ms, tz)
    if start + since_ms >= now_ms:
        start = _previous_month_start_ms(start, tz)
    return start + since_ms


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@attrs.define
class UniqIdGenerator:
    """Makes UNIQ_KEYs as MessageClientIDSetter.createUniqID does (UTC months unless told)."""

    ip: str
    pid: int
    salt: int
    clock_ms: Callable[[], int] = _wall_clock_ms
    tz: datetime.tzinfo = datetime.UTC
    _counter: int = 0
    _month_start_ms: int = -1
    _next_month_start_ms: int = -1
    _prefix: str = ""

    def __attrs_post_init__(self) -> None:
        self._prefix = (
            (_packed_ip(self.ip) + struct.pack(">hi", _int16(self.pid), self.salt)).hex().upper()
        )

    @classmethod
    def for_this_process(cls, ip: str) -> UniqIdGenerator:
        return cls(ip=ip, pid=os.getpid(), salt=int.from_bytes(os.urandom(4), "big", signed=True))

    def next_id(self) -> str:
        since = self._since_month_start(self.clock_ms())
        counter = self._counter & 0xFFFF
        self._counter += 1
        return self._prefix + _SINCE_COUNTER.pack(since, counter).hex().upper()

    def next_ids(self, count: int) -> list[str]:
        """`count` ids as next_id makes them one after another within one millisecond (a
        batch's messages), in C-level steps: one clock read, the shared part made once."""
        since = self._since_month_start(self.clock_ms())
        first = self._counter
        self._counter += count
        head = self._prefix + _SINCE.pack(since).hex().upper()
        return [head + "%04X" % (counter & 0xFFFF) for counter in range(first, first + count)]

    def _since_month_start(self, now: int) -> int:
        if now >= self._next_month_start_ms or self._month_start_ms < 0:
            self._month_start_ms = month_start_ms(now, self.tz)
            next_start = datetime.datetime.fromtimestamp(self._month_start_ms // 1000, self.tz)
            month_after = (next_start.replace(day=28) + datetime.timedelta(days=4)).replace(day=1)
            self._next_month_start_ms = int(month_after.timestamp()) * 1000
        since = _int32(now - self._month_start_ms)
        if -1_000_000 < since < 0:  # the clock stepped back (NTP): as Java, clamp to 0
            since = 0
        return since


def _int16(value: int) -> int:
    value &= 0xFFFF
    return value - 0x10000 if value & 0x8000 else value


def _int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - 0x100000000 if value & 0x80000000 else value
