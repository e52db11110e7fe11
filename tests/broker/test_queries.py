"""VIEW_MESSAGE_BY_ID, QUERY_MESSAGE, GET_CONSUMER_CONNECTION_LIST, GET_TOPIC_STATS_INFO and
GET_CONSUME_STATS against a live group of three replicas."""

from __future__ import annotations

import json
from pathlib import Path

import trio

from remoting import fastjson, stored_message
from remoting.client import open_connection
from remoting.codes import RequestCode, ResponseCode
from remoting.command import RemotingCommand
from remoting.connection import Connection
from remoting.message_id import parse_offset_msg_id
from tests.broker.group import Group, broker_group, send_request


def port(group: Group, which: str) -> int:
    return group.brokers[which].config.listen.port


async def send(conn: Connection, topic: str, body: bytes, **kw: object) -> RemotingCommand:
    response = await conn.request(send_request(topic, body, **kw), timeout_s=10)  # type: ignore[arg-type]
    assert response.code == ResponseCode.SUCCESS, response.remark
    return response


def split_records(data: bytes) -> list[stored_message.StoredMessage]:
    out = []
    at = 0
    while at < len(data):
        out.append(stored_message.decode(data, at))
        at += stored_message.read_size(data, at)
    return out


async def test_view_by_id_and_query_by_key_on_every_replica(tmp_path: Path) -> None:
    """A message sent through a follower is found by its offsetMsgId and by its key on each
    replica, as the same bytes."""
    async with broker_group(tmp_path) as group:
        follower = group.follower()
        keys = {"KEYS": "order-1 order-2", "TAGS": "TagA", "UNIQ_KEY": "ABC123"}
        async with open_connection("127.0.0.1", follower.config.listen.port) as conn:
            sent = await send(conn, "QueryTopic", b"body-1", properties=keys)
        _host, physical_offset = parse_offset_msg_id(sent.ext_fields["msgId"])
        await group.wait_applied_everywhere()
        records = set()
        for broker in group.brokers.values():
            async with open_connection("127.0.0.1", broker.config.listen.port) as conn:
                view = await conn.request(
                    RemotingCommand.request(
                        RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(physical_offset)}
                    )
                )
                assert view.code == ResponseCode.SUCCESS, view.remark
                message = stored_message.decode(view.body)
                assert message.body == b"body-1" and message.physical_offset == physical_offset
                records.add(view.body)
                for key in ("order-2", "ABC123"):
                    query = await conn.request(
                        RemotingCommand.request(
                            RequestCode.QUERY_MESSAGE,
                            {
                                "topic": "QueryTopic",
                                "key": key,
                                "maxNum": "32",
                                "beginTimestamp": "0",
                                "endTimestamp": str(2**62),
                            },
                        )
                    )
                    assert query.code == ResponseCode.SUCCESS, query.remark
                    assert [m.body for m in split_records(query.body)] == [b"body-1"]
                    assert query.ext_fields["indexLastUpdatePhyoffset"] == str(physical_offset)
                    assert int(query.ext_fields["indexLastUpdateTimestamp"]) > 0
        assert len(records) == 1


async def test_view_and_query_not_found(tmp_path: Path) -> None:
    async with broker_group(tmp_path) as group:
        leader = group.leader()
        async with open_connection("127.0.0.1", leader.config.listen.port) as conn:
            sent = await send(conn, "QueryTopic", b"x", properties={"KEYS": "k1"})
            _host, physical_offset = parse_offset_msg_id(sent.ext_fields["msgId"])
            for offset in (physical_offset + 1, 1 << 40, -5):
                view = await conn.request(
                    RemotingCommand.request(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(offset)})
                )
                assert view.code == ResponseCode.SYSTEM_ERROR
                assert str(offset) in view.remark and not view.body
            fields = {"topic": "QueryTopic", "maxNum": "32", "beginTimestamp": "0"}
            fields["endTimestamp"] = str(2**62)
            for key, topic in (("nope", "QueryTopic"), ("k1", "OtherTopic")):
                query = await conn.request(
                    RemotingCommand.request(
                        RequestCode.QUERY_MESSAGE, {**fields, "key": key, "topic": topic}
                    )
                )
                assert query.code == ResponseCode.QUERY_NOT_FOUND, query.remark
                assert "indexLastUpdatePhyoffset" in query.ext_fields
            # outside the time range
            query = await conn.request(
                RemotingCommand.request(
                    RequestCode.QUERY_MESSAGE, {**fields, "key": "k1", "endTimestamp": "1"}
                )
            )
            assert query.code == ResponseCode.QUERY_NOT_FOUND


HEARTBEAT = {
    "clientID": "4242-127.0.0.1@probe",
    "consumerDataSet": [
        {
            "consumeFromWhere": 0,
            "consumeType": 1,
            "groupName": "probe_cg",
            "messageModel": 1,
            "subscriptionDataSet": [
                {"subString": "*", "subVersion": "1795378235379", "topic": "%RETRY%probe_cg"},
                {
                    "codeSet": [0],
                    "subString": "TagA || TagB",
                    "subVersion": "1795378235379",
                    "tagsSet": ["TagA", "TagB"],
                    "topic": "StatsTopic",
                },
            ],
        }
    ],
}


