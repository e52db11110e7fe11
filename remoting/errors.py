"""Errors the remoting layer raises on purpose: each names what went wrong, as fields.

`FrameError`s are the peer's fault and close its connection; `HeaderFieldError`s are a bad
request and get an error answer; `ConnectionClosed` and `RequestTimeout` reach a requester.
"""

from __future__ import annotations

import attrs


class RemotingError(Exception):
    """Base of every error raised on purpose by remoting/."""


class FrameError(RemotingError):
    """The bytes on a connection are not a frame we accept; the connection closes."""


@attrs.define
class FrameTooLarge(FrameError):
    length: int  # what the length prefix said
    limit: int

    def __str__(self) -> str:
        return f"frame of {self.length} bytes exceeds the limit of {self.limit}"


@attrs.define
class MalformedFrame(FrameError):
    reason: str  # "header length 900 runs past the frame (100 bytes)", "header is not JSON: ..."

    def __str__(self) -> str:
        return f"malformed frame: {self.reason}"


@attrs.define
class HeaderFieldError(RemotingError):
    """A request's extFields lack a required field, or hold one we cannot read."""

    header: str  # the header class, e.g. "PullMessageRequestHeader"
    field: str  # the wire name, e.g. "queueId" (or "e" in a SEND_MESSAGE_V2)
    reason: str  # "missing", "not an integer: 'x'"

    def __str__(self) -> str:
        return f"{self.header}: field {self.field!r} {self.reason}"


@attrs.define
class ConnectionClosed(RemotingError):
    """The connection ended before the answer came; the request may or may not have run."""

    peer: str
    reason: str

    def __str__(self) -> str:
        return f"connection to {self.peer} closed: {self.reason}"


@attrs.define
class RequestTimeout(RemotingError):
    """No answer within the timeout; the request may or may not have run."""

    peer: str
    code: int
    opaque: int
    timeout_s: float

    def __str__(self) -> str:
        return (
            f"no answer from {self.peer} to request code {self.code} (opaque {self.opaque}) "
            f"within {self.timeout_s:g} s"
        )


class MessageFormatError(RemotingError):
    """A message, its properties or its id that the stored-message format cannot hold or read."""


@attrs.define
class CorruptMessage(MessageFormatError):
    """A stored message that fails a check when read back."""

    at: int  # where the record starts in the buffer it was read from
    reason: str  # "bad magic 0x...", "body crc mismatch", "size 90 but fields end at 203", ...

    def __str__(self) -> str:
        return f"corrupt stored message at {self.at}: {self.reason}"


@attrs.define
class MessageTooLarge(MessageFormatError):
    """A stored record longer than one log entry may carry."""

    size: int  # the record's store_size
    limit: int

    def __str__(self) -> str:
        return f"stored message of {self.size} bytes exceeds the limit of {self.limit} bytes"


@attrs.define
class BadProperty(MessageFormatError):
    """A property the properties string cannot carry (a separator inside it, an empty key)."""

    key: str
    reason: str

    def __str__(self) -> str:
        return f"property {self.key!r} cannot be stored: {self.reason}"


@attrs.define
class PropertiesTooLong(MessageFormatError):
    """Encoded properties longer than their int16 length field holds."""

    size: int  # bytes, UTF-8
    limit: int

    def __str__(self) -> str:
        return f"properties of {self.size} bytes exceed the limit of {self.limit} bytes"


@attrs.define
class TopicTooLong(MessageFormatError):
    """A topic longer than the stored message's topic length field holds."""

    topic: str
    size: int  # bytes, UTF-8
    limit: int

    def __str__(self) -> str:
        return f"topic of {self.size} bytes exceeds the limit of {self.limit} bytes"


@attrs.define
class BadMessageId(MessageFormatError):
    """A message id string that is not one of the formats it claims to be."""

    text: str
    reason: str

    def __str__(self) -> str:
        return f"bad message id {self.text!r}: {self.reason}"
