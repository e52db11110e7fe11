"""A DLedger client for trio: finds the leader, follows NOT_LEADER redirects, retries within a
deadline, and pipelines many concurrent calls over one connection per server.

Outcomes follow Jepsen's three: an append returns its index (it happened), raises
`AppendFailed` (it surely did not happen), or raises `OutcomeUnknown` (it may have happened:
the request was sent and the answer lost, or the server said so). Only the first two are
retried automatically; retrying an unknown outcome could store a value twice, so that is the
caller's decision.

    async with open_client(parse_peers("n0-127.0.0.1:40911;...")) as client:
        index = await client.append(b"hello")
"""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from dledger import limits
from dledger.config import Address
from dledger.outbox import Outbox
from dledger.wire import Code, FrameError, FrameReader, Status, encode_frame
from netio.streams import receive_some

log = logging.getLogger("dledger.client")


# Statuses after which nothing was stored: safe to retry, elsewhere or later.
RETRYABLE = {
    Status.NOT_LEADER,
    Status.BUSY,
    Status.TRANSFERRING,
    Status.NOT_COMMITTED,
    Status.SHUTTING_DOWN,
}


class ClientError(Exception):
    """Base of the errors a DLedgerClient raises on purpose."""


@attrs.define
class AppendFailed(ClientError):
    """The append surely did not happen."""

    status: Status
    message: str

    def __str__(self) -> str:
        return f"append failed ({self.status.name}): {self.message}"


@attrs.define
class OutcomeUnknown(ClientError):
    """The append may or may not have happened."""

    reason: str

    def __str__(self) -> str:
        return f"outcome unknown: {self.reason}"


@attrs.define
class RequestFailed(ClientError):
    status: Status
    message: str
    fields: dict[str, Any] = attrs.field(factory=dict)

    def __str__(self) -> str:
        return f"{self.status.name}: {self.message}"


class ConnectionLost(ClientError):
    """The connection closed while a request was out."""


@attrs.frozen
class Entry:
    index: int
    term: int
    kind: int
    position: int
    body: bytes


@attrs.frozen
class Reply:
    status: Status
    message: str
    fields: dict[str, Any]


class _Call:
    __slots__ = ("done", "error", "reply")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.reply: Reply | None = None
        self.error: str | None = None


class _AppendSlot:
    """One append() call waiting for its batch's answer. The caller parks on its own task
    rather than on a trio.Event: a batch wakes every caller in it, and with many callers the
    Event and its parking lot were a fair share of the client's time per append."""

    __slots__ = ("bodies", "deadline", "error", "finished", "index", "task")

    def __init__(self, bodies: list[bytes], deadline: float) -> None:
        self.bodies = bodies
        self.deadline = deadline
        self.index = 0
        self.error: ClientError | None = None
        self.finished = False
        self.task: trio.lowlevel.Task | None = None  # the caller, while it waits

    def finish(self) -> None:
        self.finished = True
        task, self.task = self.task, None
        if task is not None:
            trio.lowlevel.reschedule(task)

    async def wait(self) -> None:
        if self.finished:
            return
        self.task = trio.lowlevel.current_task()

        def abort(_: object) -> trio.lowlevel.Abort:
            self.task = None  # cancelled: the append may still be stored, nobody waits for it
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)


