"""What mqadmin asks about consumers and topics (RocketMQ's AdminBrokerProcessor):
GET_CONSUMER_CONNECTION_LIST (203), GET_TOPIC_STATS_INFO (202), GET_CONSUME_STATS (208).

Answers come from this replica: its applied queues, the replicated consumer offsets (with the
commits this replica holds but has not written yet), and the clients that heartbeat *this*
replica, as each RocketMQ broker answers for its own connections. Maps keyed by a message queue
are written as fastjson writes them, the key an object (remoting/fastjson.py), so a Java
mqadmin reads them; docs/protocol.md#broker shows the bodies.
"""

from __future__ import annotations

from typing import Any

from broker.clients import Member
from broker.context import Broker
from dledger.log.errors import LogError
from remoting import fastjson, stored_message
from remoting.codes import LanguageCode, ResponseCode
from remoting.command import RemotingCommand
from remoting.connection import Connection
from remoting.headers import (
    GetConsumerConnectionListRequestHeader,
    GetConsumeStatsRequestHeader,
    TopicRequestHeader,
)
from remoting.tag_hash import tags_code

# ConsumeFromWhere: C++ sends the ordinal, Java the name; both orders are RocketMQ's enum's
CONSUME_FROM_WHERE = (
    "CONSUME_FROM_LAST_OFFSET",
    "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
    "CONSUME_FROM_MIN_OFFSET",
    "CONSUME_FROM_MAX_OFFSET",
    "CONSUME_FROM_FIRST_OFFSET",
    "CONSUME_FROM_TIMESTAMP",
)


def message_queue(broker: Broker, topic: str, queue_id: int) -> dict[str, Any]:
    """A MessageQueue as fastjson writes it (fields in name order)."""
    return {"brokerName": broker.config.group, "queueId": queue_id, "topic": topic}


def store_time_ms(broker: Broker, topic: str, queue_id: int, queue_offset: int) -> int:
    """Store timestamp of the message at `queue_offset`, 0 when there is none (any more)."""
    lo, hi = broker.state.queue_range(topic, queue_id)
    if not lo <= queue_offset < hi:
        return 0
    try:
        unit = broker.state.units(topic, queue_id, queue_offset, 1)[0]
        record = broker.state.record_at(unit.physical_offset)
    except (LogError, IndexError):
        return 0
    return stored_message.read_store_timestamp(record)


# --- GET_CONSUMER_CONNECTION_LIST ----------------------------------------------------------------


def _consume_from(value: object) -> str:
    if (
        isinstance(value, int)
        and not isinstance(value, bool)
        and 0 <= value < len(CONSUME_FROM_WHERE)
    ):
        return CONSUME_FROM_WHERE[value]
    return str(value) if value in CONSUME_FROM_WHERE else CONSUME_FROM_WHERE[0]


def _language(name: str) -> str:
    """The LanguageCode name a Java reader accepts (JSON headers carry any text)."""
    return name if name in LanguageCode.__members__ else LanguageCode.OTHER.name


def consumer_connection(members: list[Member]) -> dict[str, Any]:
    """RocketMQ's ConsumerConnection; the group-wide fields from the latest heartbeat."""
    latest = max(members, key=lambda m: m.last_seen)
    subscriptions: dict[str, Any] = {}
    for member in sorted(members, key=lambda m: m.last_seen):
        for topic, sub in member.subscriptions.items():
            tags = sorted(sub.tags)
            subscriptions[topic] = {
                "classFilterMode": False,
                "codeSet": [tags_code(t) for t in tags],
                "expressionType": sub.expression_type,
                "subString": sub.expression,
                "subVersion": sub.version,
                "tagsSet": tags,
                "topic": topic,
            }
    return {
        "connectionSet": [
            {
                "clientAddr": m.connection.peer,
                "clientId": m.client_id,
                "language": _language(m.language),
                "version": m.version,
            }
            for m in sorted(members, key=lambda m: m.client_id)
        ],
        "consumeFromWhere": _consume_from(latest.consume_from),
        "consumeType": latest.consume_type,
        "messageModel": latest.message_model,
        "subscriptionTable": subscriptions,
    }


async def handle_consumer_connections(
    broker: Broker, request: RemotingCommand, connection: Connection
) -> RemotingCommand:
    header = GetConsumerConnectionListRequestHeader.decode(request.ext_fields)
    members = list(broker.clients.consumers.get(header.consumer_group, {}).values())
    if not members:
        return request.response(
            ResponseCode.CONSUMER_NOT_ONLINE,
            f"the consumer group[{header.consumer_group}] not online",
        )
    body = fastjson.dumps(consumer_connection(members)).encode()
    return request.response(ResponseCode.SUCCESS, body=body)


# --- GET_TOPIC_STATS_INFO ------------------------------------------------------------------------


async def handle_topic_stats(
    broker: Broker, request: RemotingCommand, connection: Connection
) -> RemotingCommand:
    """TopicStatsTable: per write queue its min and max offsets and the store time of its last
    message (0 for an empty queue)."""
    header = TopicRequestHeader.decode(request.ext_fields)
    config = broker.topic(header.topic)
    if config is None:
        return request.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{header.topic}] not exist")
    pairs = []
    for queue_id in range(config.write_queues):
        lo, hi = broker.state.queue_range(header.topic, queue_id)
        last_ms = store_time_ms(broker, header.topic, queue_id, hi - 1) if hi > 0 else 0
        offsets = {"lastUpdateTimestamp": last_ms, "maxOffset": hi, "minOffset": lo}
        pairs.append((message_queue(broker, header.topic, queue_id), offsets))
    body = {"offsetTable": fastjson.ObjectKeyed.of(pairs)}
    return request.response(ResponseCode.SUCCESS, body=fastjson.dumps(body).encode())


# --- GET_CONSUME_STATS ---------------------------------------------------------------------------


def _group_topics(broker: Broker, group: str) -> list[str]:
    """The topics `group` has offsets for or live members subscribe to."""
    topics = {t for g, t, _q in broker.state.metadata.offsets if g == group}
    for member in broker.clients.consumers.get(group, {}).values():
        topics.update(member.subscriptions)
    return sorted(topics)


async def handle_consume_stats(
    broker: Broker, request: RemotingCommand, connection: Connection
) -> RemotingCommand:
    """ConsumeStats: per queue of each topic, the queue's end (brokerOffset), the group's
    committed offset (0 for none) and the store time of the last message it consumed."""
    header = GetConsumeStatsRequestHeader.decode(request.ext_fields)
    group = header.consumer_group
    topics = [header.topic] if header.topic else _group_topics(broker, group)
    pairs = []
    for topic in topics:
        config = broker.topic(topic)
        if config is None:
            continue  # as RocketMQ: a topic deleted since the group used it is left out
        for queue_id in range(config.write_queues):
            _lo, hi = broker.state.queue_range(topic, queue_id)
            committed = broker.offsets.query(group, topic, queue_id)
            consumer_offset = max(committed or 0, 0)
            last_ms = (
                store_time_ms(broker, topic, queue_id, consumer_offset - 1)
                if consumer_offset > 0
                else 0
            )
            wrapper = {
                "brokerOffset": hi,
                "consumerOffset": consumer_offset,
                "lastTimestamp": last_ms,
            }
            pairs.append((message_queue(broker, topic, queue_id), wrapper))
    body = {"consumeTps": 0.0, "offsetTable": fastjson.ObjectKeyed.of(pairs)}
    return request.response(ResponseCode.SUCCESS, body=fastjson.dumps(body).encode())
