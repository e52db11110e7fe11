"""The API of the deprecated native `rocketmq-client-python` (PyPI `rocketmq`), on our client.

A script written for the native binding switches with one import line and no native library:

    from rocketmq.client import Producer, Message        # before
    from client.compat import Producer, Message          # after

Both generations of that API are served: 0.4.x (`set_namesrv_addr`, `send_orderly(msg, arg)`
with a `queue_selector(mq_size, msg, arg)`) and 2.x (`set_name_server_address`,
`send_orderly_with_sharding_key`, listeners returning `ConsumeStatus`). What the native client
did in C++ threads runs on our client's trio thread and worker threads; what it could not do
(it keyed pull offsets by topic and queue id only, so two brokers' queue 0 shared one offset)
is done right here. Name-server domains and ACL credentials are not supported: setting them
raises, rather than silently connecting without them.
"""

from __future__ import annotations

import enum
import logging
from collections import namedtuple
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from client.blocking_producer import Producer as _Producer
from client.errors import MQClientError
from client.listeners import ConsumeOrderlyStatus
from client.listeners import ConsumeStatus as _ConsumeStatus
from client.message import Message as _Message
from client.message import MessageExt, MessageQueue
from client.pull_consumer import PullConsumer as _PullConsumer
from client.push_consumer import PushConsumer as _PushConsumer
from client.send_result import SendResult as _SendResult
from remoting import properties as props

__all__ = [
    "ConsumeStatus",
    "Message",
    "MessageModel",
    "MessageProperty",
    "Producer",
    "ProducerSendAsyncFailed",
    "ProducerSendSyncFailed",
    "PullConsumer",
    "PushConsumer",
    "RecvMessage",
    "RocketMQException",
    "SendResult",
    "SendStatus",
    "hashing_queue_selector",
]

log = logging.getLogger("client.compat")

DEFAULT_NAMESRV = "127.0.0.1:9876"
SendResult = namedtuple("SendResult", ["status", "msg_id", "offset"])


class SendStatus(enum.IntEnum):
    OK = 0
    FLUSH_DISK_TIMEOUT = 1
    FLUSH_SLAVE_TIMEOUT = 2
    SLAVE_NOT_AVAILABLE = 3


class ConsumeStatus(enum.IntEnum):
    CONSUME_SUCCESS = 0
    RECONSUME_LATER = 1


class MessageModel(enum.IntEnum):
    BROADCASTING = 0
    CLUSTERING = 1


class MessageProperty(enum.Enum):
    """Property names, as the native binding's consts.MessageProperty."""

    TRACE_SWITCH = "TRACE_ON"
    MSG_REGION = "MSG_REGION"
    KEYS = "KEYS"
    TAGS = "TAGS"
    WAIT_STORE_MSG_OK = "WAIT"
    DELAY_TIME_LEVEL = "DELAY"
    RETRY_TOPIC = "RETRY_TOPIC"
    REAL_TOPIC = "REAL_TOPIC"
    REAL_QUEUE_ID = "REAL_QID"
    TRANSACTION_PREPARED = "TRAN_MSG"
    PRODUCER_GROUP = "PGROUP"
    MIN_OFFSET = "MIN_OFFSET"
    MAX_OFFSET = "MAX_OFFSET"
    BUYER_ID = "BUYER_ID"
    ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
    TRANSFER_FLAG = "TRANSFER_FLAG"
    CORRECTION_FLAG = "CORRECTION_FLAG"
    MQ2_FLAG = "MQ2_FLAG"
    RECONSUME_TIME = "RECONSUME_TIME"
    UNIQ_CLIENT_MESSAGE_ID_KEYIDX = "UNIQ_KEY"
    MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
    CONSUME_START_TIMESTAMP = "CONSUME_START_TIME"


class RocketMQException(Exception):
    """Base of what this module raises, as the native binding's."""


class ProducerException(RocketMQException):
    pass


class ProducerStartFailed(ProducerException):
    pass


class ProducerSendSyncFailed(ProducerException):
    pass


class ProducerSendOnewayFailed(ProducerException):
    pass


class ProducerSendOrderlyFailed(ProducerException):
    pass


class ProducerSendAsyncFailed(ProducerException):
    pass


class ProducerSendBatchFailed(ProducerException):
    pass


class ConsumerException(RocketMQException):
    pass


