"""client.compat's producers: `Producer` and the 2.x binding's `TransactionMQProducer`, on
our blocking Producer and TransactionProducer. Import them from client.compat."""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Sequence
from typing import Any

from client.blocking_producer import Producer as _Producer
from client.blocking_transaction_producer import TransactionProducer as _TransactionProducer
from client.compat_messages import (
    DEFAULT_NAMESRV,
    Message,
    NameServerSettings,
    ProducerSendAsyncFailed,
    ProducerSendBatchFailed,
    ProducerSendOnewayFailed,
    ProducerSendOrderlyFailed,
    ProducerSendSyncFailed,
    ProducerStartFailed,
    RecvMessage,
    RocketMQException,
    SendResult,
    SendStatus,
    as_text,
    hashing_queue_selector,
    send_result,
)
from client.errors import MQClientError
from client.message import Message as _Message
from client.message import MessageExt, MessageQueue
from client.send_result import SendResult as _SendResult
from client.transaction_producer import LocalTransactionState
from remoting import properties as props

log = logging.getLogger("client.compat")


class Producer(NameServerSettings):
    """`Producer(group_id)`, `set_name_server_address(...)` (or `set_namesrv_addr`), `start()`,
    sends, `shutdown()`."""

    def __init__(
        self,
        group_id: str | bytes,
        orderly: bool = False,
        timeout: int | None = None,
        compress_level: int | None = None,
        max_message_size: int | None = None,
    ) -> None:
        self._group = as_text(group_id)
        self._namesrv = DEFAULT_NAMESRV
        self._timeout_s: float | None = timeout / 1000 if timeout else None
        self._producer: _Producer | None = None
        if compress_level is not None:
            self.set_compress_level(compress_level)
        if max_message_size is not None:
            self.set_max_message_size(max_message_size)

    def set_group(self, group_name: str | bytes) -> None:
        self._group = as_text(group_name)

    def set_timeout(self, timeout: int) -> None:
        """The send timeout in milliseconds, as the native binding."""
        self._timeout_s = timeout / 1000

    def set_compress_level(self, level: int) -> None:
        log.info("compress level %s ignored: bodies of 4 KiB or more are zlib level 5", level)

    def set_max_message_size(self, max_size: int) -> None:
        log.info("max message size %s ignored: the broker's maxMessageSize applies", max_size)

    def start(self) -> None:
        if self._producer is None:
            try:
                self._producer = _Producer(self._group, self._namesrv)
                self._producer.start()
            except (MQClientError, ValueError) as err:
                self._producer = None
                raise ProducerStartFailed(str(err)) from err

    def shutdown(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.shutdown()

    def __enter__(self) -> Producer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _running(self, failure: type[RocketMQException]) -> _Producer:
        if self._producer is None:
            raise failure("the producer is not started")
        return self._producer

    def send_sync(self, msg: Message) -> tuple[SendStatus, str, int]:
        producer = self._running(ProducerSendSyncFailed)
        try:
            return send_result(producer.send(msg._ours(), self._timeout_s))
        except MQClientError as err:
            raise ProducerSendSyncFailed(str(err)) from err

    def send_async(
        self,
        msg: Message,
        success_callback: Callable[[Any], None] | None,
        exception_callback: Callable[[Exception], None] | None,
    ) -> None:
        producer = self._running(ProducerSendAsyncFailed)

        def done(outcome: _SendResult | BaseException) -> None:
            if isinstance(outcome, _SendResult):
                if success_callback is not None:
                    success_callback(send_result(outcome))
            elif exception_callback is not None:
                exception_callback(ProducerSendAsyncFailed(str(outcome)))
            else:
                log.error("async send failed and no exception callback was given: %s", outcome)

        producer.send_async(msg._ours(), done, self._timeout_s)

    def send_oneway(self, msg: Message) -> None:
        producer = self._running(ProducerSendOnewayFailed)
        try:
            producer.send_oneway(msg._ours())
        except MQClientError as err:
            raise ProducerSendOnewayFailed(str(err)) from err

    def send_orderly(
        self,
        msg: Message,
        arg: Any,
        retry_times: int = 3,
        queue_selector: Callable[[int, Any, Any], int] = hashing_queue_selector,
    ) -> tuple[SendStatus, str, int]:
        """The queue is `queue_selector(queue count, msg, arg)`; an ordered send never moves
        to another queue (`retry_times` is the native binding's; our send retries the same
        queue within the timeout)."""
        producer = self._running(ProducerSendOrderlyFailed)

        def select(queues: Sequence[MessageQueue], message: Any, user_arg: Any) -> MessageQueue:
            return queues[queue_selector(len(queues), msg, user_arg) % len(queues)]

        try:
            result = producer.send(msg._ours(), self._timeout_s, selector=select, arg=arg)
        except MQClientError as err:
            raise ProducerSendOrderlyFailed(str(err)) from err
        return send_result(result)

    def send_oneway_orderly(
        self,
        msg: Message,
        arg: Any,
        queue_selector: Callable[[int, Any, Any], int] = hashing_queue_selector,
    ) -> None:
        """As the native binding's: the selected queue, no answer awaited (here: answered, for
        the queue's order; the result is dropped)."""
        self.send_orderly(msg, arg, queue_selector=queue_selector)

    def send_orderly_with_sharding_key(
        self, msg: Message, sharding_key: str | bytes
    ) -> tuple[SendStatus, str, int]:
        """2.x: messages with one sharding key go to one queue, in order."""
        from client.selectors import hash_selector

        producer = self._running(ProducerSendOrderlyFailed)
        try:
            result = producer.send(
                msg._ours(), self._timeout_s, selector=hash_selector, arg=as_text(sharding_key)
            )
        except MQClientError as err:
            raise ProducerSendOrderlyFailed(str(err)) from err
        return send_result(result)

    def send_batch(self, msgs: Sequence[Message]) -> tuple[SendStatus, str, int]:
        if not msgs:
            raise ProducerSendBatchFailed("a batch needs at least one message")
        producer = self._running(ProducerSendBatchFailed)
        try:
            results = producer.send_batch([m._ours() for m in msgs], self._timeout_s)
        except MQClientError as err:
            raise ProducerSendBatchFailed(str(err)) from err
        first = results[0]
        status, _, offset = send_result(first)
        return SendResult(status, ",".join(r.msg_id for r in results), offset)


class TransactionStatus(enum.IntEnum):
    """What a local transaction came to, as the 2.x binding's."""

    COMMIT = 0
    ROLLBACK = 1
    UNKNOWN = 2


_STATES = {
    TransactionStatus.COMMIT: LocalTransactionState.COMMIT,
    TransactionStatus.ROLLBACK: LocalTransactionState.ROLLBACK,
    TransactionStatus.UNKNOWN: LocalTransactionState.UNKNOWN,
}
LocalExecute = Callable[[RecvMessage, Any], Any]


def _state_of(answer: object, what: str) -> LocalTransactionState:
    """A callback's TransactionStatus (or its number) as our state; anything else is UNKNOWN,
    as the binding makes it (it raises ValueError in the callback)."""
    if isinstance(answer, int) and not isinstance(answer, bool) and 0 <= answer <= 2:
        return _STATES[TransactionStatus(answer)]
    log.warning("%s answered %r, not a TransactionStatus: counted as UNKNOWN", what, answer)
    return LocalTransactionState.UNKNOWN


def _half_view(half: _Message) -> RecvMessage:
    """The half message as `local_execute` sees it: a RecvMessage whose `id` is the
    transaction id (its UNIQ_KEY); it is not stored anywhere readable yet, so its queue,
    offsets and store time are 0."""
    uniq_key = half.properties.get(props.UNIQ_KEY, "")
    properties = half.wire_properties(uniq_key)
    return RecvMessage(
        MessageExt(
            topic=half.topic,
            body=half.body,
            properties=properties,
            queue=MessageQueue(half.topic, "", 0),
            queue_offset=0,
            commit_log_offset=0,
            msg_id=uniq_key,
            offset_msg_id="",
            born_timestamp_ms=0,
            store_timestamp_ms=0,
            born_host="",
            store_host="",
            reconsume_times=0,
            sys_flag=0x4,  # prepared
            flag=half.flag,
        )
    )


class _Listener:
    """Our TransactionListener over the binding's callbacks: the checker given at
    construction, and the `local_execute` of each send, which travels in the send's `arg`."""

    def __init__(self, checker: Callable[[RecvMessage], Any]) -> None:
        self._checker = checker

    def execute_local_transaction(
        self, msg: _Message, arg: tuple[LocalExecute, Any]
    ) -> LocalTransactionState:
        local_execute, user_args = arg
        return _state_of(local_execute(_half_view(msg), user_args), "local_execute")

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        return _state_of(self._checker(RecvMessage(msg)), "checker_callback")


class TransactionMQProducer(Producer):
    """The 2.x binding's transaction producer: `TransactionMQProducer(group_id,
    checker_callback)`, `set_name_server_address(...)`, `start()`, then
    `send_message_in_transaction(msg, local_execute, user_args)`, `shutdown()`.

    The half message is stored invisible to consumers, then `local_execute(msg, user_args)`
    runs in the calling thread and returns a TransactionStatus: COMMIT makes the message
    visible, ROLLBACK discards it, UNKNOWN (or an exception, or anything else, logged) leaves
    it to the broker, which later asks a live producer of the group: then
    `checker_callback(msg)` answers, in a worker thread, with `msg.id` the transaction id.
    `user_args` of the constructor is accepted and unused, as the binding's. The other send
    methods of Producer send ordinary messages."""

    def __init__(
        self,
        group_id: str | bytes,
        checker_callback: Callable[[RecvMessage], Any],
        user_args: Any = None,
        timeout: int | None = None,
        compress_level: int | None = None,
        max_message_size: int | None = None,
    ) -> None:
        if not callable(checker_callback):
            raise RocketMQException("checker_callback must be callable")
        super().__init__(
            group_id,
            timeout=timeout,
            compress_level=compress_level,
            max_message_size=max_message_size,
        )
        self._listener = _Listener(checker_callback)

    def start(self) -> None:
        if self._producer is None:
            try:
                producer = _TransactionProducer(self._group, self._namesrv, self._listener)
                producer.start()
            except (MQClientError, ValueError) as err:
                raise ProducerStartFailed(str(err)) from err
            self._producer = producer

    def __enter__(self) -> TransactionMQProducer:
        self.start()
        return self

    def send_message_in_transaction(
        self, message: Message, local_execute: LocalExecute, user_args: Any = None
    ) -> tuple[SendStatus, str, int]:
        """SendResult(status, msg_id, offset) of the half message (its msg_id is the
        transaction id); raises ProducerSendSyncFailed when it was not stored."""
        producer = self._running(ProducerSendSyncFailed)
        assert isinstance(producer, _TransactionProducer), producer
        try:
            result = producer.send_message_in_transaction(
                message._ours(), (local_execute, user_args), self._timeout_s
            )
        except MQClientError as err:
            raise ProducerSendSyncFailed(str(err)) from err
        return send_result(result)
