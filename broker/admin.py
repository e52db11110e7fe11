"""Administration: topics and subscription groups (through the log), broker info and config.

UPDATE_AND_CREATE_TOPIC (17), DELETE_TOPIC_IN_BROKER (215), GET_ALL_TOPIC_CONFIG (21),
UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200), DELETE_SUBSCRIPTIONGROUP (207),
GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201), GET_BROKER_RUNTIME_INFO (28), GET_BROKER_CONFIG (26).
A change is answered once the group's log holds it (any replica may take it; a follower
forwards it), and every replica re-registers its topics with the name servers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping

from broker.context import Broker
from broker.entries import encode_meta
from broker.metadata import QUEUES_MAX, GroupConfig, Metadata, TopicConfig, topic_problem
from broker.schedule import schedule_info
from broker.writes import WriteFailed, WriteUnknown
from remoting.codes import ResponseCode
from remoting.command import RemotingCommand
from remoting.connection import Connection

ADMIN_WRITE_TIMEOUT_S = 5.0


def _int(fields: Mapping[str, str], key: str, default: int) -> int:
    value = fields.get(key)
    if value is None or value == "":
        return default
    return int(value)


def _bool(fields: Mapping[str, str], key: str, default: bool) -> bool:
    value = fields.get(key)
    if value is None or value == "":
        return default
    return value.lower() in ("true", "1")


async def _write(
    broker: Broker, request: RemotingCommand, op: dict[str, object]
) -> RemotingCommand:
    try:
        await broker.writes.append([encode_meta(op)], ADMIN_WRITE_TIMEOUT_S)
    except WriteFailed as err:
        return request.response(ResponseCode.SERVICE_NOT_AVAILABLE, f"not written: {err}")
    except WriteUnknown as err:
        return request.response(ResponseCode.SYSTEM_ERROR, f"outcome unknown: {err}")
    broker.registrar.topics_changed()
    return request.response(ResponseCode.SUCCESS)


async def handle_update_topic(
    broker: Broker, request: RemotingCommand, connection: Connection
) -> RemotingCommand:
    fields = request.ext_fields
    topic = fields.get("topic", "")
    problem = topic_problem(topic)
    if problem is not None:
        return request.response(ResponseCode.SYSTEM_ERROR, problem)
    try:
        read = _int(fields, "readQueueNums", broker.config.default_topic_queues)
        write = _int(fields, "writeQueueNums", broker.config.default_topic_queues)
        perm = _int(fields, "perm", 6)
        sys_flag = _int(fields, "topicSysFlag", 0)
    except ValueError as err:
        return request.response(ResponseCode.SYSTEM_ERROR, f"bad header: {err}")
    if not (1 <= read <= QUEUES_MAX and 1 <= write <= QUEUES_MAX):
        return request.response(ResponseCode.SYSTEM_ERROR, f"queue counts must be 1..{QUEUES_MAX}")
    config = TopicConfig(topic, read, write, perm, sys_flag, _bool(fields, "order", False))
    return await _write(broker, request, Metadata.topic_op(config))


async def handle_delete_topic(
    broker: Broker, request: RemotingCommand, connection: Connection
) -> RemotingCommand:
    topic = request.ext_fields.get("topic", "")
    if topic_problem(topic) is not None:
        return request.response(ResponseCode.SYSTEM_ERROR, topic_problem(topic) or "")
    return await _write(broker, request, {"op": "delete_topic", "topic": topic})


async def handle_all_topic_config(
    broker: Broker, request: RemotingCommand, connection: Connection
) -> RemotingCommand:
    body = {
        "topicConfigTable": {n: c.to_json() for n, c in broker.all_topics().items()},
        "dataVersion": {"timestamp": broker.started_ms, "counter": broker.state.metadata.version},
    }
    return request.response(ResponseCode.SUCCESS, body=json.dumps(body).encode())


async def handle_update_group(
    broker: Broker, request: RemotingCommand, connection: Connection
) -> RemotingCommand:
    try:
        body = json.loads(request.body or b"{}")
        group = GroupConfig(
            str(body["groupName"]),
            bool(body.get("consumeEnable", True)),
            bool(body.get("consumeBroadcastEnable", True)),
            int(body.get("retryQueueNums", 1)),
            int(body.get("retryMaxTimes", 16)),
        )
    except (ValueError, KeyError, TypeError) as err:
        return request.response(
            ResponseCode.SYSTEM_ERROR, f"bad SubscriptionGroupConfig body: {err}"
        )
    return await _write(broker, request, Metadata.group_op(group))


async def handle_delete_group(
    broker: Broker, request: RemotingCommand, connection: Connection
) -> RemotingCommand:
    group = request.ext_fields.get("groupName", "")
    if not group:
        return request.response(ResponseCode.SYSTEM_ERROR, "groupName is missing")
    return await _write(broker, request, {"op": "delete_group", "group": group})


async def handle_all_groups(
    broker: Broker, request: RemotingCommand, connection: Connection
) -> RemotingCommand:
    body = {
        "subscriptionGroupTable": {n: g.to_json() for n, g in broker.state.metadata.groups.items()},
        "dataVersion": {"timestamp": broker.started_ms, "counter": broker.state.metadata.version},
    }
    return request.response(ResponseCode.SUCCESS, body=json.dumps(body).encode())


def runtime_info(broker: Broker) -> dict[str, str]:
    node = broker.node
    role = node.role
    table = {
        "brokerVersionDesc": "V4_9_4 (dledger-mq)",
        "brokerVersion": "401",
        "brokerName": broker.config.group,
        "brokerAddr": broker.address,
        "clusterName": broker.config.cluster,
        "brokerRole": "SYNC_MASTER" if role.role.value == "leader" else "SLAVE",
        "raftRole": role.role.value,
        "raftTerm": str(role.term),
        "raftLeader": role.leader or "",
        "raftSelfId": broker.config.self_id,
        "commitIndex": str(node.commit_index),
        "appliedIndex": str(broker.state.applied_index),
        "lastIndex": str(node.last_index),
        "commitLogMinOffset": str(node.first_index),
        "commitLogMaxOffset": str(node.store.next_position),
        "bootTimestamp": str(broker.started_ms),
        "flushDiskType": broker.config.flush.value,
        "forwardedWrites": str(broker.writes.forwarded),
        "pullColdReadBytes": str(broker.cold_read_bytes),
        "lookupColdReadBytes": str(broker.state.lookup_cold_read_bytes),
        "offsetEntriesWritten": str(broker.offsets.entries_written),
        "sendRequests": str(broker.send_requests),
        "sendAppends": str(broker.send_appends),
        "raftProposals": str(node.metrics["proposals"]),
        "raftProposedEntries": str(node.metrics["proposed_entries"]),
        "topicCount": str(len(broker.state.metadata.topics)),
    }
    table.update(schedule_info(broker.state))
    table.update(broker.state.metadata.transactions.runtime_info(int(time.time() * 1000)))
    return table


async def handle_runtime_info(
    broker: Broker, request: RemotingCommand, connection: Connection
) -> RemotingCommand:
    return request.response(
        ResponseCode.SUCCESS, body=json.dumps({"table": runtime_info(broker)}).encode()
    )


async def handle_broker_config(
    broker: Broker, request: RemotingCommand, connection: Connection
) -> RemotingCommand:
    from broker.config import format_properties

    text = format_properties(broker.config)
    return request.response(ResponseCode.SUCCESS, body=text.encode())
