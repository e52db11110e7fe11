"""Registration with name servers that go away: a replica must never stop because one did.

Found by the broker chaos run (namesrvs-down): a name server killed while a replica's
REGISTER_BROKER was on the wire closed the connection, ConnectionClosed came out of the
connection's nursery wrapped in an ExceptionGroup, the registrar did not catch it, and every
replica of every group exited."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import trio

from dledger.config import Address
from dledger.localgroup import free_port
from tests.broker.group import broker_group

CLOSES_WANTED = 4  # registrations cut short before the test is satisfied
WAIT_S = 20.0


async def test_a_name_server_that_drops_every_registration_does_not_stop_the_group(
    tmp_path: Path,
) -> None:
    port = free_port()
    accepted = 0
    enough = trio.Event()

    async def drop_after_the_request(stream: trio.SocketStream) -> None:
        """Read the start of the REGISTER_BROKER, then close: a name server killed mid-call."""
        nonlocal accepted
        accepted += 1
        try:
            await stream.receive_some(64)
        finally:
            await stream.aclose()
        if accepted >= CLOSES_WANTED:
            enough.set()

    async with trio.open_nursery() as nursery:
        await nursery.start(partial(trio.serve_tcp, drop_after_the_request, port, host="127.0.0.1"))
        async with broker_group(tmp_path, namesrv=(Address("127.0.0.1", port),)) as group:
            with trio.fail_after(WAIT_S):
                await enough.wait()
            await group.wait_leader()  # still serving: every replica runs, one leads
            assert all(b.registrar.registrations == 0 for b in group.brokers.values())
        nursery.cancel_scope.cancel()
    assert accepted >= CLOSES_WANTED
