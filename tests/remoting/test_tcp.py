"""The server and client over real 127.0.0.1 sockets."""

from __future__ import annotations

import struct

import trio

from remoting.client import open_connection
from remoting.codes import RequestCode, ResponseCode, SerializeType
from remoting.connection import Connection
from remoting.dispatch import Dispatcher
from remoting.frame import RemotingCommand
from remoting.server import RemotingServer, bound_port


async def test_concurrent_requests_over_tcp() -> None:
    async def slow_echo(request: RemotingCommand, connection: Connection) -> RemotingCommand:
        await trio.sleep(0.01 * (5 - int(request.ext_fields["i"])))  # later ones finish first
        return request.response(ext_fields=request.ext_fields, body=request.body * 1000)

    server = RemotingServer(Dispatcher({RequestCode.SEND_MESSAGE: slow_echo}))
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(server.serve_tcp, "127.0.0.1", 0)
        port = bound_port(listeners)
        got: dict[int, RemotingCommand] = {}
        async with open_connection("127.0.0.1", port) as conn:

            async def ask(i: int) -> None:
                serialization = SerializeType(i % 2)
                request = RemotingCommand.request(
                    10, {"i": str(i)}, body=b"%d" % i, serialization=serialization
                )
                got[i] = await conn.request(request, timeout_s=10)

            async with trio.open_nursery() as asks:
                for i in range(5):
                    asks.start_soon(ask, i)
        for i, response in got.items():
            assert response.ext_fields == {"i": str(i)}
            assert response.body == b"%d" % i * 1000
            assert response.serialization is SerializeType(i % 2)
        nursery.cancel_scope.cancel()


async def test_lying_length_closes_one_socket_only() -> None:
    async def echo(request: RemotingCommand, connection: Connection) -> RemotingCommand:
        return request.response()

    server = RemotingServer(Dispatcher({RequestCode.HEART_BEAT: echo}))
    async with trio.open_nursery() as nursery:
        port = bound_port(await nursery.start(server.serve_tcp, "127.0.0.1", 0))
        async with open_connection("127.0.0.1", port) as good:
            bad = await trio.open_tcp_stream("127.0.0.1", port)
            await bad.send_all(struct.pack(">I", 0x7FFFFFFF))
            with trio.fail_after(5):
                assert await bad.receive_some() == b""
            await bad.aclose()
            response = await good.request(RemotingCommand.request(34), timeout_s=5)
            assert response.code == ResponseCode.SUCCESS
        nursery.cancel_scope.cancel()
