"""A stand-in for `python -m broker` with the same command line, for testing the launcher before
the broker exists (and without its cost).

It listens on --listen and answers GET_BROKER_RUNTIME_INFO with raftRole, raftTerm and
raftLeader. Each replica writes its pid to <store>/fake.pid, and the "leader" is the
lowest-numbered replica of the group whose pid runs, with term = that replica's number + 1, so
killing the leader makes the next one take over with a higher term. At start it waits (up to
START_GRACE_S) for every replica's pid file, so replicas started together agree on n0, term 1.
(No probing of peer ports: a connect to an unbound local port can connect to itself and take
the port.) Every 0.3 s it registers with
every name server: brokerId 0 when it leads, else its number + 1 (so never 0).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
from pathlib import Path

import trio

from dledger.config import parse_peers
from remoting.client import open_connection
from remoting.codes import RequestCode
from remoting.command import RemotingCommand
from remoting.dispatch import Dispatcher
from remoting.headers import RegisterBrokerRequestHeader
from remoting.server import RemotingServer

REGISTER_EVERY_S = 0.3
START_GRACE_S = 5.0
TBW102 = {"topicName": "TBW102", "readQueueNums": 8, "writeQueueNums": 8, "perm": 7}


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    for flag in ("--group", "--self-id", "--peers", "--listen", "--namesrv", "--store"):
        p.add_argument(flag, required=True)
    p.add_argument("--flush", default="ASYNC_FLUSH")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args()


def pid_file(store: Path) -> Path:
    return store / "fake.pid"


def alive(store: Path) -> bool:
    """The pid in store's pid file runs (a zombie does not)."""
    try:
        pid = int(pid_file(store).read_text())
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class FakeBroker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.peers = parse_peers(args.peers)
        self.leader = "?"
        self.term = 0

    @property
    def number(self) -> int:
        return int(self.args.self_id[1:])

    def store_of(self, node: str) -> Path:
        return Path(self.args.store).parent / node

    async def elect(self) -> None:
        for node in sorted(self.peers):
            if node == self.args.self_id or alive(self.store_of(node)):
                self.leader, self.term = node, int(node[1:]) + 1
                return

    async def runtime_info(self, request: RemotingCommand, conn: object) -> RemotingCommand:
        role = "leader" if self.leader == self.args.self_id else "follower"
        table = {"raftRole": role, "raftTerm": str(self.term), "raftLeader": self.leader}
        return request.response(body=json.dumps({"table": table}).encode())

    async def wait_for_peers(self) -> None:
        with trio.move_on_after(START_GRACE_S):
            for node in self.peers:
                while not alive(self.store_of(node)):
                    await trio.sleep(0.05)

    async def register_forever(self) -> None:
        await self.wait_for_peers()
        while True:
            await self.elect()
            broker_id = 0 if self.leader == self.args.self_id else self.number + 1
            header = RegisterBrokerRequestHeader(
                broker_name=self.args.group,
                broker_addr=self.args.listen,
                cluster_name="DefaultCluster",
                ha_server_addr="",
                broker_id=broker_id,
                compressed=False,
                body_crc32=0,
                raft_term=self.term,
            )
            body = {"topicConfigSerializeWrapper": {"topicConfigTable": {"TBW102": TBW102}}}
            for ns in self.args.namesrv.split(";"):
                host, port = ns.rsplit(":", 1)
                try:
                    with trio.fail_after(1):
                        async with open_connection(host, int(port)) as conn:
                            await conn.request(
                                RemotingCommand.request(
                                    RequestCode.REGISTER_BROKER,
                                    header.encode(),
                                    json.dumps(body).encode(),
                                )
                            )
                except Exception as err:
                    logging.info("register with %s: %r", ns, err)
            await trio.sleep(REGISTER_EVERY_S)

    async def main(self) -> None:
        host, port = self.args.listen.rsplit(":", 1)
        server = RemotingServer(
            Dispatcher({RequestCode.GET_BROKER_RUNTIME_INFO: self.runtime_info})
        )
        Path(self.args.store).mkdir(parents=True, exist_ok=True)
        pid_file(Path(self.args.store)).write_text(str(os.getpid()))
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve_tcp, host, int(port))
            nursery.start_soon(self.register_forever)
            with trio.open_signal_receiver(signal.SIGTERM) as signals:
                async for _ in signals:
                    nursery.cancel_scope.cancel()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    trio.run(FakeBroker(parse()).main)
