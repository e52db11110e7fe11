"""What a chaos target offers the nemesis and the run: a group of real processes, one per
host, that can be killed, paused, restarted, asked who leads, and read back at the end.

The dledger target (chaos/targets/dledger.py) is the first; the broker brings its own in
milestone 2 with the same shape, so nemesis, run and checkers stay as they are.
"""

from __future__ import annotations

import random
from typing import Any, Protocol

import attrs

from chaos.final import FinalState


class TargetStartFailed(Exception):
    """A replica would not start or serve on a fresh store: the run cannot be set up."""


@attrs.frozen
class Crash:
    """A replica process that exited without the nemesis killing it: a finding."""

    node: str
    returncode: int | None
    time_ns: int
    log_tail: str

    def describe(self) -> dict[str, Any]:
        return attrs.asdict(self)


class Target(Protocol):
    nodes: list[str]
    group: str

    def kill(self, node: str) -> None:
        """kill -9, and reap it."""

    def pause(self, node: str) -> None:
        """SIGSTOP."""

    def resume(self, node: str) -> None:
        """SIGCONT."""

    def start(self, node: str) -> None:
        """Start a killed replica again on its old store."""

    def running(self, node: str) -> bool: ...

    async def leader(self) -> str | None:
        """The replica that now leads (the highest term wins), or None."""

    async def wait_leader(self, timeout_s: float) -> str | None:
        """The leader, polling until one is found or the deadline passes."""

    async def wait_recovered(self, timeout_s: float) -> bool:
        """Every replica running, serving and caught up with a leader; False at the deadline."""

    async def wait_converged(self, timeout_s: float) -> bool:
        """With no writes coming, every replica at the same commit index as the leader."""

    async def read_final(self) -> FinalState: ...

    def damage_tail(self, node: str, mode: str, rng: random.Random) -> dict[str, Any]:
        """Damage the tail of a killed replica's log; what was done, for the history."""

    def recovery_note(self, node: str) -> str | None:
        """What the replica said about its store when it last started (e.g. a cut tail)."""

    def check_crashes(self, now_ns: int) -> list[Crash]:
        """Replicas that exited by themselves since the last call."""

    def stop_all(self) -> None: ...
