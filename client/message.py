"""Messages as an application sends them (`Message`) and receives them (`MessageExt`).

A `Message` becomes the properties string and body of a send (remoting/properties.py); a pull
answer's body is stored records (remoting/stored_message.py), each decoded into a `MessageExt`
with its body inflated when the compressed bit of its sys flag is set, as RocketMQ clients do.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence

import attrs

from remoting import properties as props
from remoting import stored_message
from remoting.message_id import offset_msg_id
from remoting.stored_message import StoredMessage

SYS_FLAG_COMPRESSED = 0x1  # MessageSysFlag.COMPRESSED_FLAG: the body is zlib
COMPRESS_BODY_BYTES_MIN = 4 * 1024  # compressMsgBodyOverHowmuch: RocketMQ clients' default
COMPRESS_LEVEL = 5  # the Java client's default compressLevel


def _keys_text(keys: str | Sequence[str] | None) -> str | None:
    if keys is None:
        return None
    if isinstance(keys, str):
        return keys
    return props.KEY_SEPARATOR.join(keys)


@attrs.define
class Message:
    """One message to send. `keys` are business keys (indexed for queryMsgByKey); `tags` is
    the single tag consumers filter on; `properties` are user properties."""

    topic: str
    body: bytes
    tags: str | None = None
    keys: str | Sequence[str] | None = None
    properties: dict[str, str] = attrs.field(factory=dict)
    flag: int = 0  # stored verbatim
    delay_level: int = 0  # 1..18: RocketMQ's delay levels (served by the broker's delay feature)

    def __attrs_post_init__(self) -> None:
        if type(self.body) is bytes:  # what nearly every message has: nothing to do
            return
        if isinstance(self.body, str):  # a convenience the native client had
            self.body = self.body.encode()
        if not isinstance(self.body, bytes | bytearray | memoryview):
            raise TypeError(f"body must be bytes, not {type(self.body).__name__}")
        self.body = bytes(self.body)

    def wire_properties(self, uniq_key: str, *, wait: bool = True) -> dict[str, str]:
        """Every property this message is sent with, user properties first."""
        out = dict(self.properties)
        if self.tags:
            out[props.TAGS] = self.tags
        keys = _keys_text(self.keys)
        if keys:
            out[props.KEYS] = keys
        if self.delay_level:
            out[props.DELAY] = str(self.delay_level)
        out[props.UNIQ_KEY] = uniq_key
        out[props.WAIT] = "true" if wait else "false"
        return out


def compress_body(body: bytes) -> tuple[bytes, int]:
    """(bytes to send, sys flag bits): zlib for bodies of 4 KiB or more, as RocketMQ clients."""
    if len(body) >= COMPRESS_BODY_BYTES_MIN:
        return zlib.compress(body, COMPRESS_LEVEL), SYS_FLAG_COMPRESSED
    return body, 0


@attrs.frozen(order=True)
class MessageQueue:
    """One queue of a topic on one broker group, as RocketMQ names it."""

    topic: str
    broker_name: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.broker_name}/{self.queue_id}"

    def as_json(self) -> dict[str, object]:
        return {"topic": self.topic, "brokerName": self.broker_name, "queueId": self.queue_id}


@attrs.frozen
class MessageExt:
    """A message as a consumer receives it."""

    topic: str
    body: bytes
    properties: Mapping[str, str]
    queue: MessageQueue
    queue_offset: int
    commit_log_offset: int
    msg_id: str  # the UNIQ_KEY the producer set, else the offsetMsgId
    offset_msg_id: str  # where it is stored: store host and physical offset
    born_timestamp_ms: int
    store_timestamp_ms: int
    born_host: str
    store_host: str
    reconsume_times: int
    sys_flag: int
    flag: int
    store_size: int = 0  # the stored record's size, as the broker holds it

    @property
    def tags(self) -> str | None:
        return self.properties.get(props.TAGS)

    @property
    def keys(self) -> list[str]:
        text = self.properties.get(props.KEYS, "")
        return [k for k in text.split(props.KEY_SEPARATOR) if k]

    def get_property(self, key: str, default: str | None = None) -> str | None:
        return self.properties.get(key, default)

    @classmethod
    def from_stored(
        cls, record: StoredMessage, broker_name: str, store_size: int = 0
    ) -> MessageExt:
        body = record.body
        if record.sys_flag & SYS_FLAG_COMPRESSED:
            body = zlib.decompress(body)
        store_id = offset_msg_id(record.store_host, record.physical_offset)
        return cls(
            topic=record.topic,
            body=body,
            properties=record.properties,
            queue=MessageQueue(record.topic, broker_name, record.queue_id),
            queue_offset=record.queue_offset,
            commit_log_offset=record.physical_offset,
            msg_id=record.properties.get(props.UNIQ_KEY, store_id),
            offset_msg_id=store_id,
            born_timestamp_ms=record.born_timestamp_ms,
            store_timestamp_ms=record.store_timestamp_ms,
            born_host=f"{record.born_host[0]}:{record.born_host[1]}",
            store_host=f"{record.store_host[0]}:{record.store_host[1]}",
            reconsume_times=record.reconsume_times,
            sys_flag=record.sys_flag,
            flag=record.flag,
            store_size=store_size,
        )


def decode_records(body: bytes, broker_name: str) -> list[MessageExt]:
    """Every stored record of a pull answer's body (or a query answer's), in order."""
    out = []
    at = 0
    while at < len(body):
        size = stored_message.read_size(body, at)
        out.append(MessageExt.from_stored(stored_message.decode(body, at), broker_name, size))
        at += size
    return out
