"""Read a chaos run's history.jsonl (docs/formats.md#chaos-history): the acknowledged appends.

Only `ok` completions of `append` by client processes matter to the audit: each promises that
its value (UTF-8) is the body of the entry at its acknowledged index in its group's committed
log. Everything else (invocations, fail, info, nemesis records) is skipped. A line that is not
valid JSON, or an `ok` append without its group or value, makes the history unreadable: the
audit cannot vouch for what it cannot parse.

A history of millions of appends is gigabytes of JSON lines, and reading it was most of what a
history added to an audit (docs/decisions.md, "The history is read in parallel, while the JVM
starts"). So:
- a line without the JSON string "ok" cannot be an `ok` record: it is only checked to be a
  JSON object's braces and is not parsed. numpy checks that for a block of lines at once and
  finds the lines that hold "ok";
- such a line, where the block is ASCII with no backslash and no control byte but newlines, is
  read by one regular expression (_USUAL) when it is shaped as the chaos harness writes an
  `ok` append: in such a block that shape is exactly what json.loads reads as one. Any other
  line is parsed by the json module's C scanner (json.loads' own wrapper cost more than the
  scan of a 1 KiB line here), and anything unusual by json.loads, whose errors are reported;
- per acknowledged append only columns are kept (Acked): its group, index, the SHA-256 of its
  value (compared with the digest of the committed body, spark/screen.py and
  spark/agreement.py) and where its line starts in the file. The few appends a finding must
  show in full (those the screen did not compare) are read again from there (Acked.details);
- a large history is read in byte ranges by one process per CPU, and dledger-audit starts that
  before the JVM (Reading), so the parse and the JVM's start overlap.

Lines end at a newline ("\r" before it is JSON whitespace); the last one may lack it.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import multiprocessing
import os
import re
import threading
from array import array
from collections.abc import Iterable, Sequence
from typing import IO

import attrs
import numpy as np

from spark.layout import InputUnreadable, filesystem

HISTORY_LINE_BYTES_MAX = 16 << 20  # one operation; appends carry values up to 4 MiB as JSON
HEAD_BYTES = 40  # of an acknowledged value or a body, shown in a finding
OK_MARK = b'"ok"'  # every ok record holds this JSON string; lines without it are not parsed
READ_BYTES = 8 << 20  # the history is read in blocks of this size (< HISTORY_LINE_BYTES_MAX)
RANGE_BYTES = 256 << 20  # a large history is read in ranges of this size, one task each
PARALLEL_BYTES_MIN = 64 << 20  # a smaller history is read in the calling process
DIGEST_BYTES = 32  # SHA-256
DETAIL_READ_BYTES = 64 << 10  # Acked.details reads a line in pieces of this size

# the C scanner json.loads runs, without json.loads' wrapper
_scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
JSON_SPACE = " \t\n\r"  # what JSON allows around a value (str.isspace allows more)


@attrs.frozen
class AckedAppend:
    """One acknowledged append in full: what a finding about it shows."""

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


AckedDigests = dict[str, tuple[np.ndarray, np.ndarray]]


@attrs.frozen(eq=False)
class Acked:
    """The acknowledged appends of a history, one array per column, in the history's order."""

    path: str  # the history, for details
    groups: tuple[str, ...]
    group: np.ndarray  # int32: the append's group, as a position in `groups`
    index: np.ndarray  # int64: the acknowledged index; 0 where the history records none
    digest: np.ndarray  # uint8, n x 32: SHA-256 of the value's UTF-8 bytes
    offset: np.ndarray  # int64: where the append's line starts in the file

    def __len__(self) -> int:
        return len(self.index)

    def highest(self) -> dict[str, int]:
        """group -> the highest index acknowledged in it (groups with an indexed append)."""
        out: dict[str, int] = {}
        if len(self):
            top = np.zeros(len(self.groups), dtype=np.int64)
            np.maximum.at(top, self.group, self.index)
            out = {g: int(top[k]) for k, g in enumerate(self.groups) if top[k] > 0}
        return out

    def digests_by_group(self) -> AckedDigests:
        """group -> (indexes, n x 32 SHA-256 digests), sorted by index, of the acknowledged
        appends that record an index: what the screen compares with the committed bodies'
        digests."""
        out: AckedDigests = {}
        for k, g in enumerate(self.groups):
            rows = np.flatnonzero((self.group == k) & (self.index > 0))
            if len(rows):
                rows = rows[np.argsort(self.index[rows], kind="stable")]
                out[g] = (self.index[rows], self.digest[rows])
        return out

    def details(self, which: np.ndarray) -> list[AckedAppend]:
        """The appends where `which` (a bool per append) holds, in full, read again from the
        history (the lines at their offsets), in the history's order."""
        out = []
        with _open(self.path) as f:
            for at in self.offset[which].tolist():
                line = _line_at(f, at)
                out.append(_appended(line, self.path, at))
        return out


