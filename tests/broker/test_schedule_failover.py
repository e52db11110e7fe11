"""Delayed messages across failovers, on a BrokerState group of three nodes on memory streams
under the mock clock (tests/node/memnet.py), each node running the leader's scheduler
(broker/schedule.py) with a clock that follows trio's.

What must hold (docs/decisions.md "Delayed messages are delivered exactly once across a
failover"): every schedule record reaches its real topic exactly once, never before it is due,
whatever leaders are killed meanwhile; a second delivery of a record, even one proposed by a
new leader, is voided by the shaper; timer records are rolled forward and still delivered once.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

from broker import delays, schedule
from broker.delays import SCHEDULE_TOPIC, TIMER_TOPIC, Delay, Source
from broker.entries import EntryType, decode_meta, encode_meta, entry_type
from broker.metadata import Metadata, TopicConfig
from broker.schedule import ScheduleConfig, supervise
from broker.state import BrokerState
from remoting import properties as props
from remoting import stored_message
from remoting.stored_message import StoredMessage
from tests.broker.test_state_replicated import broker_group, states
from tests.node.memnet import MemoryGroup

BASE_MS = 1_764_000_000_000  # the wall clock the schedulers see at trio time 0
LEVELS = (1000, 3000, 5000)
TOPIC = "T"
QUEUES = 2
STORE_HOST = ("127.0.0.1", 10911)


def clock_ms() -> int:
    return BASE_MS + int(trio.current_time() * 1000)


def schedule_record(n: int, delay: Delay, *, topic: str = TOPIC) -> bytes:
    """A schedule record as a send would store it: message n, real queue n % QUEUES."""
    properties = delays.scheduled_properties(
        {"UNIQ_KEY": f"u{n}", "KEYS": f"k{n}"}, topic, n % QUEUES, delay
    )
    return stored_message.pack(
        queue_id=delay.queue_id,
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
        topic=delay.topic,
        properties_data=props.encode(properties),
    )


@attrs.define
class Schedulers:
    """A supervisor (broker/schedule.py) per running node, stopped with its node."""

    group: MemoryGroup
    nursery: trio.Nursery
    config: ScheduleConfig
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
            await supervise(node, state, self.config, clock_ms)  # type: ignore[arg-type]

    async def kill(self, n: str) -> None:
        self.scopes.pop(n).cancel()
        self.group.kill(n)
        await self.group.wait_stopped(n)


@asynccontextmanager
async def scheduled_group(
    root: Path, config: ScheduleConfig | None = None
) -> AsyncIterator[Schedulers]:
    async with broker_group(root) as group, trio.open_nursery() as nursery:
        schedulers = Schedulers(group, nursery, config or ScheduleConfig(LEVELS, STORE_HOST))
        for n in list(group.nodes):  # memory_group started them; restart each with a scheduler
            group.kill(n)
            await group.wait_stopped(n)
        for n in ("n0", "n1", "n2"):
            await schedulers.start(n)
        topic = Metadata.topic_op(TopicConfig(TOPIC, QUEUES, QUEUES))
        await group.append([encode_meta(topic)])
        yield schedulers
        nursery.cancel_scope.cancel()


def real_messages(state: BrokerState, topic: str = TOPIC) -> list[StoredMessage]:
    found = []
    for queue_id in range(QUEUES):
        lo, hi = state.queue_range(topic, queue_id)
        for unit in state.units(topic, queue_id, lo, hi - lo):
            found.append(stored_message.decode(state.record_at(unit.physical_offset)))
    return found


async def wait_delivered(group: MemoryGroup, count: int, timeout_s: float = 600) -> None:
    """Until every replica holds `count` messages in TOPIC and has applied all committed."""
    with trio.fail_after(timeout_s):
        while True:
            nodes = list(group.nodes.values())
            commit = max(node.commit_index for node in nodes)
            applied = all(states(group)[n].applied_index >= commit for n in group.nodes)
            if (
                applied
                and all(len(real_messages(states(group)[n])) >= count for n in group.nodes)
                and len(group.nodes) == 3
            ):
                return
            await trio.sleep(0.05)


def check_exactly_once(group: MemoryGroup, dues: dict[str, int]) -> None:
    for n in group.nodes:
        messages = real_messages(states(group)[n])
        counts = Counter(m.properties["UNIQ_KEY"] for m in messages)
        assert counts == Counter(dues.keys()), n  # every one, once
        for message in messages:
            due = dues[message.properties["UNIQ_KEY"]]
            assert message.store_timestamp_ms >= due  # never early
            assert message.store_timestamp_ms <= due + 1000  # within 1 s (no kill near it)
            assert "TIMER_OUT_MS" not in message.properties
            source = Source.parse(message.properties["SCHEDULE_SOURCE"])
            assert source is not None
            assert states(group)[n].metadata.schedule.delivered(source)


async def test_levels_and_timers_arrive_once_and_on_time(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with scheduled_group(tmp_path) as schedulers:
        group = schedulers.group
        dues: dict[str, int] = {}
        rng = random.Random(7)
        for n in range(40):
            if n % 2:
                delay = delays.level_delay(1 + n % 3, clock_ms(), LEVELS)
            else:
                due = clock_ms() + rng.randrange(100, 8000)
                delay = Delay(TIMER_TOPIC, 0, due, 0)
            dues[f"u{n}"] = delay.due_ms
            await group.append([schedule_record(n, delay)])
            await trio.sleep(0.05)
        await wait_delivered(group, len(dues))
        check_exactly_once(group, dues)
        # a level queue is delivered in order: its watermark is all a replica needs
        progress = states(group)["n0"].metadata.schedule
        assert all(not p.ahead for (t, _), p in progress.queues.items() if t == SCHEDULE_TOPIC)


async def test_leader_kills_lose_nothing_and_deliver_nothing_twice(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with scheduled_group(tmp_path) as schedulers:
        group = schedulers.group
        dues: dict[str, int] = {}
        rng = random.Random(11)
        n = 0
        for round_ in range(6):
            for _ in range(15):  # due now, soon and later: some are in flight at the kill
                if n % 3:
                    delay = delays.level_delay(1 + n % 3, clock_ms(), LEVELS)
                else:
                    delay = Delay(TIMER_TOPIC, 0, clock_ms() + rng.randrange(0, 4000), 0)
                dues[f"u{n}"] = delay.due_ms
                await group.append([schedule_record(n, delay)])
                n += 1
            await trio.sleep(rng.uniform(0.5, 3.0))
            leader = await group.wait_for_leader()
            await schedulers.kill(leader)
            await trio.sleep(rng.uniform(0.0, 1.5))
            await schedulers.start(leader)
            del round_
        await wait_delivered(group, len(dues))
        for state in states(group).values():  # nothing more comes
            assert len(real_messages(state)) == len(dues)
        for name in group.nodes:
            counts = Counter(m.properties["UNIQ_KEY"] for m in real_messages(states(group)[name]))
            assert counts == Counter(dues.keys()), name
            for message in real_messages(states(group)[name]):
                assert message.store_timestamp_ms >= dues[message.properties["UNIQ_KEY"]]


async def test_a_second_delivery_of_a_record_is_voided_even_by_a_new_leader(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Deliveries proposed by hand (no scheduler runs: its levels are far away)."""
    async with broker_group(tmp_path) as group:
        await group.append([encode_meta(Metadata.topic_op(TopicConfig(TOPIC, QUEUES, QUEUES)))])
        source = Source(SCHEDULE_TOPIC, 0, 0)
        first = delivery(0, source)
        await group.append([first, first])  # in one proposal
        first_leader = await group.wait_for_leader()
        group.kill(first_leader)
        await group.wait_stopped(first_leader)
        index = await group.append([delivery(0, source), delivery(1, Source(SCHEDULE_TOPIC, 0, 1))])
        await group.start(first_leader)
        await wait_delivered(group, 2, timeout_s=60)
        leader = await group.wait_for_leader()
        voided = [group.stores[leader].get(i).body for i in (index - 1,)]
        for state in states(group).values():
            keys = sorted(m.properties["UNIQ_KEY"] for m in real_messages(state))
            assert keys == ["u0", "u1"]
            assert state.metadata.schedule.of(SCHEDULE_TOPIC, 0).watermark == 2
    (body,) = voided
    assert entry_type(body) is EntryType.META
    op = decode_meta(body)
    assert op is not None and op["op"] == "void"