class Connection:
    """One pipelined connection to one server."""

    def __init__(self, node: str, stream: trio.abc.Stream) -> None:
        self.node = node
        self.stream = stream
        self.closed = False
        self._ids = itertools.count(1)
        self._calls: dict[int, _Call] = {}
        self._outbox = Outbox(stream)

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write, nursery.cancel_scope)
                await self._read()
                nursery.cancel_scope.cancel()
        finally:
            self._close("connection closed")

    async def _read(self) -> None:
        reader = FrameReader()
        try:
            while True:
                data = await receive_some(self.stream, limits.RECEIVE_BYTES)
                if not data:
                    return
                reader.feed(data)
                for frame in reader.frames():
                    call = self._calls.pop(frame.get("id", -1), None)
                    if call is None:
                        if frame.get("id") == 0:
                            log.warning(
                                "server %s refused the connection: %s", self.node, frame.get("msg")
                            )
                        continue
                    fields = {
                        k: v for k, v in frame.items() if k not in ("c", "id", "status", "msg")
                    }
                    call.reply = Reply(Status(frame["status"]), str(frame.get("msg", "")), fields)
                    call.done.set()
        except (
            trio.BrokenResourceError,
            trio.ClosedResourceError,
            OSError,
            FrameError,
            ValueError,
        ) as err:
            log.debug("reading from %s failed: %s", self.node, err)

    async def _write(self, scope: trio.CancelScope) -> None:
        try:
            await self._outbox.run()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as err:
            log.debug("writing to %s failed: %s", self.node, err)
            scope.cancel()

    def _close(self, why: str) -> None:
        if self.closed:
            return
        self.closed = True
        self._outbox.close()
        for call in self._calls.values():
            call.error = why
            call.done.set()
        self._calls.clear()

    async def request(self, code: Code, **fields: Any) -> Reply:
        """Send one request and wait for its reply; ConnectionLost if the connection goes first
        (the request may have been received)."""
        if self.closed:
            raise ConnectionLost(f"connection to {self.node} is closed")
        request_id = next(self._ids)
        call = _Call()
        self._calls[request_id] = call
        self._outbox.put(encode_frame({"c": int(code), "id": request_id, **fields}))
        await call.done.wait()
        if call.reply is None:
            raise ConnectionLost(f"{self.node}: {call.error}")
        return call.reply

    async def aclose(self) -> None:
        self._close("closed by the client")
        await self.stream.aclose()


# How a client reaches a server: (server id, address) -> stream. TCP unless a test passes
# memory streams (the same shape as dledger.transport.PeerConnector).
Connector = Callable[[str, Address], Awaitable[trio.abc.Stream]]


async def _tcp_connect(_node: str, address: Address) -> trio.abc.Stream:
    return await trio.open_tcp_stream(address.host, address.port)


@asynccontextmanager
async def open_client(
    peers: dict[str, Address],
    *,
    rng: random.Random | None = None,
    connect: Connector = _tcp_connect,
) -> AsyncIterator[DLedgerClient]:
    """A client whose connections live in a nursery of its own, closed on the way out."""
    async with trio.open_nursery() as nursery:
        client = DLedgerClient(peers, nursery, rng=rng, connect=connect)
        try:
            yield client
        finally:
            await client.aclose()
            nursery.cancel_scope.cancel()


