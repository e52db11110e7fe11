"""Work only the leader does (delayed deliveries, transaction checks): run once per term this
replica leads, and cancelled as soon as that term's leadership ends."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from dledger.node import Node
from dledger.raft.events import Role


async def each_term_led(node: Node, run: Callable[[int], Awaitable[None]]) -> None:
    """`run(term)` for each term this replica leads, cancelled when the term ends."""
    while True:
        role = node.role
        if role.role is not Role.LEADER:
            await node.wait_role_change()
            continue
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, role.term)
            while node.role.role is Role.LEADER and node.role.term == role.term:
                await node.wait_role_change()
            nursery.cancel_scope.cancel()
