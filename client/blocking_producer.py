"""The blocking producer: `AsyncProducer` running on the client's own trio thread
(client/blocking.py), so there is one implementation of sending.

    with Producer("pg", "127.0.0.1:9876") as producer:
        result = producer.send(Message("Orders", b"hello"))

Every method may be called from any thread and blocks until the send ends (within its
timeout). `send_async`'s callback runs on the client's trio thread: it must return quickly and
must not call this producer's blocking methods (they would wait for that very thread); hand
the result to your own thread or queue if there is work to do.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from client import limits
from client.blocking import LoopThread
from client.errors import ClientClosed
from client.message import Message
from client.producer import DEFAULT_NAMESRV, AsyncProducer, SendCallback
from client.selectors import Selector
from client.send_result import SendResult


class Producer:
    """A producer for blocking code: `start()` ... `shutdown()`, or `with Producer(...) as p:`.
    Arguments as AsyncProducer's."""

    def __init__(
        self,
        group: str,
        namesrv: str | Sequence[str] = DEFAULT_NAMESRV,
        *,
        retry_times: int = limits.RETRY_TIMES_DEFAULT,
        send_timeout: float = limits.SEND_TIMEOUT_S_DEFAULT,
        instance_name: str | None = None,
        auto_batch: bool = False,
    ) -> None:
        self._async = AsyncProducer(  # checks the arguments now, not at start()
            group,
            namesrv,
            retry_times=retry_times,
            send_timeout=send_timeout,
            instance_name=instance_name,
            auto_batch=auto_batch,
        )
        self._loop: LoopThread[AsyncProducer] | None = None
        self._stopped = False

    @property
    def group(self) -> str:
        return self._async.group

    def start(self) -> None:
        """Start the client thread; a second call does nothing, a call after shutdown raises."""
        if self._stopped:
            raise ClientClosed("this producer was shut down; make a new one")
        if self._loop is None:
            self._loop = LoopThread(lambda: self._async, name=f"mq-producer-{self.group}")

    def shutdown(self) -> None:
        """Wait for the async sends in flight (each within its timeout), close every
        connection and stop the client thread. Safe to call twice."""
        self._stopped = True
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.close()

    def __enter__(self) -> Producer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _running(self) -> LoopThread[AsyncProducer]:
        if self._loop is None:
            raise ClientClosed("the producer is not started: call start() or use `with`")
        return self._loop

    def send(
        self,
        message: Message,
        timeout: float | None = None,
        *,
        selector: Selector | None = None,
        arg: Any = None,
    ) -> SendResult:
        """AsyncProducer.send: stored, or an exception saying why not (or that it may be)."""
        return self._running().call(
            partial(self._async.send, message, timeout, selector=selector, arg=arg)
        )

    def send_batch(
        self, messages: Sequence[Message], timeout: float | None = None
    ) -> list[SendResult]:
        """AsyncProducer.send_batch: one SendResult per batch the splitter made."""
        return self._running().call(partial(self._async.send_batch, messages, timeout))

    def send_oneway(self, message: Message) -> None:
        """AsyncProducer.send_oneway: handed to a connection, no answer awaited."""
        self._running().call(partial(self._async.send_oneway, message))

    def send_async(
        self,
        message: Message,
        callback: SendCallback,
        timeout: float | None = None,
        *,
        selector: Selector | None = None,
        arg: Any = None,
    ) -> None:
        """Start a send and return; `callback(result or exception)` runs on the client's
        thread when it ends (see the module docstring). Blocks while too many sends are in
        flight (limits.ASYNC_SENDS_MAX)."""
        self._running().call(
            partial(self._async.send_async, message, callback, timeout, selector=selector, arg=arg)
        )
