"""A client's remoting connection: open one, send requests on it, let it answer the server.

`open_connection("127.0.0.1", 9876)` is an async context manager giving a Connection whose
reader runs in a task of its own; `request()` may be called from many tasks at once. A
`handler` answers what the server asks (the broker's NOTIFY_CONSUMER_IDS_CHANGED or
CHECK_TRANSACTION_STATE); without one, those are answered REQUEST_CODE_NOT_SUPPORTED.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from remoting import limits
from remoting.connection import Connection, RequestHandler

CONNECT_TIMEOUT_S_DEFAULT = 3.0


@asynccontextmanager
async def open_connection(
    host: str,
    port: int,
    *,
    handler: RequestHandler | None = None,
    connect_timeout_s: float = CONNECT_TIMEOUT_S_DEFAULT,
) -> AsyncIterator[Connection]:
    """Connect to host:port; the connection closes when the block ends."""
    with trio.fail_after(connect_timeout_s):
        stream = await trio.open_tcp_stream(host, port)
    async with open_stream_connection(stream, handler=handler, peer=f"{host}:{port}") as conn:
        yield conn


@asynccontextmanager
async def open_stream_connection(
    stream: trio.abc.Stream,
    *,
    handler: RequestHandler | None = None,
    peer: str = "server",
    frame_bytes_max: int = limits.FRAME_BYTES_MAX,
) -> AsyncIterator[Connection]:
    """A Connection over any stream (a memory stream in tests), run until the block ends."""
    connection = Connection(stream, handler, peer=peer, frame_bytes_max=frame_bytes_max)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(connection.run)
        try:
            yield connection
        finally:
            connection.close()
