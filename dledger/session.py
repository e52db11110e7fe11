"""One client connection: requests come in pipelined, answers go out as they are ready.

Answers are queued and one writer task sends all queued ones in a single `send_all`, so a
client with hundreds of appends in flight costs one syscall per wake-up, not one per answer.
The number of unanswered requests is bounded; past it the reader stops reading, and TCP
pushes back on the client.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from dledger import limits
from dledger.wire import Code, Status, encode_frame

log = logging.getLogger("dledger.session")

RESERVED = frozenset({"c", "id", "status", "msg"})  # every reply's own keys


class ClientSession:
    def __init__(self, stream: trio.SocketStream, peer_name: str) -> None:
        self.stream = stream
        self.peer_name = peer_name
        self.unanswered = 0
        self.closed = False
        self._out: list[bytes] = []
        self._wake = trio.Event()
        self._room = trio.Event()
        self._drained = trio.Event()

    def reply(self, request_id: int, status: Status, message: str, fields: dict[str, Any]) -> None:
        """Queue the answer to request `request_id` (callable from any task)."""
        if self.closed:
            return
        self.unanswered -= 1
        assert not RESERVED & fields.keys(), f"reply fields may not use {RESERVED & fields.keys()}"
        body = {"c": Code.REPLY, "id": request_id, "status": int(status), "msg": message, **fields}
        self._out.append(encode_frame(body))
        self._wake.set()
        if self.unanswered < limits.CLIENT_PENDING_REQUESTS_MAX:
            self._room.set()

    def answer_later(self) -> None:
        """A request was taken; its answer will come through `reply`."""
        self.unanswered += 1

    async def wait_for_room(self) -> None:
        while self.unanswered >= limits.CLIENT_PENDING_REQUESTS_MAX and not self.closed:
            self._room = trio.Event()
            await self._room.wait()

    async def write_replies(self) -> None:
        try:
            while True:
                while not self._out:
                    await self._wake.wait()
                    self._wake = trio.Event()
                out, self._out = self._out, []
                await self.stream.send_all(out[0] if len(out) == 1 else b"".join(out))
                if not self._out:
                    self._drained.set()
                    self._drained = trio.Event()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as err:
            log.debug("client %s went away while we answered: %s", self.peer_name, err)
        finally:
            self.close()

    async def drained(self) -> None:
        """Return once every queued answer has been handed to the socket."""
        if self._out and not self.closed:
            await self._drained.wait()

    def close(self) -> None:
        self.closed = True
        self._out.clear()
        self._wake.set()
        self._room.set()
        self._drained.set()
