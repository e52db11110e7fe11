"""A read that waits before it tries, and a write that never waits.

Both are for the hot loops of a connection (a leader reading requests and acknowledgements, a
follower reading appends, answers going back) where trio's generic methods spend system calls
and scheduler passes that the situation makes useless. Streams that are not sockets (memory
streams in tests) go through trio's methods unchanged.
"""

from __future__ import annotations

import os

import trio


async def receive_some(stream: trio.abc.Stream, max_bytes: int) -> bytes | bytearray:
    """`stream.receive_some(max_bytes)`, waiting for readability first.

    Trio tries the read first. On a connection whose peer waits for our answer it usually finds
    nothing, and then costs a failed recv, a raised and caught BlockingIOError and the wait
    before the read that succeeds. Here the wait comes first, then one read: leader CPU per
    message -2 %, followers' -4 % in bench.broker (docs/decisions.md). Cancellation and a
    socket closed meanwhile end it as they end trio's wait (Cancelled, ClosedResourceError);
    a failing read raises its OSError, as trio's does. Only for a stream with one reader."""
    if not isinstance(stream, trio.SocketStream):
        return await stream.receive_some(max_bytes)
    socket = stream.socket
    await trio.lowlevel.wait_readable(socket)
    try:
        return os.read(socket.fileno(), max_bytes)
    except BlockingIOError:  # readable, then not (a spurious wake-up): trio waits again
        return await stream.receive_some(max_bytes)


def write_nowait(stream: trio.abc.Stream, data: bytes) -> int:
    """Write what the socket takes of `data` now, without blocking; the number of bytes taken.

    Only for a stream whose sender task is parked with nothing to send, so that nothing else
    is writing to it. 0 when the socket is full, and also when it is broken or closed: the
    sender task, handed the rest, meets the error on its own send and ends the connection the
    usual way. A stream that is no socket (a memory stream in tests) takes nothing here: the
    sender sends it all."""
    if not isinstance(stream, trio.SocketStream):
        return 0
    try:
        return os.write(stream.socket.fileno(), data)
    except OSError:
        return 0
