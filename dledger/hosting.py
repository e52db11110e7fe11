"""Run a node with the listener its peers (and dledger clients) connect to.

`dledger-server` (server.py) and an embedding program such as the broker both host a node this
way: the node's own tasks, plus one TCP listener on the node's peer address whose connections
dledger/service.py serves. The listener is the embedder's to replace: tests pass
`serve=` a function that serves memory streams instead (tests/node/memnet.py).
"""

from __future__ import annotations

import gc
from collections.abc import Awaitable, Callable
from functools import partial

import trio

from dledger import limits
from dledger.node import Node
from dledger.service import Service

Handler = Callable[[trio.abc.Stream], Awaitable[None]]
# Serves `handler` on the node's address until cancelled; `started` with the bound listeners.
Serve = Callable[..., Awaitable[object]]


def settle_heap() -> None:
    """Once a server process serves: what start-up built (modules, configuration, recovered
    state) is moved out of the collector's sight (`gc.freeze`), and a young collection runs
    every GC_YOUNG_ALLOCATIONS container allocations instead of every 700. Under load each
    request allocates hundreds of short-lived tuples and lists, nearly all freed by reference
    counting, so the default threshold ran a collection every few requests, and the older
    generations it reached walked the whole start-up heap: ~5 % of a loaded leader's CPU
    (docs/decisions.md, "The collector, tuned for a server"). Cycles still get collected."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(limits.GC_YOUNG_ALLOCATIONS, older, oldest)


async def serve_tcp(
    handler: Handler,
    host: str,
    port: int,
    *,
    task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> None:
    await trio.serve_tcp(handler, port, host=host, task_status=task_status)


async def host_node(
    node: Node,
    *,
    serve: Serve = serve_tcp,
    task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run `node` and serve its peer address until cancelled. `started` once the listener is
    bound and the node runs, with the listeners (for their port)."""
    service = Service(node)
    listen = node.config.listen
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            partial(serve, service.handle_connection, listen.host, listen.port)
        )
        await nursery.start(node.run)
        task_status.started(listeners)
