"""Connections to a node: peers and clients share one listener, told apart by the first frame.

A peer opens with HELLO (group, from, to, segment size) and then only sends Raft messages. A
client sends requests (APPEND, GET, STATUS, TRANSFER), each with an id its reply echoes, and
may pipeline as many as CLIENT_PENDING_REQUESTS_MAX. A bad frame or a wrong HELLO closes that
one connection, with a reply saying why when one can still be sent; the node keeps serving.

The service sees the node through `ServedNode`, the narrow face a replica shows its connections
(its identity, role, indexes, reads, and where to hand messages and appends); it never reaches
into the core or the store. Streams are any `trio.abc.Stream`, so tests serve memory streams.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import trio

from dledger import limits
from dledger.codec import decode_message
from dledger.config import NodeConfig
from dledger.log.errors import Compacted, IndexOutOfRange
from dledger.log.reader import StoredEntry
from dledger.raft.events import Accepted, Event, Refused, Result, TransferLeadership
from dledger.raft.messages import Message
from dledger.session import ClientSession
from dledger.transport import limit_unacked_time
from dledger.wire import (
    REFUSAL_STATUS,
    Code,
    FrameError,
    FrameReader,
    MalformedFrame,
    Status,
    code_of,
    encode_frame,
    field,
)
from netio.streams import receive_some

log = logging.getLogger("dledger.service")


class ServedNode(Protocol):
    """What connections need of a replica (dledger.node.Node is one)."""

    @property
    def config(self) -> NodeConfig: ...
    @property
    def segment_bytes(self) -> int: ...
    @property
    def accepting_appends(self) -> bool: ...
    @property
    def leader(self) -> str | None: ...
    @property
    def commit_index(self) -> int: ...
    @property
    def first_index(self) -> int: ...
    @property
    def last_index(self) -> int: ...
    def entry(self, index: int) -> StoredEntry: ...
    async def deliver(self, message: Message) -> None: ...
    def peer_disconnected(self, peer: str) -> None: ...
    def submit_append(self, bodies: Sequence[bytes], reply: Callable[..., None]) -> None: ...
    async def step(self, event: Event) -> Result | None: ...
    def status(self) -> dict[str, object]: ...
    def leader_hint(self, leader: str | None) -> dict[str, object]: ...


class TooManyConnections(FrameError):
    status = Status.BUSY


class WrongPeer(FrameError):
    status = Status.WRONG_PEER

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return f"refused peer: {self.reason}"


def peer_name(stream: trio.abc.Stream) -> str:
    if not isinstance(stream, trio.SocketStream):
        return type(stream).__name__
    try:
        host, port = stream.socket.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "?"


class Service:
    def __init__(self, node: ServedNode) -> None:
        self.node = node
        self._inbound: Counter[str] = Counter()  # live connections from each peer
        self.connections = 0

    async def handle_connection(self, stream: trio.abc.Stream) -> None:
        name = peer_name(stream)
        reader = FrameReader()
        self.connections += 1
        try:
            if self.connections > limits.CONNECTIONS_MAX:
                raise TooManyConnections(f"this node serves at most {limits.CONNECTIONS_MAX}")
            with trio.fail_after(limits.FIRST_FRAME_TIMEOUT_S):
                first = await self._next_frame(stream, reader)
            if first is None:
                return
            raw = field(first, "c", int)
            if raw == Code.HELLO:
                await self._serve_peer(stream, reader, first, name)
            elif raw >= Code.APPEND:  # client codes, known or not (unknown ones get an answer)
                await self._serve_client(stream, reader, first, name)
            else:
                code = code_of(first)
                raise MalformedFrame(
                    f"a connection must open with HELLO or a request, not {code.name}"
                )
        except FrameError as err:
            log.warning("closing connection from %s: %s", name, err)
            await _send_quietly(
                stream, {"c": Code.REPLY, "id": 0, "status": int(err.status), "msg": str(err)}
            )
        except trio.TooSlowError:
            log.info(
                "closing connection from %s: nothing sent within %.0f s",
                name,
                limits.FIRST_FRAME_TIMEOUT_S,
            )
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as err:
            log.debug("connection from %s ended: %s", name, err)
        finally:
            self.connections -= 1
            await stream.aclose()

    async def _next_frame(
        self, stream: trio.abc.Stream, reader: FrameReader
    ) -> dict[str, Any] | None:
        while True:
            for frame in reader.frames():
                return frame
            data = await receive_some(stream, limits.RECEIVE_BYTES)
            if not data:
                return None
            reader.feed(data)

    # --- peers --------------------------------------------------------------------------------

    def _check_hello(self, hello: dict[str, Any]) -> str:
        cfg = self.node.config
        group, sender = field(hello, "group", str), field(hello, "from", str)
        to, segment_bytes = field(hello, "to", str), field(hello, "segment_bytes", int)
        if group != cfg.group:
            raise WrongPeer(f"{sender} is of group {group!r}, this node is of {cfg.group!r}")
        if to != cfg.self_id:
            raise WrongPeer(f"{sender} wanted {to!r}, this node is {cfg.self_id!r}")
        if sender not in cfg.peers or sender == cfg.self_id:
            raise WrongPeer(f"{sender!r} is not a peer of {cfg.self_id} ({', '.join(cfg.peers)})")
        mine = self.node.segment_bytes
        if segment_bytes != mine:
            raise WrongPeer(
                f"{sender} uses segments of {segment_bytes} bytes, this node {mine}: positions "
                "would differ between replicas"
            )
        return sender

    async def _serve_peer(
        self, stream: trio.abc.Stream, reader: FrameReader, hello: dict[str, Any], name: str
    ) -> None:
        peer = self._check_hello(hello)
        log.info("peer %s connected from %s", peer, name)
        node = self.node
        limit_unacked_time(stream, node.config.peer_unacked_timeout_ms)
        self._inbound[peer] += 1
        try:
            while True:
                for frame in reader.frames():
                    await node.deliver(decode_message(frame, sender=peer))
                data = await receive_some(stream, limits.RECEIVE_BYTES)
                if not data:
                    log.info("peer %s closed its connection", peer)
                    return
                reader.feed(data)
        finally:
            self._inbound[peer] -= 1
            if not self._inbound[peer]:
                del self._inbound[peer]
                node.peer_disconnected(peer)

    # --- clients ------------------------------------------------------------------------------

    async def _serve_client(
        self, stream: trio.abc.Stream, reader: FrameReader, first: dict[str, Any], name: str
    ) -> None:
        session = ClientSession(stream, name)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session.write_replies)
            try:
                await self._request(session, first)
                while not session.closed:
                    for frame in reader.frames():
                        await self._request(session, frame)
                        await session.wait_for_room()
                    data = await receive_some(stream, limits.RECEIVE_BYTES)
                    if not data:
                        break
                    reader.feed(data)
            except FrameError as err:
                log.warning("closing client connection from %s: %s", name, err)
                session.reply(0, err.status, str(err), {})
                with trio.move_on_after(1):
                    await session.drained()  # let the refusal go out before closing
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
            finally:
                session.close()
                nursery.cancel_scope.cancel()

    async def _request(self, session: ClientSession, frame: dict[str, Any]) -> None:
        request_id = field(frame, "id", int)
        session.answer_later()

        def reply(status: Status, message: str, fields: dict[str, Any]) -> None:
            session.reply(request_id, status, message, fields)

        raw = field(frame, "c", int)
        try:
            code = Code(raw)
        except ValueError:  # a newer client's request: answer it, keep the connection
            reply(Status.BAD_REQUEST, f"unknown request code {raw}", {})
            return

        if code is Code.APPEND:
            self._append(frame, reply)
        elif code is Code.GET:
            self._get(frame, reply)
        elif code is Code.STATUS:
            reply(Status.OK, "status", self.node.status())
        elif code is Code.TRANSFER:
            await self._transfer(frame, reply)
        else:
            reply(Status.BAD_REQUEST, f"{code.name} is not a client request", {})

    def _append(self, frame: dict[str, Any], reply: Any) -> None:
        node = self.node
        bodies = field(frame, "bodies", list)
        if not bodies:
            reply(Status.BAD_REQUEST, "no bodies to append", {})
            return
        if len(bodies) > limits.PROPOSAL_ENTRIES_MAX:
            reply(
                Status.BAD_REQUEST,
                f"{len(bodies)} bodies; at most {limits.PROPOSAL_ENTRIES_MAX} per append",
                {},
            )
            return
        for body in bodies:
            if type(body) is not bytes:
                reply(Status.BAD_REQUEST, "bodies must be bytes", {})
                return
            if len(body) > limits.ENTRY_BODY_BYTES_MAX:
                reply(
                    Status.ENTRY_TOO_LARGE,
                    f"entry of {len(body)} bytes exceeds the limit of "
                    f"{limits.ENTRY_BODY_BYTES_MAX}",
                    {},
                )
                return
        if not node.accepting_appends:
            leader = node.leader
            reply(
                Status.NOT_LEADER,
                f"{node.config.self_id} is not the leader",
                node.leader_hint(leader),
            )
            return
        node.submit_append(bodies, reply)

    def _get(self, frame: dict[str, Any], reply: Any) -> None:
        node = self.node
        index = field(frame, "index", int)
        count = frame.get("count", 1)
        committed_only = frame.get("committed", True)
        if not isinstance(count, int) or not 1 <= count <= limits.GET_BATCH_ENTRIES_MAX:
            reply(Status.BAD_REQUEST, f"count must be 1..{limits.GET_BATCH_ENTRIES_MAX}", {})
            return
        commit, first, last = node.commit_index, node.first_index, node.last_index
        end = commit if committed_only is not False else last
        info = {"commit_index": commit, "last_index": last, "first_index": first}
        if index < first:
            reply(
                Status.COMPACTED,
                f"index {index} is compacted; first available index is {first}",
                info,
            )
            return
        if index > end:
            what = "committed" if committed_only is not False else "stored"
            reply(
                Status.INDEX_OUT_OF_RANGE, f"index {index} is not {what} here (up to {end})", info
            )
            return
        entries: list[list[Any]] = []
        size = 0
        for i in range(index, min(end, index + count - 1) + 1):
            try:
                e = node.entry(i)
            except (Compacted, IndexOutOfRange) as err:
                reply(Status.INDEX_OUT_OF_RANGE, str(err), info)
                return
            if entries and size + len(e.body) > limits.GET_BYTES_MAX:
                break
            entries.append([e.index, e.term, e.kind, e.position, e.body])
            size += len(e.body)
        reply(Status.OK, f"{len(entries)} entries", {**info, "entries": entries})

    async def _transfer(self, frame: dict[str, Any], reply: Any) -> None:
        target = field(frame, "target", str)
        result = await self.node.step(TransferLeadership(target))
        if isinstance(result, Accepted):
            reply(Status.OK, f"transferring leadership to {target}", {})
        else:
            assert isinstance(result, Refused), result
            detail = f": {result.detail}" if result.detail else ""
            reply(
                REFUSAL_STATUS[result.refusal],
                result.refusal.value + detail,
                self.node.leader_hint(result.leader),
            )


async def _send_quietly(stream: trio.abc.Stream, body: dict[str, Any]) -> None:
    try:
        with trio.move_on_after(1):
            await stream.send_all(encode_frame(body))
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