def read_acked(path: str, *, processes: int | None = None) -> Acked:
    """Every acknowledged append in the history at `path`. A history of PARALLEL_BYTES_MIN or
    more is read by `processes` (default: one per CPU) in ranges of RANGE_BYTES."""
    return Reading(path, processes=processes).result()


class Reading:
    """A history being read: by worker processes in the background when it is large (they
    start here, so the caller can start the JVM meanwhile), else here and now. `result()`
    gives the Acked, or raises InputUnreadable for the first bad line of the file."""

    def __init__(self, path: str, *, processes: int | None = None) -> None:
        self.path = path
        self.ranges = 0  # read by worker processes; 0 when read here
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._futures: list[concurrent.futures.Future[Part]] = []
        self._parts: list[Part] = []
        size = _size(path)
        if size < PARALLEL_BYTES_MIN:
            self._parts = [read_range(path, 0, size)]
            return
        ranges = [(lo, min(lo + RANGE_BYTES, size)) for lo in range(0, size, RANGE_BYTES)]
        workers = processes or len(os.sched_getaffinity(0))
        # fork where this is the only thread (dledger-audit, before the JVM): the workers then
        # import nothing; spawn otherwise, as forking a threaded process is unsafe
        method = "fork" if threading.active_count() == 1 else "spawn"
        self._pool = concurrent.futures.ProcessPoolExecutor(
            min(workers, len(ranges)), mp_context=multiprocessing.get_context(method)
        )
        self._futures = [self._pool.submit(read_range, path, lo, hi) for lo, hi in ranges]
        self.ranges = len(ranges)

    def result(self) -> Acked:
        parts = list(self._parts)
        try:
            for future in self._futures:  # in file order: the first bad line is the one told
                parts.append(future.result())
                if parts[-1].error is not None:
                    break
        finally:
            self.close()
        bad = next((p.error for p in parts if p.error is not None), None)
        if bad is not None:
            at, reason = bad
            said = reason if at < 0 else f"{_line_of(self.path, at)}: {reason}"
            raise InputUnreadable(self.path, said)
        return joined(self.path, parts)

    def close(self) -> None:
        """Stop the workers (those still reading are not waited for)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


# --- one range of the file: runs in a worker process --------------------------------------------
@attrs.frozen
class Part:
    """What one range of the history holds: Acked's columns, and its first bad line."""

    groups: list[str]
    group: bytes  # array("i")
    index: bytes  # array("q")
    digest: bytes
    offset: bytes  # array("q")
    error: tuple[int, str] | None  # (where the line starts, why), or (-1, why) for the file


class _BadLine(Exception):
    def __init__(self, reason: str, at: int = -1) -> None:
        self.reason = reason
        self.at = at  # where the line starts in the file


class _Columns:
    """Acked's columns of one range, as the range is read."""

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}
        self.by_bytes: dict[bytes, int] = {}  # codes, by the group's UTF-8 bytes
        self.group, self.index, self.offset = array("i"), array("q"), array("q")
        self.digests = bytearray()

    def take(self, line: bytes, at: int) -> None:
        """The line starting at `at`, one holding OK_MARK: kept if an acknowledged append."""
        try:
            op = _object(line)
            if not _is_ack(op):
                return
            group, value, index = _fields(op)
            _time_ns(op)
        except _BadLine as bad:
            raise _BadLine(bad.reason, at) from bad
        self.add(group, index or 0, hashlib.sha256(value.encode()).digest(), at)

    def add(self, group: str, index: int, digest: bytes, at: int) -> None:
        self.group.append(self.code(group))
        self.index.append(index)
        self.digests += digest
        self.offset.append(at)

    def code(self, group: str) -> int:
        """The group's position in the part's list of groups."""
        return self.codes.setdefault(group, len(self.codes))

    def part(self, error: tuple[int, str] | None) -> Part:
        return Part(
            list(self.codes),
            self.group.tobytes(),
            self.index.tobytes(),
            bytes(self.digests),
            self.offset.tobytes(),
            error,
        )