async def test_consumer_connection_list_after_heartbeat(tmp_path: Path) -> None:
    async with broker_group(tmp_path) as group:
        follower = group.follower()
        async with open_connection("127.0.0.1", follower.config.listen.port) as conn:
            ask = RemotingCommand.request(
                RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "probe_cg"}
            )
            before = await conn.request(ask)
            assert before.code == ResponseCode.CONSUMER_NOT_ONLINE
            assert "probe_cg" in before.remark
            beat = await conn.request(
                RemotingCommand.request(RequestCode.HEART_BEAT, body=json.dumps(HEARTBEAT).encode())
            )
            assert beat.code == ResponseCode.SUCCESS
            after = await conn.request(ask)
            assert after.code == ResponseCode.SUCCESS, after.remark
        answer = json.loads(after.body)
        [connection] = answer["connectionSet"]
        assert connection["clientId"] == "4242-127.0.0.1@probe"
        assert connection["clientAddr"].startswith("127.0.0.1:")
        assert connection["language"] == "PYTHON" and connection["version"] == 401
        assert answer["consumeType"] == "CONSUME_PASSIVELY"
        assert answer["messageModel"] == "CLUSTERING"
        assert answer["consumeFromWhere"] == "CONSUME_FROM_LAST_OFFSET"
        sub = answer["subscriptionTable"]["StatsTopic"]
        assert sub["subString"] == "TagA || TagB" and sub["tagsSet"] == ["TagA", "TagB"]
        assert sub["subVersion"] == 1795378235379
        assert set(answer["subscriptionTable"]) == {"StatsTopic", "%RETRY%probe_cg"}


def queue_table(body: bytes) -> dict[tuple[str, int], dict[str, int]]:
    """An offsetTable keyed by MessageQueue objects, as fastjson writes it."""
    value = fastjson.loads(body)
    table = value["offsetTable"]
    if table == {}:
        return {}
    assert isinstance(table, fastjson.ObjectKeyed)
    out = {}
    for key, offsets in table.pairs:
        assert key["brokerName"] == "broker-a"
        out[(key["topic"], key["queueId"])] = offsets
    return out


async def test_topic_stats(tmp_path: Path) -> None:
    async with broker_group(tmp_path) as group:
        leader = group.leader()
        async with open_connection("127.0.0.1", leader.config.listen.port) as conn:
            for body in (b"a", b"b", b"c"):
                await send(conn, "StatsTopic", body, queue_id=1)
            await group.wait_applied_everywhere()
            unknown = await conn.request(
                RemotingCommand.request(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "NoSuchTopic"})
            )
            assert unknown.code == ResponseCode.TOPIC_NOT_EXIST and "NoSuchTopic" in unknown.remark
        for broker in group.brokers.values():
            async with open_connection("127.0.0.1", broker.config.listen.port) as conn:
                stats = await conn.request(
                    RemotingCommand.request(
                        RequestCode.GET_TOPIC_STATS_INFO, {"topic": "StatsTopic"}
                    )
                )
            assert stats.code == ResponseCode.SUCCESS, stats.remark
            assert stats.body.startswith(b'{"offsetTable":{{"brokerName":"broker-a","queueId":0,')
            table = queue_table(stats.body)
            assert sorted(table) == [("StatsTopic", q) for q in range(4)]
            assert table[("StatsTopic", 1)]["maxOffset"] == 3
            assert table[("StatsTopic", 1)]["minOffset"] == 0
            assert table[("StatsTopic", 1)]["lastUpdateTimestamp"] > 0
            assert table[("StatsTopic", 0)] == {
                "lastUpdateTimestamp": 0,
                "maxOffset": 0,
                "minOffset": 0,
            }


async def test_consume_stats(tmp_path: Path) -> None:
    async with broker_group(tmp_path) as group:
        leader = group.leader()
        async with open_connection("127.0.0.1", leader.config.listen.port) as conn:
            for body in (b"a", b"b", b"c"):
                await send(conn, "StatsTopic", body, queue_id=2)
            commit = await conn.request(
                RemotingCommand.request(
                    RequestCode.UPDATE_CONSUMER_OFFSET,
                    {
                        "consumerGroup": "cg",
                        "topic": "StatsTopic",
                        "queueId": "2",
                        "commitOffset": "2",
                    },
                )
            )
            assert commit.code == ResponseCode.SUCCESS
            for fields in ({"consumerGroup": "cg", "topic": "StatsTopic"}, {"consumerGroup": "cg"}):
                with trio.fail_after(5):  # the commit is written within the coalescing interval
                    while True:
                        stats = await conn.request(
                            RemotingCommand.request(RequestCode.GET_CONSUME_STATS, fields)
                        )
                        assert stats.code == ResponseCode.SUCCESS, stats.remark
                        table = queue_table(stats.body)
                        if ("StatsTopic", 2) in table:
                            break
                        await trio.sleep(0.01)
                assert fastjson.loads(stats.body)["consumeTps"] == 0.0
                assert sorted(table) == [("StatsTopic", q) for q in range(4)]
                q2 = table[("StatsTopic", 2)]
                assert q2["brokerOffset"] == 3 and q2["consumerOffset"] == 2
                assert q2["lastTimestamp"] > 0
                assert table[("StatsTopic", 0)] == {
                    "brokerOffset": 0,
                    "consumerOffset": 0,
                    "lastTimestamp": 0,
                }
            none = await conn.request(
                RemotingCommand.request(RequestCode.GET_CONSUME_STATS, {"consumerGroup": "idle"})
            )
            assert none.code == ResponseCode.SUCCESS
            assert fastjson.loads(none.body)["offsetTable"] == {}
