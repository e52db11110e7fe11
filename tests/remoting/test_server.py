"""The trio server and connection on memory streams: no sockets, no sleeps."""

from __future__ import annotations

import struct

import pytest
import trio
import trio.testing

from remoting.codes import FLAG_ONEWAY, RequestCode, ResponseCode, SerializeType
from remoting.connection import Connection
from remoting.dispatch import Dispatcher
from remoting.errors import ConnectionClosed, RequestTimeout
from remoting.frame import FrameDecoder, RemotingCommand, encode
from remoting.headers import GetRouteInfoRequestHeader
from remoting.server import RemotingServer

from .helpers import raw_client, served


async def echo(request: RemotingCommand, connection: Connection) -> RemotingCommand:
    return request.response(ext_fields=request.ext_fields, body=request.body)


async def read_commands(stream: trio.abc.Stream, count: int) -> list[RemotingCommand]:
    decoder, out = FrameDecoder(), []
    while len(out) < count:
        data = await stream.receive_some()
        assert data, "stream closed early"
        decoder.feed(data)
        out += decoder.commands()
    return out


async def test_interleaved_requests_answered_out_of_order() -> None:
    """Requests in flight at once each get their own answer, whatever order they finish in."""
    gates = {str(i): trio.Event() for i in range(5)}
    finished: list[str] = []

    async def held(request: RemotingCommand, connection: Connection) -> RemotingCommand:
        key = request.ext_fields["k"]
        await gates[key].wait()
        finished.append(key)
        return request.response(ext_fields={"k": key})

    server = RemotingServer(Dispatcher({RequestCode.PULL_MESSAGE: held}))
    answers: dict[str, str] = {}
    async with served(server) as conn:

        async def ask(key: str) -> None:
            response = await conn.request(RemotingCommand.request(11, {"k": key}), timeout_s=5)
            answers[key] = response.ext_fields["k"]

        async with trio.open_nursery() as nursery:
            for key in gates:
                nursery.start_soon(ask, key)
            await trio.testing.wait_all_tasks_blocked()
            for key in reversed(list(gates)):
                gates[key].set()
                await trio.testing.wait_all_tasks_blocked()
    assert finished == ["4", "3", "2", "1", "0"]
    assert answers == {k: k for k in gates}


async def test_held_request_does_not_block_others() -> None:
    """A long-polled pull stays held while later requests on the connection are answered."""
    release = trio.Event()

    async def pull(request: RemotingCommand, connection: Connection) -> RemotingCommand:
        await release.wait()
        return request.response(ResponseCode.PULL_NOT_FOUND)

    server = RemotingServer(
        Dispatcher({RequestCode.PULL_MESSAGE: pull, RequestCode.SEND_MESSAGE: echo})
    )
    async with served(server) as conn, trio.open_nursery() as nursery:
        pulled: list[int] = []

        async def long_poll() -> None:
            pulled.append((await conn.request(RemotingCommand.request(11), timeout_s=30)).code)

        nursery.start_soon(long_poll)
        await trio.testing.wait_all_tasks_blocked()
        for i in range(3):
            sent = await conn.request(RemotingCommand.request(10, {"i": str(i)}), timeout_s=5)
            assert sent.ext_fields == {"i": str(i)}
        assert pulled == []
        release.set()
    assert pulled == [ResponseCode.PULL_NOT_FOUND]


async def test_unknown_code_answered_not_supported() -> None:
    server = RemotingServer(Dispatcher({}))
    async with served(server) as conn:
        response = await conn.request(RemotingCommand.request(9999), timeout_s=5)
    assert response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert "9999" in response.remark


async def test_flag_zero_answered_oneway_bit_not() -> None:
    """C++'s "one-way" requests (flag 0) are answered; a real one-way request is not."""
    server = RemotingServer(Dispatcher({RequestCode.SEND_MESSAGE: echo}))
    async with raw_client(server) as stream:
        oneway = RemotingCommand(code=10, opaque=1, flag=FLAG_ONEWAY, ext_fields={"n": "1"})
        flag0 = RemotingCommand(code=10, opaque=2, flag=0, ext_fields={"n": "2"})
        await stream.send_all(encode(oneway) + encode(flag0))
        (answer,) = await read_commands(stream, 1)
        assert (answer.opaque, answer.ext_fields, answer.is_response) == (2, {"n": "2"}, True)
        await trio.testing.wait_all_tasks_blocked()
        await stream.send_all(encode(RemotingCommand(code=10, opaque=3)))
        (answer,) = await read_commands(stream, 1)
        assert answer.opaque == 3  # nothing for opaque 1 came in between