class PushConsumerStartFailed(ConsumerException):
    pass


class PullConsumerStartFailed(ConsumerException):
    pass


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value


class Message:
    """A message to send: `Message(topic)`, then its setters."""

    def __init__(self, topic: str | bytes) -> None:
        self.topic = _text(topic)
        self._body = b""
        self._keys: str | None = None
        self._tags: str | None = None
        self._properties: dict[str, str] = {}
        self._delay_level = 0

    def set_keys(self, keys: str | bytes) -> None:
        self._keys = _text(keys)

    def set_tags(self, tags: str | bytes) -> None:
        self._tags = _text(tags)

    def set_body(self, body: str | bytes) -> None:
        self._body = _bytes(body)

    def set_property(self, key: str | bytes, value: str | bytes) -> None:
        self._properties[_text(key)] = _text(value)

    def set_delay_time_level(self, delay_time_level: int) -> None:
        self._delay_level = int(delay_time_level)

    def _ours(self) -> _Message:
        return _Message(
            self.topic,
            self._body,
            tags=self._tags,
            keys=self._keys,
            properties=dict(self._properties),
            delay_level=self._delay_level,
        )


class RecvMessage:
    """A received message, with the native binding's attribute names."""

    def __init__(self, message: MessageExt) -> None:
        self._message = message

    @property
    def topic(self) -> str:
        return self._message.topic

    @property
    def tags(self) -> str:
        return self._message.tags or ""

    @property
    def keys(self) -> str:
        return self._message.properties.get(props.KEYS, "")

    @property
    def body(self) -> bytes:
        return self._message.body

    @property
    def id(self) -> str:
        return self._message.msg_id

    @property
    def delay_time_level(self) -> int:
        return int(self._message.properties.get(props.DELAY, "0") or 0)

    @property
    def queue_id(self) -> int:
        return self._message.queue.queue_id

    @property
    def reconsume_times(self) -> int:
        return self._message.reconsume_times

    @property
    def store_size(self) -> int:
        return self._message.store_size

    @property
    def born_timestamp(self) -> int:
        return self._message.born_timestamp_ms

    @property
    def store_timestamp(self) -> int:
        return self._message.store_timestamp_ms

    @property
    def queue_offset(self) -> int:
        return self._message.queue_offset

    @property
    def commit_log_offset(self) -> int:
        return self._message.commit_log_offset

    @property
    def prepared_transaction_offset(self) -> int:
        return 0

    def get_property(self, prop: str | bytes | MessageProperty) -> str | None:
        key = prop.value if isinstance(prop, MessageProperty) else _text(prop)
        return self._message.properties.get(key)

    def __getitem__(self, key: str | bytes | MessageProperty) -> str | None:
        return self.get_property(key)

    def __str__(self) -> str:
        return self.body.decode(errors="replace")

    def __bytes__(self) -> bytes:
        return self.body

    def __repr__(self) -> str:
        return f"<RecvMessage topic={self.topic!r} id={self.id!r} body={self.body!r}>"


def hashing_queue_selector(mq_size: int, msg: Any, arg: Any) -> int:
    """The native default: an integer argument modulo the queue count."""
    return int(arg) % mq_size


def _result(result: _SendResult) -> tuple[SendStatus, str, int]:
    status = SendStatus[result.status.name.removeprefix("SEND_")]
    return SendResult(status, result.msg_id, result.queue_offset)


