"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310), SEND_BATCH_MESSAGE (320) and the C++ batch flag.

A send becomes one log entry per message, a batch one append of consecutive entries (all or
none), preceded in the same append by the topic's creation when it is auto-created. SEND_OK
means a quorum holds the messages (fsynced by it under SYNC_FLUSH): the answer waits for the
commit. The leader writes queue and physical offsets into the records as they enter the log
(broker/state.py), so the answer's msgId and queueOffset are those every replica holds.
"""

from __future__ import annotations

import logging
import random
import struct
import time

import attrs

from broker.context import Broker
from broker.entries import encode_meta
from broker.metadata import (
    DEFAULT_TOPIC,
    PERM_INHERIT,
    PERM_WRITE,
    Metadata,
    TopicConfig,
    topic_problem,
)
from broker.state import Placed
from broker.writes import WriteFailed, WriteUnknown
from remoting import properties as props
from remoting import stored_message
from remoting.codes import RequestCode, ResponseCode
from remoting.command import RemotingCommand
from remoting.connection import Connection
from remoting.errors import MessageFormatError
from remoting.headers import SendMessageRequestHeader, SendMessageResponseHeader
from remoting.message_id import offset_msg_id

log = logging.getLogger("broker.send")

# A batch body: records of totalSize, magic, bodyCRC, flag, bodyLen, body, propLen(int16), props
BATCH_HEAD = struct.Struct(">iiiii")
INT16 = struct.Struct(">h")
BATCH_MESSAGES_MAX = 1024  # RocketMQ has none beyond the 4 MiB body; ours bounds one append
SEND_TIMEOUT_S = 3.0  # the C++ client's default send timeout; a write waits at most this


@attrs.frozen
class Outgoing:
    body: bytes
    flag: int
    properties: bytes


class SendRefused(Exception):
    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark


def parse_batch(body: bytes) -> list[Outgoing]:
    out = []
    at = 0
    while at < len(body):
        if len(body) - at < BATCH_HEAD.size:
            raise SendRefused(ResponseCode.MESSAGE_ILLEGAL, "a batch record is cut short")
        total, _magic, _crc, flag, body_len = BATCH_HEAD.unpack_from(body, at)
        end = at + total
        props_at = at + BATCH_HEAD.size + body_len
        if total < BATCH_HEAD.size + 2 or end > len(body) or body_len < 0 or props_at + 2 > end:
            raise SendRefused(ResponseCode.MESSAGE_ILLEGAL, f"a batch record at {at} has bad sizes")
        (props_len,) = INT16.unpack_from(body, props_at)
        if props_len < 0 or props_at + 2 + props_len != end:
            raise SendRefused(ResponseCode.MESSAGE_ILLEGAL, f"a batch record at {at} has bad sizes")
        out.append(
            Outgoing(
                body[at + BATCH_HEAD.size : props_at],
                flag,
                body[props_at + 2 : end],
            )
        )
        at = end
        if len(out) > BATCH_MESSAGES_MAX:
            raise SendRefused(
                ResponseCode.MESSAGE_ILLEGAL, f"a batch of more than {BATCH_MESSAGES_MAX} messages"
            )
    if not out:
        raise SendRefused(ResponseCode.MESSAGE_ILLEGAL, "an empty batch")
    return out


def default_topic_config(broker: Broker) -> TopicConfig:
    perm = PERM_WRITE | 4 | (PERM_INHERIT if broker.config.auto_create_topic else 0)
    return TopicConfig(DEFAULT_TOPIC, 8, 8, perm)


def topic_for_send(
    broker: Broker, header: SendMessageRequestHeader
) -> tuple[TopicConfig, bytes | None]:
    """The topic's config, and the metadata entry creating it when it must be auto-created."""
    topic = header.topic
    problem = topic_problem(topic)
    if problem is not None:
        raise SendRefused(ResponseCode.SYSTEM_ERROR, problem)
    config = broker.topic(topic)
    if config is not None:
        return config, None
    template = broker.topic(header.default_topic) if header.default_topic else None
    if template is None or not template.perm & PERM_INHERIT or not broker.config.auto_create_topic:
        raise SendRefused(
            ResponseCode.TOPIC_NOT_EXIST,
            f"topic[{topic}] not exist, apply first please!",
        )
    queues = max(1, min(header.default_topic_queue_nums, template.write_queues))
    config = TopicConfig(topic, queues, queues, template.perm & ~PERM_INHERIT)
    return config, encode_meta(Metadata.topic_op(config))


