"""One remoting connection over a trio stream, the same on the server and the client side.

The peer's requests each run in their own task (at most REQUESTS_IN_FLIGHT_MAX at once; past
that one is answered SYSTEM_BUSY at once), so a long-polled pull never holds up the requests
behind it. A handler that is `Batching` (remoting.dispatch.Dispatcher with `batched` codes) gets
the requests of such a code that one read delivered together, in one task, and their answers
go to the writer together. Every request gets exactly one answer, unless it has the one-way
bit: the C++ client sends what it treats as one-way with flag 0, and drops the answer. Answers
and our own requests go out through one writer task and a bounded outbox, except that a frame
put while the writer is parked with nothing queued is written at once by the task that made it
(as dledger's peer links do, docs/decisions.md "Frames go straight to an idle socket"). Our own
requests (`request`, `send_oneway`) are matched to their responses by opaque, with any number
in flight.

A frame we cannot read (too large, a lying length, a bad header) ends this connection with one
log line; other connections never notice.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import operator
import socket
import struct
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, runtime_checkable

import attrs
import trio

from netio.streams import receive_some, write_nowait
from remoting import limits
from remoting.codes import FLAG_ONEWAY, FLAG_RESPONSE, ResponseCode, code_name
from remoting.command import RemotingCommand
from remoting.errors import ConnectionClosed, FrameError, RequestTimeout
from remoting.frame import FrameDecoder, encode
from remoting.limits import BATCH_BODY_BYTES_MAX, BATCH_REQUESTS_MAX

log = logging.getLogger("remoting.connection")

# Answers a request; it returns the response (`request.response(...)`). Exceptions it raises
# become SYSTEM_ERROR answers (see remoting/dispatch.py for the code table that builds one).
RequestHandler = Callable[[RemotingCommand, "Connection"], Awaitable[RemotingCommand]]
# Answers several requests of one code at once: one response per request, in their order. A
# response may come as the frame that answers its request, already encoded (bytes: the
# request's opaque and serialization, the response flag), for a handler that writes its usual
# answer from a template (broker/send.py's SEND_OK).
BatchHandler = Callable[
    [list[RemotingCommand], "Connection"], Awaitable[Sequence[RemotingCommand | bytes]]
]


@runtime_checkable
class Batching(Protocol):
    """A RequestHandler that also handles some codes in batches (remoting.dispatch.Dispatcher):
    the requests of such a code read from a connection in one go are handed over together."""

    def batch_handler(self, code: int) -> BatchHandler | None: ...


TRANSPORT_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)
_BODY = operator.attrgetter("body")


CLOSED_BY_PEER = "closed by the peer"


@attrs.define
class _Waiter:
    """One of our requests awaiting its response."""

    done: trio.Event = attrs.field(factory=trio.Event)
    response: RemotingCommand | None = None


class Connection:
    """Run it with `await connection.run()` in a task; it returns when the connection ends."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        handler: RequestHandler | None,
        *,
        peer: str,
        frame_bytes_max: int = limits.FRAME_BYTES_MAX,
        requests_in_flight_max: int = limits.REQUESTS_IN_FLIGHT_MAX,
    ) -> None:
        self.peer = peer
        self._stream = stream
        self._handler = handler
        self._batching = handler if isinstance(handler, Batching) else None
        self._decoder = FrameDecoder(frame_bytes_max)
        self._outbox_in, self._outbox_out = trio.open_memory_channel[bytes](
            limits.OUTBOX_FRAMES_MAX
        )
        self._writer_parked = False  # the writer waits for frames and none is queued
        self._in_flight = 0
        self._idle = trio.Event()  # set whenever no request is being handled
        self._idle.set()
        self._in_flight_max = requests_in_flight_max
        self._opaques = itertools.count(1)
        self._waiters: dict[int, _Waiter] = {}
        self._pending_slots = trio.Semaphore(limits.PENDING_RESPONSES_MAX)
        self._closed_reason: str | None = None
        self._cancel_scope = trio.CancelScope()
        self._ended = trio.Event()

    @property
    def closed(self) -> bool:
        return self._closed_reason is not None

    @property
    def requests_in_flight(self) -> int:
        """The peer's requests being handled now."""
        return self._in_flight

    # --- our requests ----------------------------------------------------------------------

    async def request(
        self, command: RemotingCommand, timeout_s: float = limits.REQUEST_TIMEOUT_S_DEFAULT
    ) -> RemotingCommand:
        """Send `command` and return its response; RequestTimeout or ConnectionClosed if none."""
        assert not command.is_response and not command.is_oneway, command
        opaque = self._next_opaque()
        # a CancelScope, not trio.fail_after: its context-manager wrapper was a tenth of a
        # client's CPU per send (one scope per request)
        with trio.CancelScope(deadline=trio.current_time() + timeout_s) as scope:
            async with self._pending_slots:
                self._raise_if_closed()
                waiter = self._waiters[opaque] = _Waiter()
                try:
                    await self._put(encode(command.with_opaque(opaque)))
                    await waiter.done.wait()
                finally:
                    del self._waiters[opaque]
        if scope.cancelled_caught:
            raise RequestTimeout(self.peer, command.code, opaque, timeout_s)
        if waiter.response is None:
            self._raise_if_closed()
        assert waiter.response is not None
        return waiter.response

    async def send_oneway(self, command: RemotingCommand) -> None:
        """Send `command` with the one-way bit; the peer does not answer."""
        assert not command.is_response, command
        self._raise_if_closed()
        one_way = command.with_opaque(self._next_opaque(), command.flag | FLAG_ONEWAY)
        await self._put(encode(one_way))

    def _next_opaque(self) -> int:
        return next(self._opaques) & 0x7FFFFFFF  # C++ masks the sign bit too

    def _raise_if_closed(self) -> None:
        if self._closed_reason is not None:
            raise ConnectionClosed(self.peer, self._closed_reason)

    # --- running ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Read, handle and answer until the peer closes, a frame is bad, or `close()`."""
        reason = "closed by us"
        try:
            with self._cancel_scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._write)
                    reason = await self._read(nursery)
                    if reason == CLOSED_BY_PEER and self._in_flight:
                        # A client may close right after its last request (the C++ client's
                        # one-way sends, a producer shutting down): what it sent is still
                        # handled, within a bound; only the answers have nowhere to go.
                        self._end(reason)
                        with trio.move_on_after(limits.CLOSED_REQUESTS_GRACE_S):
                            await self._idle.wait()
                    nursery.cancel_scope.cancel()
        finally:
            self._end(reason)
            with trio.CancelScope(shield=True):
                await self._stream.aclose()
            self._ended.set()

    def close(self, reason: str = "closed by us") -> None:
        """End the connection: `run()` returns, waiting requesters get ConnectionClosed."""
        self._end(reason)
        self._cancel_scope.cancel()

    def abort(self, reason: str = "aborted by us") -> None:
        """close(), discarding what the kernel has not delivered yet: the socket ends with a
        reset, not a FIN after its queued bytes. After a request timed out in a network fault
        its bytes may still sit in the kernel's retransmission queue; delivered once the fault
        heals, a consumer offset commit would land after the newer ones sent since on another
        connection (the 30-minute broker soak saw consumers rewind 200 messages so)."""
        if isinstance(self._stream, trio.SocketStream):
            with contextlib.suppress(OSError):
                self._stream.socket.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
        self.close(reason)

    async def wait_closed(self) -> None:
        await self._ended.wait()

    def _end(self, reason: str) -> None:
        if self._closed_reason is None:
            self._closed_reason = reason
        self._outbox_in.close()  # senders blocked on a full outbox wake with ConnectionClosed
        for waiter in self._waiters.values():
            waiter.done.set()  # with no response: the requester raises ConnectionClosed

    async def _read(self, nursery: trio.Nursery) -> str:
        """Returns why the connection ended."""
        batching = self._batching
        try:
            while True:
                batches: dict[int, list[RemotingCommand]] = {}
                # is_response and the batching test written out: this runs for every request
                for command in self._decoder.commands():
                    if command.flag & FLAG_RESPONSE:
                        self._deliver(command)
                    elif (
                        batching is not None
                        and len(command.body) < BATCH_BODY_BYTES_MAX
                        and batching.batch_handler(command.code) is not None
                    ):
                        batches.setdefault(command.code, []).append(command)
                    else:
                        await self._start_handling(command, nursery)
                for requests in batches.values():
                    await self._start_batches(requests, nursery)
                data = await receive_some(self._stream, limits.RECEIVE_BYTES)
                if not data:
                    self._decoder.check_closed()
                    return CLOSED_BY_PEER
                self._decoder.feed(data)
        except FrameError as err:
            log.warning("closing connection from %s: %s", self.peer, err)
            return str(err)
        except ConnectionClosed as err:  # closed while we answered an overload
            return err.reason
        except TRANSPORT_ERRORS as err:
            log.debug("connection from %s broke: %r", self.peer, err)
            return f"transport error: {err!r}"

    def _deliver(self, response: RemotingCommand) -> None:
        waiter = self._waiters.get(response.opaque)
        if waiter is None:  # its requester timed out and left
            log.debug("%s: response to unknown opaque %d dropped", self.peer, response.opaque)
            return
        waiter.response = response
        waiter.done.set()

    async def _start_handling(self, request: RemotingCommand, nursery: trio.Nursery) -> None:
        if self._in_flight >= self._in_flight_max:
            remark = (
                f"[OVERLOAD] {self._in_flight} requests of this connection are being handled; "
                "try again later"
            )
            await self._answer(request, request.response(ResponseCode.SYSTEM_BUSY, remark))
            return
        self._in_flight += 1
        self._idle = trio.Event()
        nursery.start_soon(self._handle, request)

    async def _start_batches(self, requests: list[RemotingCommand], nursery: trio.Nursery) -> None:
        """Requests of one batched code read in one go: handled in batches of at most
        BATCH_REQUESTS_MAX requests and BATCH_BODY_BYTES_MAX bytes, in the order they came."""
        assert self._batching is not None
        handler = self._batching.batch_handler(requests[0].code)
        assert handler is not None
        if len(requests) <= BATCH_REQUESTS_MAX and (
            sum(map(len, map(_BODY, requests))) <= BATCH_BODY_BYTES_MAX
        ):  # the usual read: one batch, without the loop below
            await self._start_batch(requests, handler, nursery)
            return
        batch: list[RemotingCommand] = []
        size = 0
        for request in requests:
            if batch and (
                len(batch) == BATCH_REQUESTS_MAX or size + len(request.body) > BATCH_BODY_BYTES_MAX
            ):
                await self._start_batch(batch, handler, nursery)
                batch, size = [], 0
            batch.append(request)
            size += len(request.body)
        await self._start_batch(batch, handler, nursery)

    async def _start_batch(
        self, batch: list[RemotingCommand], handler: BatchHandler, nursery: trio.Nursery
    ) -> None:
        room = self._in_flight_max - self._in_flight
        taken, rest = batch[:room], batch[room:]
        if len(taken) == 1:
            await self._start_handling(taken[0], nursery)
        elif taken:
            self._in_flight += len(taken)
            self._idle = trio.Event()
            nursery.start_soon(self._handle_batch, taken, handler)
        for request in rest:  # past the bound: refused SYSTEM_BUSY, as _start_handling does
            await self._start_handling(request, nursery)

    async def _handle_batch(self, batch: list[RemotingCommand], handler: BatchHandler) -> None:
        try:
            try:
                responses = await handler(batch, self)
                assert len(responses) == len(batch), (len(responses), len(batch))
                frames = [
                    r if isinstance(r, bytes) else encode(r.answering(q))
                    for q, r in zip(batch, responses, strict=True)
                ]
            except Exception as err:  # a handler bug: answer them all, log it, keep going
                log.exception(
                    "%s: handling %d %s failed", self.peer, len(batch), code_name(batch[0].code)
                )
                remark = f"{type(err).__name__}: {err}"[:1000]
                frames = [encode(q.response(ResponseCode.SYSTEM_ERROR, remark)) for q in batch]
            # one item for the writer: frames put one by one would each wake it, and each go
            # out in a send of its own
            answers = b"".join(f for q, f in zip(batch, frames, strict=True) if not q.is_oneway)
            if answers:
                await self._put(answers)
        except ConnectionClosed:
            log.debug("%s: closed before %d requests were answered", self.peer, len(batch))
        finally:
            self._in_flight -= len(batch)
            if not self._in_flight:
                self._idle.set()

    async def _handle(self, request: RemotingCommand) -> None:
        try:
            try:
                frame = encode(await self._response_to(request))
            except Exception as err:  # a handler bug: answer it, log it, keep the connection
                log.exception("%s: handling %s failed", self.peer, code_name(request.code))
                remark = f"{type(err).__name__}: {err}"[:1000]
                frame = encode(request.response(ResponseCode.SYSTEM_ERROR, remark))
            if not request.is_oneway:
                await self._put(frame)
        except ConnectionClosed:
            log.debug("%s: closed before %s was answered", self.peer, code_name(request.code))
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()

    async def _response_to(self, request: RemotingCommand) -> RemotingCommand:
        if self._handler is None:
            return request.response(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                f"request type {request.code} not supported: this side serves no requests",
            )
        response = await self._handler(request, self)
        # Matching is this connection's job: whatever the handler built, it answers this request.
        return response.answering(request)

    async def _answer(self, request: RemotingCommand, response: RemotingCommand) -> None:
        if not request.is_oneway:
            await self._put(encode(response))

    async def _put(self, frame: bytes) -> None:
        if self._writer_parked and self._closed_reason is None:
            # Nothing is queued and nothing is being sent: write it here, and spare a loaded
            # process two scheduler passes (the writer's wake-up and its send) per frame. A
            # leader's batch answers came 0.3-0.6 ms sooner; send_batch +6 % (2026-11-27).
            sent = write_nowait(self._stream, frame)
            if sent == len(frame):
                return
            frame = frame[sent:]
            self._writer_parked = False  # what is put next queues behind the rest
        try:
            await self._outbox_in.send(frame)
        except trio.ClosedResourceError:
            self._raise_if_closed()
            raise

    async def _next_frame(self) -> bytes | None:
        """The next frame to send, waiting parked while none is queued; None once the outbox is
        closed and empty."""
        try:
            return self._outbox_out.receive_nowait()
        except trio.WouldBlock:
            pass
        except trio.EndOfChannel:
            return None
        self._writer_parked = True
        try:
            return await self._outbox_out.receive()
        except trio.EndOfChannel:
            return None
        finally:
            self._writer_parked = False

    async def _write(self) -> None:
        """The one task that sends; it batches what is queued into one send_all."""
        try:
            while (frame := await self._next_frame()) is not None:
                batch = [frame]
                while True:
                    try:
                        batch.append(self._outbox_out.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break  # EndOfChannel: _end() closed the outbox; the loop ends next
                await self._stream.send_all(batch[0] if len(batch) == 1 else b"".join(batch))
        except TRANSPORT_ERRORS as err:
            log.debug("connection to %s broke while writing: %r", self.peer, err)
            self.close(f"transport error: {err!r}")