async def test_handler_exception_answers_system_error_and_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken(request: RemotingCommand, connection: Connection) -> RemotingCommand:
        raise ValueError("boom")

    async def route(request: RemotingCommand, connection: Connection) -> RemotingCommand:
        GetRouteInfoRequestHeader.decode(request.ext_fields)
        return request.response()

    server = RemotingServer(
        Dispatcher(
            {RequestCode.SEND_MESSAGE: broken, RequestCode.GET_ROUTEINFO_BY_TOPIC: route, 11: echo}
        )
    )
    async with served(server) as conn:
        response = await conn.request(RemotingCommand.request(10), timeout_s=5)
        assert response.code == ResponseCode.SYSTEM_ERROR and "boom" in response.remark
        response = await conn.request(RemotingCommand.request(105), timeout_s=5)
        assert response.code == ResponseCode.SYSTEM_ERROR and "'topic' missing" in response.remark
        assert (await conn.request(RemotingCommand.request(11), timeout_s=5)).code == 0
    assert "boom" in caplog.text


async def test_bad_frame_closes_only_its_connection() -> None:
    server = RemotingServer(Dispatcher({RequestCode.SEND_MESSAGE: echo}))
    async with served(server) as good, raw_client(server) as bad:
        await bad.send_all(struct.pack(">II", 6, 900) + b"{}")
        assert await bad.receive_some() == b""  # the server closed it
        assert (await good.request(RemotingCommand.request(10), timeout_s=5)).code == 0
        assert len(server.connections) == 1


async def test_oversized_frame_closes_connection(caplog: pytest.LogCaptureFixture) -> None:
    server = RemotingServer(Dispatcher({}))
    async with raw_client(server) as bad:
        await bad.send_all(struct.pack(">I", 1 << 30))
        assert await bad.receive_some() == b""
    assert "exceeds the limit" in caplog.text


async def test_server_sends_requests_to_its_client() -> None:
    """The broker asks a consumer (NOTIFY_CONSUMER_IDS_CHANGED) on the client's connection."""
    clients: list[Connection] = []

    async def heartbeat(request: RemotingCommand, connection: Connection) -> RemotingCommand:
        clients.append(connection)
        return request.response()

    asked: list[RemotingCommand] = []

    async def on_notify(request: RemotingCommand, connection: Connection) -> RemotingCommand:
        asked.append(request)
        return request.response(ext_fields={"ok": "yes"})

    server = RemotingServer(Dispatcher({RequestCode.HEART_BEAT: heartbeat}))
    client_handler = Dispatcher({RequestCode.NOTIFY_CONSUMER_IDS_CHANGED: on_notify})
    async with served(server, handler=client_handler) as conn:
        await conn.request(RemotingCommand.request(RequestCode.HEART_BEAT), timeout_s=5)
        (to_client,) = clients
        notify = RemotingCommand.request(40, {"consumerGroup": "g"})
        answer = await to_client.request(notify, timeout_s=5)
        assert answer.ext_fields == {"ok": "yes"}
        assert asked[0].ext_fields == {"consumerGroup": "g"}
        # a client without a handler for it says so
        check = await to_client.request(RemotingCommand.request(39), timeout_s=5)
        assert check.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        await to_client.send_oneway(notify)
        await trio.testing.wait_all_tasks_blocked()
        assert len(asked) == 2


async def test_timeout_is_named(autojump_clock: trio.testing.MockClock) -> None:
    async def never(request: RemotingCommand, connection: Connection) -> RemotingCommand:
        await trio.sleep_forever()
        raise AssertionError

    server = RemotingServer(Dispatcher({11: never}))
    async with served(server) as conn:
        with pytest.raises(RequestTimeout) as err:
            await conn.request(RemotingCommand.request(11), timeout_s=2)
        assert err.value.code == 11 and err.value.timeout_s == 2


async def test_close_fails_every_waiter() -> None:
    """When the connection ends, every request still waiting gets ConnectionClosed."""

    async def never(request: RemotingCommand, connection: Connection) -> RemotingCommand:
        await trio.sleep_forever()
        raise AssertionError

    server = RemotingServer(Dispatcher({11: never}))
    errors: list[BaseException] = []
    async with served(server) as conn:

        async def ask() -> None:
            try:
                await conn.request(RemotingCommand.request(11), timeout_s=30)
            except ConnectionClosed as err:
                errors.append(err)

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(ask)
            await trio.testing.wait_all_tasks_blocked()
            for server_side in list(server.connections):
                server_side.close()
    assert len(errors) == 3
    with pytest.raises(ConnectionClosed):
        await conn.request(RemotingCommand.request(11))