def delivery(n: int, source: Source) -> bytes:
    """A delivered record of message n from `source`, as the scheduler builds one."""
    target = delays.delivered(
        {"UNIQ_KEY": f"u{n}", props.REAL_TOPIC: TOPIC, props.REAL_QID: "0"}, source
    )
    assert target is not None
    return stored_message.pack(
        queue_id=target.queue_id,
        flag=0,
        queue_offset=0,
        physical_offset=0,
        sys_flag=0,
        born_timestamp_ms=BASE_MS,
        born_host=("127.0.0.1", 1),
        store_timestamp_ms=BASE_MS,
        store_host=STORE_HOST,
        reconsume_times=0,
        prepared_transaction_offset=0,
        body=b"m%d" % n,
        topic=target.topic,
        properties_data=props.encode(target.properties),
    )


async def test_timer_records_roll_forward_and_still_arrive_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A window of 5 and a roll age of 20 s: far timers are copied to the queue's tail again
    and again, the watermark keeps up, and each arrives once at its time."""
    monkeypatch.setattr(schedule, "TIMER_WINDOW_MAX", 5)
    monkeypatch.setattr(schedule, "TIMER_ROLL_MARGIN_MS", 2000)
    config = ScheduleConfig(LEVELS, STORE_HOST, roll_age_ms=20_000)
    async with scheduled_group(tmp_path, config) as schedulers:
        group = schedulers.group
        dues: dict[str, int] = {}
        for n in range(4):  # far ahead: rolled by age, more than once
            dues[f"u{n}"] = clock_ms() + 60_000 + 1000 * n
            await group.append([schedule_record(n, Delay(TIMER_TOPIC, 0, dues[f"u{n}"], 0))])
        for n in range(4, 24):  # near, many: the window overflows
            dues[f"u{n}"] = clock_ms() + 5000 + 100 * n
            await group.append([schedule_record(n, Delay(TIMER_TOPIC, 0, dues[f"u{n}"], 0))])
        await wait_delivered(group, len(dues))
        check_exactly_once(group, dues)
        state = states(group)["n0"]
        _, end = state.queue_range(TIMER_TOPIC, 0)
        progress = state.metadata.schedule.of(TIMER_TOPIC, 0)
    assert end > 24  # copies were appended
    assert progress.watermark == end and not progress.ahead


async def test_level_records_waiting_past_the_roll_age_survive_retention(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A level of 60 s against a roll age of 20 s (as a retention of 80 s would make it): the
    records are rolled to the timer queue before their segment may go; once every replica's
    log lost everything before the first copy (as retention deletes it), they still arrive,
    once each and on time."""
    monkeypatch.setattr(schedule, "TIMER_ROLL_MARGIN_MS", 2000)
    config = ScheduleConfig((1000, 60_000), STORE_HOST, roll_age_ms=20_000)
    async with scheduled_group(tmp_path, config) as schedulers:
        group = schedulers.group
        dues: dict[str, int] = {}
        for n in range(3):
            delay = delays.level_delay(2, clock_ms(), config.levels)
            dues[f"u{n}"] = delay.due_ms
            await group.append([schedule_record(n, delay)])
        sent_ms = clock_ms()
        with trio.fail_after(60):
            while not all(
                s.metadata.schedule.of(SCHEDULE_TOPIC, 1).watermark == 3
                and s.queue_range(TIMER_TOPIC, 0)[1] >= 3
                for s in states(group).values()
            ):
                await trio.sleep(0.05)
        rolled_ms = clock_ms()
        for state in states(group).values():  # retention, on every replica
            (first_copy,) = state.units(TIMER_TOPIC, 0, 0, 1)
            state.log_trimmed(first_copy.physical_offset)
            assert state.queue_range(SCHEDULE_TOPIC, 1)[0] == 3  # the records are gone
        assert real_messages(states(group)["n0"]) == []  # none delivered early
        await wait_delivered(group, len(dues))
        check_exactly_once(group, dues)
        for state in states(group).values():
            for message in real_messages(state):
                source = Source.parse(message.properties["SCHEDULE_SOURCE"])
                assert source is not None and source.topic == TIMER_TOPIC
    assert 20_000 < rolled_ms - sent_ms < 40_000  # rolled at the roll age, not before


