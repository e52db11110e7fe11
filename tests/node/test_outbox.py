"""Frames written straight to an idle socket (dledger/outbox.py, and the peer links' use of it):
they go out without the sender task, what the socket does not take goes out after them in
order, and nothing of a half-written frame reaches a later connection."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import trio
import trio.testing

from dledger.codec import decode_message
from dledger.config import Address
from dledger.outbox import Outbox
from dledger.raft.entries import EntryBatch, EntryId
from dledger.raft.messages import AppendEntries, Envelope, Heartbeat
from dledger.transport import PeerLinks
from dledger.wire import Code, FrameReader, encode_frame
from tests.sockets import stream_pair

DEADLINE_S = 10


async def read_exactly(sock: socket.socket, count: int) -> bytes:
    data = bytearray()
    with trio.fail_after(DEADLINE_S):
        while len(data) < count:
            await trio.lowlevel.wait_readable(sock)
            data += sock.recv(count - len(data))
    return bytes(data)


async def test_a_frame_put_while_the_sender_is_parked_is_on_the_socket_at_once() -> None:
    stream, theirs = stream_pair()
    outbox = Outbox(stream)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outbox.run)
        await trio.testing.wait_all_tasks_blocked()
        frame = encode_frame({"c": 1, "id": 7})
        outbox.put(frame)
        # No checkpoint since put(): the sender task has not run, yet the bytes are there.
        assert theirs.recv(1024) == frame
        outbox.close()
    theirs.close()


async def test_what_the_socket_does_not_take_goes_out_first_then_the_rest_in_order() -> None:
    stream, theirs = stream_pair(buffer_bytes=4096)
    outbox = Outbox(stream)
    big = encode_frame({"c": 1, "body": bytes(range(256)) * 4096})  # ~1 MiB: cannot fit
    small = [encode_frame({"c": 1, "id": i}) for i in range(50)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outbox.run)
        await trio.testing.wait_all_tasks_blocked()
        outbox.put(big)
        for frame in small:
            outbox.put(frame)
        expected = big + b"".join(small)
        assert await read_exactly(theirs, len(expected)) == expected
        await outbox.drained()
        outbox.close()
    theirs.close()


async def test_a_put_to_a_closed_peer_ends_the_sender_with_the_error_and_drops_the_rest() -> None:
    stream, theirs = stream_pair()
    outbox = Outbox(stream)
    theirs.close()
    errors: list[BaseException] = []

    async def run() -> None:
        try:
            await outbox.run()
        except (trio.BrokenResourceError, OSError) as err:
            errors.append(err)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await trio.testing.wait_all_tasks_blocked()
        with trio.fail_after(DEADLINE_S):
            while not outbox.closed:  # a write to a closed peer may first succeed
                outbox.put(encode_frame({"c": 1, "body": bytes(64 * 1024)}))
                await trio.sleep(0)
    assert errors and outbox.closed
    outbox.put(encode_frame({"c": 1}))  # dropped, no error


# --- peer links ---------------------------------------------------------------------------


def heartbeat(term: int) -> Envelope:
    return Envelope("n1", Heartbeat(term, "n0", 0))


def append_entries(first: int, body_bytes: int) -> Envelope:
    batch = EntryBatch(first, [1], [0], [bytes([first % 256]) * body_bytes])
    return Envelope("n1", AppendEntries(1, "n0", EntryId(first - 1, 1), batch, 0))


class FakePeer:
    """n1: a listener that reads only when told to, one connection at a time."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        # Small receive buffers (inherited by accepted sockets, so set before the handshake)
        # make a large frame more than the link's socket takes at once.
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.listener.setblocking(False)
        self.address = Address("127.0.0.1", self.listener.getsockname()[1])

    async def accept(self) -> socket.socket:
        with trio.fail_after(DEADLINE_S):
            await trio.lowlevel.wait_readable(self.listener)
        conn, _ = self.listener.accept()
        conn.setblocking(False)
        return conn

    async def frames(self, conn: socket.socket, count: int) -> list[dict[str, object]]:
        reader, got = FrameReader(), []
        with trio.fail_after(DEADLINE_S):
            while len(got) < count:
                await trio.lowlevel.wait_readable(conn)
                data = conn.recv(1 << 16)
                assert data, "the link closed"
                reader.feed(data)
                got.extend(reader.frames())
        return got


@pytest.fixture
def peer() -> Iterator[FakePeer]:
    fake = FakePeer()
    yield fake
    fake.listener.close()


@pytest.fixture
def out(peer: FakePeer, nursery: trio.Nursery) -> PeerLinks:
    """n0's links to n1, running until the test ends (pytest-trio cancels its nursery)."""
    links = PeerLinks(
        group="g",
        self_id="n0",
        peers={"n0": Address("127.0.0.1", 1), "n1": peer.address},
        segment_bytes=1 << 20,
        on_disconnect=lambda _: None,
        unacked_timeout_ms=5000,
    )
    nursery.start_soon(links.run)
    return links


async def connected(peer: FakePeer, out: PeerLinks) -> socket.socket:
    """n1's end of the link's next connection, once the link is up and its sender parked."""
    conn = await peer.accept()
    with trio.fail_after(DEADLINE_S):
        while not out.stats["n1"].connected:
            await trio.sleep(0.001)
    await trio.testing.wait_all_tasks_blocked()
    return conn


async def test_peer_messages_offered_while_the_link_is_idle_arrive_whole_and_in_order(
    peer: FakePeer, out: PeerLinks
) -> None:
    conn = await connected(peer, out)
    # The first AppendEntries fills the small socket buffers; the rest queue behind it.
    offered = [append_entries(i, 256 * 1024) for i in range(1, 4)] + [heartbeat(2)]
    for envelope in offered:
        out.offer(envelope)
    got = await peer.frames(conn, 1 + len(offered))  # HELLO first
    assert got[0]["c"] == Code.HELLO and got[0]["to"] == "n1"
    assert [decode_message(f, sender="n0") for f in got[1:]] == [e.message for e in offered]
    stats = out.stats["n1"]
    assert stats.frames_sent == len(offered)
    conn.close()


async def test_the_unsent_rest_of_a_frame_never_reaches_the_next_connection(
    peer: FakePeer, out: PeerLinks
) -> None:
    first = await connected(peer, out)
    out.offer(append_entries(1, 1 << 20))  # far more than the socket takes at once
    first.close()  # n1 goes away with most of the frame unsent
    second = await connected(peer, out)
    out.offer(heartbeat(3))
    got = await peer.frames(second, 2)
    assert got[0]["c"] == Code.HELLO  # not the end of the old frame
    assert decode_message(got[1], sender="n0") == heartbeat(3).message
    second.close()
