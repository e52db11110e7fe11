"""What clients and the nemesis saw, as a list of operations (Jepsen's history).

Every operation is an invocation followed later by exactly one completion from the same
process: `ok` (it happened), `fail` (it surely did not) or `info` (unknown, e.g. a timeout).
Faults are recorded by the process "nemesis": `invoke` when injected, `ok` when healed.
Times are monotonic nanoseconds since the run started, from one clock shared by every writer.

On disk: `history.jsonl`, one JSON object per line, keys as in docs/formats.md#chaos-history
(type, process, f, value, group, index, time_ns, error) plus `node`, the replica that
answered an `ok` append (a reader ignores keys it does not know).
"""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import attrs

NEMESIS = "nemesis"  # the process name of fault records
HISTORY_FILE = "history.jsonl"
HISTORY_LINE_BYTES_MAX = 16 << 20  # one operation; a reader refuses longer lines
FLUSH_OPS = 512  # the writer flushes at least this often, so a watcher sees progress


class Phase(enum.Enum):
    INVOKE = "invoke"
    OK = "ok"
    FAIL = "fail"  # surely not applied
    INFO = "info"  # outcome unknown


COMPLETIONS = frozenset({Phase.OK, Phase.FAIL, Phase.INFO})


@attrs.frozen
class Op:
    process: int | str  # a client worker (its operations never overlap) or NEMESIS
    phase: Phase
    f: str  # "append", or for the nemesis the fault: "kill", "pause", "partition", ...
    value: Any  # for an append the value (a str; the entry body is its UTF-8 encoding)
    time_ns: int
    group: str = "g"
    index: int | None = None  # for an ok append, the index the server acknowledged
    error: str | None = None  # for fail and info, what the client saw
    node: str | None = None  # for an ok append, the replica that answered

    @property
    def is_client(self) -> bool:
        return self.process != NEMESIS

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": self.phase.value,
            "process": self.process,
            "f": self.f,
            "value": self.value,
            "group": self.group,
            "index": self.index,
            "time_ns": self.time_ns,
            "error": self.error,
        }
        if self.node is not None:
            out["node"] = self.node
        return out

    @classmethod
    def from_json(cls, row: dict[str, Any], where: str = "") -> Op:
        try:
            process = row["process"]
            if not isinstance(process, int | str):
                raise ValueError(f"process {process!r} is neither int nor str")
            index = row.get("index")
            if index is not None and not isinstance(index, int):
                raise ValueError(f"index {index!r} is not an int")
            return cls(
                process=process,
                phase=Phase(row["type"]),
                f=str(row["f"]),
                value=row.get("value"),
                time_ns=int(row["time_ns"]),
                group=str(row.get("group", "g")),
                index=index,
                error=row.get("error"),
                node=row.get("node"),
            )
        except (KeyError, ValueError, TypeError) as err:
            raise HistoryUnreadable(where, f"bad operation {row!r}: {err}") from err


@attrs.define
class HistoryUnreadable(Exception):
    where: str  # "path:line"
    reason: str

    def __str__(self) -> str:
        return f"history {self.where}: {self.reason}"


class RunClock:
    """Monotonic nanoseconds since the run started; every writer of one history shares it.
    `source` is the monotonic clock (tests pass trio's, so a virtual clock drives it)."""

    def __init__(
        self, start_ns: int | None = None, source: Callable[[], int] = time.monotonic_ns
    ) -> None:
        self.source = source
        self.start_ns = source() if start_ns is None else start_ns

    def restart(self) -> None:
        """t = 0 is now."""
        self.start_ns = self.source()

    def now_ns(self) -> int:
        return self.source() - self.start_ns

    def elapsed_s(self) -> float:
        return self.now_ns() / 1e9


class HistoryWriter:
    """Appends operations to history.jsonl as they happen (and keeps them in memory unless
    told not to)."""

    def __init__(self, path: Path, clock: RunClock, *, group: str = "g", keep: bool = True) -> None:
        self.path = path
        self.clock = clock
        self.group = group
        self.keep = keep  # a long run reads its history back from the file instead
        self.ops: list[Op] = []
        self._file: IO[str] | None = open(path, "w", encoding="utf-8")  # noqa: SIM115
        self._unflushed = 0

    def record(
        self,
        process: int | str,
        phase: Phase,
        f: str,
        value: Any,
        *,
        index: int | None = None,
        error: str | None = None,
        node: str | None = None,
        group: str | None = None,
    ) -> Op:
        """`group` overrides the writer's (a broker run names the broker group per operation)."""
        at_group = self.group if group is None else group
        op = Op(process, phase, f, value, self.clock.now_ns(), at_group, index, error, node)
        if self.keep:
            self.ops.append(op)
        if self._file is not None:
            self._file.write(json.dumps(op.to_json(), separators=(",", ":")) + "\n")
            self._unflushed += 1
            if self._unflushed >= FLUSH_OPS:
                self.flush()
        return op

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()
            self._unflushed = 0

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_history(path: Path, ops: Iterable[Op]) -> None:
    with open(path, "w", encoding="utf-8") as out:
        for op in ops:
            out.write(json.dumps(op.to_json(), separators=(",", ":")) + "\n")


def iter_history(path: Path) -> Iterator[Op]:
    """Operations in recorded order; HistoryUnreadable names the line that is not one. A last
    line cut short (the writer was killed mid-line) is skipped, as a torn tail."""
    with open(path, encoding="utf-8") as lines:
        pending: tuple[int, str] | None = None
        for number, line in enumerate(lines, start=1):
            if pending is not None:
                yield _parse(path, *pending)
            pending = (number, line)
        if pending is not None:
            number, line = pending
            if line.endswith("\n"):
                yield _parse(path, number, line)


def read_history(path: Path) -> list[Op]:
    return [op for op in iter_history(path)]


def _parse(path: Path, number: int, line: str) -> Op:
    where = f"{path}:{number}"
    if len(line) > HISTORY_LINE_BYTES_MAX:
        raise HistoryUnreadable(where, f"longer than {HISTORY_LINE_BYTES_MAX} bytes")
    try:
        row = json.loads(line)
    except ValueError as err:
        raise HistoryUnreadable(where, f"not JSON: {err}") from err
    if not isinstance(row, dict):
        raise HistoryUnreadable(where, "not a JSON object")
    return Op.from_json(row, where)


def check_well_formed(ops: Iterable[Op]) -> list[str]:
    """Problems with the history itself: a completion without an invocation, two open
    invocations of one process, a completion of another function. Empty when well formed."""
    problems: list[str] = []
    open_ops: dict[int | str, Op] = {}
    for op in ops:
        if op.phase is Phase.INVOKE:
            if op.process in open_ops and op.is_client:
                problems.append(f"process {op.process} invoked {op.f} at {op.time_ns} twice")
            open_ops[op.process] = op
            continue
        started = open_ops.pop(op.process, None)
        if started is None:
            problems.append(f"process {op.process}: {op.phase.value} at {op.time_ns} uninvoked")
        elif started.f != op.f:
            problems.append(f"process {op.process}: {op.f} completes {started.f}")
    return problems
