"""JSON as RocketMQ's Java side writes it with fastjson: maps whose keys are objects.

Java's `RemotingSerializable.toJson` is fastjson, which writes a `Map<MessageQueue, X>`
(TopicStatsTable.offsetTable, ConsumeStats.offsetTable) with each key as a JSON object, and a
`Map<Long, X>` with bare numeric keys:

    {"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"T"}:{"maxOffset":3,...}}}
    {"brokerAddrs":{0:"127.0.0.1:10911"}}

Neither is standard JSON, and both are what a Java client or mqadmin reads back (fastjson
cannot rebuild a MessageQueue key from a string). So the broker writes such maps as fastjson
does (`dumps`, with `ObjectKeyed` for a map with object keys) and our own code reads them with
`loads`, which accepts object and bare-number keys; docs/protocol.md#broker says which answers
carry them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import attrs

NESTING_MAX = 64  # a body nested deeper is refused rather than recursed into
_WHITESPACE = " \t\n\r"
_DECODER = json.JSONDecoder()


@attrs.frozen
class ObjectKeyed:
    """A map whose keys are JSON objects (or any JSON value): its (key, value) pairs, in order."""

    pairs: tuple[tuple[Any, Any], ...]

    @classmethod
    def of(cls, pairs: Iterable[tuple[Any, Any]]) -> ObjectKeyed:
        return cls(tuple(pairs))


class FastjsonError(ValueError):
    """Text that is not JSON, even allowing fastjson's object and numeric keys."""

    def __init__(self, at: int, reason: str) -> None:
        super().__init__(f"at {at}: {reason}")
        self.at = at
        self.reason = reason


def dumps(value: Any) -> str:
    """Compact JSON, an ObjectKeyed map written with its keys as JSON values (fastjson's form)."""
    if isinstance(value, ObjectKeyed):
        items = (f"{dumps(k)}:{dumps(v)}" for k, v in value.pairs)
        return "{" + ",".join(items) + "}"
    if isinstance(value, dict):
        items = (f"{json.dumps(str(k))}:{dumps(v)}" for k, v in value.items())
        return "{" + ",".join(items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    return json.dumps(value, separators=(",", ":"))


def loads(text: str | bytes) -> Any:
    """Parse JSON that may have fastjson keys: an object with only string keys becomes a dict
    (a bare number key becomes its text, as `"0"`), one with any object or array key becomes
    an ObjectKeyed. Raises FastjsonError."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    value, at = _value(text, _skip(text, 0), 0)
    at = _skip(text, at)
    if at != len(text):
        raise FastjsonError(at, "text after the value")
    return value


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in _WHITESPACE:
        at += 1
    return at


def _value(text: str, at: int, depth: int) -> tuple[Any, int]:
    if depth > NESTING_MAX:
        raise FastjsonError(at, f"nested deeper than {NESTING_MAX}")
    if at >= len(text):
        raise FastjsonError(at, "the text ends where a value was expected")
    if text[at] == "{":
        return _object(text, at + 1, depth + 1)
    if text[at] == "[":
        return _array(text, at + 1, depth + 1)
    try:
        return _DECODER.raw_decode(text, at)
    except json.JSONDecodeError as err:
        raise FastjsonError(at, err.msg) from None


def _array(text: str, at: int, depth: int) -> tuple[list[Any], int]:
    out: list[Any] = []
    at = _skip(text, at)
    if at < len(text) and text[at] == "]":
        return out, at + 1
    while True:
        value, at = _value(text, _skip(text, at), depth)
        out.append(value)
        at = _skip(text, at)
        if at < len(text) and text[at] == ",":
            at += 1
        elif at < len(text) and text[at] == "]":
            return out, at + 1
        else:
            raise FastjsonError(at, "expected ',' or ']'")


def _object(text: str, at: int, depth: int) -> tuple[dict[str, Any] | ObjectKeyed, int]:
    pairs: list[tuple[Any, Any]] = []
    at = _skip(text, at)
    if at < len(text) and text[at] == "}":
        return {}, at + 1
    while True:
        key, at = _value(text, _skip(text, at), depth)
        if isinstance(key, int | float) and not isinstance(key, bool):
            key = str(key)
        at = _skip(text, at)
        if at >= len(text) or text[at] != ":":
            raise FastjsonError(at, "expected ':' after a key")
        value, at = _value(text, _skip(text, at + 1), depth)
        pairs.append((key, value))
        at = _skip(text, at)
        if at < len(text) and text[at] == ",":
            at += 1
        elif at < len(text) and text[at] == "}":
            break
        else:
            raise FastjsonError(at, "expected ',' or '}'")
    if all(isinstance(k, str) for k, _ in pairs):
        return dict(pairs), at + 1
    return ObjectKeyed.of(pairs), at + 1
