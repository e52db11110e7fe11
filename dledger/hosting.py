"""Run a node with the listener its peers (and dledger clients) connect to.

`dledger-server` (server.py) and an embedding program such as the broker both host a node this
way: the node's own tasks, plus one TCP listener on the node's peer address whose connections
dledger/service.py serves. The listener is the embedder's to replace: tests pass
`serve=` a function that serves memory streams instead (tests/node/memnet.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial

import trio

from dledger.node import Node
from dledger.service import Service

Handler = Callable[[trio.abc.Stream], Awaitable[None]]
# Serves `handler` on the node's address until cancelled; `started` with the bound listeners.
Serve = Callable[..., Awaitable[object]]


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
