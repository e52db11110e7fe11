"""Transactions across failovers, on a BrokerState group of three nodes on memory streams under
the mock clock (tests/node/memnet.py), each node running the leader's checks
(broker/transaction_check.py) with a clock that follows trio's and a stand-in producer: it
answers a check with its decision for that transaction by appending what END_TRANSACTION would
(broker/transactions.py resolution_entry), as a replica would on its behalf.

What must hold (docs/decisions.md "Transactions are resolved once across a failover"): every
committed half reaches its topic exactly once and no rolled-back one ever does, whatever leaders
are killed between the half and its end, whoever proposes the same commit again; a half that is
never resolved is checked exactly transactionCheckMax times in the log in all, spaced by the
interval, across leader changes, then discarded; a half's CHECK_IMMUNITY_TIME_IN_SECONDS holds
for the leaders after the one that stored it.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio
import trio.testing

from broker.entries import EntryType, decode_meta, encode_meta, entry_type
from broker.metadata import Metadata, TopicConfig
from broker.state import BrokerState
from broker.transaction_check import CheckConfig, supervise
from broker.transactions import (
    COMMIT,
    HALF_QUEUE_ID,
    HALF_TOPIC,
    ROLLBACK,
    Check,
    half_properties,
    resolution_entry,
)
from remoting import stored_message
from remoting.stored_message import StoredMessage
from tests.broker.test_state_replicated import broker_group, states
from tests.node.memnet import MemoryGroup

BASE_MS = 1_764_000_000_000  # the wall clock the checkers see at trio time 0
TOPIC = "T"
QUEUES = 2
STORE_HOST = ("127.0.0.1", 10911)
PRODUCER_GROUP = "pg"


def clock_ms() -> int:
    return BASE_MS + int(trio.current_time() * 1000)


def half_record(n: int, **extra: str) -> bytes:
    """Transaction n's half message as a send stores it (real queue n % QUEUES)."""
    sent = {"UNIQ_KEY": f"t{n}", **extra}
    properties = half_properties(sent, TOPIC, n % QUEUES, PRODUCER_GROUP)
    return stored_message.pack(
        queue_id=HALF_QUEUE_ID,
        flag=0,
        queue_offset=0,
        physical_offset=0,
        sys_flag=0,
        born_timestamp_ms=BASE_MS,
        born_host=("127.0.0.1", 1),
        store_timestamp_ms=clock_ms(),
        store_host=STORE_HOST,
        reconsume_times=0,
        prepared_transaction_offset=0,
        body=b"m%d" % n,
        topic=HALF_TOPIC,
        properties_data=stored_message.props.encode(properties),
    )


def halves(state: BrokerState) -> dict[str, StoredMessage]:
    """The half messages a replica holds, by UNIQ_KEY."""
    lo, hi = state.queue_range(HALF_TOPIC, HALF_QUEUE_ID)
    found = {}
    for unit in state.units(HALF_TOPIC, HALF_QUEUE_ID, lo, hi - lo):
        half = stored_message.decode(state.record_at(unit.physical_offset))
        assert half.properties["UNIQ_KEY"] not in found, "a half was stored twice"
        found[half.properties["UNIQ_KEY"]] = half
    return found


def real_messages(state: BrokerState) -> Counter[str]:
    found: Counter[str] = Counter()
    for queue_id in range(QUEUES):
        lo, hi = state.queue_range(TOPIC, queue_id)
        for unit in state.units(TOPIC, queue_id, lo, hi - lo):
            found[
                stored_message.decode(state.record_at(unit.physical_offset)).properties["UNIQ_KEY"]
            ] += 1
    return found


@attrs.define
class Cluster:
    """A checker supervisor per running node, stopped with its node, and the producer: its
    decision per transaction (None: it does not know, it answers nothing) and the checks it
    got."""

    group: MemoryGroup
    nursery: trio.Nursery
    config: CheckConfig
    decisions: dict[str, int | None] = attrs.field(factory=dict)
    checks: Counter[str] = attrs.field(factory=Counter)
    scopes: dict[str, trio.CancelScope] = attrs.field(factory=dict)

    async def start(self, n: str) -> None:
        node = await self.group.start(n)
        state = states(self.group)[n]
        self.scopes[n] = await self.nursery.start(self._run, node, state)

    async def _run(
        self, node: object, state: BrokerState, *, task_status: trio.TaskStatus[trio.CancelScope]
    ) -> None:
        with trio.CancelScope() as scope:
            task_status.started(scope)
            await supervise(node, state, self.config, self.check, clock_ms)  # type: ignore[arg-type]

    async def kill(self, n: str) -> None:
        self.scopes.pop(n).cancel()
        self.group.kill(n)
        await self.group.wait_stopped(n)

    async def check(self, check: Check) -> str | None:
        self.checks[check.uniq_key] += 1
        how = self.decisions.get(check.uniq_key)
        if how is not None:  # END_TRANSACTION from the check, later, through any replica
            self.nursery.start_soon(self.end, check.uniq_key, how)
        return "producer-1"

    async def end(self, uniq_key: str, how: int) -> None:
        """What END_TRANSACTION does: the entry built by a replica that holds the half,
        appended through the leader (retried until it is in: maybe twice)."""
        group = self.group
        with trio.fail_after(120):
            while True:
                names = [n for n in group.nodes if uniq_key in halves(states(group)[n])]
                if names:
                    break
                await trio.sleep(0.05)
        half = halves(states(group)[names[0]])[uniq_key]
        await group.append([resolution_entry(half, how, STORE_HOST, clock_ms())])


