"""Availability as clients saw it, from the history alone (pure functions).

Failover time of a fault: from its injection to the first ok append after it, before the
next fault starts. When the fault hit the leader (`leader_affected` in its value), an ok
answered by the old leader counts only after the fault healed, so an answer that was already
on the wire when the leader died, or that an isolated leader sent for entries committed
before the cut, is not taken for a new leader's. For faults that spare the leader the same
number measures how long appends stalled, if at all.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import attrs

from chaos.history import NEMESIS, Op, Phase

NS_PER_MS = 1_000_000
RECOVER = "recover"  # the nemesis's wait for recovery after a heal: not a fault


@attrs.frozen
class FaultWindow:
    number: int  # 1, 2, ... in the order injected
    kind: str  # e.g. "kill-leader" (value["fault"]), or `f` if the value does not say
    f: str
    start_ns: int
    end_ns: int | None  # healed; None if the history ends first
    value: dict[str, Any]

    @property
    def leader(self) -> str | None:
        leader = self.value.get("leader")
        return leader if isinstance(leader, str) else None

    @property
    def applied_ns(self) -> int:
        """When the fault was in force (its rules applied, its process killed); the start
        when the history does not say."""
        applied = self.value.get("applied_ns")
        return applied if isinstance(applied, int) else self.start_ns

    @property
    def leader_affected(self) -> bool:
        return bool(self.value.get("leader_affected", False))


@attrs.frozen
class Failover:
    number: int
    kind: str
    leader_affected: bool
    ms: float | None  # None: no ok append before the next fault (or the end)
    node: str | None  # who answered that first ok append


@attrs.frozen
class Gap:
    start_ns: int
    end_ns: int
    faults: tuple[int, ...]  # numbers of the faults in force during the gap

    @property
    def ms(self) -> float:
        return (self.end_ns - self.start_ns) / NS_PER_MS


def fault_windows(history: Sequence[Op]) -> list[FaultWindow]:
    windows: list[FaultWindow] = []
    open_fault: Op | None = None
    for op in history:
        if op.process != NEMESIS or op.f == RECOVER:
            continue
        if op.phase is Phase.INVOKE:
            if open_fault is not None:  # never healed (a malformed history): close it here
                windows.append(_window(len(windows) + 1, open_fault, None))
            open_fault = op
        elif open_fault is not None and op.f == open_fault.f:
            healed = open_fault
            if isinstance(op.value, dict) and isinstance(open_fault.value, dict):
                # the completion adds what applying and healing did (applied_ns, ...)
                healed = attrs.evolve(open_fault, value={**open_fault.value, **op.value})
            windows.append(_window(len(windows) + 1, healed, op.time_ns))
            open_fault = None
    if open_fault is not None:
        windows.append(_window(len(windows) + 1, open_fault, None))
    return windows


def _window(number: int, op: Op, end_ns: int | None) -> FaultWindow:
    value = op.value if isinstance(op.value, dict) else {"value": op.value}
    kind = value.get("fault")
    return FaultWindow(
        number, kind if isinstance(kind, str) else op.f, op.f, op.time_ns, end_ns, value
    )


def ok_appends(history: Sequence[Op]) -> list[Op]:
    """Client ok appends in completion order."""
    oks = [op for op in history if op.is_client and op.f == "append" and op.phase is Phase.OK]
    return sorted(oks, key=lambda op: op.time_ns)


def failovers(history: Sequence[Op]) -> list[Failover]:
    windows = fault_windows(history)
    oks = ok_appends(history)
    times = [op.time_ns for op in oks]
    found = []
    for i, w in enumerate(windows):
        until = windows[i + 1].start_ns if i + 1 < len(windows) else math.inf
        first = _first_ok(oks, bisect.bisect_right(times, w.start_ns), until, w)
        ms = None if first is None else (first.time_ns - w.start_ns) / NS_PER_MS
        found.append(
            Failover(w.number, w.kind, w.leader_affected, ms, first.node if first else None)
        )
    return found


def _first_ok(oks: Sequence[Op], start: int, until: float, w: FaultWindow) -> Op | None:
    for op in itertools.islice(oks, start, None):
        if op.time_ns >= until:
            return None
        if _counts(w, op):
            return op
    return None


def _counts(w: FaultWindow, op: Op) -> bool:
    if not w.leader_affected or op.node is None or op.node != w.leader:
        return True
    return w.end_ns is not None and op.time_ns > w.end_ns


def longest_gap(history: Sequence[Op]) -> Gap | None:
    """The longest stretch with no ok append, from the first client invocation to the last
    client completion."""
    client = [op for op in history if op.is_client and op.f == "append"]
    if not client:
        return None
    begin = min(op.time_ns for op in client)
    end = max(op.time_ns for op in client)
    marks = [begin, *(op.time_ns for op in ok_appends(history)), end]
    start, stop = max(itertools.pairwise(marks), key=lambda pair: pair[1] - pair[0])
    during = tuple(
        w.number
        for w in fault_windows(history)
        if w.start_ns < stop and (w.end_ns is None or w.end_ns > start)
    )
    return Gap(start, stop, during)


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest rank: the smallest value with at least p% of the values at or below it."""
    assert sorted_values, "no values"
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def summarize(values: Sequence[float]) -> dict[str, float | int | None]:
    """{p50, p99, max, count} in the values' unit; None for each statistic when empty."""
    ordered = sorted(values)
    if not ordered:
        return {"p50": None, "p99": None, "max": None, "count": 0}
    return {
        "p50": round(percentile(ordered, 50), 1),
        "p99": round(percentile(ordered, 99), 1),
        "max": round(ordered[-1], 1),
        "count": len(ordered),
    }


def failover_summary(found: Sequence[Failover]) -> dict[str, Any]:
    """Overall over the faults that hit the leader; per kind over every fault of the kind."""
    by_kind: dict[str, list[float]] = defaultdict(list)
    unmeasured: dict[str, int] = defaultdict(int)
    for f in found:
        if f.ms is None:
            unmeasured[f.kind] += 1
        else:
            by_kind[f.kind].append(f.ms)
    kinds = sorted({f.kind for f in found})
    return {
        "overall": summarize([f.ms for f in found if f.leader_affected and f.ms is not None]),
        "by_kind": {
            k: {**summarize(by_kind[k]), "no_ok_before_next_fault": unmeasured[k]} for k in kinds
        },
    }
