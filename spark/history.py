"""Read a chaos run's history.jsonl (docs/formats.md#chaos-history): the acknowledged appends.

Only `ok` completions of `append` by client processes matter to the audit: each promises that
its value (UTF-8) is the body of the entry at its acknowledged index in its group's committed
log. Everything else (invocations, fail, info, nemesis records) is skipped. A line that is not
valid JSON, or an `ok` append without its group or value, makes the history unreadable: the
audit cannot vouch for what it cannot parse.

Only what the check needs is kept per acknowledged append: the SHA-256 of its value (the
audit compares it with the digest of the committed body, spark/screen.py and
spark/agreement.py), the value's length and its first HEAD_BYTES bytes for a finding.
Parsing is the history check's main cost (one json.loads per line), so a line that cannot be
an `ok` record, one without the JSON string "ok", is only checked to be a JSON object's braces
and is not parsed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence

import attrs
import numpy as np

from spark.layout import InputUnreadable, filesystem

HISTORY_LINE_BYTES_MAX = 16 << 20  # one operation; appends carry values up to 4 MiB as JSON
HEAD_BYTES = 40  # of an acknowledged value or a body, shown in a finding
OK_MARK = b'"ok"'  # every ok record holds this JSON string; lines without it are not parsed
READ_BYTES = 16 << 20  # the history is read in blocks of this size


@attrs.frozen
class AckedAppend:
    group: str
    index: int | None  # the index the server acknowledged; None if the history lacks it
    value: str  # the value's first HEAD_BYTES bytes, escaped (escaped_head)
    process: str
    time_ns: int
    digest: bytes = b""  # SHA-256 of the whole value's UTF-8 bytes
    value_bytes: int = 0  # the whole value's length in UTF-8 bytes


def escaped_head(data: bytes) -> str:
    """The first HEAD_BYTES of `data` as a Python bytes literal, "..." after when cut: what a
    finding shows of a value or a body, printable whatever the bytes."""
    return repr(bytes(data[:HEAD_BYTES])) + ("..." if len(data) > HEAD_BYTES else "")


def acknowledged(
    group: str, index: int | None, value: str, process: str, time_ns: int
) -> AckedAppend:
    """The AckedAppend of an ok record: digest and length of `value`, and its head."""
    data = value.encode()
    return AckedAppend(
        group,
        index,
        escaped_head(data),
        process,
        time_ns,
        hashlib.sha256(data).digest(),
        len(data),
    )


def _lines(path: str) -> Iterator[bytes]:
    """The file's lines (without line ends), read in blocks of READ_BYTES: a history of
    millions of appends is gigabytes, and is never held whole."""
    fs, local = filesystem(path)
    try:
        with fs.open_input_stream(local) as stream:
            rest = b""
            while block := stream.read(READ_BYTES):
                lines = (rest + block).splitlines(keepends=True)
                rest = lines.pop() if lines and not lines[-1].endswith((b"\n", b"\r")) else b""
                if len(rest) > HISTORY_LINE_BYTES_MAX:
                    yield rest  # the caller refuses it
                    return
                for line in lines:
                    yield line.rstrip(b"\r\n")
            if rest:
                yield rest
    except OSError as err:
        raise InputUnreadable(path, str(err)) from err


def read_acked(path: str) -> list[AckedAppend]:
    """Every acknowledged append in the history at `path`, in recorded order."""
    acked: list[AckedAppend] = []
    for number, line in enumerate(_lines(path), start=1):
        if not line.strip():
            continue
        if len(line) > HISTORY_LINE_BYTES_MAX:
            raise InputUnreadable(path, f"line {number}: longer than {HISTORY_LINE_BYTES_MAX}")
        if OK_MARK not in line:  # an invocation, fail, info or nemesis record
            braces = line.startswith(b"{") and line.endswith(b"}")  # without a copy, usually
            if not braces and not (line.strip().startswith(b"{") and line.strip().endswith(b"}")):
                raise InputUnreadable(path, f"line {number}: not JSON: not an object")
            continue
        try:
            op = json.loads(line)
        except ValueError as err:
            raise InputUnreadable(path, f"line {number}: not JSON: {err}") from err
        if not isinstance(op, dict):
            raise InputUnreadable(path, f"line {number}: not a JSON object")
        if op.get("type") != "ok" or op.get("f") != "append" or op.get("process") == "nemesis":
            continue
        group, value, index = op.get("group"), op.get("value"), op.get("index")
        if not isinstance(group, str) or not isinstance(value, str):
            raise InputUnreadable(path, f"line {number}: ok append without a string group/value")
        if index is not None and (not isinstance(index, int) or index < 1):
            raise InputUnreadable(path, f"line {number}: index {index!r} is not an index")
        acked.append(
            acknowledged(group, index, value, str(op.get("process")), int(op.get("time_ns") or 0))
        )
    return acked


AckedDigests = dict[str, tuple[np.ndarray, np.ndarray]]


def digests_by_group(acked: Sequence[AckedAppend]) -> AckedDigests:
    """group -> (indexes, n x 32 SHA-256 digests), sorted by index, of the acknowledged appends
    that record an index: what the screen compares with the committed bodies' digests."""
    rows: dict[str, tuple[list[int], list[bytes]]] = {}
    for a in acked:
        if a.index is not None:
            indexes, digests = rows.setdefault(a.group, ([], []))
            indexes.append(a.index)
            digests.append(a.digest)
    out: AckedDigests = {}
    for group, (indexes, digests) in rows.items():
        order = np.argsort(np.array(indexes, dtype=np.int64), kind="stable")
        matrix = np.frombuffer(b"".join(digests), dtype=np.uint8).reshape(-1, 32)
        out[group] = (np.array(indexes, dtype=np.int64)[order], matrix[order])
    return out
