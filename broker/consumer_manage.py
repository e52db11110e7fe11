"""Offsets: QUERY_CONSUMER_OFFSET (14), UPDATE_CONSUMER_OFFSET (15), GET_MAX_OFFSET (30),
GET_MIN_OFFSET (31), SEARCH_OFFSET_BY_TIMESTAMP (29), GET_EARLIEST_MSG_STORETIME (32); and the
client registry's requests: HEART_BEAT (34), UNREGISTER_CLIENT (35),
GET_CONSUMER_LIST_BY_GROUP (38), LOCK_BATCH_MQ (41), UNLOCK_BATCH_MQ (42), CHECK_CLIENT_CONFIG
(46)."""

from __future__ import annotations

import json
import logging
import time

import trio

from broker.clients import decode_json_body
from broker.context import Broker
from broker.entries import encode_meta
from broker.filter.errors import FilterError
from broker.filter.subscription import compile_subscription, expression_type_of
from broker.metadata import RETRY_GROUP_PREFIX, GroupConfig, Metadata, TopicConfig
from broker.writes import WriteFailed, WriteUnknown
from dledger.log.errors import LogError
from remoting import stored_message
from remoting.codes import ResponseCode
from remoting.command import RemotingCommand
from remoting.connection import Connection
from remoting.headers import (
    OFFSET_UNSETTLED_AT_ONCE_FIELD,
    OFFSET_UNSETTLED_FIELD,
    GetConsumerListByGroupRequestHeader,
    GetEarliestMsgStoretimeResponseHeader,
    OffsetResponseHeader,
    QueryConsumerOffsetRequestHeader,
    QueueRequestHeader,
    SearchOffsetRequestHeader,
    UnregisterClientRequestHeader,
    UpdateConsumerOffsetRequestHeader,
)

log = logging.getLogger("broker.consumer_manage")

META_WRITE_TIMEOUT_S = 3.0


def _offset(request: RemotingCommand, offset: int) -> RemotingCommand:
    return request.response(
        ResponseCode.SUCCESS, ext_fields=OffsetResponseHeader(offset=offset).encode()
    )


async def handle_query_consumer_offset(
    broker: Broker, request: RemotingCommand, connection: Connection
) -> RemotingCommand:
    header = QueryConsumerOffsetRequestHeader.decode(request.ext_fields)
    if (
        request.ext_fields.get(OFFSET_UNSETTLED_AT_ONCE_FIELD) == "true"
        and broker.node.leader is None
    ):
        settled = False  # our client, with other replicas to ask: no wait for an election here
    else:
        settled = await broker.offsets.settle()  # broker/offsets.py: why a read settles first
    if not settled:
        log.warning(
            "offset of %s on %s/%d read before this replica settled (no leader?): it may be "
            "older than the group's",
            header.consumer_group,
            header.topic,
            header.queue_id,
        )
    response = _query_answer(broker, request, header)
    if settled:
        return response
    # our client asks the group's other replicas first; RocketMQ's ignore the field
    return response._replace(ext_fields={**response.ext_fields, OFFSET_UNSETTLED_FIELD: "true"})


def _query_answer(
    broker: Broker, request: RemotingCommand, header: QueryConsumerOffsetRequestHeader
) -> RemotingCommand:
    offset = broker.offsets.query(header.consumer_group, header.topic, header.queue_id)
    if offset is not None:
        return _offset(request, offset)
    lo, _hi = broker.state.queue_range(header.topic, header.queue_id)
    if lo <= 0:  # nothing deleted from the queue yet: a new group starts at its beginning
        return _offset(request, 0)
    return request.response(
        ResponseCode.QUERY_NOT_FOUND,
        "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first",
    )


async def handle_update_consumer_offset(
    broker: Broker, request: RemotingCommand, connection: Connection
) -> RemotingCommand:
    header = UpdateConsumerOffsetRequestHeader.decode(request.ext_fields)
    broker.offsets.commit(
        header.consumer_group, header.topic, header.queue_id, header.commit_offset
    )
    return request.response(ResponseCode.SUCCESS)


