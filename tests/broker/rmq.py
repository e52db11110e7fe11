"""A few RocketMQ requests over remoting/, as tests of the broker make them (the Python client
proper is issue 30's)."""

from __future__ import annotations

import json
import time
from typing import Any

from remoting import stored_message
from remoting.codes import RequestCode, ResponseCode
from remoting.command import RemotingCommand
from remoting.connection import Connection
from remoting.stored_message import StoredMessage


def properties(**values: str) -> str:
    return "".join(f"{k}\x01{v}\x02" for k, v in values.items())


async def send(
    conn: Connection,
    topic: str,
    queue_id: int,
    body: bytes,
    *,
    props: str = "",
    timeout_s: float = 10.0,
) -> RemotingCommand:
    fields = {
        "producerGroup": "test_pg",
        "topic": topic,
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": 4,
        "queueId": queue_id,
        "sysFlag": 0,
        "bornTimestamp": int(time.time() * 1000),
        "flag": 0,
        "properties": props,
        "reconsumeTimes": 0,
        "unitMode": "false",
    }
    request = RemotingCommand.request(
        RequestCode.SEND_MESSAGE, {k: str(v) for k, v in fields.items()}, body
    )
    return await conn.request(request, timeout_s=timeout_s)


async def pull(
    conn: Connection,
    topic: str,
    queue_id: int,
    offset: int,
    *,
    group: str = "test_cg",
    max_nums: int = 32,
    suspend_ms: int = 0,
    commit_offset: int | None = None,
    timeout_s: float = 30.0,
    subscription: str | None = "*",
    expression_type: str | None = None,
) -> tuple[RemotingCommand, list[StoredMessage]]:
    """One PULL_MESSAGE. `subscription` None: no subscription flag, so the broker filters by
    what the group's heartbeat registered; `expression_type` "SQL92" for an SQL filter."""
    sys_flag = (4 if subscription is not None else 0) | (2 if suspend_ms else 0)
    sys_flag |= 1 if commit_offset is not None else 0
    fields = {
        "consumerGroup": group,
        "topic": topic,
        "queueId": queue_id,
        "queueOffset": offset,
        "maxMsgNums": max_nums,
        "sysFlag": sys_flag,
        "commitOffset": commit_offset if commit_offset is not None else 0,
        "suspendTimeoutMillis": suspend_ms,
        "subVersion": 0,
    }
    if subscription is not None:
        fields["subscription"] = subscription
    if expression_type is not None:
        fields["expressionType"] = expression_type
    request = RemotingCommand.request(
        RequestCode.PULL_MESSAGE, {k: str(v) for k, v in fields.items()}
    )
    response = await conn.request(request, timeout_s=timeout_s)
    messages = []
    if response.code == ResponseCode.SUCCESS:
        at = 0
        while at < len(response.body):
            message = stored_message.decode(response.body, at)
            messages.append(message)
            at += stored_message.read_size(response.body, at)
    return response, messages


async def call(
    conn: Connection, code: int, fields: dict[str, Any] | None = None, body: bytes = b""
) -> RemotingCommand:
    request = RemotingCommand.request(code, {k: str(v) for k, v in (fields or {}).items()}, body)
    return await conn.request(request, timeout_s=10.0)


async def json_call(conn: Connection, code: int, fields: dict[str, Any] | None = None) -> Any:
    response = await call(conn, code, fields)
    assert response.code == ResponseCode.SUCCESS, (response.code, response.remark)
    return json.loads(response.body)