async def test_records_retention_deleted_are_skipped_everywhere(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The leader's schedule queue lost its first file (retention): a schedule_skip moves every
    replica's watermark past it, and the records still held are delivered."""
    config = ScheduleConfig((60_000,), STORE_HOST)
    async with scheduled_group(tmp_path, config) as schedulers:
        group = schedulers.group
        for n in range(70):  # the test geometry holds 64 units per ConsumeQueue file
            delay = delays.level_delay(1, clock_ms(), config.levels)
            await group.append([schedule_record(n, delay)])
        leader = await group.wait_for_leader()
        state = states(group)[leader]
        with trio.fail_after(30):  # committed is not yet applied: wait for the leader's apply
            while state.queue_range(SCHEDULE_TOPIC, 0)[1] < 70:
                await trio.sleep(0.01)
        (unit,) = state.units(SCHEDULE_TOPIC, 0, 64, 1)
        state.log_trimmed(unit.physical_offset)  # as retention would, on the leader only
        assert state.queue_range(SCHEDULE_TOPIC, 0) == (64, 70)
        await wait_delivered(group, 6)
        for s in states(group).values():
            keys = sorted(int(m.properties["UNIQ_KEY"][1:]) for m in real_messages(s))
            assert keys == list(range(64, 70))
            assert s.metadata.schedule.of(SCHEDULE_TOPIC, 0).watermark == 70