async def test_overload_answers_system_busy() -> None:
    client_stream, server_stream = trio.testing.memory_stream_pair()
    release = trio.Event()

    async def held(request: RemotingCommand, connection: Connection) -> RemotingCommand:
        await release.wait()
        return request.response()

    server_side = Connection(server_stream, held, peer="c", requests_in_flight_max=2)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server_side.run)
        await client_stream.send_all(
            b"".join(encode(RemotingCommand(11, opaque=i)) for i in range(3))
        )
        (busy,) = await read_commands(client_stream, 1)
        assert (busy.opaque, busy.code) == (2, ResponseCode.SYSTEM_BUSY)
        assert server_side.requests_in_flight == 2
        release.set()
        answers = await read_commands(client_stream, 2)
        assert sorted(a.opaque for a in answers) == [0, 1]
        server_side.close()


async def test_connections_max() -> None:
    server = RemotingServer(Dispatcher({10: echo}), connections_max=1)
    async with served(server) as first:
        await trio.testing.wait_all_tasks_blocked()  # the first is being served
        async with raw_client(server) as second:
            assert await second.receive_some() == b""  # refused at once
        assert (await first.request(RemotingCommand.request(10), timeout_s=5)).code == 0


async def test_handler_answers_are_matched_whatever_it_built(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A handler's answer is sent as the response to its request; an unencodable one is a
    SYSTEM_ERROR, and a body past the frame limit too, and the connection goes on."""

    async def fresh(request: RemotingCommand, connection: Connection) -> RemotingCommand:
        return RemotingCommand(code=0, ext_fields={"x": "1"})  # no opaque, no response bit

    async def unencodable(request: RemotingCommand, connection: Connection) -> RemotingCommand:
        return request.response(ext_fields={"n": 5})  # type: ignore[dict-item]

    async def too_big(request: RemotingCommand, connection: Connection) -> RemotingCommand:
        return request.response(body=b"x" * (16 << 20))

    server = RemotingServer(Dispatcher({10: fresh, 11: unencodable, 12: too_big}))
    async with served(server) as conn:
        binary = RemotingCommand.request(10, serialization=SerializeType.ROCKETMQ)
        answer = await conn.request(binary, timeout_s=5)
        assert answer.ext_fields == {"x": "1"} and answer.serialization is SerializeType.ROCKETMQ
        failed = await conn.request(
            RemotingCommand.request(11, serialization=SerializeType.ROCKETMQ), timeout_s=5
        )
        assert failed.code == ResponseCode.SYSTEM_ERROR
        assert (await conn.request(RemotingCommand.request(12), timeout_s=5)).code == 1
        assert (await conn.request(RemotingCommand.request(10), timeout_s=5)).code == 0
    assert "handling" in caplog.text


async def test_requests_read_before_the_peer_closed_are_still_handled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The C++ client sends one-way requests and may close at once: what it sent is handled
    (a send stored), within CLOSED_REQUESTS_GRACE_S; only the answers are dropped."""
    client_stream, server_stream = trio.testing.memory_stream_pair()
    handled: list[int] = []

    async def slow(request: RemotingCommand, connection: Connection) -> RemotingCommand:
        await trio.sleep(1.0)  # a write waiting for its commit
        handled.append(request.opaque)
        return request.response()

    server_side = Connection(server_stream, slow, peer="c")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server_side.run)
        await client_stream.send_all(
            b"".join(encode(RemotingCommand(10, opaque=i)) for i in range(3))
        )
        await trio.testing.wait_all_tasks_blocked()
        await client_stream.aclose()
        await server_side.wait_closed()
    assert sorted(handled) == [0, 1, 2]


async def test_a_request_outliving_the_grace_is_cancelled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client_stream, server_stream = trio.testing.memory_stream_pair()
    forever = trio.Event()

    async def held(request: RemotingCommand, connection: Connection) -> RemotingCommand:
        await forever.wait()
        return request.response()

    server_side = Connection(server_stream, held, peer="c")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server_side.run)
        await client_stream.send_all(encode(RemotingCommand(11, opaque=1)))
        await trio.testing.wait_all_tasks_blocked()
        closed_at = trio.current_time()
        await client_stream.aclose()
        await server_side.wait_closed()
        assert trio.current_time() - closed_at == pytest.approx(5.0, abs=0.5)


async def test_a_closing_peer_with_answers_queued_ends_the_writer_quietly(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A client that times out and closes while the server still owes it answers: the outbox
    closes under a writer with frames queued, which used to crash the whole server with an
    uncaught EndOfChannel (found with a paused name server in tests/cluster)."""
    client_stream, server_stream = trio.testing.memory_stream_pair()
    release = trio.Event()

    async def held(request: RemotingCommand, connection: Connection) -> RemotingCommand:
        await release.wait()
        return request.response()

    server_side = Connection(server_stream, held, peer="c")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server_side.run)
        await client_stream.send_all(
            b"".join(encode(RemotingCommand(11, opaque=i)) for i in range(3))
        )
        await trio.testing.wait_all_tasks_blocked()
        release.set()  # the answers go to the outbox while the peer's EOF arrives
        await client_stream.aclose()
        await server_side.wait_closed()
    assert server_side.closed
