"""A trio stream on one end of a socket pair and the plain socket on the other, for tests of
what a writer puts on a socket (dledger's outbox, remoting's connection)."""

from __future__ import annotations

import socket

import trio


def stream_pair(buffer_bytes: int | None = None) -> tuple[trio.SocketStream, socket.socket]:
    """A trio stream to write on, and the non-blocking plain socket at its other end; with
    `buffer_bytes`, both socket buffers that small, so a large frame does not fit at once."""
    ours, theirs = socket.socketpair()
    if buffer_bytes is not None:
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer_bytes)
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer_bytes)
    theirs.setblocking(False)
    return trio.SocketStream(trio.socket.from_stdlib_socket(ours)), theirs
