"""The JSON bodies the name server reads and writes, in RocketMQ 4.9.4's shapes.

RegisterBrokerBody (REGISTER_BROKER, not compressed):
  {"topicConfigSerializeWrapper": {"topicConfigTable": {name: TopicConfig},
                                   "dataVersion": {"timestamp": ms, "counter": n}},
   "filterServerList": []}
  TopicConfig: {"topicName", "readQueueNums", "writeQueueNums", "perm", "topicFilterType",
                "topicSysFlag", "order"}
  A bare TopicConfigSerializeWrapper is accepted too.
TopicRouteData (GET_ROUTEINFO_BY_TOPIC):
  {"queueDatas": [{"brokerName", "readQueueNums", "writeQueueNums", "perm", "topicSysFlag"}],
   "brokerDatas": [{"cluster", "brokerName", "brokerAddrs": {"0": addr, "1": addr}}],
   "filterServerTable": {}}
ClusterInfo (GET_BROKER_CLUSTER_INFO): {"brokerAddrTable": {name: BrokerData},
                                        "clusterAddrTable": {cluster: [name]}}
TopicList (206, 224): {"topicList": [topic]}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs

from namesrv import limits
from namesrv.registry import BrokerData, QueueData, TopicConfig, TopicRoute


@attrs.define
class BadBody(Exception):
    """A request body we cannot read; answered SYSTEM_ERROR with this sentence."""

    what: str  # "RegisterBrokerBody"
    reason: str

    def __str__(self) -> str:
        return f"bad {self.what}: {self.reason}"


def decode_register_body(body: bytes) -> tuple[tuple[TopicConfig, ...], dict[str, Any]]:
    """(topics, dataVersion) of a RegisterBrokerBody or TopicConfigSerializeWrapper."""
    what = "RegisterBrokerBody"
    if not body:
        return (), {}
    if len(body) > limits.REGISTER_BODY_BYTES_MAX:
        raise BadBody(what, f"{len(body)} bytes; at most {limits.REGISTER_BODY_BYTES_MAX}")
    obj = _json_object(body, what)
    wrapper = obj.get("topicConfigSerializeWrapper", obj)
    if not isinstance(wrapper, dict):
        raise BadBody(what, "topicConfigSerializeWrapper is not an object")
    table = wrapper.get("topicConfigTable") or {}
    if not isinstance(table, dict):
        raise BadBody(what, "topicConfigTable is not an object")
    if len(table) > limits.TOPICS_PER_BROKER_MAX:
        raise BadBody(what, f"{len(table)} topics; at most {limits.TOPICS_PER_BROKER_MAX}")
    topics = tuple(_topic_config(name, config) for name, config in table.items())
    version = wrapper.get("dataVersion") or {}
    if not isinstance(version, dict):
        raise BadBody(what, "dataVersion is not an object")
    return topics, version


def _topic_config(name: str, config: object) -> TopicConfig:
    what = "RegisterBrokerBody"
    if not isinstance(config, dict):
        raise BadBody(what, f"topic {name!r} is not an object")

    def number(key: str, default: int | None = None) -> int:
        value = config.get(key, default)
        if type(value) is not int:
            raise BadBody(what, f"topic {name!r}: {key} is {value!r:.40}, not an integer")
        return value

    topic_name = config.get("topicName", name)
    if not isinstance(topic_name, str) or not topic_name:
        raise BadBody(what, f"topic {name!r}: topicName is {topic_name!r:.40}")
    return TopicConfig(
        topic_name=topic_name,
        read_queue_nums=number("readQueueNums"),
        write_queue_nums=number("writeQueueNums"),
        perm=number("perm"),
        topic_sys_flag=number("topicSysFlag", 0),
    )


def decode_data_version(body: bytes) -> dict[str, Any]:
    """The DataVersion body of QUERY_DATA_VERSION."""
    return _json_object(body, "DataVersion") if body else {}


def encode_data_version(version: Mapping[str, Any]) -> bytes:
    return _dump(dict(version))


def _json_object(body: bytes, what: str) -> dict[str, Any]:
    try:
        obj = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise BadBody(what, f"not JSON: {err}") from None
    if not isinstance(obj, dict):
        raise BadBody(what, f"a {type(obj).__name__}, not an object")
    return obj


def queue_data_json(q: QueueData) -> dict[str, Any]:
    return {
        "brokerName": q.broker_name,
        "readQueueNums": q.read_queue_nums,
        "writeQueueNums": q.write_queue_nums,
        "perm": q.perm,
        "topicSysFlag": q.topic_sys_flag,
    }


def broker_data_json(b: BrokerData) -> dict[str, Any]:
    # Standard JSON: keys quoted ("0"), where a Java name server writes {0:"..."}.
    addrs = {str(broker_id): addr for broker_id, addr in b.broker_addrs.items()}
    return {"cluster": b.cluster, "brokerName": b.broker_name, "brokerAddrs": addrs}


def encode_route(route: TopicRoute) -> bytes:
    return _dump(
        {
            "queueDatas": [queue_data_json(q) for q in route.queue_datas],
            "brokerDatas": [broker_data_json(b) for b in route.broker_datas],
            "filterServerTable": {},
        }
    )


def encode_cluster_info(brokers: list[BrokerData], clusters: Mapping[str, list[str]]) -> bytes:
    return _dump(
        {
            "brokerAddrTable": {b.broker_name: broker_data_json(b) for b in brokers},
            "clusterAddrTable": dict(clusters),
        }
    )


def encode_topic_list(topics: list[str]) -> bytes:
    return _dump({"topicList": topics})


def _dump(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
