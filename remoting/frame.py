"""The remoting frame codec, sans-I/O (h11's shape): feed bytes, take commands; encode commands.

Spec: docs/protocol.md#remoting-frame; change both or neither. Big-endian.

Frame:
  off  len  field          meaning
    0    4  length         bytes after this field = 4 + header_len + body_len; <= FRAME_BYTES_MAX,
                           checked before anything is allocated
    4    1  serialization  SerializeType: 0 JSON, 1 ROCKETMQ (binary)
    5    3  header_len     (bytes 4-7 are Java's "header mark"; C++ reads all 32 bits as the
                           length, so it must only ever get serialization 0)
    8    h  header         JSON text (C++ appends a newline), or the binary form below
  8+h    .  body           opaque bytes, may be empty

Binary header (serialization 1; RocketMQSerializable.java):
  off  len  field          meaning
    0    2  code           int16
    2    1  language       LanguageCode number
    3    2  version        int16
    5    4  opaque         int32
    9    4  flag           int32
   13    4  remark_len     int32; 0 for no remark
   17    r  remark         UTF-8
 17+r    4  ext_len        int32: bytes of ext that follow
 21+r    e  ext            repeated: key_len int16, key UTF-8, value_len int32, value UTF-8
The header is exactly 21 + r + e bytes; anything else is malformed.

JSON header: {"code", "language", "version", "opaque", "flag", "remark", "extFields"}; extFields
values are text on output, and numbers or booleans are accepted on input (the C++ client sends
some numbers).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from typing import Any

import orjson

from netio.native import optional_extension
from remoting import limits
from remoting.codes import LanguageCode, SerializeType
from remoting.command import RemotingCommand
from remoting.errors import FrameTooLarge, MalformedFrame
from remoting.stored_message import new_tuple

__all__ = [
    "FrameDecoder",
    "RemotingCommand",
    "decode_header",
    "encode",
    "encode_header",
    "json_frame",
]

PREFIX = struct.Struct(">II")  # length, header mark
assert PREFIX.size == limits.LENGTH_BYTES + limits.HEADER_MARK_BYTES == 8
BINARY_FIXED = struct.Struct(">hbhii")  # code, language, version, opaque, flag
assert BINARY_FIXED.size == 13
INT16 = struct.Struct(">h")
INT32 = struct.Struct(">i")
UINT32 = struct.Struct(">I")  # the length and the header mark are read unsigned
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
HEADER_LEN_MASK = 0xFFFFFF
OTHER_LANGUAGE = LanguageCode.OTHER.name

# The usual frame decoded in C (remoting/frame_native.c), or None (netio/native.py):
# FrameDecoder then reads every frame in Python, which also defines what the C half must do
# (tests/remoting/test_frame_native.py).
native = optional_extension("remoting._frame_native")


def encode(command: RemotingCommand) -> bytes:
    """The whole frame for `command`, header in `command.serialization`."""
    header = encode_header(command)
    assert len(header) <= limits.HEADER_BYTES_MAX, f"header of {len(header)} bytes"
    length = limits.HEADER_MARK_BYTES + len(header) + len(command.body)
    assert length <= limits.FRAME_BYTES_MAX, f"frame of {length} bytes exceeds FRAME_BYTES_MAX"
    mark = (int(command.serialization) << 24) | len(header)
    return PREFIX.pack(length, mark) + header + command.body


def json_frame(header: bytes, body: bytes = b"") -> bytes:
    """The frame of a JSON header already written (`encode_header`'s text, or text made from a
    template of it) and a body."""
    return PREFIX.pack(limits.HEADER_MARK_BYTES + len(header) + len(body), len(header)) + (
        header + body
    )


def encode_header(command: RemotingCommand) -> bytes:
    if command.serialization is SerializeType.ROCKETMQ:
        return _encode_binary(command)
    return _encode_json(command)


def decode_header(serialization: int, header: bytes, body: bytes = b"") -> RemotingCommand:
    if serialization == SerializeType.JSON:
        return _decode_json(header, body)
    if serialization == SerializeType.ROCKETMQ:
        return _decode_binary(header, body)
    raise MalformedFrame(f"unknown serialization type {serialization}")


class FrameDecoder:
    """Turns a byte stream into commands, checking each length before buffering the frame.

    `feed(data)`, then `next_command()` until it answers None (more data needed). A bad frame
    raises a FrameError, and so does every later call: the stream cannot be resynchronised.
    """

    def __init__(self, frame_bytes_max: int = limits.FRAME_BYTES_MAX) -> None:
        assert 8 <= frame_bytes_max <= limits.FRAME_BYTES_MAX
        self._buf = bytearray()
        self._start = 0  # bytes of _buf already decoded
        self._max = frame_bytes_max
        self._error: MalformedFrame | FrameTooLarge | None = None

    @property
    def buffered(self) -> int:
        """Bytes fed but not yet decoded."""
        return len(self._buf) - self._start

    def feed(self, data: bytes | bytearray) -> None:
        if self._start:
            del self._buf[: self._start]
            self._start = 0
        self._buf += data

    def next_command(self) -> RemotingCommand | None:
        if self._error is not None:
            raise self._error
        try:
            return self._next()
        except (MalformedFrame, FrameTooLarge) as err:
            self._error = err
            raise

    def commands(self) -> Iterator[RemotingCommand]:
        """Every complete command fed so far. The usual frames (a JSON header of the usual
        shape) are decoded in C several at a time; each other one in Python, which waits for
        the rest of a frame or names what is wrong with it."""
        while True:
            if native is not None and self._error is None:
                decoded, self._start = native.json_frames(
                    self._buf, self._start, self._max, orjson.loads, RemotingCommand,
                    SerializeType.JSON, OTHER_LANGUAGE, limits.EXT_FIELDS_MAX,
                )  # fmt: skip
                yield from decoded
            command = self.next_command()
            if command is None:
                return
            yield command

    def check_closed(self) -> None:
        """The peer closed the stream: raise if it did so inside a frame."""
        if self.buffered:
            raise MalformedFrame(f"stream ended inside a frame, {self.buffered} bytes in")

    def _next(self) -> RemotingCommand | None:
        buf, start = self._buf, self._start
        available = len(buf) - start
        if available < limits.LENGTH_BYTES:
            return None
        (length,) = UINT32.unpack_from(buf, start)
        if length > self._max:
            raise FrameTooLarge(length, self._max)
        if length < limits.HEADER_MARK_BYTES:
            raise MalformedFrame(f"length {length} leaves no room for the header mark")
        if available < PREFIX.size:
            return None
        (mark,) = UINT32.unpack_from(buf, start + limits.LENGTH_BYTES)
        serialization, header_len = (mark >> 24) & 0xFF, mark & HEADER_LEN_MASK
        if header_len > length - limits.HEADER_MARK_BYTES:
            raise MalformedFrame(
                f"header length {header_len} runs past the frame ({length} bytes after the length)"
            )
        if serialization not in (SerializeType.JSON, SerializeType.ROCKETMQ):
            raise MalformedFrame(f"unknown serialization type {serialization}")
        if available < limits.LENGTH_BYTES + length:
            return None
        header_at = start + PREFIX.size
        body_at = header_at + header_len
        end = start + limits.LENGTH_BYTES + length
        with memoryview(buf) as view:  # one copy of each part, not two
            header, body = bytes(view[header_at:body_at]), bytes(view[body_at:end])
        self._start = end
        return decode_header(serialization, header, body)


# --- JSON header -----------------------------------------------------------------------------


def _encode_json(command: RemotingCommand) -> bytes:
    header = {
        "code": command.code,
        "language": command.language,
        "version": command.version,
        "opaque": command.opaque,
        "flag": command.flag,
        "remark": command.remark,
        "extFields": dict(command.ext_fields),
    }
    return orjson.dumps(header)  # compact UTF-8, byte for byte what json.dumps would write


def _decode_json(header: bytes, body: bytes) -> RemotingCommand:
    try:
        obj = orjson.loads(header)
    except orjson.JSONDecodeError as err:  # also invalid UTF-8, NaN, nesting past 1024
        raise MalformedFrame(f"header is not JSON: {err}") from None
    if type(obj) is not dict:
        raise MalformedFrame(f"JSON header is a {type(obj).__name__}, not an object")
    get = obj.get
    remark, language = get("remark"), get("language")
    if remark is not None and type(remark) is not str:
        raise MalformedFrame(f"remark is a {type(remark).__name__}, not text")
    if language is not None and type(language) is not str:
        raise MalformedFrame(f"language is a {type(language).__name__}, not text")
    code, opaque, flag, version = get("code"), get("opaque"), get("flag", 0), get("version", 0)
    # the usual case checked inline; `_int32` names whichever is not a 32-bit integer
    if not (
        type(code) is int
        and type(opaque) is int
        and type(flag) is int
        and type(version) is int
        and INT32_MIN <= code <= INT32_MAX
        and INT32_MIN <= opaque <= INT32_MAX
        and INT32_MIN <= flag <= INT32_MAX
        and INT32_MIN <= version <= INT32_MAX
    ):
        code, opaque = _int32(obj, "code", required=True), _int32(obj, "opaque", required=True)
        flag, version = _int32(obj, "flag"), _int32(obj, "version")
    return new_tuple(
        RemotingCommand,
        (
            code,
            opaque,
            flag,
            remark or "",
            _ext_fields_from_json(get("extFields")),
            body,
            language or OTHER_LANGUAGE,
            version,
            SerializeType.JSON,
        ),
    )


def _int32(obj: dict[str, Any], key: str, *, required: bool = False) -> int:
    value = obj.get(key)
    if value is None and not required:
        return 0
    if type(value) is not int or not INT32_MIN <= value <= INT32_MAX:
        raise MalformedFrame(f"{key} must be a 32-bit integer, got {value!r:.40}")
    return value


def _ext_fields_from_json(raw: object) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise MalformedFrame(f"extFields is a {type(raw).__name__}, not an object")
    if len(raw) > limits.EXT_FIELDS_MAX:
        raise MalformedFrame(f"{len(raw)} extFields; at most {limits.EXT_FIELDS_MAX}")
    fields: dict[str, str] = {}
    for key, value in raw.items():
        if type(value) is str:  # what Java sends, and most of what C++ sends
            fields[key] = value
        elif value is not None:  # Java omits nulls; a null means the same
            fields[key] = _ext_text(key, value)
    return fields


def _ext_text(key: str, value: object) -> str:
    """An extFields value as the text Java would have sent."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return str(int(value)) if value.is_integer() else repr(value)
    raise MalformedFrame(f"extFields[{key!r}] is a {type(value).__name__}, not a scalar")


