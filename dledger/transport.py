"""Outbound links to peers: one TCP connection each, reconnected with back-off.

Each link has a bounded queue. `offer` never blocks: when the queue is full the oldest message
is dropped (Raft resends what matters, and a stale AppendEntries is worth less than a fresh
one). The sender drains everything queued into one `send_all`, because on this machine trio
sends ~40k frames/s one by one but ~700k/s in batches of 64 (shared/bench/results). While the
sender is parked with nothing queued, `offer` writes the frame to the socket itself and leaves
only what the socket did not take to the sender (outbox.py says why).

A link also watches its socket for EOF: when a peer process dies its kernel closes our
connection, and the node hears of it at once (PeerDisconnected) rather than after an election
timeout. Inbound connections are the embedder's business (service.py, hosting.py); a peer
only ever sends us Raft messages on the connection it opened.

Links connect through a `PeerConnector`: TCP by default (`tcp_connector`), memory streams in
tests, so a whole group runs in one trio process under a mock clock.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections import deque
from collections.abc import Awaitable, Callable

import attrs
import trio

from dledger import limits
from dledger.codec import encode_message
from dledger.config import Address
from dledger.raft.messages import AppendEntries, Envelope, Message
from dledger.wire import Code, encode_frame
from netio.streams import write_nowait

log = logging.getLogger("dledger.transport")

# Opens the stream of a link to `peer` at `address`; raising OSError means "try again later".
PeerConnector = Callable[[str, Address], Awaitable[trio.abc.Stream]]


@attrs.define
class LinkStats:
    connected: bool = False
    connects: int = 0
    frames_sent: int = 0
    sends: int = 0  # writes (send_all calls, direct writes): frames_sent / sends shows coalescing
    bytes_sent: int = 0
    dropped: int = 0  # messages pushed out of a full queue


def limit_unacked_time(stream: trio.abc.Stream, timeout_ms: int) -> None:
    """Fail a peer connection whose sent data stays unacknowledged for `timeout_ms` (Linux's
    TCP_USER_TIMEOUT). Without it a link across a partition lives on while TCP doubles its
    retransmission timer, and after the partition heals the peers wait out seconds of
    back-off; with it the link breaks, reconnects, and is back within a reconnect interval."""
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if option is not None and isinstance(stream, trio.SocketStream):
        with contextlib.suppress(OSError):
            stream.setsockopt(socket.IPPROTO_TCP, option, timeout_ms)


def tcp_connector(local_host: str | None, unacked_timeout_ms: int) -> PeerConnector:
    """TCP links from `local_host` (this replica's own address, so that a replica is one host
    to the network: chaos partitions 127.0.0.x aliases by address), with unacknowledged data
    bounded in time (limit_unacked_time)."""

    async def connect(peer: str, address: Address) -> trio.abc.Stream:
        stream = await trio.open_tcp_stream(address.host, address.port, local_address=local_host)
        limit_unacked_time(stream, unacked_timeout_ms)
        return stream

    return connect


class PeerLinks:
    def __init__(
        self,
        *,
        group: str,
        self_id: str,
        peers: dict[str, Address],
        segment_bytes: int,
        on_disconnect: Callable[[str], None],
        unacked_timeout_ms: int,
        queue_frames_max: int = limits.PEER_SEND_QUEUE_FRAMES_MAX,
        connect: PeerConnector | None = None,
    ) -> None:
        self._hello = {"group": group, "from": self_id, "segment_bytes": segment_bytes}
        if connect is None:
            local_host = peers[self_id].host if self_id in peers else None
            connect = tcp_connector(local_host, unacked_timeout_ms)
        self._connect = connect
        self._peers = {p: a for p, a in peers.items() if p != self_id}
        self._on_disconnect = on_disconnect
        self._queues: dict[str, deque[Envelope]] = {
            p: deque(maxlen=queue_frames_max) for p in self._peers
        }
        self._wake = {p: trio.Event() for p in self._peers}
        self.stats = {p: LinkStats() for p in self._peers}
        self._frames: dict[tuple[object, ...], bytes] = {}  # recent AppendEntries frames
        # Links whose sender is parked with nothing queued; the unsent end of a frame `offer`
        # wrote, which the sender sends before anything queued after it.
        self._parked: dict[str, trio.abc.Stream] = {}
        self._rest: dict[str, bytes] = {}

    def offer(self, envelope: Envelope) -> None:
        queue = self._queues.get(envelope.to)
        if queue is None:
            log.debug("no link to %s; dropping %s", envelope.to, type(envelope.message).__name__)
            return
        stream = self._parked.get(envelope.to)
        if stream is not None:
            self._write_now(envelope.to, stream, self._encode(envelope.message))
            return
        if len(queue) == queue.maxlen:
            self.stats[envelope.to].dropped += 1
        queue.append(envelope)
        self._wake[envelope.to].set()

    def _write_now(self, peer: str, stream: trio.abc.Stream, frame: bytes) -> None:
        sent = write_nowait(stream, frame)
        stats = self.stats[peer]
        stats.frames_sent += 1
        stats.sends += 1
        stats.bytes_sent += len(frame)
        if sent < len(frame):
            self._rest[peer] = frame[sent:]
            del self._parked[peer]  # what follows queues behind the rest of this frame
            self._wake[peer].set()

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            for peer, address in self._peers.items():
                nursery.start_soon(self._link, peer, address)

    async def _link(self, peer: str, address: Address) -> None:
        backoff_ms = limits.PEER_RECONNECT_MS_MIN
        stats = self.stats[peer]
        while True:
            try:
                with trio.fail_after(limits.PEER_CONNECT_TIMEOUT_S):
                    stream = await self._connect(peer, address)
            except (OSError, trio.TooSlowError):
                await trio.sleep(backoff_ms / 1000)
                backoff_ms = min(2 * backoff_ms, limits.PEER_RECONNECT_MS_MAX)
                continue
            backoff_ms = limits.PEER_RECONNECT_MS_MIN
            stats.connects += 1
            try:
                async with stream:
                    hello = {"c": Code.HELLO, **self._hello, "to": peer}
                    await stream.send_all(encode_frame(hello))
                    stats.connected = True
                    log.info("connected to peer %s at %s", peer, address)
                    async with trio.open_nursery() as nursery:
                        # each task handles its own transport errors and ends both: no
                        # exception group to unwind here
                        nursery.start_soon(self._watch, stream, peer, nursery.cancel_scope)
                        nursery.start_soon(self._pump, peer, stream, nursery.cancel_scope)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as err:
                log.info("link to peer %s broke: %s", peer, err or type(err).__name__)
            finally:
                if stats.connected:
                    stats.connected = False
                    self._on_disconnect(peer)
            await trio.sleep(limits.PEER_RECONNECT_MS_MIN / 1000)

    async def _watch(self, stream: trio.abc.Stream, peer: str, scope: trio.CancelScope) -> None:
        """A peer sends nothing on our link except a refusal; EOF means it went away."""
        try:
            data = await stream.receive_some(limits.PEER_REFUSAL_BYTES_MAX)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            data = b""
        if data:
            log.warning("peer %s refused our link: %r", peer, data[:200])
        else:
            log.info("peer %s closed our link", peer)
        scope.cancel()

    def _encode(self, message: Message) -> bytes:
        """A frame for `message`. Followers at the same point get the same AppendEntries; its
        (term, prev, commit, entry range, last term) names its content (log matching), so the
        frame encoded for the first is reused for the others."""
        if type(message) is AppendEntries and len(message.entries):
            e = message.entries
            key = (message.term, message.prev.index, message.prev.term, message.commit,
                   e.first_index, e.last_index, e.terms[-1])  # fmt: skip
            frame = self._frames.get(key)
            if frame is None:
                frame = encode_frame(encode_message(message))
                self._frames[key] = frame
                if len(self._frames) > limits.PEER_FRAME_CACHE_MAX:
                    del self._frames[next(iter(self._frames))]
            return frame
        return encode_frame(encode_message(message))

    async def _pump(self, peer: str, stream: trio.abc.Stream, scope: trio.CancelScope) -> None:
        queue, stats = self._queues[peer], self.stats[peer]
        try:
            while True:
                while not queue and peer not in self._rest:
                    self._parked[peer] = stream
                    try:
                        await self._wake[peer].wait()
                    finally:
                        self._parked.pop(peer, None)
                    self._wake[peer] = trio.Event()
                rest = self._rest.pop(peer, None)  # counted in the stats when it was offered
                frames = [] if rest is None else [rest]
                encoded = size = 0
                while queue and size < limits.SEND_COALESCE_BYTES_MAX:
                    frame = self._encode(queue.popleft().message)
                    frames.append(frame)
                    encoded += 1
                    size += len(frame)
                await stream.send_all(frames[0] if len(frames) == 1 else b"".join(frames))
                stats.frames_sent += encoded
                stats.sends += 1
                stats.bytes_sent += size
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as err:
            log.info("sending to peer %s failed: %s", peer, err or type(err).__name__)
        finally:
            # The rest of a frame belongs to this connection: on a new one it would be garbage.
            self._rest.pop(peer, None)
            scope.cancel()