@asynccontextmanager
async def checked_group(root: Path, config: CheckConfig) -> AsyncIterator[Cluster]:
    async with broker_group(root) as group, trio.open_nursery() as nursery:
        cluster = Cluster(group, nursery, config)
        for n in list(group.nodes):  # memory_group started them; restart each with a checker
            group.kill(n)
            await group.wait_stopped(n)
        for n in ("n0", "n1", "n2"):
            await cluster.start(n)
        await group.append([encode_meta(Metadata.topic_op(TopicConfig(TOPIC, QUEUES, QUEUES)))])
        yield cluster
        nursery.cancel_scope.cancel()


async def wait_settled(group: MemoryGroup, timeout_s: float = 600) -> None:
    """Until all three replicas run, have applied all that is committed and hold no pending
    half."""
    with trio.fail_after(timeout_s):
        while True:
            nodes = list(group.nodes.values())
            commit = max(node.commit_index for node in nodes)
            ready = len(group.nodes) == 3 and all(
                states(group)[n].applied_index >= commit
                and not states(group)[n].metadata.transactions.pending
                for n in group.nodes
            )
            if ready:
                return
            await trio.sleep(0.05)


async def test_leader_kills_between_half_and_end_lose_nothing_and_deliver_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    config = CheckConfig(timeout_ms=2000, interval_ms=1000, check_max=5)
    async with checked_group(tmp_path, config) as cluster:
        group = cluster.group
        rng = random.Random(5)
        n = 0
        for _ in range(6):
            sent = []
            for _ in range(10):
                key = f"t{n}"
                await group.append([half_record(n)])
                # the local transaction: commit, roll back, or unknown (then the producer finds
                # out before the check comes, and answers it)
                cluster.decisions[key] = COMMIT if rng.random() < 0.7 else ROLLBACK
                sent.append(key)
                n += 1
            for key in sent:
                if rng.random() < 0.6:  # an end right away, sometimes twice
                    how = cluster.decisions[key]
                    assert how is not None
                    for _ in range(rng.choice((1, 1, 2))):
                        cluster.nursery.start_soon(cluster.end, key, how)
            await trio.sleep(rng.uniform(0.0, 1.5))
            leader = await group.wait_for_leader()
            await cluster.kill(leader)
            await trio.sleep(rng.uniform(0.0, 1.5))
            # the same commits again, through the new leader
            for key in sent[:3]:
                how = cluster.decisions[key]
                assert how is not None
                cluster.nursery.start_soon(cluster.end, key, how)
            await cluster.start(leader)
        await wait_settled(group)
        committed = Counter(k for k, how in cluster.decisions.items() if how == COMMIT)
        for name, state in states(group).items():
            assert len(halves(state)) == n, name
            assert real_messages(state) == committed, name
    assert committed and len(committed) < n
    assert all(count <= config.check_max for count in cluster.checks.values())


