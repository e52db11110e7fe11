"""How a connection's frames reach its socket: straight from the task that made them while the
writer is parked with nothing queued, else through the writer, and always in the order made."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from remoting.codes import RequestCode
from remoting.command import RemotingCommand
from remoting.connection import Connection, RequestHandler
from remoting.errors import ConnectionClosed
from remoting.frame import FrameDecoder, encode
from tests.sockets import stream_pair

DEADLINE_S = 10


@asynccontextmanager
async def running(
    handler: RequestHandler | None = None, buffer_bytes: int | None = None
) -> AsyncIterator[tuple[Connection, socket.socket]]:
    """A running connection, its writer parked, and the plain socket at the other end."""
    stream, theirs = stream_pair(buffer_bytes)
    connection = Connection(stream, handler, peer="test")
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(connection.run)
            await trio.testing.wait_all_tasks_blocked()
            yield connection, theirs
            connection.close()
    finally:
        theirs.close()


def commands_in(data: bytes) -> list[RemotingCommand]:
    decoder = FrameDecoder()
    decoder.feed(data)
    return list(decoder.commands())


async def read_commands(sock: socket.socket, count: int) -> list[RemotingCommand]:
    decoder, got = FrameDecoder(), []
    with trio.fail_after(DEADLINE_S):
        while len(got) < count:
            await trio.lowlevel.wait_readable(sock)
            data = sock.recv(1 << 20)
            assert data, "the connection closed"
            decoder.feed(data)
            got.extend(decoder.commands())
    return got


def oneway(i: int, body: bytes = b"") -> RemotingCommand:
    return RemotingCommand.request(RequestCode.HEART_BEAT, {"i": str(i)}, body=body)


async def test_a_frame_sent_while_the_writer_is_parked_is_on_the_socket_at_once() -> None:
    async with running() as (connection, theirs):
        await connection.send_oneway(oneway(1))
        # No checkpoint since the send: the writer task has not run, yet the frame is there.
        [got] = commands_in(theirs.recv(1 << 16))
        assert got.ext_fields == {"i": "1"} and got.is_oneway


async def test_what_the_socket_does_not_take_goes_out_before_every_later_frame() -> None:
    big = bytes(range(256)) * 8192  # 2 MiB: far more than the socket takes at once
    async with running(buffer_bytes=4096) as (connection, theirs):

        async def send_all() -> None:
            await connection.send_oneway(oneway(0, big))
            for i in range(1, 40):
                await connection.send_oneway(oneway(i))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_all)
            got = await read_commands(theirs, 40)
        assert [c.ext_fields["i"] for c in got] == [str(i) for i in range(40)]
        assert got[0].body == big


async def test_a_send_after_close_raises_and_nothing_more_is_written() -> None:
    async with running() as (connection, theirs):
        connection.close()
        with pytest.raises(ConnectionClosed):
            await connection.send_oneway(oneway(1))
        with trio.fail_after(DEADLINE_S):
            await trio.lowlevel.wait_readable(theirs)
        assert theirs.recv(1 << 16) == b""  # the close, and not a byte before it


async def test_answers_to_requests_read_together_all_arrive_whole() -> None:
    async def echo(request: RemotingCommand, connection: Connection) -> RemotingCommand:
        return request.response(ext_fields=request.ext_fields)

    async with running(echo) as (_, theirs):
        requests = [
            RemotingCommand.request(RequestCode.HEART_BEAT, {"i": str(i)}).with_opaque(i + 1)
            for i in range(20)
        ]
        theirs.sendall(b"".join(encode(r) for r in requests))
        got = await read_commands(theirs, len(requests))
        assert sorted(c.opaque for c in got) == [r.opaque for r in requests]
        assert all(c.is_response and c.ext_fields == {"i": str(c.opaque - 1)} for c in got)
