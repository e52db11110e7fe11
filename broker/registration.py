"""Registration with every name server: the leader as brokerId 0, followers as 1..n.

Each replica registers with all name servers at start, at once on every change of role, term
or leader (not at the next heartbeat), and every `namesrv_heartbeat_ms` after that, carrying its
Raft term (`raftTerm`, docs/protocol.md) so a name server never lets an older term's master
displace a newer one. One task per name server; a name server that is down is retried at the
next round without holding up the others.
"""

from __future__ import annotations

import json
import logging
import time

import trio

from broker.context import Broker
from dledger.raft.events import Role
from remoting.client import open_connection
from remoting.codes import RequestCode, ResponseCode
from remoting.command import RemotingCommand
from remoting.errors import RemotingError
from remoting.headers import RegisterBrokerRequestHeader

log = logging.getLogger("broker.registration")

REGISTER_TIMEOUT_S = 3.0
RECONNECT_S = 0.2  # after a failed registration, try that name server again this soon


def broker_id(broker: Broker) -> int:
    """0 for the Raft leader; a follower's id is its place among the peers, from 1."""
    if broker.node.role.role is Role.LEADER:
        return 0
    return sorted(broker.config.peers).index(broker.config.self_id) + 1


def register_request(broker: Broker) -> RemotingCommand:
    topics = broker.all_topics()
    body = {
        "topicConfigSerializeWrapper": {
            "topicConfigTable": {name: config.to_json() for name, config in topics.items()},
            "dataVersion": {
                "timestamp": broker.started_ms,
                "counter": broker.state.metadata.version,
            },
        },
        "filterServerList": [],
    }
    header = RegisterBrokerRequestHeader(
        broker_name=broker.config.group,
        broker_addr=broker.address,
        cluster_name=broker.config.cluster,
        ha_server_addr=broker.address,
        broker_id=broker_id(broker),
        compressed=False,
        body_crc32=0,
        raft_term=broker.node.role.term,
    )
    return RemotingCommand.request(
        RequestCode.REGISTER_BROKER, header.encode(), json.dumps(body).encode()
    )


class Registrar:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._wake = {str(a): trio.Event() for a in broker.config.namesrv}
        self.registrations = 0

    def role_changed(self) -> None:
        for event in self._wake.values():
            event.set()

    def topics_changed(self) -> None:
        self.role_changed()

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            for address in self.broker.config.namesrv:
                nursery.start_soon(self._register_with, address.host, address.port)

    async def _register_with(self, host: str, port: int) -> None:
        name = f"{host}:{port}"
        period_s = self.broker.config.namesrv_heartbeat_ms / 1000
        while True:
            try:
                async with open_connection(
                    host, port, connect_timeout_s=REGISTER_TIMEOUT_S
                ) as conn:
                    while True:
                        self._wake[name] = trio.Event()
                        request = register_request(self.broker)
                        response = await conn.request(request, timeout_s=REGISTER_TIMEOUT_S)
                        self.registrations += 1
                        if response.code != ResponseCode.SUCCESS:
                            log.warning(
                                "name server %s refused our registration: %s", name, response.remark
                            )
                        with trio.move_on_after(period_s):
                            await self._wake[name].wait()
            except* (OSError, trio.TooSlowError, RemotingError) as group:
                # the connection's nursery wraps what its block raised: a name server that
                # went away mid-request is one more failed round, never the broker's end
                causes = "; ".join(str(e) or type(e).__name__ for e in group.exceptions)
                log.info("registration with name server %s failed: %s", name, causes)
            with trio.move_on_after(RECONNECT_S):
                await self._wake[name].wait()


def now_ms() -> int:
    return int(time.time() * 1000)
