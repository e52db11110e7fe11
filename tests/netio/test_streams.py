"""netio.streams.receive_some: what trio's receive_some gives, in every case a reader meets (data
there, data later, the peer's close, cancellation, the stream closed meanwhile, a wake-up with
nothing to read, a stream that is no socket); and write_nowait never blocks."""

from __future__ import annotations

import os
import socket
import struct

import pytest
import trio
import trio.testing

from netio import streams
from netio.streams import receive_some, write_nowait
from tests.sockets import stream_pair

DEADLINE_S = 10


async def test_data_already_there_is_read() -> None:
    stream, theirs = stream_pair()
    theirs.send(b"hello")
    with trio.fail_after(DEADLINE_S):
        assert await receive_some(stream, 1024) == b"hello"
    theirs.close()
    await stream.aclose()


async def test_a_reader_waits_for_data_sent_later() -> None:
    stream, theirs = stream_pair()
    got: list[bytes | bytearray] = []

    async def read() -> None:
        got.append(await receive_some(stream, 1024))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []  # parked, not spinning
        theirs.send(b"later")
    assert got == [b"later"]
    theirs.close()
    await stream.aclose()


async def test_at_most_max_bytes_and_the_rest_on_the_next_read() -> None:
    stream, theirs = stream_pair()
    theirs.send(b"abcdefgh")
    with trio.fail_after(DEADLINE_S):
        assert await receive_some(stream, 5) == b"abcde"
        assert await receive_some(stream, 5) == b"fgh"
    theirs.close()
    await stream.aclose()


async def test_the_peers_close_reads_as_empty() -> None:
    stream, theirs = stream_pair()
    theirs.send(b"last")
    theirs.close()
    with trio.fail_after(DEADLINE_S):
        assert await receive_some(stream, 1024) == b"last"
        assert await receive_some(stream, 1024) == b""
    await stream.aclose()


async def test_a_reset_raises_an_oserror() -> None:
    theirs, ours = _tcp_pair()
    # closed with SO_LINGER 0: a reset, not a FIN
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    theirs.send(b"sent before the reset")
    theirs.close()
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
    with trio.fail_after(DEADLINE_S), pytest.raises(OSError):
        while await receive_some(stream, 1024):
            pass
    await stream.aclose()


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
    return client, accepted


async def test_a_cancelled_wait_loses_nothing() -> None:
    stream, theirs = stream_pair()
    with trio.move_on_after(0.01) as scope:
        await receive_some(stream, 1024)
    assert scope.cancelled_caught
    theirs.send(b"after")
    with trio.fail_after(DEADLINE_S):
        assert await receive_some(stream, 1024) == b"after"
    theirs.close()
    await stream.aclose()


async def test_closing_the_stream_under_a_waiting_reader_raises_closed_resource() -> None:
    stream, theirs = stream_pair()
    errors: list[BaseException] = []

    async def read() -> None:
        try:
            await receive_some(stream, 1024)
        except trio.ClosedResourceError as err:
            errors.append(err)

    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            await stream.aclose()
    assert len(errors) == 1
    theirs.close()


async def test_a_wake_up_with_nothing_to_read_waits_again(monkeypatch: pytest.MonkeyPatch) -> None:
    stream, theirs = stream_pair()
    theirs.send(b"x")
    real_read = os.read
    spurious = [True]

    def read_once_empty(fd: int, n: int) -> bytes:
        if spurious.pop() if spurious else False:
            raise BlockingIOError  # as if another reader took the data between wake and read
        return real_read(fd, n)

    monkeypatch.setattr(streams.os, "read", read_once_empty)
    with trio.fail_after(DEADLINE_S):
        assert await receive_some(stream, 1024) == b"x"
    assert spurious == []
    theirs.close()
    await stream.aclose()


async def test_a_stream_that_is_no_socket_reads_as_trio_reads() -> None:
    ours, theirs = trio.testing.memory_stream_pair()
    await theirs.send_all(b"memory")
    with trio.fail_after(DEADLINE_S):
        assert await receive_some(ours, 1024) == b"memory"
    assert write_nowait(ours, b"never") == 0  # a memory stream takes nothing here


async def test_write_nowait_takes_what_fits_and_never_blocks() -> None:
    stream, theirs = stream_pair(buffer_bytes=4096)
    big = bytes(4 << 20)
    taken = write_nowait(stream, big)
    assert 0 < taken < len(big)
    assert write_nowait(stream, big) == 0  # full: nothing more, at once
    theirs.close()
    assert write_nowait(stream, b"x") == 0  # broken: 0, the sender task meets the error
    await stream.aclose()
