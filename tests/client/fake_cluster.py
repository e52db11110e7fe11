"""A namesrv and broker replicas in this trio run, on 127.0.0.1, whose answers a test sets.

    async with fake_cluster({"broker-a": 2, "broker-b": 1}, topics={"T": 4}) as cluster:
        cluster.replica("broker-a", 0).mode = Mode.SILENT        # reads, never answers
        async with AsyncProducer("pg", cluster.namesrv_addr) as producer: ...

Each replica decodes SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE as our broker does (batches through
broker/send.py's parse_batch) and keeps what it stored in `stored`; `mode` makes it refuse
with a code, never answer, close the connection after reading, or (DOWN) not listen at all,
so that connecting is refused, or (SLOW) answer late; `forwarded` marks its answers as our
follower's after forwarding a write to the leader. The namesrv answers routes from `routes`, which a test edits.
"""

from __future__ import annotations

import enum
import json
import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from broker.send import parse_batch
from remoting import properties as props
from remoting.codes import RequestCode, ResponseCode
from remoting.command import RemotingCommand
from remoting.connection import Connection
from remoting.headers import (
    OFFSET_UNSETTLED_AT_ONCE_FIELD,
    OFFSET_UNSETTLED_FIELD,
    RAFT_FORWARDED_FIELD,
    SendMessageRequestHeader,
)
from remoting.message_id import offset_msg_id
from remoting.server import RemotingServer, bound_port

HOST = "127.0.0.1"
CLUSTER = "FakeCluster"


class Mode(enum.Enum):
    OK = "ok"  # store and answer SUCCESS (or `code` when it is a "stored" code)
    REFUSE = "refuse"  # answer `code` with `remark`
    SILENT = "silent"  # read the request, never answer
    SLOW = "slow"  # store and answer after `delay_s`
    CLOSE = "close"  # read the request, close the connection
    DOWN = "down"  # nothing listens: connecting is refused


@attrs.define
class Stored:
    request_code: int
    header: SendMessageRequestHeader
    body: bytes  # as sent (compressed if the sys flag says so)
    flag: int
    properties: dict[str, str]
    queue_offset: int


@attrs.define
class Replica:
    broker_name: str
    index: int  # 0 registers as the master
    port: int = 0
    mode: Mode = Mode.OK
    code: int = ResponseCode.SUCCESS
    remark: str = "refused by the test"
    refusals_left: int = -1  # REFUSE this many times, then OK; -1: for ever
    delay_s: float = 0.0  # SLOW: how long each answer takes
    forwarded: bool = False  # answer as our follower does after forwarding (raftForwarded)
    # QUERY_CONSUMER_OFFSET's answer: (offset or None for QUERY_NOT_FOUND, marked unsettled)
    offset_answer: tuple[int | None, bool] | None = None
    # the answer to a query that allows the replica its wait for a leader (no
    # offsetUnsettledAtOnce field), when it differs: an election ended meanwhile
    offset_answer_waited: tuple[int | None, bool] | None = None
    offset_queries: int = 0
    offset_at_once: list[bool] = attrs.field(factory=list)  # each query's offsetUnsettledAtOnce
    requests: list[RemotingCommand] = attrs.field(factory=list)  # every send received
    stored: list[Stored] = attrs.field(factory=list)
    ends: list[RemotingCommand] = attrs.field(factory=list)  # every END_TRANSACTION received
    clients: list[Connection] = attrs.field(factory=list)  # connections that sent a heartbeat
    arrived: trio.Event = attrs.field(factory=trio.Event)  # set (and renewed) on each of both

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"


