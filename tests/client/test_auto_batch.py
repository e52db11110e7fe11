"""Automatic batching (client/auto_batch.py) against fake brokers in this trio run: concurrent
sends share SEND_BATCH_MESSAGE requests, yet each message gets its own result or its own
error."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from client import AsyncProducer, Message, SendOutcomeUnknown, SendResult, SendStatus, limits
from client.auto_batch import split_result
from client.message import MessageQueue
from remoting import properties as props
from remoting.codes import RequestCode
from tests.client.fake_cluster import FakeCluster, Mode, fake_cluster


def producer(cluster: FakeCluster) -> AsyncProducer:
    return AsyncProducer("pg_test", cluster.namesrv_addr, auto_batch=True)


async def test_concurrent_sends_share_requests_and_each_gets_its_own_result() -> None:
    async with fake_cluster({"broker-a": 1}, topics={"T": 1}) as cluster:
        results: dict[int, SendResult] = {}
        async with producer(cluster) as p:

            async def one(i: int) -> None:
                results[i] = await p.send(Message("T", b"m%d" % i))

            async with trio.open_nursery() as nursery:
                for i in range(200):
                    nursery.start_soon(one, i)
        requests = cluster.replica("broker-a", 0).requests
        assert len(requests) < 200  # batched while earlier requests were in flight
        assert all(r.code == RequestCode.SEND_BATCH_MESSAGE for r in requests)
        stored = cluster.stored()
        by_key = {s.properties[props.UNIQ_KEY]: s for s in stored}
        assert len(by_key) == 200
        for i, result in results.items():
            assert result.status is SendStatus.SEND_OK
            assert by_key[result.msg_id].body == b"m%d" % i
            assert by_key[result.msg_id].queue_offset == result.queue_offset
        offsets = sorted(r.queue_offset for r in results.values())
        assert offsets == list(range(200))
        assert len({r.offset_msg_id for r in results.values()}) == 200


async def test_a_lone_send_leaves_at_once_as_a_batch_of_one() -> None:
    async with fake_cluster({"broker-a": 1}, topics={"T": 4}) as cluster, producer(cluster) as p:
        with trio.fail_after(2):
            result = await p.send(Message("T", b"alone"))
        (stored,) = cluster.stored()
        assert stored.request_code == RequestCode.SEND_BATCH_MESSAGE
        assert result.msg_id == stored.properties[props.UNIQ_KEY]


async def test_while_a_request_is_in_flight_the_next_waits_for_a_batch_worth_sending(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with fake_cluster({"broker-a": 1}, topics={"T": 1}) as cluster:
        replica = cluster.replica("broker-a", 0)
        outcomes: list[SendResult | BaseException] = []
        async with producer(cluster) as p:
            replica.mode, replica.delay_s = Mode.SLOW, 0.3
            await p.send_async(Message("T", b"first"), outcomes.append)
            await trio.testing.wait_all_tasks_blocked()
            assert len(replica.requests) == 1  # a lone send leaves at once
            eager = limits.AUTO_BATCH_EAGER_MESSAGES
            for i in range(eager - 1):
                await p.send_async(Message("T", b"%d" % i), outcomes.append)
            await trio.testing.wait_all_tasks_blocked()
            assert len(replica.requests) == 1  # not yet a batch worth its own request
            await p.send_async(Message("T", b"last"), outcomes.append)
            await trio.testing.wait_all_tasks_blocked()
            assert len(replica.requests) == 2  # now one leaves beside the first
            with trio.fail_after(5):
                while len(outcomes) < eager + 1:
                    await trio.sleep(0.1)
        assert all(isinstance(o, SendResult) and o.ok for o in outcomes)
        assert len(replica.requests) == 2 and len(cluster.stored()) == eager + 1


async def test_send_async_calls_back_each_message() -> None:
    async with fake_cluster({"broker-a": 1, "broker-b": 1}, topics={"T": 2}) as cluster:
        outcomes: list[SendResult | BaseException] = []
        async with producer(cluster) as p:
            for i in range(50):
                await p.send_async(Message("T", b"%d" % i), outcomes.append)
        assert len(outcomes) == 50
        assert all(isinstance(o, SendResult) and o.ok for o in outcomes)
        assert len(cluster.stored()) == 50


async def test_an_unanswered_batch_gives_each_message_its_own_unknown_outcome() -> None:
    async with fake_cluster({"broker-a": 1}, topics={"T": 1}) as cluster:
        cluster.replica("broker-a", 0).mode = Mode.SILENT
        errors: list[BaseException] = []
        async with producer(cluster) as p:

            async def one(i: int) -> None:
                with pytest.raises(SendOutcomeUnknown) as info:
                    await p.send(Message("T", b"%d" % i), timeout=0.5)
                errors.append(info.value)

            async with trio.open_nursery() as nursery:
                for i in range(20):
                    nursery.start_soon(one, i)
        keys = {e.uniq_key for e in errors if isinstance(e, SendOutcomeUnknown)}
        assert len(keys) == 20 and all("," not in k for k in keys)
        sent = set()
        for request in cluster.replica("broker-a", 0).requests:
            sent |= {k for k in keys if k.encode() in request.body}
        assert sent == keys  # each error names a message that went out in some batch


async def test_delayed_and_ordered_sends_are_not_batched() -> None:
    async with fake_cluster({"broker-a": 1}, topics={"T": 4}) as cluster, producer(cluster) as p:
        await p.send(Message("T", b"d", delay_level=3))
        await p.send(Message("T", b"o"), selector=lambda qs, m, a: qs[0], arg=None)
        codes = [r.code for r in cluster.replica("broker-a", 0).requests]
        assert codes == [RequestCode.SEND_MESSAGE_V2] * 2


def test_split_result_gives_each_message_its_ids_and_offset() -> None:
    queue = MessageQueue("T", "broker-a", 3)
    batch = SendResult(SendStatus.SEND_OK, "k1,k2,k3", "o1,o2,o3", queue, 40)
    assert split_result(batch, 3) == [
        SendResult(SendStatus.SEND_OK, "k1", "o1", queue, 40),
        SendResult(SendStatus.SEND_OK, "k2", "o2", queue, 41),
        SendResult(SendStatus.SEND_OK, "k3", "o3", queue, 42),
    ]
