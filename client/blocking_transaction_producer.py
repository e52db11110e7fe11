"""The blocking transaction producer: `AsyncTransactionProducer` on the client's own trio thread
(client/blocking.py), as `Producer` wraps `AsyncProducer` (whose methods it inherits, for
ordinary messages).

    with TransactionProducer("pg", "127.0.0.1:9876", listener) as producer:
        result = producer.send_message_in_transaction(Message("Orders", b"..."), arg=order)

`send_message_in_transaction` runs `execute_local_transaction` in the calling thread, between
the half message and END_TRANSACTION (as Java's does), so a local transaction may use what
that thread holds (a database connection, a thread-local session). `check_local_transaction`
runs in one of the client's worker threads when the broker asks; it must not call this
producer's blocking methods from an `async def` listener (they would wait for the client's
own thread).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial
from typing import Any

from client import limits
from client.blocking import LoopThread
from client.blocking_producer import Producer
from client.errors import ClientClosed
from client.message import Message
from client.producer import DEFAULT_NAMESRV
from client.send_result import SendStatus
from client.transaction_producer import (
    AsyncTransactionProducer,
    LocalTransactionState,
    TransactionListener,
    TransactionSendResult,
    local_state,
)

log = logging.getLogger("client.transaction_producer")


class TransactionProducer(Producer):
    """A transaction producer for blocking code: `start()` ... `shutdown()`, or `with`.
    Arguments as AsyncTransactionProducer's; the listener's methods are plain functions. It
    has Producer's methods too, for ordinary messages."""

    def __init__(
        self,
        group: str,
        namesrv: str | Sequence[str] = DEFAULT_NAMESRV,
        listener: TransactionListener | None = None,
        *,
        retry_times: int = limits.RETRY_TIMES_DEFAULT,
        send_timeout: float = limits.SEND_TIMEOUT_S_DEFAULT,
        instance_name: str | None = None,
    ) -> None:
        self._tx = AsyncTransactionProducer(  # checks the arguments now, not at start()
            group,
            namesrv,
            listener,
            retry_times=retry_times,
            send_timeout=send_timeout,
            instance_name=instance_name,
        )
        self._async = self._tx  # what Producer's methods send with
        self._loop = None
        self._stopped = False

    def start(self) -> None:
        """Start the client thread; a second call does nothing, a call after shutdown raises."""
        if self._stopped:
            raise ClientClosed("this producer was shut down; make a new one")
        if self._loop is None:
            self._loop = LoopThread(lambda: self._async, name=f"mq-tx-producer-{self.group}")

    def __enter__(self) -> TransactionProducer:
        self.start()
        return self

    def send_message_in_transaction(
        self, message: Message, arg: Any = None, timeout: float | None = None
    ) -> TransactionSendResult:
        """AsyncTransactionProducer.send_message_in_transaction, with the local transaction
        run in this thread."""
        loop = self._running()
        half, result = loop.call(partial(self._tx.send_half, message, timeout))
        state = LocalTransactionState.ROLLBACK
        if result.status is SendStatus.SEND_OK:
            execute = self._tx.listener.execute_local_transaction
            try:
                state = local_state(execute(half, arg), "execute_local_transaction")
            except Exception:
                log.exception("execute_local_transaction raised: counted as UNKNOWN")
                state = LocalTransactionState.UNKNOWN
        return loop.call(partial(self._tx.end_transaction, result, state))
