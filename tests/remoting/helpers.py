"""A server and client wired back to back over memory streams (h11's ConnectionPair)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
import trio.testing

from remoting.client import open_stream_connection
from remoting.connection import Connection, RequestHandler
from remoting.server import RemotingServer


@asynccontextmanager
async def served(
    server: RemotingServer, *, handler: RequestHandler | None = None, peer: str = "client"
) -> AsyncIterator[Connection]:
    """A client Connection to `server` over a fresh memory stream pair."""
    client_stream, server_stream = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.serve_stream, server_stream, peer)
        async with open_stream_connection(client_stream, handler=handler) as conn:
            yield conn
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def raw_client(server: RemotingServer) -> AsyncIterator[trio.abc.Stream]:
    """A bare stream to `server`, for sending bytes no Connection would."""
    client_stream, server_stream = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.serve_stream, server_stream, "raw")
        yield client_stream
        nursery.cancel_scope.cancel()
