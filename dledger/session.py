"""One client connection: requests come in pipelined, answers go out as they are ready.

Answers go out through an Outbox: straight to the socket when its writer task is idle, else
queued, and the writer sends all queued ones in a single `send_all`, so a client with hundreds
of appends in flight costs one syscall per wake-up, not one per answer.
The number of unanswered requests is bounded; past it the reader stops reading, and TCP
pushes back on the client.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from dledger import limits
from dledger.outbox import Outbox
from dledger.wire import Code, Status, encode_frame

log = logging.getLogger("dledger.session")

RESERVED = frozenset({"c", "id", "status", "msg"})  # every reply's own keys


class ClientSession:
    def __init__(self, stream: trio.abc.Stream, peer_name: str) -> None:
        self.peer_name = peer_name
        self.unanswered = 0
        self._outbox = Outbox(stream)
        self._room = trio.Event()

    @property
    def closed(self) -> bool:
        return self._outbox.closed

    def reply(self, request_id: int, status: Status, message: str, fields: dict[str, Any]) -> None:
        """Send the answer to request `request_id` (from any task; never blocks)."""
        if self.closed:
            return
        self.unanswered -= 1
        assert not RESERVED & fields.keys(), f"reply fields may not use {RESERVED & fields.keys()}"
        body = {"c": Code.REPLY, "id": request_id, "status": int(status), "msg": message, **fields}
        self._outbox.put(encode_frame(body))
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
            await self._outbox.run()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as err:
            log.debug("client %s went away while we answered: %s", self.peer_name, err)
        finally:
            self.close()

    async def drained(self) -> None:
        """Return once every answer so far has been handed to the socket."""
        await self._outbox.drained()

    def close(self) -> None:
        self._outbox.close()
        self._room.set()
