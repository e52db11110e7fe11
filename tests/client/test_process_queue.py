"""ProcessQueue (client/process_queue.py): the commit offset is the lowest offset not yet
consumed, flow control stops and resumes pulls, orderly batches go out in order."""

from __future__ import annotations

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from client.message import MessageQueue
from client.process_queue import FlowLimits, ProcessQueue
from tests.client.messages import message

Q = MessageQueue("T", "broker-a", 0)


def test_commit_offset_is_the_lowest_message_not_consumed() -> None:
    pq = ProcessQueue(Q, 10)
    batch = [message(Q, o) for o in range(10, 15)]
    assert pq.put(batch, 15) == batch
    assert pq.commit_offset() == 10
    assert pq.remove([batch[1], batch[3]]) == 10  # 10 still in flight
    assert pq.remove([batch[0]]) == 12  # 11 done, 12 is next
    assert pq.remove([batch[2], batch[4]]) == 15  # all done: where the next pull starts


def test_a_filtered_gap_is_committed_past_once_everything_before_is_done() -> None:
    pq = ProcessQueue(Q, 0)
    m = message(Q, 3)
    pq.put([m], 9)  # the broker scanned 0..8; only offset 3 matched the tags
    assert pq.commit_offset() == 3
    assert pq.remove([m]) == 9


def test_no_start_no_commit_offset() -> None:
    pq = ProcessQueue(Q)
    assert pq.commit_offset() is None
    pq.start_at(7)
    assert pq.commit_offset() == 7


def test_a_message_is_held_once() -> None:
    pq = ProcessQueue(Q, 0)
    pq.put([message(Q, 0), message(Q, 1)], 2)
    assert pq.put([message(Q, 1), message(Q, 0)], 2) == []
    assert pq.count == 2


@settings(max_examples=100, deadline=None)
@given(data=st.data(), size=st.integers(min_value=1, max_value=40))
def test_the_commit_offset_never_passes_an_unconsumed_message(
    data: st.DataObject, size: int
) -> None:
    pq = ProcessQueue(Q, 0)
    messages = [message(Q, o) for o in range(size)]
    pq.put(messages, size)
    order = data.draw(st.permutations(messages))
    left = set(range(size))
    for m in order:
        pq.remove([m])
        left.discard(m.queue_offset)
        assert pq.commit_offset() == (min(left) if left else size)


def test_flow_control_by_count_bytes_and_span() -> None:
    pq = ProcessQueue(Q, 0)
    pq.put([message(Q, o, b"12345") for o in range(4)], 4)
    assert pq.over_limit(FlowLimits(count_max=4)) is None
    assert "messages held" in (pq.over_limit(FlowLimits(count_max=3)) or "")
    assert "bytes held" in (pq.over_limit(FlowLimits(bytes_max=19)) or "")
    assert pq.over_limit(FlowLimits(bytes_max=20)) is None
    far = ProcessQueue(Q, 0)
    far.put([message(Q, 0), message(Q, 2500)], 2501)
    assert "span 2500" in (far.over_limit(FlowLimits()) or "")
    assert far.over_limit(FlowLimits(span_max=None)) is None  # orderly: not checked


async def test_a_full_queue_holds_the_pull_until_consumption_drains_it() -> None:
    pq = ProcessQueue(Q, 0)
    limits = FlowLimits(count_max=2)
    batch = [message(Q, o) for o in range(3)]
    pq.put(batch, 3)
    resumed = trio.Event()

    async def puller() -> None:
        await pq.wait_for_room(limits)
        resumed.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(puller)
        await trio.testing.wait_all_tasks_blocked()
        assert not resumed.is_set()
        pq.remove(batch[:1])
        await resumed.wait()


async def test_a_drop_releases_a_waiting_pull() -> None:
    pq = ProcessQueue(Q, 0)
    pq.put([message(Q, o) for o in range(3)], 3)
    with trio.fail_after(1):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pq.wait_for_room, FlowLimits(count_max=1))
            await trio.testing.wait_all_tasks_blocked()
            pq.drop()


def test_orderly_batches_in_order_commit_and_return() -> None:
    pq = ProcessQueue(Q, 0)
    pq.put([message(Q, o) for o in range(5)], 5)
    first = pq.take(2)
    assert [m.queue_offset for m in first] == [0, 1]
    assert pq.commit_offset() == 0  # taken, not yet consumed
    assert pq.commit_taken() == 2
    second = pq.take(2)
    pq.return_taken([m for m in second])  # SUSPEND: the same ones again, first
    assert [m.queue_offset for m in pq.take(3)] == [2, 3, 4]
    assert pq.commit_taken() == 5
    assert pq.take(1) == []


async def test_wait_idle_waits_for_the_batch_in_progress() -> None:
    pq = ProcessQueue(Q, 0)
    pq.begin_batch()
    done = trio.Event()

    async def waiter() -> None:
        await pq.wait_idle()
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert not done.is_set()
        pq.end_batch()
    assert done.is_set()


def test_lock_validity_lapses_after_30_s() -> None:
    pq = ProcessQueue(Q, 0)
    assert not pq.lock_valid(0.0)
    pq.set_locked(True, 100.0)
    assert pq.lock_valid(129.0) and not pq.lock_valid(130.5)
    pq.set_locked(False, 131.0)
    assert not pq.lock_valid(131.0)
