"""A broker chaos run's history (docs/formats.md#broker-chaos-history), as the broker checks
need it: every acknowledged send and every consumed message, and the last committed consumer
offsets per group (driver side).

Only lines that mention `"send"`, `"consume"` or `"committed"` are parsed; the rest are not
operations these checks read. A line that is not a JSON object is an unreadable input.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import attrs

from spark import layout

ACKED_SCHEMA = (
    "group string, topic string, queue_id long, queue_offset long, value string, "
    "digest binary, process string, time_ns long"
)
CONSUMED_SCHEMA = (
    "group string, topic string, queue_id long, queue_offset long, value string, "
    "digest binary, consumer_group string"
)
READ_BYTES = 16 << 20  # history bytes read at once
MARKERS = (b'"send"', b'"consume"', b'"committed"')


@attrs.frozen
class BrokerHistory:
    acked: list[tuple[Any, ...]]  # ACKED_SCHEMA rows
    consumed: list[tuple[Any, ...]]  # CONSUMED_SCHEMA rows, one per (queue offset, value)
    committed: dict[tuple[str, str, str, int], int]  # (group, cg, topic, queue) -> last offset

    def is_empty(self) -> bool:
        return not self.acked and not self.consumed


def digest(value: str) -> bytes:
    """SHA-256 of a value as the body that carries it (its UTF-8 bytes)."""
    return hashlib.sha256(value.encode()).digest()


def read(path: str) -> BrokerHistory:
    """The sends, consumptions and commits of a broker history; raises layout.InputUnreadable."""
    acked: list[tuple[Any, ...]] = []
    consumed: list[tuple[Any, ...]] = []
    committed: dict[tuple[str, str, str, int], int] = {}
    for number, line in _lines(path):
        if not any(marker in line for marker in MARKERS):
            continue
        try:
            op = json.loads(line)
            assert isinstance(op, dict)
        except (ValueError, AssertionError) as err:
            raise layout.InputUnreadable(path, f"line {number} is not a JSON object") from err
        if op.get("type") != "ok":
            continue
        try:
            _take(op, acked, consumed, committed)
        except (KeyError, TypeError, ValueError) as err:
            raise layout.InputUnreadable(path, f"line {number}: unexpected layout ({err})") from err
    return BrokerHistory(acked, consumed, committed)


def _take(
    op: dict[str, Any],
    acked: list[tuple[Any, ...]],
    consumed: list[tuple[Any, ...]],
    committed: dict[tuple[str, str, str, int], int],
) -> None:
    f, group = op.get("f"), str(op.get("group") or "")
    value: dict[str, Any] = op["value"] if f in ("send", "consume", "committed") else {}
    if f == "send":
        v = str(value["v"])
        acked.append(
            (
                group,
                str(value["t"]),
                int(value["q"]),
                int(value["o"]),
                v,
                digest(v),
                str(op.get("process")),
                int(op.get("time_ns") or 0),
            )
        )
    elif f == "consume":
        for queue_offset, v, _msg_id in value["m"]:
            consumed.append(
                (
                    group,
                    str(value["t"]),
                    int(value["q"]),
                    int(queue_offset),
                    str(v),
                    digest(str(v)),
                    str(value["cg"]),
                )
            )
    elif f == "committed":
        committed[(group, str(value["cg"]), str(value["t"]), int(value["q"]))] = int(value["o"])


def _lines(path: str) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of the file, read READ_BYTES at a time."""
    fs, local = layout.filesystem(path)
    number, rest = 0, b""
    try:
        with fs.open_input_stream(local) as f:
            while chunk := f.read(READ_BYTES):
                lines = (rest + chunk).split(b"\n")
                rest = lines.pop()
                for line in lines:
                    number += 1
                    yield number, line
    except OSError as err:
        raise layout.InputUnreadable(path, str(err)) from err
    if rest.strip():
        yield number + 1, rest
