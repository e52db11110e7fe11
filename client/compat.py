"""The API of the deprecated native `rocketmq-client-python` (PyPI `rocketmq`), on our client.

A script written for the native binding switches with one import line and no native library:

    from rocketmq.client import Producer, Message        # before
    from client.compat import Producer, Message          # after

Both generations of that API are served: 0.4.x (`set_namesrv_addr`, `send_orderly(msg, arg)`
with a `queue_selector(mq_size, msg, arg)`) and 2.x (`set_name_server_address`,
`send_orderly_with_sharding_key`, listeners returning `ConsumeStatus`, `TransactionMQProducer`
with a checker callback and `TransactionStatus`). What the native client
did in C++ threads runs on our client's trio thread and worker threads; what it could not do
(it keyed pull offsets by topic and queue id only, so two brokers' queue 0 shared one offset)
is done right here. Name-server domains and ACL credentials are not supported: setting them
raises, rather than silently connecting without them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from client.compat_messages import (
    DEFAULT_NAMESRV,
    ConsumerException,
    ConsumeStatus,
    Message,
    MessageModel,
    MessageProperty,
    NameServerSettings,
    ProducerException,
    ProducerSendAsyncFailed,
    ProducerSendBatchFailed,
    ProducerSendOnewayFailed,
    ProducerSendOrderlyFailed,
    ProducerSendSyncFailed,
    ProducerStartFailed,
    PullConsumerStartFailed,
    PushConsumerStartFailed,
    ReceivedMessage,
    RecvMessage,
    RocketMQException,
    SendResult,
    SendStatus,
    as_text,
    hashing_queue_selector,
)
from client.compat_producer import Producer, TransactionMQProducer, TransactionStatus
from client.errors import MQClientError
from client.listeners import ConsumeOrderlyStatus
from client.listeners import ConsumeStatus as _ConsumeStatus
from client.message import MessageExt, MessageQueue
from client.pull_consumer import PullConsumer as _PullConsumer
from client.push_consumer import PushConsumer as _PushConsumer
from remoting import properties as props

__all__ = [
    "ConsumeStatus",
    "ConsumerException",
    "Message",
    "MessageModel",
    "MessageProperty",
    "Producer",
    "ProducerException",
    "ProducerSendAsyncFailed",
    "ProducerSendBatchFailed",
    "ProducerSendOnewayFailed",
    "ProducerSendOrderlyFailed",
    "ProducerSendSyncFailed",
    "ProducerStartFailed",
    "PullConsumer",
    "PullConsumerStartFailed",
    "PushConsumer",
    "PushConsumerStartFailed",
    "ReceivedMessage",
    "RecvMessage",
    "RocketMQException",
    "SendResult",
    "SendStatus",
    "TransactionMQProducer",
    "TransactionStatus",
    "hashing_queue_selector",
]

log = logging.getLogger("client.compat")


class PushConsumer(NameServerSettings):
    """`PushConsumer(group_id)`, `set_name_server_address`, `subscribe(topic, callback)`,
    `start()`, `shutdown()`. The callback gets one RecvMessage; returning None or
    CONSUME_SUCCESS consumes it, RECONSUME_LATER or an exception has it delivered again."""

    def __init__(
        self,
        group_id: str | bytes,
        orderly: bool = False,
        message_model: MessageModel = MessageModel.CLUSTERING,
    ) -> None:
        self._group = as_text(group_id)
        self._orderly = orderly
        self._model = message_model
        self._namesrv = DEFAULT_NAMESRV
        self._threads: int | None = None
        self._batch = 1
        self._instance: str | None = None
        self._subscriptions: list[tuple[str, Callable[[RecvMessage], Any], str]] = []
        self._consumer: _PushConsumer | None = None

    def set_group(self, group_id: str | bytes) -> None:
        self._group = as_text(group_id)

    def set_message_model(self, model: MessageModel) -> None:
        self._model = MessageModel(model)

    def set_thread_count(self, thread_count: int) -> None:
        self._threads = int(thread_count)

    def set_message_batch_max_size(self, max_size: int) -> None:
        self._batch = max(1, int(max_size))

    def set_instance_name(self, name: str | bytes) -> None:
        self._instance = as_text(name)

    def subscribe(
        self, topic: str | bytes, callback: Callable[[RecvMessage], Any], expression: str = "*"
    ) -> None:
        self._subscriptions.append((as_text(topic), callback, as_text(expression)))

    def start(self) -> None:
        if self._consumer is not None:
            return
        if not self._subscriptions:
            raise PushConsumerStartFailed("subscribe to a topic before start()")
        settings: dict[str, Any] = {}
        if self._threads is not None:
            settings["workers"] = self._threads
        model = "broadcasting" if self._model is MessageModel.BROADCASTING else "clustering"
        try:
            consumer = _PushConsumer(
                self._group, self._namesrv, model=model, instance_name=self._instance, **settings
            )
        except (MQClientError, ValueError, TypeError) as err:
            raise PushConsumerStartFailed(str(err)) from err
        callbacks = {}
        for topic, callback, expression in self._subscriptions:
            consumer.subscribe(topic, expression)
            callbacks[topic] = callback
        if self._orderly:
            consumer.register_orderly_listener(lambda batch: self._orderly_call(callbacks, batch))
        else:
            consumer.register_listener(lambda batch: self._call(callbacks, batch))
        try:
            consumer.start()
        except (MQClientError, ValueError) as err:
            raise PushConsumerStartFailed(str(err)) from err
        self._consumer = consumer

    def shutdown(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.shutdown()

    def __enter__(self) -> PushConsumer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @staticmethod
    def _consumed(
        callbacks: dict[str, Callable[[RecvMessage], Any]], batch: list[MessageExt]
    ) -> bool:
        for message in batch:
            topic = message.properties.get(props.RETRY_TOPIC, message.topic)
            callback = callbacks.get(topic) or callbacks.get(message.topic)
            if callback is None:
                continue
            try:
                answer = callback(RecvMessage(message))
            except Exception:
                log.exception("the consumer callback raised; the message will be delivered again")
                return False
            if answer is ConsumeStatus.RECONSUME_LATER or answer == ConsumeStatus.RECONSUME_LATER:
                return False
        return True

    def _call(
        self, callbacks: dict[str, Callable[[RecvMessage], Any]], batch: list[MessageExt]
    ) -> _ConsumeStatus:
        if self._consumed(callbacks, batch):
            return _ConsumeStatus.CONSUME_SUCCESS
        return _ConsumeStatus.RECONSUME_LATER

    def _orderly_call(
        self, callbacks: dict[str, Callable[[RecvMessage], Any]], batch: list[MessageExt]
    ) -> ConsumeOrderlyStatus:
        if self._consumed(callbacks, batch):
            return ConsumeOrderlyStatus.SUCCESS
        return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT


class PullConsumer(NameServerSettings):
    """0.4.x's pull consumer: `pull(topic)` yields every message from each queue's offset on,
    queue after queue, and remembers how far it got (in memory, per queue)."""

    def __init__(self, group_id: str | bytes) -> None:
        self._group = as_text(group_id)
        self._namesrv = DEFAULT_NAMESRV
        self._consumer: _PullConsumer | None = None
        self._offsets: dict[MessageQueue, int] = {}

    def set_group(self, group_id: str | bytes) -> None:
        self._group = as_text(group_id)

    def start(self) -> None:
        if self._consumer is None:
            try:
                consumer = _PullConsumer(self._group, self._namesrv)
                consumer.start()
            except (MQClientError, ValueError) as err:
                raise PullConsumerStartFailed(str(err)) from err
            self._consumer = consumer

    def shutdown(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.shutdown()

    def __enter__(self) -> PullConsumer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def get_message_queue_offset(self, mq: MessageQueue) -> int:
        return self._offsets.get(mq, 0)

    def set_message_queue_offset(self, mq: MessageQueue, offset: int) -> None:
        self._offsets[mq] = offset

    def pull(
        self, topic: str | bytes, expression: str = "*", max_num: int = 32
    ) -> Iterator[RecvMessage]:
        if self._consumer is None:
            raise RocketMQException("the pull consumer is not started")
        consumer = self._consumer
        for queue in consumer.fetch_queues(as_text(topic)):
            while True:
                offset = self.get_message_queue_offset(queue)
                result = consumer.pull(queue, offset, max_num, expression=as_text(expression))
                self.set_message_queue_offset(queue, result.next_begin_offset)
                if not result.messages:
                    if result.next_begin_offset == offset:
                        break
                    continue
                for message in result.messages:
                    yield RecvMessage(message)