@attrs.define
class FakeCluster:
    replicas: dict[str, list[Replica]]
    routes: dict[str, dict[str, Any]]  # topic -> route JSON; TBW102 included
    namesrv_port: int = 0
    queue_offsets: dict[tuple[str, str, int], int] = attrs.field(factory=dict)
    route_queries: list[str] = attrs.field(factory=list)
    register_created: bool = True  # an auto-created topic appears in the namesrv's routes

    @property
    def namesrv_addr(self) -> str:
        return f"{HOST}:{self.namesrv_port}"

    def replica(self, broker_name: str, index: int) -> Replica:
        return self.replicas[broker_name][index]

    def stored(self, broker_name: str | None = None) -> list[Stored]:
        return [
            s
            for name, group in self.replicas.items()
            if broker_name in (None, name)
            for r in group
            for s in r.stored
        ]

    def sends(self, broker_name: str | None = None) -> int:
        return sum(
            len(r.requests)
            for name, group in self.replicas.items()
            if broker_name in (None, name)
            for r in group
        )

    def set_route(self, topic: str, queues: int, perm: int = 6) -> None:
        self.routes[topic] = {
            "queueDatas": [
                {
                    "brokerName": name,
                    "readQueueNums": queues,
                    "writeQueueNums": queues,
                    "perm": perm,
                    "topicSysFlag": 0,
                }
                for name in sorted(self.replicas)
            ],
            "brokerDatas": [
                {
                    "cluster": CLUSTER,
                    "brokerName": name,
                    "brokerAddrs": {str(r.index): r.address for r in group},
                }
                for name, group in sorted(self.replicas.items())
            ],
        }

    # --- the namesrv -----------------------------------------------------------------------

    async def namesrv(self, request: RemotingCommand, _conn: Connection) -> RemotingCommand:
        if request.code != RequestCode.GET_ROUTEINFO_BY_TOPIC:
            return request.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, "fake namesrv")
        topic = request.ext_fields["topic"]
        self.route_queries.append(topic)
        route = self.routes.get(topic)
        if route is None:
            return request.response(
                ResponseCode.TOPIC_NOT_EXIST, f"No topic route info in name server for {topic}"
            )
        return request.response(body=json.dumps(route).encode())

    # --- a broker replica ------------------------------------------------------------------

    def broker(self, replica: Replica) -> Any:
        async def handle(request: RemotingCommand, conn: Connection) -> RemotingCommand:
            if request.code in (RequestCode.HEART_BEAT, RequestCode.END_TRANSACTION):
                if request.code == RequestCode.END_TRANSACTION:
                    replica.ends.append(request)
                elif conn not in replica.clients:
                    replica.clients.append(conn)
                replica.arrived.set()
                replica.arrived = trio.Event()
                return request.response()
            if request.code == RequestCode.UNREGISTER_CLIENT:
                return request.response()
            if request.code == RequestCode.QUERY_CONSUMER_OFFSET and replica.offset_answer:
                replica.offset_queries += 1
                if replica.mode is Mode.DOWN or replica.mode is Mode.CLOSE:
                    conn.close("closed by the fake broker")
                    await trio.sleep_forever()
                at_once = request.ext_fields.get(OFFSET_UNSETTLED_AT_ONCE_FIELD) == "true"
                replica.offset_at_once.append(at_once)
                offset, unsettled = replica.offset_answer
                if not at_once and replica.offset_answer_waited is not None:
                    offset, unsettled = replica.offset_answer_waited
                fields = {} if offset is None else {"offset": str(offset)}
                if unsettled:
                    fields[OFFSET_UNSETTLED_FIELD] = "true"
                code = ResponseCode.SUCCESS if offset is not None else ResponseCode.QUERY_NOT_FOUND
                return request.response(code, ext_fields=fields)
            if request.code not in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
                return request.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, "fake broker")
            replica.requests.append(request)
            if replica.mode is Mode.SILENT:
                await trio.sleep_forever()
            if replica.mode is Mode.SLOW:
                await trio.sleep(replica.delay_s)
            if replica.mode is Mode.CLOSE:
                conn.close("closed by the fake broker")
                await trio.sleep_forever()
            if replica.mode is Mode.REFUSE and replica.refusals_left != 0:
                replica.refusals_left -= 1
                return request.response(replica.code, replica.remark)
            return self._store(replica, request)

        return handle

    def _store(self, replica: Replica, request: RemotingCommand) -> RemotingCommand:
        header = SendMessageRequestHeader.decode(request.ext_fields, short_names=True)
        topic = header.topic
        if topic not in self.routes:
            assert header.default_topic == "TBW102", header
            if self.register_created:
                self.set_route(topic, min(header.default_topic_queue_nums, 8))
        if request.code == RequestCode.SEND_BATCH_MESSAGE:
            records = [
                (o.body, o.flag, props.decode(o.properties)) for o in parse_batch(request.body)
            ]
        else:
            records = [
                (request.body, header.flag, props.decode((header.properties or "").encode()))
            ]
        key = (replica.broker_name, topic, header.queue_id)
        first = self.queue_offsets.get(key, 0)
        ids = []
        for i, (body, flag, properties) in enumerate(records):
            replica.stored.append(Stored(request.code, header, body, flag, properties, first + i))
            ids.append(offset_msg_id((HOST, replica.port), 1000 * (first + i)))
        self.queue_offsets[key] = first + len(records)
        code = replica.code if replica.mode is Mode.OK else ResponseCode.SUCCESS
        fields = {
            "msgId": ",".join(ids),
            "queueId": str(header.queue_id),
            "queueOffset": str(first),
        }
        if replica.forwarded:
            fields[RAFT_FORWARDED_FIELD] = "true"
        return request.response(code, ext_fields=fields)


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def fake_cluster(
    groups: Mapping[str, int],
    *,
    topics: Mapping[str, int] | None = None,
    down: tuple[str, ...] = (),
) -> AsyncIterator[FakeCluster]:
    """Replicas per group ("broker-a": 2); `down` names replicas ("broker-a/0") that never
    listen. Everything stops when the block ends."""
    cluster = FakeCluster(
        {name: [Replica(name, i) for i in range(count)] for name, count in groups.items()}, {}
    )
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(RemotingServer(cluster.namesrv).serve_tcp, HOST, 0)
        cluster.namesrv_port = bound_port(listeners)
        for name, group in cluster.replicas.items():
            for replica in group:
                if f"{name}/{replica.index}" in down:
                    replica.mode = Mode.DOWN
                    replica.port = _unused_port()
                    continue
                server = RemotingServer(cluster.broker(replica))
                replica.port = bound_port(await nursery.start(server.serve_tcp, HOST, 0))
        cluster.set_route("TBW102", 8, perm=7)
        for topic, queues in (topics or {}).items():
            cluster.set_route(topic, queues)
        yield cluster
        nursery.cancel_scope.cancel()
