"""The name server's answers, over memory streams; expiry on trio's mock clock."""

from __future__ import annotations

import json
import zlib

import trio
import trio.testing

from namesrv.registry import Registry
from namesrv.server import run_expiry
from namesrv.service import NameService
from remoting.codes import RequestCode, ResponseCode
from remoting.command import RemotingCommand
from remoting.server import RemotingServer

from ..remoting.helpers import served
from .helpers import register_request

A, B = "127.0.0.1:10911", "127.0.0.1:10921"


def route_request(topic: str) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})


def new_server(expiry_s: float = 10.0) -> tuple[Registry, RemotingServer]:
    registry = Registry(expiry_s)
    return registry, RemotingServer(NameService(registry).dispatcher())


async def test_register_then_route() -> None:
    _, server = new_server()
    async with served(server) as conn:
        missing = await conn.request(route_request("TBW102"))
        assert missing.code == ResponseCode.TOPIC_NOT_EXIST
        assert missing.remark.startswith("No topic route info in name server for the topic: TBW102")
        registered = await conn.request(register_request(A, 0))
        assert registered.code == ResponseCode.SUCCESS
        for topic in ("TBW102", "TopicTest"):
            answer = await conn.request(route_request(topic))
            assert answer.code == ResponseCode.SUCCESS
            route = json.loads(answer.body)
            assert route["brokerDatas"] == [
                {"cluster": "DefaultCluster", "brokerName": "broker-a", "brokerAddrs": {"0": A}}
            ]
            assert route["filterServerTable"] == {}
            (queues,) = route["queueDatas"]
            assert set(queues) == {
                "brokerName",
                "readQueueNums",
                "writeQueueNums",
                "perm",
                "topicSysFlag",
            }
        slave = await conn.request(register_request(B, 1))
        assert slave.ext_fields["masterAddr"] == A


async def test_cluster_info_and_topic_lists() -> None:
    _, server = new_server()
    async with served(server) as conn:
        await conn.request(register_request(A, 0, topics=("T1", "T2")))
        info = json.loads((await conn.request(RemotingCommand.request(106))).body)
        assert info == {
            "brokerAddrTable": {
                "broker-a": {
                    "cluster": "DefaultCluster",
                    "brokerName": "broker-a",
                    "brokerAddrs": {"0": A},
                }
            },
            "clusterAddrTable": {"DefaultCluster": ["broker-a"]},
        }
        topics = json.loads((await conn.request(RemotingCommand.request(206))).body)
        assert topics == {"topicList": ["T1", "T2", "TBW102"]}
        by_cluster = await conn.request(RemotingCommand.request(224, {"cluster": "DefaultCluster"}))
        assert json.loads(by_cluster.body) == topics
        deleted = await conn.request(RemotingCommand.request(216, {"topic": "T1"}))
        assert deleted.code == ResponseCode.SUCCESS
        assert (await conn.request(route_request("T1"))).code == ResponseCode.TOPIC_NOT_EXIST
        unreg = {
            "brokerName": "broker-a",
            "brokerAddr": A,
            "clusterName": "DefaultCluster",
            "brokerId": "0",
        }
        assert (await conn.request(RemotingCommand.request(104, unreg))).code == 0
        assert (await conn.request(route_request("T2"))).code == ResponseCode.TOPIC_NOT_EXIST


async def test_raft_term_over_the_wire() -> None:
    _, server = new_server()
    async with served(server) as conn:
        assert (await conn.request(register_request(A, 0, 5))).code == ResponseCode.SUCCESS
        stale = await conn.request(register_request(B, 0, 4))
        assert stale.code == ResponseCode.SYSTEM_ERROR
        assert "stale raft term 4" in stale.remark
        assert stale.ext_fields["raftTerm"] == "5" and stale.ext_fields["masterAddr"] == A
        newer = await conn.request(register_request(B, 0, 6))
        assert newer.code == ResponseCode.SUCCESS and newer.ext_fields["raftTerm"] == "6"
        route = json.loads((await conn.request(route_request("TopicTest"))).body)
        assert route["brokerDatas"][0]["brokerAddrs"] == {"0": B}


async def test_bad_registrations_answered() -> None:
    _, server = new_server()
    async with served(server) as conn:
        good = register_request(A, 0)
        no_name = good._replace(
            ext_fields={k: v for k, v in good.ext_fields.items() if k != "brokerName"}
        )
        answer = await conn.request(no_name)
        assert answer.code == ResponseCode.SYSTEM_ERROR and "'brokerName' missing" in answer.remark
        garbage = await conn.request(good._replace(body=b"{not json"))
        assert garbage.code == ResponseCode.SYSTEM_ERROR and "not JSON" in garbage.remark
        wrong_crc = good._replace(ext_fields={**good.ext_fields, "bodyCrc32": "1"})
        assert (await conn.request(wrong_crc)).remark == "crc32 not match"
        crc = str(zlib.crc32(good.body) & 0x7FFFFFFF)
        right_crc = good._replace(ext_fields={**good.ext_fields, "bodyCrc32": crc})
        assert (await conn.request(right_crc)).code == ResponseCode.SUCCESS
        compressed = good._replace(ext_fields={**good.ext_fields, "compressed": "true"})
        assert "compressed" in (await conn.request(compressed)).remark
        unknown = await conn.request(RemotingCommand.request(RequestCode.PULL_MESSAGE))
        assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED


async def test_query_data_version() -> None:
    _, server = new_server()
    async with served(server) as conn:
        await conn.request(register_request(A, 0, counter=3))
        header = {
            "brokerName": "broker-a",
            "brokerAddr": A,
            "clusterName": "DefaultCluster",
            "brokerId": "0",
        }
        same = json.dumps({"timestamp": 1764000000000, "counter": 3}).encode()
        answer = await conn.request(RemotingCommand.request(322, header, same))
        assert answer.ext_fields == {"changed": "false"}
        assert json.loads(answer.body) == {"timestamp": 1764000000000, "counter": 3}
        other = json.dumps({"timestamp": 1764000000000, "counter": 4}).encode()
        answer = await conn.request(RemotingCommand.request(322, header, other))
        assert answer.ext_fields == {"changed": "true"}


async def test_silent_broker_expires(autojump_clock: trio.testing.MockClock) -> None:
    """The ticker drops a broker 10 s after it last registered; re-registering keeps it."""
    registry, server = new_server(expiry_s=10.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_expiry, registry)
        async with served(server) as conn:
            await conn.request(register_request(A, 0))
            await conn.request(register_request(B, 1))
            for _ in range(3):  # A keeps registering, B falls silent
                await trio.sleep(6)
                await conn.request(register_request(A, 0))
            route = json.loads((await conn.request(route_request("TopicTest"))).body)
            assert route["brokerDatas"][0]["brokerAddrs"] == {"0": A}
            await trio.sleep(11.01)
            assert (
                await conn.request(route_request("TopicTest"))
            ).code == ResponseCode.TOPIC_NOT_EXIST
        nursery.cancel_scope.cancel()
