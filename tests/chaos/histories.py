"""Hand-made histories and final states for the checker tests: a few lines each, so that
what a checker must catch is visible in the test."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from chaos.final import FinalState, LogEntry, ReplicaLog
from chaos.history import NEMESIS, Op, Phase

MS = 1_000_000


class Builder:
    """Operations with a clock that advances 1 ms per record unless told otherwise."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.now_ns = 0

    def at(self, ms: float) -> Builder:
        self.now_ns = int(ms * MS)
        return self

    def _add(self, op: Op) -> None:
        self.ops.append(op)
        self.now_ns += MS

    def append(
        self,
        process: int,
        value: str,
        outcome: str = "ok",
        index: int | None = None,
        node: str | None = "n0",
    ) -> Builder:
        self._add(Op(process, Phase.INVOKE, "append", value, self.now_ns))
        phase = Phase(outcome)
        self._add(
            Op(
                process,
                phase,
                "append",
                value,
                self.now_ns,
                index=index if phase is Phase.OK else None,
                error=None if phase is Phase.OK else "boom",
                node=node if phase is Phase.OK else None,
            )
        )
        return self

    def fault(self, f: str, value: dict[str, Any], phase: str = "invoke") -> Builder:
        self._add(Op(NEMESIS, Phase(phase), f, value, self.now_ns))
        return self


def entries(values: Sequence[str | None], term: int = 1, first: int = 1) -> tuple[LogEntry, ...]:
    """Data entries for the values, a no-op entry for None, at consecutive indexes."""
    return tuple(
        LogEntry(first + i, term, 1 if v is None else 0, b"" if v is None else v.encode())
        for i, v in enumerate(values)
    )


def replica(node: str, log: Iterable[LogEntry], uncommitted: Iterable[LogEntry] = ()) -> ReplicaLog:
    committed = tuple(log)
    tail = tuple(uncommitted)
    commit = committed[-1].index if committed else 0
    return ReplicaLog(
        node=node,
        committed=committed,
        uncommitted=tail,
        commit_index=commit,
        last_index=tail[-1].index if tail else commit,
    )


def agreeing(values: Sequence[str | None], nodes: Sequence[str] = ("n0", "n1", "n2")) -> FinalState:
    log = entries(values)
    return FinalState({n: replica(n, log) for n in nodes}, complete=True, converged=True)
