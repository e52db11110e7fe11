"""CONSUMER_SEND_MSG_BACK (36): a consumer gives a message back for a later retry, RocketMQ's
SendMessageProcessor.consumerSendMsgBack.

The C++ client sends it to the store host recorded in the message, which may be a follower by
now: any replica reads the message at the physical offset from its own log (waiting briefly
for one it has not applied yet) and stores the retry through the write path, forwarded to the
leader like a send. The new message keeps the original's body, flag, properties (UNIQ_KEY
among them), born time and host, with reconsumeTimes + 1, RETRY_TOPIC (the topic it was first
sent to) and ORIGIN_MESSAGE_ID (the first failed message's offsetMsgId). It goes:

- to `%RETRY%<group>` (1 queue, perm 6, created on demand) after the delay of level
  3 + reconsumeTimes, or the request's delayLevel when > 0 (a level past the last is the
  last), through the delay machinery (broker/delays.py, broker/schedule.py);
- to `%DLQ%<group>` at once once reconsumeTimes reached maxReconsumeTimes (the request's when
  >= 0, else the group's retryMaxTimes, 16 by default), or when delayLevel < 0. RocketMQ creates
  the DLQ write-only (perm 2), so nobody reads it until an operator changes that; ours is
  created read-write (perm 6) so that `mqadmin` and a PullConsumer read dead letters as they are
  (docs/decisions.md). No push consumer subscribes to it on its own.
"""

from __future__ import annotations

import logging
import random
import time

from broker import delays
from broker.context import Broker
from broker.entries import encode_meta
from broker.lookup import LookupFailed, message_at
from broker.metadata import (
    DLQ_GROUP_PREFIX,
    PERM_READ,
    PERM_WRITE,
    RETRY_GROUP_PREFIX,
    GroupConfig,
    Metadata,
    TopicConfig,
)
from broker.schedule import schedule_topic_op
from broker.send import DLQ_QUEUES
from broker.transactions import HALF_OFFSET
from broker.writes import WriteFailed, WriteUnknown
from remoting import properties as props
from remoting import stored_message
from remoting.codes import ResponseCode
from remoting.command import RemotingCommand
from remoting.connection import Connection
from remoting.errors import MessageFormatError
from remoting.headers import ConsumerSendMsgBackRequestHeader
from remoting.message_id import offset_msg_id

log = logging.getLogger("broker.send_back")

WRITE_TIMEOUT_S = 3.0  # as a send's
RETRY_PERM = DLQ_PERM = PERM_READ | PERM_WRITE


class Refused(Exception):
    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark


async def handle_send_back(
    broker: Broker, request: RemotingCommand, connection: Connection
) -> RemotingCommand:
    header = ConsumerSendMsgBackRequestHeader.decode(request.ext_fields)
    try:
        await send_back(broker, header)
    except Refused as refused:
        return request.response(refused.code, refused.remark)
    return request.response(ResponseCode.SUCCESS)


async def send_back(broker: Broker, header: ConsumerSendMsgBackRequestHeader) -> None:
    """Store the retry (or dead letter) of the message at `header.offset`; Refused if not."""
    group = header.group
    metas: list[bytes] = []
    group_config = broker.state.metadata.groups.get(group)
    if group_config is None:
        if not broker.config.auto_create_subscription_group:
            raise Refused(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {group}"
            )
        group_config = GroupConfig(group)
        metas.append(encode_meta(Metadata.group_op(group_config)))
    if group_config.retry_queues <= 0:
        return  # RocketMQ answers SUCCESS and drops it
    original = await _original(broker, header.offset)
    limit = header.max_reconsume_times
    if limit is None or limit < 0:
        limit = group_config.retry_max_times
    properties = dict(original.properties)
    properties.pop(delays.SOURCE, None)
    properties.pop(HALF_OFFSET, None)  # a commit's mark: its retry commits nothing
    properties.setdefault(props.RETRY_TOPIC, original.topic)
    if not properties.get(props.ORIGIN_MESSAGE_ID):
        properties[props.ORIGIN_MESSAGE_ID] = offset_msg_id(
            original.store_host, original.physical_offset
        )
    now_ms = int(time.time() * 1000)
    if original.reconsume_times >= limit or header.delay_level < 0:
        topic, queue_id = DLQ_GROUP_PREFIX + group, random.randrange(DLQ_QUEUES)
        wanted = TopicConfig(topic, DLQ_QUEUES, DLQ_QUEUES, DLQ_PERM)
        properties.pop(props.DELAY, None)
        delay = None
    else:
        topic = RETRY_GROUP_PREFIX + group
        queue_id = random.randrange(group_config.retry_queues)
        wanted = TopicConfig(
            topic, group_config.retry_queues, group_config.retry_queues, RETRY_PERM
        )
        level = header.delay_level or delays.RETRY_LEVEL_BASE + original.reconsume_times
        delay = delays.level_delay(level, now_ms, broker.config.delay_levels)
    config = broker.topic(topic)
    if config is None:
        config = wanted
        metas.append(encode_meta(Metadata.topic_op(config)))
    if not config.perm & PERM_WRITE:
        raise Refused(
            ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending message is forbidden"
        )
    queue_id %= max(1, config.write_queues)
    record_topic, record_queue_id = topic, queue_id
    if delay is not None:
        properties = delays.scheduled_properties(properties, topic, queue_id, delay)
        record_topic, record_queue_id = delay.topic, delay.queue_id
        op = schedule_topic_op(broker.state.metadata, delay, len(broker.config.delay_levels))
        if op is not None:
            metas.append(encode_meta(op))
    try:
        record = stored_message.pack(
            queue_id=record_queue_id,
            flag=original.flag,
            queue_offset=0,
            physical_offset=0,
            sys_flag=original.sys_flag & ~stored_message.STORE_HOST_V6_FLAG,
            born_timestamp_ms=original.born_timestamp_ms,
            born_host=original.born_host,
            store_timestamp_ms=now_ms,
            store_host=broker.store_host,
            reconsume_times=original.reconsume_times + 1,
            prepared_transaction_offset=0,
            body=original.body,
            topic=record_topic,
            properties_data=props.encode(properties),
        )
    except MessageFormatError as err:
        raise Refused(ResponseCode.MESSAGE_ILLEGAL, str(err)) from err
    try:
        await broker.writes.append([*metas, record], WRITE_TIMEOUT_S)
    except WriteFailed as err:
        raise Refused(
            ResponseCode.SERVICE_NOT_AVAILABLE, f"service not available now: {err}"
        ) from err
    except WriteUnknown as err:
        raise Refused(
            ResponseCode.SYSTEM_ERROR, f"outcome unknown (the retry may be stored): {err}"
        ) from err
    log.debug(
        "message at %d of %s sent back to %s (reconsumeTimes %d)",
        header.offset,
        group,
        topic,
        original.reconsume_times + 1,
    )


async def _original(broker: Broker, physical_offset: int) -> stored_message.StoredMessage:
    """The stored message at `physical_offset` (broker/lookup.py), or Refused."""
    try:
        return await message_at(broker.state, physical_offset)
    except LookupFailed as err:
        raise Refused(ResponseCode.SYSTEM_ERROR, str(err)) from err
