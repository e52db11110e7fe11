"""One broker group of three replicas in this trio process, and the requests tests send it.

`broker_group(tmp_path, **config)` runs three `broker.server.serve` replicas on free
127.0.0.1 ports with tiny derived-file geometries and 1 MiB segments, no name server, and
yields once a leader is elected (`namesrv=` gives it name servers). Tests talk to it with remoting.client.open_connection, as a
client would.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import trio

from broker.config import BrokerConfig
from broker.context import Broker
from broker.server import serve
from broker.state import Geometry
from dledger.config import Address
from dledger.processes import free_port_block
from remoting import properties as props
from remoting.codes import RequestCode
from remoting.command import RemotingCommand
from remoting.headers import PullMessageRequestHeader, SendMessageRequestHeader

GEOMETRY = Geometry(cq_units_per_file=1000, index_slots=1000, index_items=4000)
SEGMENT_BYTES = 1 << 20
MESSAGE_BYTES_MAX = 256 * 1024  # maxMessageSize here: must fit a 1 MiB segment
LEADER_TIMEOUT_S = 10.0
APPLY_TIMEOUT_S = 5.0
POLL_S = 0.01
REPLICAS = ("n0", "n1", "n2")


@attrs.define
class Group:
    brokers: dict[str, Broker]

    def leader(self) -> Broker:
        leaders = [b for b in self.brokers.values() if b.is_leader]
        assert len(leaders) == 1, [b.node.role for b in self.brokers.values()]
        return leaders[0]

    def follower(self) -> Broker:
        return next(b for b in self.brokers.values() if not b.is_leader)

    async def wait_leader(self) -> Broker:
        with trio.fail_after(LEADER_TIMEOUT_S):
            while not any(b.is_leader for b in self.brokers.values()):
                await trio.sleep(POLL_S)
        return self.leader()

    async def wait_applied_everywhere(self) -> None:
        """Every replica has applied what the leader has committed."""
        leader = self.leader()
        target = leader.node.commit_index
        with trio.fail_after(APPLY_TIMEOUT_S):
            while any(b.state.applied_index < target for b in self.brokers.values()):
                await trio.sleep(POLL_S)


@asynccontextmanager
async def broker_group(tmp_path: Path, **config: Any) -> AsyncIterator[Group]:
    # six distinct ports: free_port() twice may hand out the same one (it failed a full run
    # with "listenPort ... is also this replica's Raft address")
    first = free_port_block(2 * len(REPLICAS))
    peers = {n: Address("127.0.0.1", first + k) for k, n in enumerate(REPLICAS)}
    listens = {n: Address("127.0.0.1", first + len(REPLICAS) + k) for k, n in enumerate(REPLICAS)}
    config.setdefault("message_bytes_max", MESSAGE_BYTES_MAX)
    config.setdefault("namesrv", ())
    async with trio.open_nursery() as nursery:
        brokers = {}
        for n in REPLICAS:
            broker_config = BrokerConfig(
                group="broker-a",
                self_id=n,
                peers=peers,
                store_root=tmp_path / n,
                listen=listens[n],
                segment_bytes=SEGMENT_BYTES,
                **config,
            )
            brokers[n] = await nursery.start(partial(serve, broker_config, geometry=GEOMETRY))
        group = Group(brokers)
        await group.wait_leader()
        yield group
        nursery.cancel_scope.cancel()


def send_request(
    topic: str,
    body: bytes = b"hello",
    *,
    queue_id: int = 0,
    properties: dict[str, str] | None = None,
    raw_properties: str | None = None,
) -> RemotingCommand:
    """A SEND_MESSAGE as the C++ client sends it (long header names)."""
    text = props.encode(properties or {"TAGS": "TagA"}).decode()
    header = SendMessageRequestHeader(
        producer_group="pg",
        topic=topic,
        default_topic="TBW102",
        default_topic_queue_nums=4,
        queue_id=queue_id,
        sys_flag=0,
        born_timestamp=1764000000000,
        flag=0,
        properties=text if raw_properties is None else raw_properties,
        reconsume_times=0,
        unit_mode=False,
        batch=False,
    )
    return RemotingCommand.request(RequestCode.SEND_MESSAGE, header.encode(), body)


def pull_request(
    topic: str, queue_id: int, offset: int, *, group: str = "cg", suspend_ms: int = 0
) -> RemotingCommand:
    header = PullMessageRequestHeader(
        consumer_group=group,
        topic=topic,
        queue_id=queue_id,
        queue_offset=offset,
        max_msg_nums=32,
        sys_flag=2 if suspend_ms else 0,
        commit_offset=0,
        suspend_timeout_millis=suspend_ms,
        subscription="*",
        sub_version=0,
    )
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, header.encode())


def topic_request(code: int, topic: str, queues: int = 4) -> RemotingCommand:
    """UPDATE_AND_CREATE_TOPIC as mqadmin sends it."""
    fields = {"topic": topic, "readQueueNums": str(queues), "writeQueueNums": str(queues)}
    fields["perm"] = "6"
    return RemotingCommand.request(code, fields)
