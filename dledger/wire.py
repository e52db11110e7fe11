"""Frames on the wire, and every code and status in one place (docs/protocol.md).

A frame is a 4-byte big-endian length, then that many bytes of one msgpack map. The length
is checked against FRAME_BYTES_MAX before anything is allocated. `FrameReader` is sans-I/O
(h11's shape): feed it bytes, take frames out; the trio code only moves bytes.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterator
from typing import Any

import attrs
import msgpack

from dledger import limits
from dledger.raft.events import Refusal

LENGTH = struct.Struct(">I")
assert LENGTH.size == 4


class Code(enum.IntEnum):
    """What a frame carries: its map's "c" key."""

    HELLO = 1  # first frame of a peer connection: group, from, to, segment_bytes
    REQUEST_VOTE = 10
    REQUEST_VOTE_REPLY = 11
    APPEND_ENTRIES = 12
    APPEND_ENTRIES_REPLY = 13
    HEARTBEAT = 14
    HEARTBEAT_REPLY = 15
    TIMEOUT_NOW = 16
    INSTALL_LOG_START = 17
    # client requests; each carries an "id" that its reply echoes, so requests pipeline
    APPEND = 100  # bodies: [bytes] -> index of the last one
    GET = 101  # index, count -> entries
    STATUS = 102  # -> role, term, leader, indexes, peers
    TRANSFER = 103  # target -> ok once the transfer started
    REPLY = 200  # every answer to a client request


class Status(enum.IntEnum):
    """Every reply has one, and a sentence saying what it means for this request."""

    OK = 0
    NOT_LEADER = 1  # carries "leader" and "leader_addr" when known; retry there at once
    FRAME_TOO_LARGE = 2  # the connection closes after this reply
    MALFORMED = 3  # the frame is not a map this server understands; the connection closes
    WRONG_PEER = 4  # a peer from another group, or not in this group's peer list
    ENTRY_TOO_LARGE = 5  # nothing was appended
    BUSY = 6  # too much is uncommitted; retry later
    OUTCOME_UNKNOWN = 7  # leadership changed or the wait timed out: it may yet commit
    NOT_COMMITTED = 8  # the entry was replaced by a new leader's: it will never commit
    INDEX_OUT_OF_RANGE = 9
    COMPACTED = 10  # carries "first_index", the first index still stored
    TRANSFERRING = 11  # a leadership transfer is under way; retry shortly
    BAD_REQUEST = 12
    SHUTTING_DOWN = 13


# What a client is told when the core refuses its request.
REFUSAL_STATUS = {
    Refusal.NOT_LEADER: Status.NOT_LEADER,
    Refusal.TRANSFERRING: Status.TRANSFERRING,
    Refusal.BUSY: Status.BUSY,
    Refusal.CONFIG_PENDING: Status.BUSY,
    Refusal.BAD_REQUEST: Status.BAD_REQUEST,
}
assert set(REFUSAL_STATUS) == set(Refusal), "every refusal has a status"


class FrameError(Exception):
    """Base of errors about what a peer or client sent."""

    status = Status.MALFORMED


@attrs.define
class FrameTooLarge(FrameError):
    length: int
    limit: int
    status = Status.FRAME_TOO_LARGE

    def __str__(self) -> str:
        return f"frame of {self.length} bytes exceeds the limit of {self.limit}"


@attrs.define
class MalformedFrame(FrameError):
    reason: str

    def __str__(self) -> str:
        return f"malformed frame: {self.reason}"


def encode_frame(body: dict[str, Any]) -> bytes:
    payload = msgpack.packb(body, use_bin_type=True)
    return LENGTH.pack(len(payload)) + payload


class FrameReader:
    """Turns a byte stream into decoded frames (maps), checking each length first."""

    def __init__(self, frame_bytes_max: int = limits.FRAME_BYTES_MAX) -> None:
        self._buf = bytearray()
        self._max = frame_bytes_max

    def feed(self, data: bytes | bytearray) -> None:
        self._buf += data

    def frames(self) -> Iterator[dict[str, Any]]:
        """Every complete frame fed so far; raises FrameError on a bad one."""
        buf, start, end = self._buf, 0, len(self._buf)
        try:
            while end - start >= 4:
                (length,) = LENGTH.unpack_from(buf, start)
                if length > self._max:
                    raise FrameTooLarge(length, self._max)
                if end - start - 4 < length:
                    break
                payload = memoryview(buf)[start + 4 : start + 4 + length]
                start += 4 + length
                try:
                    body = msgpack.unpackb(payload, raw=False)
                except (ValueError, msgpack.ExtraData, msgpack.FormatError) as err:
                    raise MalformedFrame(f"not msgpack: {err}") from err
                finally:
                    payload.release()
                if not isinstance(body, dict):
                    raise MalformedFrame(f"expected a map, got {type(body).__name__}")
                yield body
        finally:
            del buf[:start]

    @property
    def buffered(self) -> int:
        return len(self._buf)


# --- reading fields out of a decoded map, with errors that name the field ------------------


def field(body: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    try:
        value = body[name]
    except KeyError:
        raise MalformedFrame(f"missing field {name!r}") from None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        expected = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise MalformedFrame(f"field {name!r} must be {expected}, got {type(value).__name__}")
    return value


def code_of(body: dict[str, Any]) -> Code:
    raw = field(body, "c", int)
    try:
        return Code(raw)
    except ValueError:
        raise MalformedFrame(f"unknown message code {raw}") from None