def read_range(path: str, lo: int, hi: int) -> Part:
    """The acknowledged appends whose lines start in [lo, hi) (a line starts at 0 or after a
    newline), reading on past `hi` to finish the last of them."""
    columns = _Columns()
    at = lo  # where in the file the next line to look at starts
    try:
        with _open(path) as f:
            if lo > 0:
                at = _next_line(f, lo)
            f.seek(at)
            rest = b""  # the start of a line the blocks so far cut
            while at < hi:
                block = f.read(READ_BYTES)
                if not block:  # the last line, without a newline
                    _lines(rest, 0, len(rest), at, columns)
                    break
                begin = 0
                if rest:
                    begin = block.find(b"\n") + 1
                    if not begin:
                        rest += block
                        if len(rest) > HISTORY_LINE_BYTES_MAX:
                            raise _BadLine(f"longer than {HISTORY_LINE_BYTES_MAX}", at)
                        continue
                    line = rest + block[:begin]
                    _lines(line, 0, len(line), at, columns)
                    at += len(line)
                    if at >= hi:
                        break
                end = max(begin, block.rfind(b"\n") + 1)  # whole lines
                if at + end - begin > hi:  # lines starting at hi or later are the next range's
                    end = min(end, block.find(b"\n", begin + hi - at - 1) + 1 or end)
                _lines(block, begin, end, at, columns)
                at += end - begin
                rest = block[end:]
                if len(rest) > HISTORY_LINE_BYTES_MAX:
                    raise _BadLine(f"longer than {HISTORY_LINE_BYTES_MAX}", at)
    except _BadLine as bad:
        return columns.part((bad.at, bad.reason))
    except OSError as err:
        return columns.part((-1, str(err)))
    except InputUnreadable as err:
        return columns.part((-1, err.reason))
    return columns.part(None)


NEWLINE, OPEN, CLOSE, QUOTE, LETTER_O, LETTER_K, SPACE = b'\n{}"ok '  # what _lines looks for
# The ok append as the chaos harness writes it (keys in its order, "error" and "node" optional,
# compact or with spaces). In a line of ASCII without a backslash or control character this
# matches exactly the lines json.loads reads as such an append: no string there can hold an
# escape, so each "..." is the string, its bytes the value's UTF-8. Captured: the value, the
# group, the index. Possessive quantifiers (the grammar never needs to give back) made it ~30 %
# cheaper per line.
_USUAL = re.compile(
    rb"\{ *+"
    + rb" *+, *+".join(
        rb'"%s" *+: *+%s' % (key, value)
        for key, value in [
            (b"type", b'"ok"'),
            (b"process", rb"-?+(?:0|[1-9][0-9]*+)"),
            (b"f", b'"append"'),
            (b"value", rb'"([^"]*+)"'),
            (b"group", rb'"([^"]*+)"'),
            (b"index", rb"([1-9][0-9]*+)"),
            (b"time_ns", rb"-?+(?:0|[1-9][0-9]*+)"),
        ]
    )
    + rb'(?: *+, *+"error" *+: *+null)?(?: *+, *+"node" *+: *+"[^"]*+")? *+\}'
)
_VALUE, _GROUP, _INDEX = 1, 2, 3  # _USUAL's groups


