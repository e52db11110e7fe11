"""A group of nodes on memory streams under trio's mock clock (tests/node/memnet.py): elections,
kills and restarts in virtual time, milliseconds of real time, no sockets."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from dledger import limits
from dledger.node import PROPOSE, TICK_DUE
from dledger.raft.entries import EntryBatch, EntryKind
from dledger.raft.events import Tick
from dledger.wire import Status
from tests.node.memnet import memory_group


class Recorder:
    reads_bodies = True

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def apply(self, batch: EntryBatch) -> None:
        self.bodies += [
            p for k, p in zip(batch.kinds, batch.payloads, strict=True) if k == EntryKind.DATA
        ]


async def test_a_killed_leader_is_replaced_and_appends_go_on(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    recorders = {f"n{i}": Recorder() for i in range(3)}
    started_real = time.monotonic()
    async with memory_group(tmp_path, state_machines=dict(recorders)) as group:
        first = await group.wait_for_leader()
        await group.append([b"a1", b"a2"])
        killed_at = trio.current_time()
        group.kill(first)
        second = await group.wait_for_leader()
        elected_after_s = trio.current_time() - killed_at
        assert second != first
        await group.append([b"b1"])
        with trio.fail_after(10):
            while any(len(recorders[n].bodies) < 3 for n in group.nodes):
                await trio.sleep(0.01)
        await group.start(first)  # the old leader comes back as a follower and catches up
        await group.append([b"c1"])
        with trio.fail_after(10):  # the returned node re-applies from its checkpoint on
            while any(r.bodies[-1:] != [b"c1"] for r in recorders.values()):
                await trio.sleep(0.01)
    survivors = [n for n in recorders if n != first]
    assert recorders[survivors[0]].bodies == recorders[survivors[1]].bodies
    assert recorders[survivors[0]].bodies == [b"a1", b"a2", b"b1", b"c1"]
    assert recorders[first].bodies[-4:] == [b"a1", b"a2", b"b1", b"c1"]
    # a leader connection dropped: the followers campaign at once, well within one timeout
    assert elected_after_s < 0.5, elected_after_s
    print(f"virtual {trio.current_time():.2f} s in real {time.monotonic() - started_real:.2f} s")


async def test_a_durability_report_is_not_held_back_by_a_full_inbox(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A one-node group commits an entry when the node reports it durable. Here the raft loop's
    inbox is full at that moment (a busy node), so the report cannot be queued there: the loop
    must still step it after its drain, in the same instant, not at the next maintenance tick
    (0.25 s later, as it once did)."""
    async with memory_group(tmp_path, size=1) as group:
        node = group.nodes[await group.wait_for_leader()]
        await group.append([b"warm-up"])
        store = group.stores["n0"]
        inbox = node._inbox_send
        filled_at_report: list[int] = []
        append = store.append

        def append_then_fill_the_inbox(batch: object) -> object:
            stored = append(batch)  # type: ignore[arg-type]
            with contextlib.suppress(trio.WouldBlock):
                while True:
                    inbox.send_nowait(PROPOSE)  # a no-op for the loop: nothing is pending
            filled_at_report.append(inbox.statistics().current_buffer_used)
            return stored

        monkeypatch.setattr(store, "append", append_then_fill_the_inbox)
        started = trio.current_time()
        reply = await node.append([b"x"])
        waited_s = trio.current_time() - started
    assert reply.status is Status.OK
    assert filled_at_report == [limits.INBOX_EVENTS_MAX]
    assert waited_s < limits.MAINTENANCE_INTERVAL_S / 10, waited_s


