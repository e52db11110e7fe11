"""A network of memory streams for node tests: a whole group in one trio run, no sockets.

`MemoryNetwork.serve` stands in for the TCP listener of dledger/hosting.py and
`MemoryNetwork.connector` for the peer links' TCP connect. A connection's server side is served
in the nursery of the node that accepted it, so cancelling a node (a kill) ends its
connections, and their other ends see EOF as they would after a real process died.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import trio
import trio.testing

from dledger.config import Address, NodeConfig
from dledger.hosting import host_node
from dledger.log.store import FlushPolicy, LogStore, StoreConfig
from dledger.node import Node, StateMachine
from dledger.transport import PeerConnector
from dledger.wire import Status

Handler = Callable[[trio.abc.Stream], Awaitable[None]]


async def run_inline(fn: Callable[..., Any], *args: Any) -> Any:
    """Node's `offload` for mock-clock tests: the file write blocks the loop, so no virtual
    time passes while it runs (a worker thread would let the clock jump past timeouts)."""
    return fn(*args)


class MemoryNetwork:
    def __init__(self) -> None:
        self._listeners: dict[Address, Callable[[trio.abc.Stream], None]] = {}
        self.connects = 0
        self.names: dict[Address, str] = {}  # who listens where, for cuts by name
        self._cut: set[tuple[str, str]] = set()  # (src, dst): what src sends dst never arrives
        self._healed = trio.Event()

    def cut_off(self, node: str, others: Iterable[str]) -> None:
        """Nothing `node` sends reaches `others` and nothing they send reaches it, as with
        packets dropped: connections stay open, and what is sent waits until `heal` (TCP
        retransmitting), so only timeouts notice."""
        for other in others:
            self._cut |= {(node, other), (other, node)}

    def heal(self) -> None:
        self._cut.clear()
        self._healed.set()
        self._healed = trio.Event()

    async def deliverable(self, src: str, dst: str) -> None:
        """Returns once src -> dst is not cut."""
        while (src, dst) in self._cut:
            await self._healed.wait()

    async def serve(
        self,
        handler: Handler,
        host: str,
        port: int,
        *,
        task_status: trio.TaskStatus[list[Any]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """hosting.Serve: accept connections to host:port until cancelled."""
        address = Address(host, port)
        assert address not in self._listeners, f"{address} is already served"
        async with trio.open_nursery() as nursery:
            self._listeners[address] = partial(nursery.start_soon, handler)
            try:
                task_status.started([])
                await trio.sleep_forever()
            finally:
                del self._listeners[address]

    def connector(self, source: str | None = None) -> PeerConnector:
        """Connections from `source` (a name `cut_off` knows; None: never cut)."""

        async def connect(peer: str, address: Address) -> trio.abc.Stream:
            accept = self._listeners.get(address)
            if accept is None:
                raise ConnectionRefusedError(f"nothing listens on {address}")
            client, server = trio.testing.memory_stream_pair()
            self.connects += 1
            if source is None:
                accept(server)
                return client
            target = self.names.get(address, peer)
            accept(_CutStream(server, self, target, source))
            return _CutStream(client, self, source, target)

        return connect


class _CutStream(trio.abc.Stream):
    """One end of a memory connection whose sends wait while the network cuts src -> dst."""

    def __init__(self, inner: trio.abc.Stream, network: MemoryNetwork, src: str, dst: str):
        self.inner, self.network, self.src, self.dst = inner, network, src, dst

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.network.deliverable(self.src, self.dst)
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


@attrs.define
class MemoryGroup:
    """Nodes of one group on a MemoryNetwork; `kill` and `start` by id."""

    root: Path
    network: MemoryNetwork
    nursery: trio.Nursery
    peers: dict[str, Address]
    state_machines: dict[str, StateMachine | None]
    # builds a replica's state machine over its store (instead of `state_machines`)
    factory: Callable[[str, LogStore], StateMachine] | None = None
    nodes: dict[str, Node] = attrs.field(factory=dict)
    stores: dict[str, LogStore] = attrs.field(factory=dict)
    _scopes: dict[str, trio.CancelScope] = attrs.field(factory=dict)
    _stopped: dict[str, trio.Event] = attrs.field(factory=dict)

    async def start(self, n: str) -> Node:
        if n in self._stopped:
            await self._stopped[n].wait()  # a killed node's files are closed first
        store = LogStore.open(
            self.root / n,
            StoreConfig(segment_bytes=1 << 20, flush=FlushPolicy.ASYNC_FLUSH),
            group="g",
            self_id=n,
        )
        config = NodeConfig(
            group="g", self_id=n, peers=self.peers, store_dir=self.root / n, store=store.config
        )
        machine = self.factory(n, store) if self.factory else self.state_machines.get(n)
        if machine is not None:
            self.state_machines[n] = machine
        node = Node(
            config,
            store,
            machine,
            connect=self.network.connector(n),
            offload=run_inline,
        )
        self.nodes[n], self.stores[n] = node, store
        on_role = getattr(machine, "on_role_change", None)
        if on_role is not None:
            node.on_role_change(on_role)
        await self.nursery.start(self._run, n, node, store)
        return node

    async def _run(
        self,
        n: str,
        node: Node,
        store: LogStore,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        self._stopped[n] = trio.Event()
        try:
            with trio.CancelScope() as scope:
                self._scopes[n] = scope
                await host_node(node, serve=self.network.serve, task_status=task_status)
        finally:
            close = getattr(self.state_machines.get(n), "close", None)
            if close is not None:
                close()
            store.close()
            self._stopped[n].set()

    def kill(self, n: str) -> None:
        """Stop `n` at once: its tasks and connections end, its store closes."""
        self._scopes.pop(n).cancel()
        del self.nodes[n]

    async def wait_stopped(self, n: str) -> None:
        """Until a killed node's tasks ended and its files are closed."""
        await self._stopped[n].wait()

    def leaders(self) -> list[str]:
        return [n for n, node in self.nodes.items() if node.is_leader]

    async def wait_for_leader(self, timeout_s: float = 30.0) -> str:
        with trio.fail_after(timeout_s):
            while True:
                leaders = self.leaders()
                if len(leaders) == 1:
                    return leaders[0]
                await trio.sleep(0.01)

    async def append(self, bodies: list[bytes], timeout_s: float = 30.0) -> int:
        """Append through whichever node leads, retrying refusals until `timeout_s`; the
        index of the last entry."""
        with trio.fail_after(timeout_s):
            while True:
                leader = await self.wait_for_leader(timeout_s)
                reply = await self.nodes[leader].append(bodies)
                if reply.status is Status.OK:
                    return reply.last_index
                await trio.sleep(0.01)


@asynccontextmanager
async def memory_group(
    root: Path,
    size: int = 3,
    state_machines: dict[str, StateMachine | None] | None = None,
    factory: Callable[[str, LogStore], StateMachine] | None = None,
) -> AsyncIterator[MemoryGroup]:
    # addresses are labels here: nothing binds or dials them
    peers = {f"n{i}": Address("127.0.0.1", 40911 + i) for i in range(size)}
    network = MemoryNetwork()
    network.names.update({address: n for n, address in peers.items()})
    async with trio.open_nursery() as nursery:
        group = MemoryGroup(root, network, nursery, peers, dict(state_machines or {}), factory)
        for n in peers:
            await group.start(n)
        yield group
        nursery.cancel_scope.cancel()
