"""Node embedded in a program (what the broker will do): a state machine that reads bodies and
role-change callbacks, three nodes in one trio process on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from dledger.client import open_client
from dledger.config import Address, NodeConfig
from dledger.hosting import host_node
from dledger.log.store import LogStore, StoreConfig
from dledger.node import Node, StateMachine
from dledger.processes import free_port_block
from dledger.raft.entries import EntryBatch, EntryKind
from dledger.raft.events import Role, RoleState
from dledger.wire import Status
from tests.node.memnet import memory_group


class Recorder:
    reads_bodies = True

    def __init__(self) -> None:
        self.applied: list[tuple[int, int, bytes]] = []

    def apply(self, batch: EntryBatch) -> None:
        for offset, (kind, body) in enumerate(zip(batch.kinds, batch.payloads, strict=True)):
            if kind == EntryKind.DATA:
                self.applied.append((batch.first_index + offset, batch.terms[offset], body))


async def test_state_machine_sees_every_committed_entry_once_in_order(tmp_path: Path) -> None:
    first = free_port_block(3)  # distinct: free_port() twice may give the same port
    peers = {f"n{i}": Address("127.0.0.1", first + i) for i in range(3)}
    recorders = {n: Recorder() for n in peers}
    roles: dict[str, list[RoleState]] = {n: [] for n in peers}
    stores = {
        n: LogStore.open(tmp_path / n, StoreConfig(segment_bytes=1 << 20), group="g", self_id=n)
        for n in peers
    }
    try:
        async with trio.open_nursery() as nursery:
            nodes = {}
            for n in peers:
                config = NodeConfig(group="g", self_id=n, peers=peers, store_dir=tmp_path / n)
                node = Node(config, stores[n], recorders[n])
                node.on_role_change(roles[n].append)
                nodes[n] = node
                await nursery.start(host_node, node)
            async with open_client(peers) as client:
                values = [f"v{i}".encode() * 50 for i in range(300)]
                async with trio.open_nursery() as appenders:
                    for chunk in range(0, 300, 30):
                        appenders.start_soon(client.append, values[chunk : chunk + 30])
                with trio.fail_after(20):
                    while any(len(r.applied) < 300 for r in recorders.values()):
                        await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    finally:
        for store in stores.values():
            store.close()
    sequences = {n: r.applied for n, r in recorders.items()}
    assert sequences["n0"] == sequences["n1"] == sequences["n2"]
    assert sorted(body for _, _, body in sequences["n0"]) == sorted(values)
    indexes = [i for i, _, _ in sequences["n0"]]
    assert indexes == sorted(indexes) and len(set(indexes)) == 300
    leaders = {r.leader for changes in roles.values() for r in changes if r.leader}
    assert len(leaders) == 1
    assert any(r.role is Role.LEADER for changes in roles.values() for r in changes)


async def test_stopping_leader_answers_proposed_appends_unknown_not_failed(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """An append in the log but not yet committed may commit after a restart: a node that
    stops must not tell its client it surely failed (which invites a duplicate retry). On
    memory streams (tests/node/memnet.py): no port to collide with anything else."""
    answers: list[tuple[Status, str]] = []
    async with memory_group(tmp_path) as group:
        leader = await group.wait_for_leader()
        for n in [n for n in group.nodes if n != leader]:
            group.kill(n)  # it can no longer commit anything
        node = group.nodes[leader]
        node.submit_append([b"x"], lambda status, msg, fields: answers.append((status, msg)))
        with trio.fail_after(5):
            while node.metrics["proposals"] == 0:
                await trio.sleep(0.001)
        assert not answers
        group.kill(leader)
        await group.wait_stopped(leader)
    assert [status for status, _ in answers] == [Status.OUTCOME_UNKNOWN], answers


class AppliedOrder:
    reads_bodies = True

    def __init__(self, events: list[tuple[str, int]]) -> None:
        self.events = events

    def apply(self, batch: EntryBatch) -> None:
        for offset, kind in enumerate(batch.kinds):
            if kind == EntryKind.DATA:
                self.events.append(("applied", batch.first_index + offset))


async def test_a_leaders_writers_resume_before_it_applies_their_entries(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A commit wakes the writers waiting for it and the applier together; trio runs a batch of
    woken tasks in either order, and the applier yields once so the writers (a broker
    leader's SEND_OK) always go first."""
    events: dict[str, list[tuple[str, int]]] = {f"n{i}": [] for i in range(3)}
    machines: dict[str, StateMachine | None] = {n: AppliedOrder(e) for n, e in events.items()}
    async with memory_group(tmp_path, state_machines=machines) as group:
        leader = await group.wait_for_leader()
        node = group.nodes[leader]
        for k in range(20):
            reply = await node.append([b"v%d" % k])
            assert reply.status is Status.OK
            events[leader].append(("answered", reply.last_index))
        with trio.fail_after(5):
            while events[leader][-1][0] != "applied":
                await trio.sleep(0.001)
    seen = events[leader]
    answered = [i for what, i in seen if what == "answered"]
    assert len(answered) == 20
    for index in answered:
        assert seen.index(("answered", index)) < seen.index(("applied", index)), seen