# --- binary header ---------------------------------------------------------------------------


def _encode_binary(command: RemotingCommand) -> bytes:
    try:
        language = LanguageCode[command.language]
    except KeyError:
        language = LanguageCode.OTHER
    parts = [
        BINARY_FIXED.pack(command.code, language, command.version, command.opaque, command.flag)
    ]
    remark = command.remark.encode()
    parts += [INT32.pack(len(remark)), remark]
    ext = bytearray()
    for key, value in command.ext_fields.items():
        k, v = key.encode(), value.encode()
        ext += INT16.pack(len(k)) + k + INT32.pack(len(v)) + v
    parts += [INT32.pack(len(ext)), bytes(ext)]
    return b"".join(parts)


def _decode_binary(header: bytes, body: bytes) -> RemotingCommand:
    if len(header) < BINARY_FIXED.size + 8:
        raise MalformedFrame(f"binary header of {len(header)} bytes is shorter than 21")
    code, language, version, opaque, flag = BINARY_FIXED.unpack_from(header, 0)
    try:
        language_name = LanguageCode(language).name
    except ValueError:
        raise MalformedFrame(f"unknown language code {language}") from None
    at = BINARY_FIXED.size
    remark, at = _binary_text(header, at, INT32, "remark")
    (ext_len,) = _unpack(INT32, header, at, "ext length")
    at += INT32.size
    if ext_len < 0 or at + ext_len != len(header):
        raise MalformedFrame(
            f"ext length {ext_len} does not end the binary header ({len(header) - at} bytes left)"
        )
    fields: dict[str, str] = {}
    while at < len(header):
        if len(fields) >= limits.EXT_FIELDS_MAX:
            raise MalformedFrame(f"more than {limits.EXT_FIELDS_MAX} extFields")
        key, at = _binary_text(header, at, INT16, "ext key")
        value, at = _binary_text(header, at, INT32, f"ext value of {key!r}")
        fields[key] = value
    return RemotingCommand(
        code=code,
        opaque=opaque,
        flag=flag,
        version=version,
        language=language_name,
        remark=remark,
        ext_fields=fields,
        body=body,
        serialization=SerializeType.ROCKETMQ,
    )


def _unpack(layout: struct.Struct, header: bytes, at: int, what: str) -> tuple[int]:
    if at + layout.size > len(header):
        raise MalformedFrame(f"binary header ends inside the {what}")
    value: tuple[int] = layout.unpack_from(header, at)
    return value


def _binary_text(header: bytes, at: int, layout: struct.Struct, what: str) -> tuple[str, int]:
    (size,) = _unpack(layout, header, at, f"{what} length")
    at += layout.size
    if size < 0 or at + size > len(header):
        raise MalformedFrame(f"{what} of {size} bytes runs past the binary header")
    try:
        return header[at : at + size].decode(), at + size
    except UnicodeDecodeError as err:
        raise MalformedFrame(f"{what} is not UTF-8: {err}") from None