async def test_the_core_gets_a_tick_a_period_and_the_ticker_wakes_only_an_idle_loop_with_work(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One Tick per period whether the loop is busy or idle. A loop woken by events more often
    than that takes its ticks itself, and the ticker's deadline (a cancel and an exception
    unwound each time it fires) does not fire. An idle leader's loop is woken only for the
    ticks that may act (its heartbeats, every 5th), and given the ticks it slept through."""
    async with memory_group(tmp_path, size=1) as group:
        node = group.nodes[await group.wait_for_leader()]
        period = node.config.tick_ms / 1000
        heartbeat = node.core.cfg.heartbeat_ticks
        assert heartbeat >= 3
        stepped: list[float] = []  # every Tick the core is given
        woken: list[float] = []  # the ticker's wake-ups of the loop
        step, handle = node.core.step, node._handle

        def counting_step(event: object) -> Any:
            if isinstance(event, Tick):
                stepped.append(trio.current_time())
            return step(event)  # type: ignore[arg-type]

        async def counting_handle(event: object) -> None:
            if event is TICK_DUE:
                woken.append(trio.current_time())
            await handle(event)

        monkeypatch.setattr(node.core, "step", counting_step)
        monkeypatch.setattr(node, "_handle", counting_handle)
        busy_from = trio.current_time()
        while trio.current_time() < busy_from + 1.0:  # an event every 3 ms
            node._inbox_send.send_nowait(PROPOSE)  # a no-op for the loop: nothing is pending
            await trio.sleep(0.003)
        idle_from = trio.current_time()
        await trio.sleep(1.0)
        idle_to = trio.current_time()

    def within(times: list[float], lo: float, hi: float) -> int:
        return sum(lo <= t < hi for t in times)

    assert abs(within(stepped, busy_from, idle_from) - (idle_from - busy_from) / period) <= 2
    assert within(woken, busy_from + 2 * period, idle_from) <= 2  # ties in virtual time
    assert abs(within(stepped, idle_from, idle_to) - 1.0 / period) <= 2
    per_heartbeat = 1.0 / (heartbeat * period)
    assert per_heartbeat - 2 <= within(woken, idle_from + 2 * period, idle_to) <= per_heartbeat + 2


async def test_idle_followers_are_woken_by_heartbeats_alone_and_still_time_out(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A follower that hears its leader's heartbeats never needs the ticker: each heartbeat
    puts its election off. Once the leader goes silent (cut off, no connection dropped), the
    first follower to time out can only have been woken by its ticker (nothing else reaches
    it; the other may then wake on its pre-votes), and that happens within the timeout's
    range, every tick counted."""
    async with memory_group(tmp_path) as group:
        leader = await group.wait_for_leader()
        followers = [n for n in group.nodes if n != leader]
        cfg = group.nodes[leader].core.cfg
        period = group.nodes[leader].config.tick_ms / 1000
        woken: dict[str, list[float]] = {n: [] for n in followers}
        for name in followers:
            node = group.nodes[name]

            async def counting_handle(
                event: object, name: str = name, handle: Any = node._handle
            ) -> None:
                if event is TICK_DUE:
                    woken[name].append(trio.current_time())
                await handle(event)

            node._handle = counting_handle  # type: ignore[method-assign]
        await trio.sleep(2.0)
        assert woken == {n: [] for n in followers}
        assert all(group.nodes[n].core.leader == leader for n in followers)
        silenced_at = trio.current_time()
        group.network.cut_off(leader, followers)
        with trio.fail_after(cfg.election_ticks_max * period * 4):
            while all(group.nodes[n].core.leader == leader for n in followers):
                await trio.sleep(period)
        noticed_after_s = trio.current_time() - silenced_at
    assert cfg.election_ticks_min * period * 0.8 <= noticed_after_s
    assert noticed_after_s <= (cfg.election_ticks_max + 2) * period * 2
    assert any(woken.values()), "a follower's ticker woke it for its election timeout"


async def test_a_loaded_leader_lets_ready_appends_join_its_proposal(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """With PROPOSE_DEFER_ENTRIES_MIN entries pending, a leader's raft loop yields once before
    it proposes: an append made by a task ready at that moment goes in the same proposal,
    whichever of the two trio runs first (without the yield, half the runs propose twice)."""
    async with memory_group(tmp_path) as group:
        name = await group.wait_for_leader()
        leader = group.nodes[name]
        replies: list[Status] = []

        def reply(status: Status, message: str, fields: dict[str, Any]) -> None:
            replies.append(status)

        big = [b"m%d" % i for i in range(limits.PROPOSE_DEFER_ENTRIES_MIN)]
        before = dict(leader.metrics)

        async def later() -> None:
            leader.submit_append([b"late"], reply)

        async with trio.open_nursery() as nursery:
            leader.submit_append(big, reply)  # wakes the raft loop
            nursery.start_soon(later)  # ready in the same scheduler batch
        with trio.fail_after(10):
            while len(replies) < 2:
                await trio.sleep(0.01)
        assert replies == [Status.OK, Status.OK]
        assert leader.metrics["proposals"] - before.get("proposals", 0) == 1
        assert (
            leader.metrics["proposed_entries"] - before.get("proposed_entries", 0) == len(big) + 1
        )
