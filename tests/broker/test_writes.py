"""The broker's write path (broker/writes.py) on a group of nodes over memory streams under
trio's mock clock (tests/node/memnet.py): every write is answered within its deadline, and as
soon as waiting longer cannot help, so a client moves on to another replica."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from broker.writes import LEADERLESS_WAIT_S, WritePath, WriteUnknown
from dledger.client import open_client
from dledger.limits import ELECTION_TICKS_MAX_DEFAULT, TICK_MS_DEFAULT
from tests.node.memnet import MemoryGroup, memory_group

ELECTION_TIMEOUT_MAX_S = ELECTION_TICKS_MAX_DEFAULT * TICK_MS_DEFAULT / 1000
WRITE_TIMEOUT_S = 10.0  # far longer than any answer below may take


@asynccontextmanager
async def write_path(group: MemoryGroup, n: str) -> AsyncIterator[WritePath]:
    """A WritePath of replica `n`, forwarding through a client on the group's memory network
    whose connections come from `n` (so cutting `n` off cuts them too)."""
    async with (
        open_client(group.peers, connect=group.network.connector(n)) as client,
        trio.open_nursery() as nursery,
    ):
        writes = WritePath(group.nodes[n], client)
        await nursery.start(writes.run)
        yield writes
        nursery.cancel_scope.cancel()


async def test_a_leader_writes_and_a_follower_forwards(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with memory_group(tmp_path) as group:
        leader = await group.wait_for_leader()
        follower = next(n for n in group.nodes if n != leader)
        async with write_path(group, leader) as at_leader, write_path(group, follower) as at_other:
            here = await at_leader.append([b"a"], WRITE_TIMEOUT_S)
            there = await at_other.append([b"b"], WRITE_TIMEOUT_S)
        assert here.through_leader and not there.through_leader
        assert there.last_index == here.last_index + 1


async def test_a_leader_cut_off_from_its_peers_answers_unknown_once_deposed(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The leader proposes, then hears from no peer: check-quorum steps it down within two
    election timeouts and the write is answered 'unknown' LEADERLESS_WAIT_S later, long before
    its deadline (it used to wait for the node's 30 s append timeout)."""
    async with memory_group(tmp_path) as group:
        leader = await group.wait_for_leader()
        async with write_path(group, leader) as writes:
            await writes.append([b"warm"], WRITE_TIMEOUT_S)
            group.network.cut_off(leader, [n for n in group.nodes if n != leader])
            started = trio.current_time()
            with pytest.raises(WriteUnknown, match="known no leader"):
                await writes.append([b"x"], WRITE_TIMEOUT_S)
            took_s = trio.current_time() - started
            group.network.heal()
        assert took_s < 2 * ELECTION_TIMEOUT_MAX_S + LEADERLESS_WAIT_S + 0.1, took_s


async def test_a_write_forwarded_to_a_leader_that_was_replaced_answers_unknown(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A follower forwards to a leader that is then cut off from everyone (as if paused): once
    the follower has lost it (no leader for LEADERLESS_WAIT_S, or a new one elected) it gives
    the forward up instead of waiting for its deadline; its next write goes to the new leader
    and is stored."""
    async with memory_group(tmp_path) as group:
        leader = await group.wait_for_leader()
        follower = next(n for n in group.nodes if n != leader)
        async with write_path(group, follower) as writes:
            await writes.append([b"warm"], WRITE_TIMEOUT_S)
            group.network.cut_off(leader, [n for n in group.nodes if n != leader])
            started = trio.current_time()
            with pytest.raises(WriteUnknown, match=r"leads now|known no leader"):
                await writes.append([b"x"], WRITE_TIMEOUT_S)
            took_s = trio.current_time() - started
            written = await writes.append([b"y"], WRITE_TIMEOUT_S)
            took_both_s = trio.current_time() - started
            assert group.nodes[follower].leader != leader
            group.network.heal()
        assert took_s < 2 * ELECTION_TIMEOUT_MAX_S, took_s
        assert took_both_s < 2 * ELECTION_TIMEOUT_MAX_S + 0.1, took_both_s
        assert not written.through_leader or group.nodes[follower].is_leader


FLOAT_SLACK_S = 1e-9  # rounding of differences between the mock clock's float times


async def test_writes_proposed_here_are_given_up_at_their_own_deadlines(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """One task gives every write up (WritePath.run): a write with an earlier deadline that
    arrives after one with a later deadline is still given up at its own, not the other's.
    The leader is cut off, so neither commits; both deadlines are shorter than check-quorum
    takes to depose it."""
    async with memory_group(tmp_path) as group:
        leader = await group.wait_for_leader()
        async with write_path(group, leader) as writes:
            await writes.append([b"warm"], WRITE_TIMEOUT_S)
            group.network.cut_off(leader, [n for n in group.nodes if n != leader])
            answered_after: dict[str, float] = {}
            started = trio.current_time()

            async def write(name: str, timeout_s: float) -> None:
                with pytest.raises(WriteUnknown, match="before the write's deadline"):
                    await writes.append([name.encode()], timeout_s)
                answered_after[name] = trio.current_time() - started

            async with trio.open_nursery() as nursery:
                nursery.start_soon(write, "later", 0.3)
                await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(write, "sooner", 0.15)
            group.network.heal()
    # (started + 0.15) - started may come out as 0.1499999999999999: FLOAT_SLACK_S
    assert 0.15 - FLOAT_SLACK_S <= answered_after["sooner"] < 0.16, answered_after
    assert 0.3 - FLOAT_SLACK_S <= answered_after["later"] < 0.31, answered_after


async def test_a_write_path_whose_run_is_not_running_refuses_to_propose(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with memory_group(tmp_path) as group:
        leader = await group.wait_for_leader()
        async with open_client(group.peers, connect=group.network.connector(leader)) as client:
            with pytest.raises(RuntimeError, match="run is not running"):
                await WritePath(group.nodes[leader], client).append([b"x"], WRITE_TIMEOUT_S)
