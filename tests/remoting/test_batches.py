"""Requests of a batched code read from a connection in one go reach their batch handler
together (remoting.connection.Batching): one answer each, by opaque, in order; a failing batch
handler answers each SYSTEM_ERROR; the in-flight bound and the size bounds still hold."""

from __future__ import annotations

import trio
import trio.testing

from remoting import limits
from remoting.codes import FLAG_ONEWAY, RequestCode, ResponseCode
from remoting.connection import BatchHandler, Connection
from remoting.dispatch import Dispatcher
from remoting.frame import RemotingCommand, encode
from remoting.server import RemotingServer

from .helpers import raw_client
from .test_server import echo, read_commands

SEND = RequestCode.SEND_MESSAGE


def numbered(n: int, *, code: int = SEND, flag: int = 0, body: bytes = b"") -> RemotingCommand:
    return RemotingCommand(code=code, opaque=n, flag=flag, ext_fields={"n": str(n)}, body=body)


def batch_echo(sizes: list[int]) -> BatchHandler:
    async def handle(requests: list[RemotingCommand], conn: Connection) -> list[RemotingCommand]:
        sizes.append(len(requests))
        return [
            r.response(ext_fields={"n": r.ext_fields["n"], "of": str(len(requests))})
            for r in requests
        ]

    return handle


async def test_requests_read_together_are_one_batch_answered_each_by_opaque() -> None:
    sizes: list[int] = []
    server = RemotingServer(Dispatcher({SEND: echo}, batched={SEND: batch_echo(sizes)}))
    async with raw_client(server) as stream:
        await stream.send_all(b"".join(encode(numbered(n)) for n in range(1, 6)))
        answers = await read_commands(stream, 5)
    assert sizes == [5]
    assert [(a.opaque, a.ext_fields["n"], a.ext_fields["of"]) for a in answers] == [
        (n, str(n), "5") for n in range(1, 6)
    ]
    assert all(a.is_response for a in answers)


async def test_other_codes_go_their_own_way_and_a_lone_request_is_not_a_batch() -> None:
    sizes: list[int] = []
    server = RemotingServer(
        Dispatcher({SEND: echo, RequestCode.HEART_BEAT: echo}, batched={SEND: batch_echo(sizes)})
    )
    async with raw_client(server) as stream:
        heartbeat = numbered(2, code=RequestCode.HEART_BEAT)
        await stream.send_all(encode(numbered(1)) + encode(heartbeat))
        answers = await read_commands(stream, 2)
    assert sizes == []  # one SEND alone went through the single-request handler
    assert sorted(a.opaque for a in answers) == [1, 2]


async def test_a_one_way_request_in_a_batch_gets_no_answer() -> None:
    sizes: list[int] = []
    server = RemotingServer(Dispatcher({SEND: echo}, batched={SEND: batch_echo(sizes)}))
    async with raw_client(server) as stream:
        frames = [numbered(1), numbered(2, flag=FLAG_ONEWAY), numbered(3)]
        await stream.send_all(b"".join(map(encode, frames)))
        answers = await read_commands(stream, 2)
        await trio.testing.wait_all_tasks_blocked()
        await stream.send_all(encode(RemotingCommand(code=RequestCode.HEART_BEAT, opaque=4)))
        (last,) = await read_commands(stream, 1)
    assert sizes == [3]
    assert [a.opaque for a in answers] == [1, 3]
    assert last.opaque == 4  # nothing for opaque 2 came in between


async def test_a_failing_batch_handler_answers_each_system_error_and_the_connection_goes_on() -> (
    None
):
    async def broken(requests: list[RemotingCommand], conn: Connection) -> list[RemotingCommand]:
        raise RuntimeError("boom")

    server = RemotingServer(Dispatcher({SEND: echo}, batched={SEND: broken}))
    async with raw_client(server) as stream:
        await stream.send_all(encode(numbered(1)) + encode(numbered(2)))
        answers = await read_commands(stream, 2)
        await stream.send_all(encode(RemotingCommand(code=RequestCode.HEART_BEAT, opaque=3)))
        (after,) = await read_commands(stream, 1)
    assert [(a.opaque, a.code) for a in answers] == [
        (1, ResponseCode.SYSTEM_ERROR),
        (2, ResponseCode.SYSTEM_ERROR),
    ]
    assert "RuntimeError: boom" in answers[0].remark
    assert after.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED  # served, not closed


async def test_batches_are_bounded_by_count_and_bytes() -> None:
    sizes: list[int] = []
    server = RemotingServer(Dispatcher({SEND: echo}, batched={SEND: batch_echo(sizes)}))
    count = limits.BATCH_REQUESTS_MAX + 3
    async with raw_client(server) as stream:
        await stream.send_all(b"".join(encode(numbered(n)) for n in range(1, count + 1)))
        answers = await read_commands(stream, count)
        assert sorted(a.opaque for a in answers) == list(range(1, count + 1))
        # a body of the byte bound is handled on its own, after a batch of those read with it
        big = numbered(100, body=b"x" * limits.BATCH_BODY_BYTES_MAX)
        await stream.send_all(encode(numbered(101)) + encode(numbered(102)) + encode(big))
        answers = await read_commands(stream, 3)
    # the first read's two batches are tasks of their own: trio runs them in either order
    assert sorted(sizes[:2]) == [3, limits.BATCH_REQUESTS_MAX]
    assert sizes[2:] == [2]
    assert sorted(a.opaque for a in answers) == [100, 101, 102]


async def test_past_the_in_flight_bound_a_batch_s_overflow_is_answered_system_busy() -> None:
    gate = trio.Event()
    sizes: list[int] = []

    async def held(requests: list[RemotingCommand], conn: Connection) -> list[RemotingCommand]:
        sizes.append(len(requests))
        await gate.wait()
        return [r.response() for r in requests]

    client_stream, server_stream = trio.testing.memory_stream_pair()
    conn = Connection(
        server_stream,
        Dispatcher({SEND: echo}, batched={SEND: held}),
        peer="raw",
        requests_in_flight_max=3,
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        await client_stream.send_all(b"".join(encode(numbered(n)) for n in range(1, 6)))
        busy = await read_commands(client_stream, 2)
        assert [(a.opaque, a.code) for a in busy] == [
            (4, ResponseCode.SYSTEM_BUSY),
            (5, ResponseCode.SYSTEM_BUSY),
        ]
        assert conn.requests_in_flight == 3
        gate.set()
        done = await read_commands(client_stream, 3)
        assert [(a.opaque, a.code) for a in done] == [(n, ResponseCode.SUCCESS) for n in (1, 2, 3)]
        nursery.cancel_scope.cancel()
    assert sizes == [3]
