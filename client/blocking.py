"""The blocking API's engine: a trio loop in a thread of its own, running the trio API.

`LoopThread(factory)` enters the async context manager `factory()` (an AsyncProducer, an
AsyncPushConsumer, ...) inside a trio loop on a daemon thread and hands back what it yields;
`call(fn, *args)` runs an async function on that loop and returns its result (or raises its
exception) in the caller's thread; `close()` leaves the context manager and joins the thread.
So the blocking classes are thin wrappers and there is one implementation of everything.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, suppress
from typing import Any, Generic, TypeVar

import trio

from client.errors import ClientClosed

T = TypeVar("T")
R = TypeVar("R")

START_TIMEOUT_S = 30.0


class LoopThread(Generic[T]):
    def __init__(
        self, factory: Callable[[], AbstractAsyncContextManager[T]], *, name: str = "mq-client"
    ) -> None:
        self._factory = factory
        self._started = threading.Event()
        self._value: T | None = None
        self._error: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        if not self._started.wait(START_TIMEOUT_S):
            raise ClientClosed(f"the client's trio thread did not start in {START_TIMEOUT_S} s")
        if self._error is not None:
            self._thread.join()
            raise self._error

    @property
    def value(self) -> T:
        assert self._value is not None
        return self._value

    def call(self, fn: Callable[..., Awaitable[R]], *args: Any) -> R:
        """Run `await fn(*args)` on the loop; its result or its exception, here."""
        if self._closed or self._token is None:
            raise ClientClosed("the client is closed")
        try:
            return trio.from_thread.run(fn, *args, trio_token=self._token)
        except trio.RunFinishedError:
            raise ClientClosed("the client is closed") from None

    def call_sync(self, fn: Callable[..., R], *args: Any) -> R:
        """Run the plain function `fn(*args)` on the loop (to start a task there, say)."""
        if self._closed or self._token is None:
            raise ClientClosed("the client is closed")
        try:
            return trio.from_thread.run_sync(fn, *args, trio_token=self._token)
        except trio.RunFinishedError:
            raise ClientClosed("the client is closed") from None

    def close(self) -> None:
        """Leave the context manager (it closes what it opened) and stop the thread."""
        if self._closed:
            return
        if threading.current_thread() is self._thread:
            raise RuntimeError("close() called from the client's own thread (a listener?)")
        self._closed = True
        token, stop = self._token, self._stop
        if token is not None and stop is not None:
            with suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(stop.set, trio_token=token)
        self._thread.join()
        if self._error is not None:
            raise self._error

    def _main(self) -> None:
        try:
            trio.run(self._run)
        except BaseException as err:  # reported to whoever waits: start or close
            self._error = err
            self._started.set()

    async def _run(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        try:
            async with self._factory() as value:
                self._value = value
                self._started.set()
                await self._stop.wait()
        finally:
            self._started.set()
