"""The frame every `mqbench` run shares: its clock, its end, the report every second, signals.

A run starts when its work says so (`Run.start()`, once the producer or consumer is up) and
stops sending or receiving at the end of its duration or at the first SIGINT (Ctrl-C) or
SIGTERM; the work then finishes what is in flight and returns, and the caller prints the
summary. A second signal cancels what is still in flight, so the summary comes at once.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Awaitable, Callable

import trio

from client.errors import NoRouteError
from client.instance import open_instance

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
REPORT_EVERY_S = 1.0
NAMESRV_CHECK_S = 10.0  # the check of the name servers before a run, every one tried


class Run:
    """One run's timeline, in trio time. `going` is what a sender or receiver loop asks."""

    def __init__(self, duration_s: float) -> None:
        self.duration_s = duration_s
        self.started_at: float | None = None  # trio time, for the deadline
        self._started_s: float | None = None  # time.monotonic(), for the elapsed time, which
        self._finished_s: float | None = None  # the summary reads outside trio too
        self.stopping = trio.Event()  # the duration ended, or a signal came
        self.interrupted = False  # a signal stopped it
        self._started = trio.Event()

    @property
    def end(self) -> float:
        assert self.started_at is not None, "the run has not started"
        return self.started_at + self.duration_s

    def start(self) -> None:
        self.started_at = trio.current_time()
        self._started_s = time.monotonic()
        self._started.set()

    def finish(self) -> None:
        """The moment the summary's duration ends (the first call counts)."""
        if self._finished_s is None:
            self._finished_s = time.monotonic()

    def interrupt(self) -> None:
        self.interrupted = True
        self.stopping.set()

    def going(self) -> bool:
        """True while the run is to go on: started, before its end, not interrupted."""
        if self.stopping.is_set() or self.started_at is None:
            return False
        if trio.current_time() >= self.end:
            self.stopping.set()
            return False
        return True

    async def wait_started(self) -> None:
        await self._started.wait()

    async def wait_end(self) -> None:
        """Until the duration ends or a signal stops the run."""
        await self._started.wait()
        with trio.move_on_at(self.end):
            await self.stopping.wait()
        self.stopping.set()

    async def pause(self, seconds: float) -> None:
        """Sleep `seconds`, less if the run stops meanwhile."""
        with trio.move_on_after(seconds):
            await self.stopping.wait()

    def elapsed_s(self) -> float:
        """From start to finish (or to now, while it runs); 0 if it never started."""
        if self._started_s is None:
            return 0.0
        until = self._finished_s if self._finished_s is not None else time.monotonic()
        return until - self._started_s


async def supervise(
    run: Run, work: Callable[[Run], Awaitable[None]], report: Callable[[float], None]
) -> None:
    """Run `work(run)` with `report(seconds since the last report)` called every second once the
    run started, and signals watched; returns when the work returns (or a second signal
    cancelled it), with the run finished."""
    async with trio.open_nursery() as nursery:
        work_scope = trio.CancelScope()
        nursery.start_soon(_watch_signals, run, work_scope)
        nursery.start_soon(_report, run, report)
        with work_scope:
            await work(run)
        run.finish()
        nursery.cancel_scope.cancel()


async def _report(run: Run, report: Callable[[float], None]) -> None:
    await run.wait_started()
    assert run.started_at is not None
    last = run.started_at
    while True:
        await trio.sleep_until(last + REPORT_EVERY_S)
        now = trio.current_time()
        report(now - last)
        last = now


async def _watch_signals(run: Run, work_scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
        async for _ in signals:
            if not run.stopping.is_set():
                run.interrupt()  # finish what is in flight, then the summary
            else:
                run.finish()
                work_scope.cancel()  # a second signal: the summary now


async def topic_known(namesrv: str, topic: str) -> bool:
    """Whether a name server knows `topic`; NoRouteError when none answers (the run's one
    check before it starts: an unreachable name server is a failure, not a run of errors)."""
    async with open_instance(namesrv, instance_name="mqbench-check") as instance:
        with trio.move_on_after(NAMESRV_CHECK_S):
            return await instance.refresh(topic, force=True) is not None
    raise NoRouteError(topic, f"no name server answered within {NAMESRV_CHECK_S:.0f} s")