def _lines(data: bytes, begin: int, end: int, at: int, columns: _Columns) -> None:
    """The lines of data[begin:end], which starts at `at` in the file (each line ends in a
    newline, or at `end`). Usually every line is an object's braces: numpy tells that for the
    block at once, and finds the lines holding OK_MARK, which alone are parsed (_take).
    Otherwise, line by line."""
    if end <= begin:
        return
    byte = np.frombuffer(data, np.uint8, end - begin, begin)
    control = np.nonzero(byte < SPACE)[0]
    plain = bool((byte[control] == NEWLINE).all())  # no control byte but newlines
    newline = control if plain else np.nonzero(byte == NEWLINE)[0]
    whole = int(byte[-1] == NEWLINE)
    starts = np.concatenate(([0], newline[: len(newline) - whole] + 1))
    stops = newline if whole else np.append(newline, end - begin)
    if not (
        end - begin <= HISTORY_LINE_BYTES_MAX  # so no line is longer
        and (byte[starts] == OPEN).all()
        and (byte[stops - 1] == CLOSE).all()
    ):
        _each_line(data[begin : end - whole], at, columns)
        return
    marked = _marked(byte, newline)
    # ASCII without a backslash: _USUAL can read the lines (the block's bytes past `end` are
    # looked at too, rather than copied)
    plain = plain and data.find(b"\\", begin, end) < 0 and data.isascii()
    _take(
        data,
        (starts[marked] + begin).tolist(),
        (stops[marked] + begin).tolist(),
        at - begin,
        columns,
        plain=plain,
    )


def _marked(byte: np.ndarray, newline: np.ndarray) -> np.ndarray:
    """The numbers of the lines (ended by `newline`) of `byte` that hold OK_MARK, found by its
    k: no bytes-level search for the 4 bytes was as quick."""
    k = np.nonzero(byte == LETTER_K)[0]
    k = k[(k >= 2) & (k + 1 < len(byte))]
    k = k[(byte[k - 2] == QUOTE) & (byte[k - 1] == LETTER_O) & (byte[k + 1] == QUOTE)]
    return np.unique(np.searchsorted(newline, k))


def _take(
    data: bytes,
    starts: list[int],
    stops: list[int],
    shift: int,
    columns: _Columns,
    *,
    plain: bool,
) -> None:
    """The lines data[start:stop] (each at start + shift in the file), holding OK_MARK. In a
    `plain` block those _USUAL reads are taken together, in order with those it does not (a
    nemesis record, an invocation holding "ok"), which take parses."""
    usual = [
        _USUAL.fullmatch(data, a, b) if plain else None for a, b in zip(starts, stops, strict=True)
    ]
    view, sha256, codes = memoryview(data), hashlib.sha256, columns.by_bytes
    for name in {m.group(_GROUP) for m in usual if m is not None} - codes.keys():
        codes[name] = columns.code(name.decode())
    run = 0  # the matches usual[run:next] are still to take
    for next_ in [*(k for k, m in enumerate(usual) if m is None), len(usual)]:
        taken = [m for m in usual[run:next_] if m is not None]
        columns.digests += b"".join([sha256(view[slice(*m.span(_VALUE))]).digest() for m in taken])
        columns.index.extend(map(int, [m.group(_INDEX) for m in taken]))
        columns.group.extend([codes[m.group(_GROUP)] for m in taken])
        columns.offset.extend([start + shift for start in starts[run:next_]])
        if next_ < len(usual):
            columns.take(data[starts[next_] : stops[next_]], starts[next_] + shift)
        run = next_ + 1


def _each_line(data: bytes, at: int, columns: _Columns) -> None:
    """The lines of data (from `at` in the file), one by one."""
    for line in data.split(b"\n"):
        if len(line) > HISTORY_LINE_BYTES_MAX:
            raise _BadLine(f"longer than {HISTORY_LINE_BYTES_MAX}", at)
        if OK_MARK in line:
            columns.take(line, at)
        elif not (line[:1] == b"{" and line[-1:] == b"}"):
            s = line.strip()
            if s and not (s[:1] == b"{" and s[-1:] == b"}"):
                raise _BadLine("not JSON: not an object", at)
        at += len(line) + 1


def _parse(line: bytes) -> object:
    """The JSON value of one line, as json.loads gives it; raises _BadLine."""
    try:
        text = line.decode()
        op, end = _scan(text, 0)
        if end == len(text) or not text[end:].strip(JSON_SPACE):
            return op
    except (ValueError, StopIteration):  # leading space, a bad byte or bad JSON: json.loads says
        pass
    try:
        return json.loads(line)
    except ValueError as err:
        raise _BadLine(f"not JSON: {err}") from err


def _object(line: bytes) -> dict[str, object]:
    """The JSON object of one line; raises _BadLine when it is not JSON or not an object."""
    op = _parse(line)
    if not isinstance(op, dict):
        raise _BadLine("not a JSON object")
    return op


