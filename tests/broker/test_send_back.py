"""CONSUMER_SEND_MSG_BACK (broker/send_back.py) against one in-process group on 127.0.0.1 with
delay levels shortened by configuration: a message given back again and again comes back from
`%RETRY%<group>` with growing reconsumeTimes, after its level's delay, keeping its id, body and
properties, and lands in `%DLQ%<group>` (readable by a pull) after maxReconsumeTimes."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import trio

from broker import lookup
from broker.delays import SCHEDULE_TOPIC
from broker.metadata import PERM_READ, PERM_WRITE
from remoting.client import open_connection
from remoting.codes import RequestCode, ResponseCode
from remoting.connection import Connection
from remoting.message_id import offset_msg_id
from remoting.stored_message import StoredMessage
from tests.broker import rmq
from tests.broker.group import broker_group

LEVELS = (50, 60, 150, 250, 350)  # level 3 + reconsumeTimes: 150, 250, 350 ms
TOPIC = "Orders"
GROUP = "cg_retry"
RETRY = "%RETRY%" + GROUP
DLQ = "%DLQ%" + GROUP
WAIT_S = 10.0


def wall_ms() -> int:
    return int(time.time() * 1000)


async def give_back(
    conn: Connection,
    offset: int,
    *,
    group: str = GROUP,
    delay_level: int = 0,
    max_times: int | None = None,
) -> tuple[int, str]:
    fields: dict[str, object] = {"offset": offset, "group": group, "delayLevel": delay_level}
    if max_times is not None:
        fields["maxReconsumeTimes"] = max_times
    response = await rmq.call(conn, RequestCode.CONSUMER_SEND_MSG_BACK, fields)
    return response.code, response.remark or ""


async def next_message(conn: Connection, topic: str, offset: int) -> StoredMessage:
    """The message at `offset` of queue 0 of `topic`, once it is there."""
    with trio.fail_after(WAIT_S):
        while True:
            response, messages = await rmq.pull(conn, topic, 0, offset, max_nums=1)
            if messages:
                assert messages[0].queue_offset == offset
                return messages[0]
            assert response.code in (
                ResponseCode.PULL_NOT_FOUND,
                ResponseCode.TOPIC_NOT_EXIST,
                ResponseCode.PULL_OFFSET_MOVED,
            ), response.remark
            await trio.sleep(0.02)


async def test_retries_grow_reconsume_times_then_land_in_the_dlq(tmp_path: Path) -> None:
    async with broker_group(tmp_path, delay_levels=LEVELS) as group:
        leader, follower = group.leader(), group.follower()
        async with (
            open_connection("127.0.0.1", leader.config.listen.port) as to_leader,
            open_connection("127.0.0.1", follower.config.listen.port) as to_follower,
        ):
            properties = rmq.properties(UNIQ_KEY="u-1", KEYS="order-1", TAGS="paid")
            response = await rmq.send(to_follower, TOPIC, 0, b"the order", props=properties)
            assert response.code == ResponseCode.SUCCESS, response.remark
            (original,) = (await rmq.pull(to_leader, TOPIC, 0, 0))[1]
            origin_id = offset_msg_id(original.store_host, original.physical_offset)
            seen = [original]
            for times in (1, 2):
                # the C++ client sends it to the store host, which may follow: both work
                conn = to_follower if times == 1 else to_leader
                given_ms = wall_ms()
                code, remark = await give_back(conn, seen[-1].physical_offset, max_times=2)
                assert code == ResponseCode.SUCCESS, remark
                retry = await next_message(to_leader, RETRY, times - 1)
                delay_ms = LEVELS[2 + times - 1]
                assert given_ms + delay_ms <= retry.store_timestamp_ms <= given_ms + delay_ms + 1000
                seen.append(retry)
            code, remark = await give_back(to_follower, seen[-1].physical_offset, max_times=2)
            assert code == ResponseCode.SUCCESS, remark
            dead = await next_message(to_follower, DLQ, 0)
            retry_topic = leader.topic(RETRY)
            dlq_topic = leader.topic(DLQ)
    first, second = seen[1], seen[2]
    assert [m.reconsume_times for m in (original, first, second, dead)] == [0, 1, 2, 3]
    for message in (first, second, dead):
        assert message.body == b"the order"
        assert message.properties["UNIQ_KEY"] == "u-1"
        assert message.properties["KEYS"] == "order-1"
        assert message.properties["TAGS"] == "paid"
        assert message.properties["RETRY_TOPIC"] == TOPIC
        assert message.properties["ORIGIN_MESSAGE_ID"] == origin_id
        assert message.born_timestamp_ms == original.born_timestamp_ms
        assert "DELAY" not in message.properties
    assert (first.topic, second.topic, dead.topic) == (RETRY, RETRY, DLQ)
    assert first.properties["REAL_TOPIC"] == RETRY  # it waited in SCHEDULE_TOPIC_XXXX
    assert first.properties["SCHEDULE_SOURCE"].startswith(f"{SCHEDULE_TOPIC}:2:")
    assert retry_topic is not None and (retry_topic.queues, retry_topic.perm) == (1, 6)
    assert dlq_topic is not None and dlq_topic.perm == PERM_READ | PERM_WRITE


async def test_levels_the_group_limit_and_a_negative_level(tmp_path: Path) -> None:
    async with broker_group(tmp_path, delay_levels=LEVELS) as group:
        leader = group.leader()
        async with open_connection("127.0.0.1", leader.config.listen.port) as conn:
            for n in range(3):
                response = await rmq.send(
                    conn, TOPIC, 0, b"m%d" % n, props=rmq.properties(K=str(n))
                )
                assert response.code == ResponseCode.SUCCESS
            _, messages = await rmq.pull(conn, TOPIC, 0, 0)
            # a level asked for: level 1 (50 ms), not 3
            given_ms = wall_ms()
            assert (await give_back(conn, messages[0].physical_offset, delay_level=1))[0] == 0
            retry = await next_message(conn, RETRY, 0)
            assert given_ms + LEVELS[0] <= retry.store_timestamp_ms < given_ms + LEVELS[2]
            # a negative level: straight to the DLQ
            assert (await give_back(conn, messages[1].physical_offset, delay_level=-1))[0] == 0
            assert (await next_message(conn, DLQ, 0)).properties["K"] == "1"
            # no maxReconsumeTimes in the request: the group's retryMaxTimes (0 here)
            body = json.dumps({"groupName": GROUP, "retryMaxTimes": 0}).encode()
            response = await rmq.call(
                conn, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body
            )
            assert response.code == ResponseCode.SUCCESS
            assert (await give_back(conn, messages[2].physical_offset))[0] == 0
            assert (await next_message(conn, DLQ, 1)).properties["K"] == "2"


async def test_refusals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lookup, "LOOKUP_WAIT_S", 0.2)
    async with broker_group(tmp_path, auto_create_subscription_group=False) as group:
        leader = group.leader()
        async with open_connection("127.0.0.1", leader.config.listen.port) as conn:
            response = await rmq.send(conn, TOPIC, 0, b"m", props=rmq.properties(K="v"))
            assert response.code == ResponseCode.SUCCESS
            body = json.dumps({"groupName": GROUP}).encode()
            response = await rmq.call(
                conn, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body
            )
            assert response.code == ResponseCode.SUCCESS
            _, (message,) = await rmq.pull(conn, TOPIC, 0, 0, group=GROUP)
            code, remark = await give_back(conn, message.physical_offset, group="nobody")
            assert code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
            assert remark == "subscription group not exist, nobody"
            for offset, why in (
                (message.physical_offset + 1, "look message by offset failed"),
                (message.physical_offset + (1 << 30), "past the end of this replica's log"),
            ):
                code, remark = await give_back(conn, offset)
                assert code == ResponseCode.SYSTEM_ERROR
                assert why in remark, remark
            assert leader.topic(RETRY) is None  # nothing was stored


async def send_to_retry(
    conn: Connection, reconsume_times: int, max_times: int | None, body: bytes
) -> None:
    """A client's own give-back (the Java client's fallback): a send to %RETRY%<group> with
    reconsumeTimes and DELAY set, as DefaultMQPushConsumerImpl.sendMessageBack makes it."""
    fields = {
        "producerGroup": "CLIENT_INNER_PRODUCER",
        "topic": RETRY,
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": 1,
        "queueId": 0,
        "sysFlag": 0,
        "bornTimestamp": wall_ms(),
        "flag": 0,
        "properties": rmq.properties(DELAY=str(3 + reconsume_times), RETRY_TOPIC=TOPIC),
        "reconsumeTimes": reconsume_times,
        "unitMode": "false",
    }
    if max_times is not None:
        fields["maxReconsumeTimes"] = max_times
    response = await rmq.call(conn, RequestCode.SEND_MESSAGE, fields, body)
    assert response.code == ResponseCode.SUCCESS, response.remark


async def test_a_client_sending_to_the_retry_topic_past_the_limit_reaches_the_dlq(
    tmp_path: Path,
) -> None:
    async with broker_group(tmp_path, delay_levels=LEVELS) as group:
        leader = group.leader()
        async with open_connection("127.0.0.1", leader.config.listen.port) as conn:
            sent_ms = wall_ms()
            await send_to_retry(conn, 1, 2, b"again")  # below the limit: delayed, level 4
            await send_to_retry(conn, 2, 2, b"dead")  # at the request's limit: the DLQ, at once
            await send_to_retry(conn, 16, None, b"dead too")  # the group's default limit, 16
            retry = await next_message(conn, RETRY, 0)
            dead = [await next_message(conn, DLQ, k) for k in (0, 1)]
    assert retry.body == b"again" and retry.store_timestamp_ms >= sent_ms + LEVELS[3]
    assert [m.body for m in dead] == [b"dead", b"dead too"]
    assert all(m.store_timestamp_ms < sent_ms + LEVELS[3] for m in dead)
    assert [m.reconsume_times for m in dead] == [2, 16]
