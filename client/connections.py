"""One remoting connection per address, opened on first use and kept until it breaks.

The pool's connections run in the owner's nursery. A broken or closed connection is dropped at
once, so the next request to that address connects again. Requests from the server (the
broker's NOTIFY_CONSUMER_IDS_CHANGED, CHECK_TRANSACTION_STATE, ...) go to `handler`.
"""

from __future__ import annotations

import logging

import trio

from remoting import limits
from remoting.client import open_connection
from remoting.command import RemotingCommand
from remoting.connection import Connection, RequestHandler

log = logging.getLogger("client.connections")

CONNECT_TIMEOUT_S = 3.0  # the C++ client's tcpConnectTimeout


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"not a host:port address: {address!r}")
    return host, int(port)


class ConnectionPool:
    def __init__(self, nursery: trio.Nursery, handler: RequestHandler | None = None) -> None:
        self._nursery = nursery
        self._handler = handler
        self._connections: dict[str, Connection] = {}
        self._connecting: dict[str, trio.Lock] = {}

    def live(self, address: str) -> Connection | None:
        """The open connection to `address`, if there is one (`get` without connecting)."""
        conn = self._connections.get(address)
        return None if conn is None or conn.closed else conn

    async def get(self, address: str, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> Connection:
        """The live connection to `address`, connecting if there is none. Raises OSError or
        trio.TooSlowError when it cannot connect."""
        conn = self.live(address)
        if conn is not None:
            return conn
        lock = self._connecting.setdefault(address, trio.Lock())
        async with lock:  # one connect per address at a time; the others wait for it
            conn = self._connections.get(address)
            if conn is not None and not conn.closed:
                return conn
            conn = await self._nursery.start(self._run, address, connect_timeout_s)
            assert conn is not None
            self._connections[address] = conn
            return conn

    async def get_within(self, address: str, timeout_s: float) -> Connection:
        """`get`, all of it (a connect in progress included) within `timeout_s`: an open
        connection at once, without a cancel scope (one per request was a tenth of a send's
        CPU). Raises OSError or trio.TooSlowError when it cannot connect in time."""
        conn = self.live(address)
        if conn is None:
            with trio.fail_after(timeout_s):
                conn = await self.get(address, min(CONNECT_TIMEOUT_S, timeout_s))
        return conn

    async def request(
        self,
        address: str,
        command: RemotingCommand,
        timeout_s: float = limits.REQUEST_TIMEOUT_S_DEFAULT,
    ) -> RemotingCommand:
        """Send on the connection to `address`; raises what Connection.request raises, and
        OSError / trio.TooSlowError for a connect that fails."""
        conn = await self.get_within(address, timeout_s)
        return await conn.request(command, timeout_s)

    def drop(self, address: str) -> None:
        """Abort the connection to `address` (after a timeout: it may be half dead), so that
        nothing still queued on it reaches the broker late (Connection.abort)."""
        conn = self._connections.pop(address, None)
        if conn is not None:
            conn.abort("dropped after a failure")

    def addresses(self) -> list[str]:
        return [a for a, c in self._connections.items() if not c.closed]

    def close_all(self) -> None:
        for conn in self._connections.values():
            conn.close()
        self._connections.clear()

    async def _run(
        self,
        address: str,
        connect_timeout_s: float,
        task_status: trio.TaskStatus[Connection] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        host, port = split_address(address)
        async with open_connection(
            host, port, handler=self._handler, connect_timeout_s=connect_timeout_s
        ) as conn:
            task_status.started(conn)
            await conn.wait_closed()
        if self._connections.get(address) is conn:
            del self._connections[address]
        log.debug("connection to %s ended", address)