def _is_ack(op: dict[str, object]) -> bool:
    return op.get("type") == "ok" and op.get("f") == "append" and op.get("process") != "nemesis"


def _fields(op: dict[str, object]) -> tuple[str, str, int | None]:
    """group, value and index of an ok append; raises _BadLine when they are not those."""
    group, value, index = op.get("group"), op.get("value"), op.get("index")
    if not isinstance(group, str) or not isinstance(value, str):
        raise _BadLine("ok append without a string group/value")
    if index is not None and (type(index) is not int or index < 1):
        raise _BadLine(f"index {index!r} is not an index")
    return group, value, index


def _time_ns(op: dict[str, object]) -> int:
    """The record's time_ns as the report shows it (0 when missing)."""
    try:
        return int(op.get("time_ns") or 0)  # type: ignore[call-overload]  # checked here
    except (TypeError, ValueError) as err:
        raise _BadLine(f"time_ns {op.get('time_ns')!r} is not a number") from err


def _appended(line: bytes, path: str, at: int) -> AckedAppend:
    """The AckedAppend of the line at `at`, one that read_range took for an append."""
    try:
        op = _object(line)
        if not _is_ack(op):
            raise _BadLine("no longer an acknowledged append")
        group, value, index = _fields(op)
        time_ns = _time_ns(op)
    except _BadLine as bad:  # the file changed since it was read
        raise InputUnreadable(path, f"{_line_of(path, at)}: {bad.reason}") from bad
    return acknowledged(group, index, value, str(op.get("process")), time_ns)


def joined(path: str, parts: Sequence[Part]) -> Acked:
    """The ranges' columns as one Acked, group codes made common."""
    groups: dict[str, int] = {}
    codes = []
    for p in parts:
        remap = np.array([groups.setdefault(g, len(groups)) for g in p.groups], dtype=np.int32)
        local = np.frombuffer(p.group, dtype=np.int32)
        codes.append(remap[local] if len(remap) else local)
    return Acked(
        path,
        tuple(groups),
        np.concatenate([np.zeros(0, np.int32), *codes]),
        _cat(p.index for p in parts),
        np.frombuffer(b"".join(p.digest for p in parts), dtype=np.uint8).reshape(-1, DIGEST_BYTES),
        _cat(p.offset for p in parts),
    )


def _cat(columns: Iterable[bytes]) -> np.ndarray:
    return np.frombuffer(b"".join(columns), dtype=np.int64)


# --- the file ------------------------------------------------------------------------------------
def _open(path: str) -> IO[bytes]:
    """The history for reading with seek: a local file, or any URI pyarrow.fs opens."""
    fs, local = filesystem(path)
    try:
        if "://" not in path:
            return open(local, "rb")
        return fs.open_input_file(local)  # a NativeFile: read, seek, close
    except OSError as err:
        raise InputUnreadable(path, str(err)) from err


def _size(path: str) -> int:
    fs, local = filesystem(path)
    try:
        info = fs.get_file_info(local)
    except OSError as err:
        raise InputUnreadable(path, str(err)) from err
    if info.size is None:
        raise InputUnreadable(path, "no such file")
    return int(info.size)


def _next_line(f: IO[bytes], lo: int) -> int:
    """Where the first line starting at or after `lo` (> 0) starts: after the first newline at
    or after lo - 1; the file's end if there is none."""
    at = lo - 1
    f.seek(at)
    while block := f.read(DETAIL_READ_BYTES):
        k = block.find(b"\n")
        if k >= 0:
            return at + k + 1
        at += len(block)
    return at


def _line_at(f: IO[bytes], at: int) -> bytes:
    """The line starting at `at`, without its newline."""
    f.seek(at)
    pieces = []
    while piece := f.read(DETAIL_READ_BYTES):
        k = piece.find(b"\n")
        if k >= 0:
            pieces.append(piece[:k])
            break
        pieces.append(piece)
    return b"".join(pieces)


def _line_of(path: str, at: int) -> str:
    """ "line N" for the line starting at byte `at` (newlines before it, counted)."""
    newlines = 0
    with _open(path) as f:
        left = at
        while left > 0 and (block := f.read(min(READ_BYTES, left))):
            newlines += block.count(b"\n")
            left -= len(block)
    return f"line {newlines + 1}"
