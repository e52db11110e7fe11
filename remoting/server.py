"""The remoting server: a trio shell that gives every accepted stream its own Connection.

`RemotingServer(handler).serve_stream(stream, peer)` serves one stream (a socket, or a memory
stream in tests); `serve_tcp` accepts on host:port. At most CONNECTIONS_MAX connections are
served at once; one more is closed at once with a log line. A bad frame or a broken stream ends
only its own connection.
"""

from __future__ import annotations

import logging
from functools import partial

import trio

from remoting import limits
from remoting.connection import Connection, RequestHandler

log = logging.getLogger("remoting.server")


def peer_name(stream: trio.abc.Stream) -> str:
    """host:port of a socket stream's peer, else the stream's type."""
    if isinstance(stream, trio.SocketStream):
        try:
            host, port = stream.socket.getpeername()[:2]
            return f"{host}:{port}"
        except OSError:
            return "?"
    return type(stream).__name__


class RemotingServer:
    def __init__(
        self,
        handler: RequestHandler,
        *,
        connections_max: int = limits.CONNECTIONS_MAX,
        frame_bytes_max: int = limits.FRAME_BYTES_MAX,
    ) -> None:
        self.handler = handler
        self.connections: set[Connection] = set()  # served now
        self._connections_max = connections_max
        self._frame_bytes_max = frame_bytes_max

    async def serve_stream(self, stream: trio.abc.Stream, peer: str | None = None) -> None:
        """Serve one stream until it ends; the stream is closed on every way out."""
        peer = peer or peer_name(stream)
        if len(self.connections) >= self._connections_max:
            log.warning(
                "refusing connection from %s: %d connections served, the limit",
                peer,
                len(self.connections),
            )
            await trio.aclose_forcefully(stream)
            return
        connection = Connection(
            stream, self.handler, peer=peer, frame_bytes_max=self._frame_bytes_max
        )
        self.connections.add(connection)
        log.debug("connection from %s", peer)
        try:
            await connection.run()
        finally:
            self.connections.discard(connection)

    async def serve_tcp(
        self,
        host: str,
        port: int,
        *,
        task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept on host:port (0 picks a free port) until cancelled; started() with listeners."""
        await trio.serve_tcp(partial(_serve_socket, self), port, host=host, task_status=task_status)


async def _serve_socket(server: RemotingServer, stream: trio.SocketStream) -> None:
    await server.serve_stream(stream)


def bound_port(listeners: list[trio.SocketListener]) -> int:
    """The port the first listener is bound to (for servers started on port 0)."""
    port: int = listeners[0].socket.getsockname()[1]
    return port


async def serve_remoting(
    handler: RequestHandler,
    host: str,
    port: int,
    *,
    task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """`RemotingServer(handler).serve_tcp(host, port)` in one call."""
    await RemotingServer(handler).serve_tcp(host, port, task_status=task_status)