async def handle_max_offset(
    broker: Broker, request: RemotingCommand, connection: Connection
) -> RemotingCommand:
    header = QueueRequestHeader.decode(request.ext_fields)
    return _offset(request, broker.state.queue_range(header.topic, header.queue_id)[1])


async def handle_min_offset(
    broker: Broker, request: RemotingCommand, connection: Connection
) -> RemotingCommand:
    header = QueueRequestHeader.decode(request.ext_fields)
    return _offset(request, broker.state.queue_range(header.topic, header.queue_id)[0])


def _store_time(broker: Broker, topic: str, queue_id: int, queue_offset: int) -> int:
    unit = broker.state.units(topic, queue_id, queue_offset, 1)[0]
    return stored_message.read_store_timestamp(broker.state.record_at(unit.physical_offset))


async def handle_earliest_store_time(
    broker: Broker, request: RemotingCommand, connection: Connection
) -> RemotingCommand:
    header = QueueRequestHeader.decode(request.ext_fields)
    lo, hi = broker.state.queue_range(header.topic, header.queue_id)
    if lo >= hi:
        return request.response(
            ResponseCode.SYSTEM_ERROR, f"no message in {header.topic}/{header.queue_id}"
        )
    try:
        timestamp = _store_time(broker, header.topic, header.queue_id, lo)
    except LogError as err:
        return request.response(ResponseCode.SYSTEM_ERROR, str(err))
    fields = GetEarliestMsgStoretimeResponseHeader(timestamp=timestamp).encode()
    return request.response(ResponseCode.SUCCESS, ext_fields=fields)


async def handle_search_offset(
    broker: Broker, request: RemotingCommand, connection: Connection
) -> RemotingCommand:
    """The first queue offset whose message was stored at or after `timestamp` (the queue's
    end when none was), by binary search: store times grow along a queue."""
    header = SearchOffsetRequestHeader.decode(request.ext_fields)
    lo, hi = broker.state.queue_range(header.topic, header.queue_id)
    try:
        while lo < hi:
            mid = (lo + hi) // 2
            if _store_time(broker, header.topic, header.queue_id, mid) < header.timestamp:
                lo = mid + 1
            else:
                hi = mid
    except LogError as err:
        return request.response(ResponseCode.SYSTEM_ERROR, str(err))
    return _offset(request, lo)


# --- clients ------------------------------------------------------------------------------------


async def handle_heartbeat(
    broker: Broker, request: RemotingCommand, connection: Connection
) -> RemotingCommand:
    try:
        body = decode_json_body(request.body)
    except ValueError as err:
        return request.response(ResponseCode.SYSTEM_ERROR, f"bad heartbeat body: {err}")
    groups = broker.clients.heartbeat(body, connection, request.language, request.version)
    ops = []
    for group, model in groups:
        if (
            broker.config.auto_create_subscription_group
            and group not in broker.state.metadata.groups
        ):
            ops.append(Metadata.group_op(GroupConfig(group)))
        retry = RETRY_GROUP_PREFIX + group
        if model == "CLUSTERING" and broker.topic(retry) is None:
            ops.append(Metadata.topic_op(TopicConfig(retry, 1, 1, 6)))
    if ops:
        # the answer does not wait for it: the retry topic appears a commit later
        broker.background.start_soon(_write_meta, broker, [encode_meta(op) for op in ops])
    return request.response(ResponseCode.SUCCESS)


async def _write_meta(broker: Broker, bodies: list[bytes]) -> None:
    try:
        await broker.writes.append(bodies, META_WRITE_TIMEOUT_S)
    except (WriteFailed, WriteUnknown) as err:
        log.warning("metadata from a heartbeat not written: %s (the next heartbeat retries)", err)


