"""dledger-broker: one replica of a broker group, RocketMQ's remoting protocol on a Raft log.

    dledger-broker --group broker-a --self-id n0 \\
        --peers "n0-127.0.0.1:40911;n1-127.0.0.1:40912;n2-127.0.0.1:40913" \\
        --listen 127.0.0.1:10911 --namesrv "127.0.0.1:9876;127.0.0.1:9877" --store ./data/broker-a/n0

The process embeds a dledger Node (the peer port of --peers) whose state machine is the broker
(broker/state.py), and serves RocketMQ clients on --listen. Exit status: 0 after SIGTERM or
SIGINT, 1 when the store cannot be opened or a port bound, 2 for a bad command line or
configuration (broker/config.py).
"""

from __future__ import annotations

import logging
import signal
import sys
import time

import trio

from broker.clients import ClientRegistry
from broker.config import BrokerConfig, parse_or_exit
from broker.context import Broker
from broker.handlers import bound, bound_batched
from broker.offsets import OffsetCoalescer
from broker.registration import Registrar
from broker.schedule import run_schedules
from broker.snapshots import propose_snapshots
from broker.state import BrokerState, Geometry
from broker.transaction_check import run_checks
from broker.writes import WritePath
from dledger.client import open_client
from dledger.exceptions import operator_error
from dledger.hosting import host_node, settle_heap
from dledger.log.store import LogStore
from dledger.node import Node
from remoting.dispatch import Dispatcher
from remoting.server import RemotingServer

log = logging.getLogger("broker.server")

CHECKPOINT_INTERVAL_S = 1.0  # derived files flushed and the broker state recorded this often


async def serve(
    config: BrokerConfig,
    *,
    geometry: Geometry | None = None,
    task_status: trio.TaskStatus[Broker] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Open the stores and serve until cancelled; files closed on every way out."""
    node_config = config.node_config()
    with LogStore.open(
        node_config.store_dir, node_config.store, group=config.group, self_id=config.self_id
    ) as store:
        log.info("log store recovered: %s", store.recovery)
        state = BrokerState(config.store_root, store, geometry or config.geometry())
        try:
            node = Node(node_config, store, state)
            node.on_role_change(state.on_role_change)
            async with open_client(config.peers) as client, trio.open_nursery() as nursery:
                writes = WritePath(node, client)
                clients = ClientRegistry()
                offsets = OffsetCoalescer(state, writes)
                broker = Broker(
                    config, node, state, writes, client, clients, offsets, int(time.time() * 1000)
                )
                broker.background = nursery
                broker.registrar = Registrar(broker)
                node.on_role_change(lambda role: broker.registrar.role_changed())
                state.topic_listeners.append(broker.registrar.topics_changed)
                await nursery.start(writes.run)
                await nursery.start(host_node, node)
                await nursery.start(clients.run)
                nursery.start_soon(offsets.run)
                nursery.start_soon(state.run_checkpoints, CHECKPOINT_INTERVAL_S)
                nursery.start_soon(propose_snapshots, broker)
                nursery.start_soon(run_schedules, broker)
                nursery.start_soon(run_checks, broker)
                server = RemotingServer(Dispatcher(bound(broker), batched=bound_batched(broker)))
                listen = config.listen
                await nursery.start(server.serve_tcp, listen.host, listen.port)
                nursery.start_soon(broker.registrar.run)
                log.info(
                    "%s of %s serving RocketMQ clients on %s (advertised %s), peers on %s",
                    config.self_id,
                    config.group,
                    listen,
                    broker.address,
                    node_config.listen,
                )
                task_status.started(broker)
        finally:
            state.close()


async def serve_until_signal(config: BrokerConfig) -> None:
    """`serve` until SIGTERM or SIGINT: every task unwinds through its `finally`."""
    async with trio.open_nursery() as nursery:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            await nursery.start(serve, config)
            settle_heap()
            async for signum in signals:
                log.info("stopping on %s", signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                return


def main(argv: list[str] | None = None) -> int:
    config = parse_or_exit(argv)
    logging.basicConfig(
        level=config.log_level,
        format=f"%(asctime)s {config.group}/{config.self_id} %(levelname)s %(name)s: %(message)s",
    )
    try:
        trio.run(serve_until_signal, config)
    except Exception as exc:  # one line to stderr for what an operator can fix, else re-raise
        line = operator_error(exc, "dledger-broker", config.store_root)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
