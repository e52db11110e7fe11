"""Registering a fake broker, as a broker's REGISTER_BROKER would."""

from __future__ import annotations

import json

from remoting.codes import RequestCode
from remoting.command import RemotingCommand
from remoting.headers import RegisterBrokerRequestHeader

TBW102 = {
    "topicName": "TBW102",
    "readQueueNums": 8,
    "writeQueueNums": 8,
    "perm": 7,
    "topicFilterType": "SINGLE_TAG",
    "topicSysFlag": 0,
    "order": False,
}


def register_request(
    addr: str,
    broker_id: int = 0,
    term: int | None = None,
    *,
    name: str = "broker-a",
    topics: tuple[str, ...] = ("TopicTest",),
    counter: int = 1,
) -> RemotingCommand:
    table = {"TBW102": TBW102}
    for topic in topics:
        table[topic] = {
            **TBW102,
            "topicName": topic,
            "readQueueNums": 4,
            "writeQueueNums": 4,
            "perm": 6,
        }
    body = {
        "topicConfigSerializeWrapper": {
            "topicConfigTable": table,
            "dataVersion": {"timestamp": 1764000000000, "counter": counter},
        },
        "filterServerList": [],
    }
    header = RegisterBrokerRequestHeader(
        broker_name=name,
        broker_addr=addr,
        cluster_name="DefaultCluster",
        ha_server_addr="",
        broker_id=broker_id,
        compressed=False,
        body_crc32=0,
        raft_term=term,
    )
    return RemotingCommand.request(
        RequestCode.REGISTER_BROKER, header.encode(), json.dumps(body).encode()
    )