async def handle_check_client_config(
    broker: Broker, request: RemotingCommand, connection: Connection
) -> RemotingCommand:
    """CHECK_CLIENT_CONFIG: the Java consumer asks, before it starts, whether this broker takes
    its SQL92 subscription (RocketMQ's ClientManageProcessor.checkClientConfig). Body
    CheckClientRequestBody {"clientId", "group", "subscriptionData": {"topic", "subString",
    "expressionType", ...}}; TAG subscriptions and a body without subscriptionData pass."""
    try:
        body = decode_json_body(request.body)
    except ValueError as err:
        return request.response(ResponseCode.SYSTEM_ERROR, f"bad CheckClientRequestBody: {err}")
    data = body.get("subscriptionData")
    if not isinstance(data, dict):
        return request.response(ResponseCode.SUCCESS)
    expression_type = expression_type_of(str(data.get("expressionType") or ""))
    if expression_type == "TAG":
        return request.response(ResponseCode.SUCCESS)
    if not broker.config.enable_property_filter:
        return request.response(
            ResponseCode.SYSTEM_ERROR,
            f"The broker does not support consumer to filter message by {expression_type}",
        )
    try:
        compile_subscription(expression_type, str(data.get("subString") or ""))
    except FilterError as err:
        return request.response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(err))
    return request.response(ResponseCode.SUCCESS)


async def handle_unregister(
    broker: Broker, request: RemotingCommand, connection: Connection
) -> RemotingCommand:
    header = UnregisterClientRequestHeader.decode(request.ext_fields)
    broker.clients.unregister(header.client_id, header.producer_group, header.consumer_group)
    return request.response(ResponseCode.SUCCESS)


async def handle_consumer_list(
    broker: Broker, request: RemotingCommand, connection: Connection
) -> RemotingCommand:
    header = GetConsumerListByGroupRequestHeader.decode(request.ext_fields)
    ids = broker.clients.consumer_ids(header.consumer_group)
    if not ids:
        return request.response(
            ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {header.consumer_group}"
        )
    return request.response(ResponseCode.SUCCESS, body=json.dumps({"consumerIdList": ids}).encode())


def _queues(body: dict[str, object]) -> list[tuple[str, str, int]]:
    queues = []
    for mq in body.get("mqSet") or []:  # type: ignore[attr-defined]
        queues.append((str(mq["topic"]), str(mq["brokerName"]), int(mq["queueId"])))
    return queues


async def handle_lock(
    broker: Broker, request: RemotingCommand, connection: Connection
) -> RemotingCommand:
    """Locks go through the log, so they hold across a leader change: the request becomes a
    lock entry (any replica may take it), every replica decides it the same way as it applies
    it (broker/metadata.py), and the answer is what this replica's state then says."""
    try:
        body = decode_json_body(request.body)
        queues = _queues(body)
    except (ValueError, KeyError, TypeError) as err:
        return request.response(ResponseCode.SYSTEM_ERROR, f"bad lock body: {err}")
    group, client = str(body.get("consumerGroup", "")), str(body.get("clientId", ""))
    op = Metadata.lock_op(group, client, queues, int(time.time() * 1000))
    try:
        written = await broker.writes.append([encode_meta(op)], META_WRITE_TIMEOUT_S)
        with trio.fail_after(META_WRITE_TIMEOUT_S):
            await broker.state.wait_applied(written.last_index)
    except (WriteFailed, WriteUnknown, trio.TooSlowError) as err:
        return request.response(ResponseCode.SYSTEM_ERROR, f"locks not taken: {err}")
    granted = broker.state.metadata.held_by(group, client, queues)
    answer = {"lockOKMQSet": [{"topic": t, "brokerName": b, "queueId": q} for t, b, q in granted]}
    return request.response(ResponseCode.SUCCESS, body=json.dumps(answer).encode())


async def handle_unlock(
    broker: Broker, request: RemotingCommand, connection: Connection
) -> RemotingCommand:
    try:
        body = decode_json_body(request.body)
        queues = _queues(body)
    except (ValueError, KeyError, TypeError) as err:
        return request.response(ResponseCode.SYSTEM_ERROR, f"bad unlock body: {err}")
    group, client = str(body.get("consumerGroup", "")), str(body.get("clientId", ""))
    try:
        await broker.writes.append(
            [encode_meta(Metadata.unlock_op(group, client, queues))], META_WRITE_TIMEOUT_S
        )
    except (WriteFailed, WriteUnknown) as err:
        return request.response(ResponseCode.SYSTEM_ERROR, f"locks not released: {err}")
    return request.response(ResponseCode.SUCCESS)
