"""A topic's route as a namesrv answers GET_ROUTEINFO_BY_TOPIC (protocol reference section 4).

`brokerAddrs` is keyed by brokerId: 0 is the master (our group's Raft leader), 1.. the other
replicas. A Java namesrv writes those keys as bare numbers, ours as strings; both are read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from client.message import MessageQueue
from remoting import fastjson

PERM_PRIORITY, PERM_READ, PERM_WRITE, PERM_INHERIT = 8, 4, 2, 1
MASTER_ID = 0


@attrs.frozen
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0

    @property
    def writable(self) -> bool:
        return bool(self.perm & PERM_WRITE)

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)


@attrs.frozen
class BrokerData:
    cluster: str
    broker_name: str
    broker_addrs: Mapping[int, str]  # brokerId -> address

    @property
    def master(self) -> str | None:
        return self.broker_addrs.get(MASTER_ID)

    def addresses(self) -> list[str]:
        """Master first, then the other replicas by id: the order to try them in."""
        return [self.broker_addrs[i] for i in sorted(self.broker_addrs)]


@attrs.frozen
class TopicRoute:
    topic: str
    queue_datas: tuple[QueueData, ...]
    broker_datas: tuple[BrokerData, ...]
    order_topic_conf: str | None = None

    def broker(self, broker_name: str) -> BrokerData | None:
        for data in self.broker_datas:
            if data.broker_name == broker_name:
                return data
        return None

    def write_queues(self) -> list[MessageQueue]:
        """Queues a producer may send to, by broker name then queue id. An orderTopicConf
        ("broker-a:4;broker-b:4") overrides the queue data, as in RocketMQ."""
        if self.order_topic_conf:
            out = []
            for item in self.order_topic_conf.split(";"):
                name, _, count = item.partition(":")
                out += [MessageQueue(self.topic, name, i) for i in range(int(count or 0))]
            return out
        return [
            MessageQueue(self.topic, q.broker_name, i)
            for q in sorted(self.queue_datas, key=lambda q: q.broker_name)
            if q.writable and self.broker(q.broker_name) is not None
            for i in range(q.write_queue_nums)
        ]

    def read_queues(self) -> list[MessageQueue]:
        """Queues a consumer may pull from, by broker name then queue id."""
        return [
            MessageQueue(self.topic, q.broker_name, i)
            for q in sorted(self.queue_datas, key=lambda q: q.broker_name)
            if q.readable and self.broker(q.broker_name) is not None
            for i in range(q.read_queue_nums)
        ]


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{what} is not an integer: {value!r}")
    return int(value)


def parse_route(topic: str, body: bytes) -> TopicRoute:
    """The route in a GET_ROUTEINFO_BY_TOPIC answer's body; ValueError if it is not one."""
    data = fastjson.loads(body)
    if not isinstance(data, dict):
        raise ValueError("a route is a JSON object")
    queues = tuple(
        QueueData(
            broker_name=str(q["brokerName"]),
            read_queue_nums=_int(q.get("readQueueNums", 0), "readQueueNums"),
            write_queue_nums=_int(q.get("writeQueueNums", 0), "writeQueueNums"),
            perm=_int(q.get("perm", 0), "perm"),
            topic_sys_flag=_int(q.get("topicSysFlag", 0), "topicSysFlag"),
        )
        for q in data.get("queueDatas") or []
    )
    brokers = tuple(
        BrokerData(
            cluster=str(b.get("cluster", "")),
            broker_name=str(b["brokerName"]),
            broker_addrs={
                _int(k, "brokerId"): str(v) for k, v in (b.get("brokerAddrs") or {}).items()
            },
        )
        for b in data.get("brokerDatas") or []
    )
    order = data.get("orderTopicConf")
    return TopicRoute(topic, queues, brokers, str(order) if order else None)
