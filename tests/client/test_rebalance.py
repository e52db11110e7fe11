"""Allocation strategies (client/rebalance.py): every queue to exactly one member, the same
answer for the same inputs, RocketMQ's shapes, and consistent hashing's small moves."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client.message import MessageQueue
from client.rebalance import (
    Allocator,
    ConsistentHash,
    allocate_averagely,
    allocator,
    java_md5_hash,
    java_queue_text,
    plan,
)

STRATEGIES: list[Allocator] = [allocate_averagely, ConsistentHash(), ConsistentHash(3)]


def queues_of(count: int, brokers: int = 2) -> list[MessageQueue]:
    per = -(-count // brokers) if count else 0
    out = [MessageQueue("T", f"broker-{b}", i) for b in range(brokers) for i in range(per)]
    return sorted(out[:count])


def ids_of(count: int) -> list[str]:
    return sorted(f"127.0.0.1@{n}" for n in range(count))


def owners(
    strategy: Allocator, queues: list[MessageQueue], ids: list[str]
) -> dict[MessageQueue, list[str]]:
    out: dict[MessageQueue, list[str]] = {q: [] for q in queues}
    for member in ids:
        for queue in strategy("g", member, queues, ids):
            out[queue].append(member)
    return out


member_counts = st.integers(min_value=1, max_value=12)
queue_counts = st.integers(min_value=0, max_value=64)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=repr)
@settings(max_examples=60, deadline=None)
@given(queues=queue_counts, members=member_counts)
def test_every_queue_goes_to_exactly_one_member(
    strategy: Allocator, queues: int, members: int
) -> None:
    mqs, ids = queues_of(queues), ids_of(members)
    for queue, holders in owners(strategy, mqs, ids).items():
        assert len(holders) == 1, (queue, holders)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=repr)
@settings(max_examples=30, deadline=None)
@given(queues=queue_counts, members=member_counts)
def test_the_same_inputs_give_the_same_answer(
    strategy: Allocator, queues: int, members: int
) -> None:
    mqs, ids = queues_of(queues), ids_of(members)
    first = {m: strategy("g", m, mqs, ids) for m in ids}
    again = {m: strategy("g", m, list(mqs), list(ids)) for m in ids}
    assert first == again


@settings(max_examples=60, deadline=None)
@given(queues=queue_counts, members=member_counts)
def test_averagely_shares_differ_by_at_most_one_and_are_runs(queues: int, members: int) -> None:
    mqs, ids = queues_of(queues), ids_of(members)
    shares = [allocate_averagely("g", m, mqs, ids) for m in ids]
    sizes = [len(s) for s in shares]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the first members take the extra ones
    assert [q for share in shares for q in share] == mqs  # contiguous runs, in member order


def test_averagely_matches_rocketmq_for_8_queues_and_3_members() -> None:
    mqs = [MessageQueue("T", "broker-a", i) for i in range(8)]
    ids = ["a", "b", "c"]
    got = [[q.queue_id for q in allocate_averagely("g", m, mqs, ids)] for m in ids]
    assert got == [[0, 1, 2], [3, 4, 5], [6, 7]]


def test_more_members_than_queues_leaves_the_last_idle() -> None:
    mqs = [MessageQueue("T", "broker-a", i) for i in range(2)]
    ids = ["a", "b", "c"]
    assert [len(allocate_averagely("g", m, mqs, ids)) for m in ids] == [1, 1, 0]


@pytest.mark.parametrize("strategy", STRATEGIES, ids=repr)
def test_a_member_not_in_the_list_gets_nothing(strategy: Allocator) -> None:
    assert strategy("g", "stranger", queues_of(8), ids_of(3)) == []


@settings(max_examples=40, deadline=None)
@given(queues=st.integers(min_value=1, max_value=64), members=member_counts)
def test_consistent_hash_moves_only_to_a_joiner_and_from_a_leaver(
    queues: int, members: int
) -> None:
    strategy = ConsistentHash()
    mqs, ids = queues_of(queues), ids_of(members)
    before = {q: h[0] for q, h in owners(strategy, mqs, ids).items()}
    joiner = "10.0.0.9@joiner"
    after = {q: h[0] for q, h in owners(strategy, mqs, sorted([*ids, joiner])).items()}
    for queue in mqs:
        assert after[queue] in (before[queue], joiner)
    if members > 1:
        leaver = ids[0]
        rest = {q: h[0] for q, h in owners(strategy, mqs, ids[1:]).items()}
        for queue in mqs:
            if before[queue] != leaver:
                assert rest[queue] == before[queue]


def test_java_hash_inputs() -> None:
    # the first four bytes of MD5("a") = 0c c1 75 b9
    assert java_md5_hash("a") == 0x0CC175B9
    queue = MessageQueue("T", "broker-a", 3)
    assert java_queue_text(queue) == "MessageQueue [topic=T, brokerName=broker-a, queueId=3]"


def test_allocator_names() -> None:
    assert allocator("averagely") is allocate_averagely
    assert isinstance(allocator("consistent_hash"), ConsistentHash)
    with pytest.raises(ValueError, match="unknown allocation strategy"):
        allocator("round_robin")
    with pytest.raises(ValueError, match="virtual_nodes"):
        ConsistentHash(0)


def test_plan_starts_and_stops_the_difference() -> None:
    a, b, c = (MessageQueue("T", "broker-a", i) for i in range(3))
    change = plan([a, b], [b, c])
    assert change.start == {c} and change.stop == {a}