async def handle_send(
    broker: Broker, request: RemotingCommand, connection: Connection
) -> RemotingCommand:
    short = request.code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE)
    header = SendMessageRequestHeader.decode(request.ext_fields, short_names=short)
    try:
        return await _send(broker, request, connection, header)
    except SendRefused as refused:
        return request.response(refused.code, refused.remark)


async def _send(
    broker: Broker,
    request: RemotingCommand,
    connection: Connection,
    header: SendMessageRequestHeader,
) -> RemotingCommand:
    config, create = topic_for_send(broker, header)
    if not config.perm & PERM_WRITE:
        raise SendRefused(
            ResponseCode.NO_PERMISSION, f"the topic[{config.name}] sending message is forbidden"
        )
    queue_id = header.queue_id
    if queue_id < 0:
        queue_id = random.randrange(config.write_queues)
    if queue_id >= config.write_queues:
        raise SendRefused(
            ResponseCode.SYSTEM_ERROR,
            f"queueId[{queue_id}] is illegal, topic:[{config.name}] "
            f"topicConfig.writeQueueNums:[{config.write_queues}] consumer:[{connection.peer}]",
        )
    batch = request.code == RequestCode.SEND_BATCH_MESSAGE or bool(header.batch)
    if batch:
        outgoing = parse_batch(request.body)
    else:
        outgoing = [Outgoing(request.body, header.flag, (header.properties or "").encode())]
    born_host = _host(connection.peer)
    store_host = broker.store_host
    now_ms = int(time.time() * 1000)
    records = []
    for message in outgoing:
        properties = message.properties
        if props.find(properties, b"CLUSTER") is None:
            properties += props.encode({"CLUSTER": broker.config.cluster})
        try:
            record = stored_message.pack(
                queue_id=queue_id,
                flag=message.flag,
                queue_offset=0,  # the leader writes both offsets as the entry enters the log
                physical_offset=0,
                sys_flag=header.sys_flag & ~0x30,  # hosts are stored as IPv4 (C++ reads them so)
                born_timestamp_ms=header.born_timestamp,
                born_host=born_host,
                store_timestamp_ms=now_ms,
                store_host=store_host,
                reconsume_times=header.reconsume_times or 0,
                prepared_transaction_offset=0,
                body=message.body,
                topic=config.name,
                properties_data=properties,
            )
        except MessageFormatError as err:
            raise SendRefused(ResponseCode.MESSAGE_ILLEGAL, str(err)) from err
        if len(record) > broker.config.message_bytes_max:
            raise SendRefused(
                ResponseCode.MESSAGE_ILLEGAL,
                f"the message is {len(record)} bytes stored; maxMessageSize is "
                f"{broker.config.message_bytes_max}",
            )
        records.append(record)
    disk_full = broker.disk.full()
    if disk_full is not None:  # RocketMQ's checkStoreStatus: the store is not writable
        raise SendRefused(
            ResponseCode.SERVICE_NOT_AVAILABLE,
            f"service not available now. It may be caused by one of the following reasons: "
            f"{disk_full}, messages are put to the slave, message store has been shut down, etc.",
        )
    bodies = ([create] if create is not None else []) + records
    try:
        written = await broker.writes.append(bodies, SEND_TIMEOUT_S)
    except WriteFailed as err:
        raise SendRefused(
            ResponseCode.SERVICE_NOT_AVAILABLE, f"service not available now: {err}"
        ) from err
    except WriteUnknown as err:
        uniq = props.find(outgoing[0].properties, b"UNIQ_KEY")
        raise SendRefused(
            ResponseCode.SYSTEM_ERROR,
            f"outcome unknown (the message may be stored): {err}; UNIQ_KEY "
            f"{uniq.decode() if uniq else '?'}",
        ) from err
    first = written.last_index - len(records) + 1
    placed = await broker.placements(first, written.last_index, shaped_here=written.through_leader)
    response = SendMessageResponseHeader(
        msg_id=",".join(offset_msg_id(store_host, p.physical_offset) for p in placed),
        queue_id=queue_id,
        queue_offset=placed[0].queue_offset,
    ).encode()
    response["MSG_REGION"] = "DefaultRegion"
    response["TRACE_ON"] = "true"
    return request.response(ResponseCode.SUCCESS, ext_fields=response)


def _host(peer: str) -> tuple[str, int]:
    host, _, port = peer.rpartition(":")
    try:
        return host.strip("[]") or "127.0.0.1", int(port)
    except ValueError:
        return "127.0.0.1", 0


__all__ = ["Placed", "handle_send"]
