"""client.compat's messages, results, enums and exceptions: the native binding's (PyPI
`rocketmq`, 0.4.x and 2.x) names and shapes, on our client's types. Import them from
client.compat."""

from __future__ import annotations

import enum
from collections import namedtuple
from typing import Any

from client.message import Message as _Message
from client.message import MessageExt
from client.send_result import SendResult as _SendResult
from remoting import properties as props

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


def as_text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def as_bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value


class NameServerSettings:
    """The name-server and credential setters every client class of the binding has."""

    _namesrv: str

    def set_name_server_address(self, addr: str | bytes) -> None:
        self._namesrv = as_text(addr)

    set_namesrv_addr = set_name_server_address

    def set_namesrv_domain(self, domain: str | bytes) -> None:
        raise RocketMQException("name-server domains are not supported: give the addresses")

    def set_session_credentials(self, access_key: Any, access_secret: Any, channel: Any) -> None:
        raise RocketMQException("ACL credentials are not supported by this client")


class Message:
    """A message to send: `Message(topic)`, then its setters."""

    def __init__(self, topic: str | bytes) -> None:
        self.topic = as_text(topic)
        self._body = b""
        self._keys: str | None = None
        self._tags: str | None = None
        self._properties: dict[str, str] = {}
        self._delay_level = 0

    def set_keys(self, keys: str | bytes) -> None:
        self._keys = as_text(keys)

    def set_tags(self, tags: str | bytes) -> None:
        self._tags = as_text(tags)

    def set_body(self, body: str | bytes) -> None:
        self._body = as_bytes(body)

    def set_property(self, key: str | bytes, value: str | bytes) -> None:
        self._properties[as_text(key)] = as_text(value)

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
        key = prop.value if isinstance(prop, MessageProperty) else as_text(prop)
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


def send_result(result: _SendResult) -> tuple[SendStatus, str, int]:
    status = SendStatus[result.status.name.removeprefix("SEND_")]
    return SendResult(status, result.msg_id, result.queue_offset)


ReceivedMessage = RecvMessage  # the 2.x binding's name for it
