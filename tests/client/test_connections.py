"""The client's connection pool drops a connection that failed by aborting it: a reset, not a
FIN after whatever the kernel still holds, so a request that timed out in a network fault is
never delivered once the fault heals, after newer requests (found by the broker soak: a late
UPDATE_CONSUMER_OFFSET rewound a consumer)."""

from __future__ import annotations

import pytest
import trio

from client.connections import ConnectionPool
from remoting.codes import RequestCode
from remoting.command import RemotingCommand
from remoting.errors import RequestTimeout
from remoting.frame import FrameDecoder


async def test_a_dropped_connection_is_reset_not_closed_after_its_queued_bytes() -> None:
    seen: list[str] = []
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    ended = trio.Event()

    async def silent_broker(stream: trio.SocketStream) -> None:
        """Reads requests and never answers; records how the connection ended."""
        decoder = FrameDecoder(1 << 20)
        try:
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    seen.append("fin")
                    break
                decoder.feed(data)
                seen.extend("request" for _ in decoder.commands())
        except trio.BrokenResourceError:
            seen.append("reset")
        finally:
            ended.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, silent_broker, listeners)
        pool = ConnectionPool(nursery)
        address = f"127.0.0.1:{port}"
        request = RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {})
        with pytest.raises(RequestTimeout):
            await pool.request(address, request, timeout_s=0.2)
        pool.drop(address)
        with trio.fail_after(10):
            await ended.wait()
        assert seen == ["request", "reset"]
        nursery.cancel_scope.cancel()


async def test_a_request_on_the_open_connection_is_bounded_by_its_timeout_too() -> None:
    """The second request finds the connection open (ConnectionPool.live, no connect) and still
    ends at its timeout."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]

    async def silent_broker(stream: trio.SocketStream) -> None:
        while await stream.receive_some(65536):
            pass

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, silent_broker, listeners)
        pool = ConnectionPool(nursery)
        address = f"127.0.0.1:{port}"
        assert pool.live(address) is None
        request = RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO, {})
        with pytest.raises(RequestTimeout):
            await pool.request(address, request, timeout_s=0.2)
        first = pool.live(address)
        assert first is not None
        with pytest.raises(RequestTimeout):
            await pool.request(address, request, timeout_s=0.2)
        assert pool.live(address) is first  # the same connection, not a new one
        nursery.cancel_scope.cancel()