class DLedgerClient:
    def __init__(
        self,
        peers: dict[str, Address],
        nursery: trio.Nursery,
        *,
        rng: random.Random | None = None,
        connect: Connector = _tcp_connect,
    ) -> None:
        """`nursery` owns each connection's reader and writer tasks (trio-websocket's way)."""
        if not peers:
            raise ValueError("a client needs at least one server")
        self.peers = dict(peers)
        self._connect = connect
        self._nursery = nursery
        self._rng = rng or random.Random()
        self._leader: str | None = None
        self._connections: dict[str, Connection] = {}
        self._connecting: dict[str, trio.Event] = {}
        self._append_queue: list[_AppendSlot] = []
        self._append_wake = trio.Event()
        self._batcher_running = False

    async def aclose(self) -> None:
        for connection in list(self._connections.values()):
            with trio.CancelScope(shield=True):
                await connection.aclose()
        self._connections.clear()

    @property
    def leader(self) -> str | None:
        """The server this client last found leading (a hint)."""
        return self._leader

    def follow(self, leader: str) -> None:
        """Try `leader` first from now on: a server embedding a node (the broker forwarding
        writes) knows the leader before this client's own guess catches up. Ignored for a
        server this client does not know."""
        if leader in self.peers:
            self._leader = leader

    # --- connections ---------------------------------------------------------------------------

    async def connection(self, node: str) -> Connection:
        existing = self._connections.get(node)
        if existing is not None and not existing.closed:
            return existing
        pending = self._connecting.get(node)
        if pending is not None:  # another task is connecting: wait for it
            await pending.wait()
            existing = self._connections.get(node)
            if existing is not None and not existing.closed:
                return existing
            raise ConnectionLost(f"cannot connect to {node}")
        self._connecting[node] = event = trio.Event()
        try:
            address = self.peers[node]
            try:
                with trio.fail_after(limits.CLIENT_CONNECT_TIMEOUT_S):
                    stream = await self._connect(node, address)
            except (OSError, trio.TooSlowError) as err:
                raise ConnectionLost(f"cannot connect to {node} at {address}: {err}") from err
            connection = Connection(node, stream)
            self._connections[node] = connection
            self._nursery.start_soon(connection.run)
            return connection
        finally:
            del self._connecting[node]
            event.set()

    def _candidates(self) -> list[str]:
        """Servers to try: the known leader first, then the rest in random order."""
        others = [p for p in self.peers if p != self._leader]
        self._rng.shuffle(others)
        return ([self._leader] if self._leader in self.peers else []) + others

    def _follow_hint(self, fields: dict[str, Any]) -> bool:
        leader = fields.get("leader")
        if isinstance(leader, str) and leader in self.peers:
            changed = leader != self._leader
            self._leader = leader
            return changed
        return False

    # --- requests ------------------------------------------------------------------------------

    async def append(
        self, bodies: bytes | Sequence[bytes], *, timeout: float = limits.CLIENT_TIMEOUT_S_DEFAULT
    ) -> int:
        """Append one body or several (stored consecutively, all or none); returns the index of
        the last one once it is committed.

        Appends that tasks make at the same moment on one client travel in one APPEND request
        (as a producer batches): one frame, one proposal, one reply for all of them, each
        caller still getting its own index. Such a batch commits or fails as a whole."""
        batch = [bodies] if isinstance(bodies, bytes) else list(bodies)
        if not batch:
            raise ValueError("nothing to append")
        slot = _AppendSlot(batch, trio.current_time() + timeout)
        self._append_queue.append(slot)
        self._append_wake.set()
        if not self._batcher_running:
            self._batcher_running = True
            self._nursery.start_soon(self._batch_appends)
        await slot.wait()
        if slot.error is not None:
            raise slot.error
        return slot.index

    async def _batch_appends(self) -> None:
        queue = self._append_queue
        while True:
            while not queue:
                await self._append_wake.wait()
                self._append_wake = trio.Event()
            await trio.lowlevel.checkpoint()  # let the other runnable appenders join in
            taken: list[_AppendSlot] = []
            count = size = 0
            while queue and (
                not taken
                or (
                    count + len(queue[0].bodies) <= limits.PROPOSAL_ENTRIES_MAX
                    and size < limits.CLIENT_APPEND_BATCH_BYTES_MAX
                )
            ):
                slot = queue.pop(0)
                taken.append(slot)
                count += len(slot.bodies)
                size += sum(map(len, slot.bodies))
            self._nursery.start_soon(self._send_batch, taken)

    async def _send_batch(self, slots: list[_AppendSlot]) -> None:
        deadline = min(slot.deadline for slot in slots)
        bodies: list[bytes] = []
        for slot in slots:
            bodies.extend(slot.bodies)
        try:
            reply = await self._to_leader(
                Code.APPEND,
                {"bodies": bodies},
                timeout=max(0.0, deadline - trio.current_time()),
                unknown_is_final=True,
            )
        except ClientError as err:
            for slot in slots:
                slot.error = err
                slot.finish()
            return
        index = int(reply.fields["index"]) - len(bodies)
        for slot in slots:
            index += len(slot.bodies)
            slot.index = index
            slot.finish()

    async def transfer(
        self, target: str, *, timeout: float = limits.CLIENT_TIMEOUT_S_DEFAULT
    ) -> None:
        await self._to_leader(
            Code.TRANSFER, {"target": target}, timeout=timeout, unknown_is_final=False
        )

    async def _to_leader(
        self, code: Code, fields: dict[str, Any], *, timeout: float, unknown_is_final: bool
    ) -> Reply:
        deadline = trio.current_time() + timeout
        sleep_s = limits.CLIENT_RETRY_SLEEP_S_MIN
        last_problem = "no server answered"
        while True:
            for node in self._candidates():
                if trio.current_time() >= deadline:
                    raise self._timeout_error(code, last_problem, unknown_is_final)
                try:
                    connection = await self.connection(node)
                except ConnectionLost as err:
                    last_problem = str(err)
                    if self._leader == node:
                        self._leader = None
                    continue
                if connection.closed:
                    continue
                sent = False
                try:
                    with trio.move_on_at(deadline) as scope:
                        sent = True  # from here the server may have it
                        reply = await connection.request(code, **fields)
                    if scope.cancelled_caught:
                        if self._leader == node:
                            self._leader = (
                                None  # a paused or cut-off leader: the next call asks around
                            )
                        raise self._timeout_error(
                            code, f"no answer from {node} in time", unknown_is_final
                        )
                except ConnectionLost as err:
                    if self._leader == node:
                        self._leader = None
                    if sent and unknown_is_final:
                        raise OutcomeUnknown(
                            f"connection to {node} lost with the request out: {err}"
                        ) from err
                    last_problem = str(err)
                    continue
                if reply.status is Status.OK:
                    self._leader = node
                    return reply
                if reply.status is Status.OUTCOME_UNKNOWN and unknown_is_final:
                    raise OutcomeUnknown(f"{node}: {reply.message}")
                if reply.status not in RETRYABLE:
                    if code is Code.APPEND:
                        raise AppendFailed(reply.status, reply.message)
                    raise RequestFailed(reply.status, reply.message, reply.fields)
                last_problem = f"{node}: {reply.status.name} {reply.message}"
                if reply.status is Status.NOT_LEADER and self._follow_hint(reply.fields):
                    break  # go to the hinted leader now
                if self._leader == node:
                    self._leader = None
            else:
                await trio.sleep(min(sleep_s, max(0.0, deadline - trio.current_time())))
                sleep_s = min(2 * sleep_s, limits.CLIENT_RETRY_SLEEP_S_MAX)

    def _timeout_error(self, code: Code, problem: str, unknown_is_final: bool) -> ClientError:
        if code is Code.APPEND and unknown_is_final:
            return OutcomeUnknown(f"deadline passed ({problem})")
        return RequestFailed(Status.OUTCOME_UNKNOWN, f"deadline passed ({problem})")

    async def request(
        self,
        node: str,
        code: Code,
        *,
        timeout: float = limits.CLIENT_TIMEOUT_S_DEFAULT,
        **fields: Any,
    ) -> Reply:
        """One request to one named server, no retries."""
        with trio.fail_after(timeout):
            connection = await self.connection(node)
            return await connection.request(code, **fields)

    async def status(
        self, node: str, *, timeout: float = limits.CLIENT_TIMEOUT_S_DEFAULT
    ) -> dict[str, Any]:
        reply = await self.request(node, Code.STATUS, timeout=timeout)
        if reply.status is not Status.OK:
            raise RequestFailed(reply.status, reply.message, reply.fields)
        return reply.fields

    async def get(
        self,
        index: int,
        count: int = 1,
        *,
        node: str | None = None,
        committed: bool = True,
        timeout: float = limits.CLIENT_TIMEOUT_S_DEFAULT,
    ) -> list[Entry]:
        """Entries from `index` on (at most `count`), from `node` or the leader; committed ones
        only unless `committed=False`. RequestFailed names COMPACTED or INDEX_OUT_OF_RANGE."""
        fields = {"index": index, "count": count, "committed": committed}
        if node is None:
            reply = await self._to_leader(Code.GET, fields, timeout=timeout, unknown_is_final=False)
        else:
            reply = await self.request(node, Code.GET, timeout=timeout, **fields)
            if reply.status is not Status.OK:
                raise RequestFailed(reply.status, reply.message, reply.fields)
        return [Entry(*row) for row in reply.fields["entries"]]

    async def read_log(
        self, node: str, *, first: int = 1, last: int | None = None, timeout: float = 30.0
    ) -> list[Entry]:
        """Every committed entry `node` holds from `first` (or its first retained index) to
        `last` (default: its commit index), in pages."""
        status = await self.status(node, timeout=timeout)
        last = status["commit_index"] if last is None else last
        index = max(first, status["first_index"])
        entries: list[Entry] = []
        with trio.fail_after(timeout):
            while index <= last:
                page = await self.get(
                    index, min(limits.GET_BATCH_ENTRIES_MAX, last - index + 1), node=node
                )
                if not page:
                    break
                entries.extend(page)
                index = page[-1].index + 1
        return entries

    async def find_leader(self, *, timeout: float = limits.CLIENT_TIMEOUT_S_DEFAULT) -> str | None:
        """Ask the servers who leads; None if none knows before the deadline."""
        with trio.move_on_after(timeout):
            while True:
                for node in self._candidates():
                    try:
                        status = await self.status(node, timeout=limits.CLIENT_CONNECT_TIMEOUT_S)
                    except (ClientError, trio.TooSlowError):
                        continue
                    if status.get("role") == "leader":
                        self._leader = node
                        return node
                    if self._follow_hint(status):
                        break
                await trio.sleep(limits.CLIENT_RETRY_SLEEP_S_MAX)
        return None
