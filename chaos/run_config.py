"""What every chaos run shares, whatever its target: its configuration, the outcome, the
setup failure (exit 2), and the signal handling that lets Ctrl-C or SIGTERM unwind a run
through every `finally` (chaos/run.py runs the dledger target, chaos/broker_run.py the broker).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import attrs
import trio

from chaos.schedule import BROKER_SCENARIOS, SCENARIOS
from chaos.workloads.append import OP_TIMEOUT_S_DEFAULT, WORKERS_DEFAULT

TARGETS = ("dledger", "broker")
NODES_MIN, NODES_MAX = 3, 9
GROUPS_MAX = 8  # broker groups of a broker run
NAMESRVS_MAX = 4
FLUSH_POLICIES = ("SYNC_FLUSH", "ASYNC_FLUSH")  # broker target: what --flush takes


class SetupFailed(Exception):
    """The run could not be set up: the message says exactly what is missing (exit 2)."""


@attrs.frozen
class RunConfig:
    scenario: str
    duration_s: float
    seed: int
    out: Path
    target: str = "dledger"
    nodes: int = 3
    workers: int = WORKERS_DEFAULT
    op_timeout_s: float = OP_TIMEOUT_S_DEFAULT
    interval_s: tuple[float, float] | None = None
    keep_stores: bool = False
    groups: int = 2  # broker target: broker groups of `nodes` replicas each
    namesrvs: int = 2  # broker target: name servers
    flush: str | None = None  # broker target: the brokers' flushDiskType (None: their default)

    @property
    def scenarios(self) -> dict[str, tuple[str, ...]]:
        return BROKER_SCENARIOS if self.target == "broker" else SCENARIOS

    def validate(self) -> None:
        if self.target not in TARGETS:
            raise SetupFailed(f"unknown target {self.target!r}; one of {', '.join(TARGETS)}")
        if self.scenario not in self.scenarios:
            raise SetupFailed(
                f"unknown scenario {self.scenario!r} for target {self.target}; one of "
                + ", ".join(self.scenarios)
            )
        if not NODES_MIN <= self.nodes <= NODES_MAX:
            raise SetupFailed(f"--nodes must be {NODES_MIN}..{NODES_MAX}")
        if not 1 <= self.groups <= GROUPS_MAX or not 1 <= self.namesrvs <= NAMESRVS_MAX:
            raise SetupFailed(f"--groups must be 1..{GROUPS_MAX}, --namesrvs 1..{NAMESRVS_MAX}")
        if self.flush is not None and self.target != "broker":
            raise SetupFailed("--flush is for the broker target (dledger-server runs SYNC_FLUSH)")
        if self.flush not in (None, *FLUSH_POLICIES):
            raise SetupFailed(f"--flush must be one of {', '.join(FLUSH_POLICIES)}")
        if self.duration_s <= 0 or self.workers < 1 or self.op_timeout_s <= 0:
            raise SetupFailed("--duration, --workers and --op-timeout must be positive")


@attrs.define
class Outcome:
    verdict: str
    report: dict[str, Any]

    @property
    def exit_code(self) -> int:
        return 0 if self.verdict == "pass" else 1


class Interruptible(Protocol):
    interrupted: str | None


async def watch_signals(scope: trio.CancelScope, state: Interruptible) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            state.interrupted = signal.Signals(signum).name
            scope.cancel()
            return


@contextlib.contextmanager
def cleanup_on_signals() -> Iterator[None]:
    """Outside trio (setup, teardown) SIGTERM unwinds like Ctrl-C, through every finally."""

    def raise_interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def signals_blocked() -> Iterator[None]:
    """A second Ctrl-C must not cut the cleanup short."""
    blocked = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)
