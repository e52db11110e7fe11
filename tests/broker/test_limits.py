"""Limits and bad input (issue 29): each refused with RocketMQ's code and a clear remark, and
nothing stored: the queue's max offset, and the topic table, are as before."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from broker.disk import Usage
from remoting.client import open_connection
from remoting.codes import RequestCode, ResponseCode
from remoting.command import RemotingCommand
from remoting.connection import Connection
from remoting.headers import SendMessageRequestHeader
from remoting.limits import PROPERTIES_BYTES_MAX
from tests.broker.group import (
    MESSAGE_BYTES_MAX,
    Group,
    broker_group,
    pull_request,
    send_request,
    topic_request,
)

TOPIC = "LimitTopic"


async def create_topic(conn: Connection, topic: str = TOPIC, queues: int = 4) -> None:
    created = await conn.request(topic_request(RequestCode.UPDATE_AND_CREATE_TOPIC, topic, queues))
    assert created.code == ResponseCode.SUCCESS, created.remark


async def max_offsets(conn: Connection, topic: str = TOPIC, queues: int = 4) -> list[int]:
    out = []
    for queue_id in range(queues):
        answer = await conn.request(
            RemotingCommand.request(
                RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": str(queue_id)}
            )
        )
        assert answer.code == ResponseCode.SUCCESS
        out.append(int(answer.ext_fields["offset"]))
    return out


async def refused(
    group: Group, request: RemotingCommand, code: ResponseCode, remark_part: str
) -> RemotingCommand:
    """Send `request` to the leader and to a follower; both refuse it, nothing is stored."""
    for broker in (group.leader(), group.follower()):
        async with open_connection("127.0.0.1", broker.config.listen.port) as conn:
            await group.wait_applied_everywhere()
            before = await max_offsets(conn)
            topics = set(broker.state.metadata.topics)
            answer = await conn.request(request, timeout_s=10)
            assert answer.code == code, (answer.code, answer.remark)
            assert remark_part in answer.remark, answer.remark
            ok = await conn.request(send_request(TOPIC, b"fine"), timeout_s=10)
            assert ok.code == ResponseCode.SUCCESS  # an accepted send after it lands at the end
            assert int(ok.ext_fields["queueOffset"]) == before[0]
            assert set(broker.state.metadata.topics) == topics
    return answer


async def test_body_over_max_message_size(tmp_path: Path) -> None:
    async with broker_group(tmp_path) as group:
        async with open_connection("127.0.0.1", group.leader().config.listen.port) as conn:
            await create_topic(conn)
        answer = await refused(
            group,
            send_request(TOPIC, b"x" * MESSAGE_BYTES_MAX),
            ResponseCode.MESSAGE_ILLEGAL,
            f"maxMessageSize is {MESSAGE_BYTES_MAX}",
        )
        assert not answer.ext_fields.get("msgId")
        # one message too large refuses its whole batch
        batch = batch_request(TOPIC, [b"small", b"x" * MESSAGE_BYTES_MAX, b"small"])
        await refused(
            group, batch, ResponseCode.MESSAGE_ILLEGAL, f"maxMessageSize is {MESSAGE_BYTES_MAX}"
        )


def batch_request(topic: str, bodies: list[bytes]) -> RemotingCommand:
    """SEND_BATCH_MESSAGE as a Java producer sends it (one-letter header names)."""
    props = b"TAGS\x01TagA\x02"
    records = b"".join(
        struct.pack(">iiiii", 20 + len(body) + 2 + len(props), 0, 0, 0, len(body))
        + body
        + struct.pack(">h", len(props))
        + props
        for body in bodies
    )
    request = send_request(topic)
    header = SendMessageRequestHeader.decode(request.ext_fields)
    return RemotingCommand.request(
        RequestCode.SEND_BATCH_MESSAGE, header.encode(short_names=True), records
    )


async def test_properties_over_32_kib(tmp_path: Path) -> None:
    async with broker_group(tmp_path) as group:
        async with open_connection("127.0.0.1", group.leader().config.listen.port) as conn:
            await create_topic(conn)
        raw = "TAGS\x01TagA\x02BIG\x01" + "v" * PROPERTIES_BYTES_MAX + "\x02"  # as a client sends
        await refused(
            group,
            send_request(TOPIC, b"x", raw_properties=raw),
            ResponseCode.MESSAGE_ILLEGAL,
            "properties of",
        )


async def test_bad_topic_names(tmp_path: Path) -> None:
    async with broker_group(tmp_path) as group:
        async with open_connection("127.0.0.1", group.leader().config.listen.port) as conn:
            await create_topic(conn)
        for topic, why in (
            ("bad topic", "characters outside"),
            ("bad/topic", "characters outside"),
            ("t" * 128, "at most 127"),
            ("", "empty"),
        ):
            await refused(group, send_request(topic), ResponseCode.SYSTEM_ERROR, why)
        # 127 characters is still a name
        async with open_connection("127.0.0.1", group.leader().config.listen.port) as conn:
            ok = await conn.request(send_request("t" * 127), timeout_s=10)
            assert ok.code == ResponseCode.SUCCESS, ok.remark


async def test_queue_id_out_of_range(tmp_path: Path) -> None:
    async with broker_group(tmp_path) as group:
        async with open_connection("127.0.0.1", group.leader().config.listen.port) as conn:
            await create_topic(conn)
        await refused(
            group, send_request(TOPIC, queue_id=4), ResponseCode.SYSTEM_ERROR, "queueId[4]"
        )
        async with open_connection("127.0.0.1", group.leader().config.listen.port) as conn:
            pulled = await conn.request(pull_request(TOPIC, 9, 0))
            assert pulled.code == ResponseCode.SYSTEM_ERROR and "queueId[9]" in pulled.remark
            # a pull checks the read queues (a topic shrinking: fewer read than write queues)
            fields = {"topic": "Shrinking", "readQueueNums": "2", "writeQueueNums": "4"}
            created = await conn.request(
                RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, fields)
            )
            assert created.code == ResponseCode.SUCCESS, created.remark
            pulled = await conn.request(pull_request("Shrinking", 3, 0))
            assert pulled.code == ResponseCode.SYSTEM_ERROR, pulled.remark
            assert "readQueueNums:[2]" in pulled.remark
            pulled = await conn.request(pull_request("Shrinking", 1, 0))
            assert pulled.code == ResponseCode.PULL_NOT_FOUND, pulled.remark


async def test_unknown_topic_without_auto_creation(tmp_path: Path) -> None:
    async with broker_group(tmp_path, auto_create_topic=False) as group:
        async with open_connection("127.0.0.1", group.leader().config.listen.port) as conn:
            await create_topic(conn)
        await refused(group, send_request("NewTopic"), ResponseCode.TOPIC_NOT_EXIST, "NewTopic")
        for broker in group.brokers.values():
            assert "NewTopic" not in broker.state.metadata.topics
        async with open_connection("127.0.0.1", group.leader().config.listen.port) as conn:
            pulled = await conn.request(pull_request("NewTopic", 0, 0))
            assert pulled.code == ResponseCode.TOPIC_NOT_EXIST


async def test_pull_with_illegal_offsets(tmp_path: Path) -> None:
    """PULL_OFFSET_MOVED with nextBeginOffset as RocketMQ computes it (protocol §3.7)."""
    async with broker_group(tmp_path) as group:
        leader = group.leader()
        async with open_connection("127.0.0.1", leader.config.listen.port) as conn:
            await create_topic(conn)
            for i in range(3):
                sent = await conn.request(send_request(TOPIC, b"m%d" % i, queue_id=1))
                assert sent.code == ResponseCode.SUCCESS
            await group.wait_applied_everywhere()
            cases = [
                # (queue, offset) -> (code, nextBeginOffset)
                ((1, 7), (ResponseCode.PULL_OFFSET_MOVED, 3)),  # past the end: to the end
                ((1, -1), (ResponseCode.PULL_OFFSET_MOVED, 0)),  # before the first: to it
                ((2, 5), (ResponseCode.PULL_OFFSET_MOVED, 0)),  # empty queue, offset not 0
                ((2, 0), (ResponseCode.PULL_NOT_FOUND, 0)),  # empty queue at 0
                ((1, 3), (ResponseCode.PULL_NOT_FOUND, 3)),  # caught up
                ((1, 1), (ResponseCode.SUCCESS, 3)),
            ]
            for (queue_id, offset), (code, next_begin) in cases:
                answer = await conn.request(pull_request(TOPIC, queue_id, offset))
                assert answer.code == code, (queue_id, offset, answer.code, answer.remark)
                assert int(answer.ext_fields["nextBeginOffset"]) == next_begin, (queue_id, offset)
                assert answer.ext_fields["maxOffset"] == ("3" if queue_id == 1 else "0")
        # a follower may not have applied what the client saw: it does not move the consumer
        follower = group.follower()
        async with open_connection("127.0.0.1", follower.config.listen.port) as conn:
            answer = await conn.request(pull_request(TOPIC, 1, 7))
            assert answer.code == ResponseCode.PULL_NOT_FOUND, answer.remark
            assert answer.ext_fields["nextBeginOffset"] == "7"
            answer = await conn.request(pull_request(TOPIC, 1, -1))
            assert answer.code == ResponseCode.PULL_OFFSET_MOVED
            assert answer.ext_fields["nextBeginOffset"] == "0"


async def test_unknown_group_without_auto_creation(tmp_path: Path) -> None:
    async with broker_group(tmp_path, auto_create_subscription_group=False) as group:
        async with open_connection("127.0.0.1", group.leader().config.listen.port) as conn:
            await create_topic(conn)
            sent = await conn.request(send_request(TOPIC, b"m", queue_id=0))
            assert sent.code == ResponseCode.SUCCESS
            await group.wait_applied_everywhere()
        for broker in group.brokers.values():
            async with open_connection("127.0.0.1", broker.config.listen.port) as conn:
                answer = await conn.request(pull_request(TOPIC, 0, 0, group="stranger"))
                assert answer.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, answer.remark
                assert "stranger" in answer.remark and not answer.body
                assert "nextBeginOffset" in answer.ext_fields
        async with open_connection("127.0.0.1", group.leader().config.listen.port) as conn:
            created = await conn.request(
                RemotingCommand.request(
                    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                    body=json.dumps({"groupName": "stranger"}).encode(),
                )
            )
            assert created.code == ResponseCode.SUCCESS, created.remark
            answer = await conn.request(pull_request(TOPIC, 0, 0, group="stranger"))
            assert answer.code == ResponseCode.SUCCESS, answer.remark


async def test_full_disk_refuses_writes_and_serves_reads(tmp_path: Path) -> None:
    async with broker_group(tmp_path, disk_max_used_percent=75) as group:
        async with open_connection("127.0.0.1", group.leader().config.listen.port) as conn:
            await create_topic(conn)
            sent = await conn.request(send_request(TOPIC, b"before", queue_id=0))
            assert sent.code == ResponseCode.SUCCESS
            await group.wait_applied_everywhere()
        for broker in group.brokers.values():
            # 80 % is past diskMaxUsedSpaceRatio but below the 90 % at which writes stop
            broker.disk.usage = lambda path: Usage(100, 80, 20)
            broker.disk.forget()
        async with open_connection("127.0.0.1", group.leader().config.listen.port) as conn:
            ok = await conn.request(send_request(TOPIC, b"at 80%", queue_id=0))
            assert ok.code == ResponseCode.SUCCESS, ok.remark
        for broker in group.brokers.values():
            broker.disk.usage = lambda path: Usage(100, 95, 5)
            broker.disk.forget()
        answer = await refused_while_full(group)
        assert "disk is full" in answer.remark and "95.0%" in answer.remark
        for broker in group.brokers.values():
            broker.disk.usage = lambda path: Usage(100, 50, 50)
            broker.disk.forget()
        async with open_connection("127.0.0.1", group.leader().config.listen.port) as conn:
            ok = await conn.request(send_request(TOPIC, b"after", queue_id=0))
            assert ok.code == ResponseCode.SUCCESS, ok.remark
            assert ok.ext_fields["queueOffset"] == "2"


async def refused_while_full(group: Group) -> RemotingCommand:
    for broker in (group.leader(), group.follower()):
        async with open_connection("127.0.0.1", broker.config.listen.port) as conn:
            await group.wait_applied_everywhere()
            before = await max_offsets(conn)
            answer = await conn.request(send_request(TOPIC, b"full", queue_id=0), timeout_s=10)
            assert answer.code == ResponseCode.SERVICE_NOT_AVAILABLE, answer.remark
            assert await max_offsets(conn) == before
            # reads go on
            pulled = await conn.request(pull_request(TOPIC, 0, 0))
            assert pulled.code == ResponseCode.SUCCESS, pulled.remark
            stats = await conn.request(
                RemotingCommand.request(RequestCode.GET_TOPIC_STATS_INFO, {"topic": TOPIC})
            )
            assert stats.code == ResponseCode.SUCCESS
    return answer