async def test_unresolved_halves_are_checked_check_max_times_in_all_then_discarded(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    config = CheckConfig(timeout_ms=3000, interval_ms=2000, check_max=4)
    async with checked_group(tmp_path, config) as cluster:
        group = cluster.group
        rng = random.Random(9)
        stored_ms = {}
        for n in range(8):
            stored_ms[f"t{n}"] = clock_ms()
            await group.append([half_record(n)])  # nobody ever decides: every check unanswered
            await trio.sleep(0.3)
        for _ in range(5):  # leaders die while the checks go on
            await trio.sleep(rng.uniform(0.5, 4.0))
            leader = await group.wait_for_leader()
            await cluster.kill(leader)
            await trio.sleep(rng.uniform(0.0, 1.0))
            await cluster.start(leader)
        await wait_settled(group)
        leader = await group.wait_for_leader()
        state = states(group)[leader]
        offsets = {key: half.queue_offset for key, half in halves(state).items()}
        recorded, ends = recorded_checks(group, leader)
    for key, offset in offsets.items():
        times = recorded[offset]
        assert len(times) == config.check_max, (key, times)  # exactly, across the leaders
        assert times[0] >= stored_ms[key] + config.timeout_ms
        assert all(b - a >= config.interval_ms for a, b in itertools.pairwise(times))
        assert ends[offset][0] == "discard"  # first end: the discard
        assert cluster.checks[key] <= config.check_max  # sent: at most that many
    assert sum(cluster.checks.values()) >= len(offsets)  # checks were sent


async def test_a_halfs_immunity_holds_across_leaders(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """CHECK_IMMUNITY_TIME_IN_SECONDS=10 against a timeout of 1 s: the leader that stored the
    half dies before the 10 s are up, and the next one still waits them out (the immunity is
    part of the replicated progress); the plain half beside it is checked after 1 s."""
    config = CheckConfig(timeout_ms=1000, interval_ms=1000, check_max=2)
    async with checked_group(tmp_path, config) as cluster:
        group = cluster.group
        stored_ms = clock_ms()
        await group.append([half_record(0, CHECK_IMMUNITY_TIME_IN_SECONDS="10"), half_record(1)])
        await trio.sleep(3.0)
        leader = await group.wait_for_leader()
        await cluster.kill(leader)
        await trio.sleep(1.0)
        await cluster.start(leader)
        await wait_settled(group)  # nobody answers: both are discarded after 2 checks
        leader = await group.wait_for_leader()
        offsets = {k: h.queue_offset for k, h in halves(states(group)[leader]).items()}
        recorded, _ = recorded_checks(group, leader)
    immune, plain = recorded[offsets["t0"]], recorded[offsets["t1"]]
    assert stored_ms + 1000 <= plain[0] < stored_ms + 3000  # before the kill
    assert immune[0] >= stored_ms + 10_000  # by a later leader, after its immunity
    assert len(immune) == len(plain) == config.check_max


def recorded_checks(
    group: MemoryGroup, n: str
) -> tuple[dict[int, list[int]], dict[int, list[str]]]:
    """From node n's committed log: each half's recorded check times and its "txn_end"s."""
    store = group.stores[n]
    checks: dict[int, list[int]] = {}
    ends: dict[int, list[str]] = {}
    for index in range(store.first_index, group.nodes[n].commit_index + 1):
        body = store.get(index).body
        if entry_type(body) is not EntryType.META:
            continue
        op = decode_meta(body)
        assert op is not None
        if op["op"] == "txn_check":
            for offset, number in op["halves"]:
                times = checks.setdefault(offset, [])
                assert number == len(times) + 1, (offset, number, times)  # numbered in order
                times.append(op["at_ms"])
        elif op["op"] == "txn_end":
            ends.setdefault(op["offset"], []).append(op["how"])
    return checks, ends


async def test_a_second_commit_is_voided_even_by_a_new_leader(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Ends proposed by hand (the checks are far away)."""
    config = CheckConfig(timeout_ms=3_600_000, interval_ms=3_600_000, check_max=1)
    async with checked_group(tmp_path, config) as cluster:
        group = cluster.group
        await group.append([half_record(0), half_record(1)])
        leader = await group.wait_for_leader()
        while len(halves(states(group)[leader])) < 2:
            await trio.sleep(0.01)
        h0, h1 = (halves(states(group)[leader])[k] for k in ("t0", "t1"))
        commit0 = resolution_entry(h0, COMMIT, STORE_HOST, clock_ms())
        await group.append([commit0, commit0])  # twice in one proposal
        await cluster.kill(leader)
        # again through a new leader, after a rollback of the other and before its commit
        rollback1 = resolution_entry(h1, ROLLBACK, STORE_HOST, clock_ms())
        commit1 = resolution_entry(h1, COMMIT, STORE_HOST, clock_ms())
        index = await group.append([commit0, rollback1, commit1])
        await cluster.start(leader)
        await wait_settled(group)
        new_leader = await group.wait_for_leader()
        voided = [group.stores[new_leader].get(i).body for i in (index - 2, index)]
        for name, state in states(group).items():
            assert real_messages(state) == Counter({"t0": 1}), name
            assert state.metadata.transactions.resolved(h1.queue_offset)
    for body in voided:
        assert entry_type(body) is EntryType.META
        op = decode_meta(body)
        assert op is not None and op["op"] == "void"