class Producer:
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
        self._group = _text(group_id)
        self._namesrv = DEFAULT_NAMESRV
        self._timeout_s: float | None = timeout / 1000 if timeout else None
        self._producer: _Producer | None = None
        if compress_level is not None:
            self.set_compress_level(compress_level)
        if max_message_size is not None:
            self.set_max_message_size(max_message_size)

    def set_group(self, group_name: str | bytes) -> None:
        self._group = _text(group_name)

    def set_name_server_address(self, addr: str | bytes) -> None:
        self._namesrv = _text(addr)

    set_namesrv_addr = set_name_server_address

    def set_namesrv_domain(self, domain: str | bytes) -> None:
        raise RocketMQException("name-server domains are not supported: give the addresses")

    def set_session_credentials(self, access_key: Any, access_secret: Any, channel: Any) -> None:
        raise RocketMQException("ACL credentials are not supported by this client")

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
            return _result(producer.send(msg._ours(), self._timeout_s))
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
                    success_callback(_result(outcome))
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
        return _result(result)

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
                msg._ours(), self._timeout_s, selector=hash_selector, arg=_text(sharding_key)
            )
        except MQClientError as err:
            raise ProducerSendOrderlyFailed(str(err)) from err
        return _result(result)

    def send_batch(self, msgs: Sequence[Message]) -> tuple[SendStatus, str, int]:
        if not msgs:
            raise ProducerSendBatchFailed("a batch needs at least one message")
        producer = self._running(ProducerSendBatchFailed)
        try:
            results = producer.send_batch([m._ours() for m in msgs], self._timeout_s)
        except MQClientError as err:
            raise ProducerSendBatchFailed(str(err)) from err
        first = results[0]
        status, _, offset = _result(first)
        return SendResult(status, ",".join(r.msg_id for r in results), offset)


class PushConsumer:
    """`PushConsumer(group_id)`, `set_name_server_address`, `subscribe(topic, callback)`,
    `start()`, `shutdown()`. The callback gets one RecvMessage; returning None or
    CONSUME_SUCCESS consumes it, RECONSUME_LATER or an exception has it delivered again."""

    def __init__(
        self,
        group_id: str | bytes,
        orderly: bool = False,
        message_model: MessageModel = MessageModel.CLUSTERING,
    ) -> None:
        self._group = _text(group_id)
        self._orderly = orderly
        self._model = message_model
        self._namesrv = DEFAULT_NAMESRV
        self._threads: int | None = None
        self._batch = 1
        self._instance: str | None = None
        self._subscriptions: list[tuple[str, Callable[[RecvMessage], Any], str]] = []
        self._consumer: _PushConsumer | None = None

    def set_group(self, group_id: str | bytes) -> None:
        self._group = _text(group_id)

    def set_name_server_address(self, addr: str | bytes) -> None:
        self._namesrv = _text(addr)

    set_namesrv_addr = set_name_server_address

    def set_namesrv_domain(self, domain: str | bytes) -> None:
        raise RocketMQException("name-server domains are not supported: give the addresses")

    def set_session_credentials(self, access_key: Any, access_secret: Any, channel: Any) -> None:
        raise RocketMQException("ACL credentials are not supported by this client")

    def set_message_model(self, model: MessageModel) -> None:
        self._model = MessageModel(model)

    def set_thread_count(self, thread_count: int) -> None:
        self._threads = int(thread_count)

    def set_message_batch_max_size(self, max_size: int) -> None:
        self._batch = max(1, int(max_size))

    def set_instance_name(self, name: str | bytes) -> None:
        self._instance = _text(name)

    def subscribe(
        self, topic: str | bytes, callback: Callable[[RecvMessage], Any], expression: str = "*"
    ) -> None:
        self._subscriptions.append((_text(topic), callback, _text(expression)))

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


class PullConsumer:
    """0.4.x's pull consumer: `pull(topic)` yields every message from each queue's offset on,
    queue after queue, and remembers how far it got (in memory, per queue)."""

    def __init__(self, group_id: str | bytes) -> None:
        self._group = _text(group_id)
        self._namesrv = DEFAULT_NAMESRV
        self._consumer: _PullConsumer | None = None
        self._offsets: dict[MessageQueue, int] = {}

    def set_group(self, group_id: str | bytes) -> None:
        self._group = _text(group_id)

    def set_name_server_address(self, addr: str | bytes) -> None:
        self._namesrv = _text(addr)

    set_namesrv_addr = set_name_server_address

    def set_namesrv_domain(self, domain: str | bytes) -> None:
        raise RocketMQException("name-server domains are not supported: give the addresses")

    def set_session_credentials(self, access_key: Any, access_secret: Any, channel: Any) -> None:
        raise RocketMQException("ACL credentials are not supported by this client")

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
        for queue in consumer.fetch_queues(_text(topic)):
            while True:
                offset = self.get_message_queue_offset(queue)
                result = consumer.pull(queue, offset, max_num, expression=_text(expression))
                self.set_message_queue_offset(queue, result.next_begin_offset)
                if not result.messages:
                    if result.next_begin_offset == offset:
                        break
                    continue
                for message in result.messages:
                    yield RecvMessage(message)
