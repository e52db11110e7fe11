"""The producer against fake brokers in this trio run (tests/client/fake_cluster.py): what goes
on the wire, retries and failover, and what each way of failing raises."""

from __future__ import annotations

import threading
import zlib

import pytest
import trio
import trio.testing

from client import (
    AsyncProducer,
    BrokerUnreachable,
    ClientClosed,
    InvalidMessage,
    Message,
    MessageQueue,
    MQBrokerError,
    Producer,
    SendOutcomeUnknown,
    SendResult,
    SendStatus,
    hash_selector,
    limits,
)
from client.message import COMPRESS_BODY_BYTES_MIN, SYS_FLAG_COMPRESSED
from remoting import properties as props
from remoting.codes import FLAG_ONEWAY, RequestCode, ResponseCode
from tests.client.fake_cluster import FakeCluster, Mode, fake_cluster

TWO_GROUPS = {"broker-a": 2, "broker-b": 2}


def producer(cluster: FakeCluster, **kwargs: object) -> AsyncProducer:
    return AsyncProducer("pg_test", cluster.namesrv_addr, **kwargs)  # type: ignore[arg-type]


async def test_a_send_carries_every_field_and_returns_where_it_was_stored() -> None:
    """SEND_MESSAGE_V2 with one-letter header names; tags, keys, user properties, flag and a
    UNIQ_KEY arrive; the result's msg_id is that UNIQ_KEY, offset_msg_id the broker's."""
    async with fake_cluster(TWO_GROUPS, topics={"T": 4}) as cluster, producer(cluster) as p:
        message = Message(
            "T", b"hello", tags="TagA", keys=["k1", "k2"], properties={"a": "1"}, flag=9
        )
        result = await p.send(message)
        (stored,) = cluster.stored()
        (request,) = [r for g in cluster.replicas.values() for x in g for r in x.requests]
        assert request.code == RequestCode.SEND_MESSAGE_V2
        assert {"a", "b", "c", "d", "e", "f", "g", "h", "i"} <= set(request.ext_fields)
        assert request.ext_fields["a"] == "pg_test" and request.ext_fields["c"] == "TBW102"
        assert stored.body == b"hello" and stored.flag == 9
        assert stored.properties[props.TAGS] == "TagA"
        assert stored.properties[props.KEYS] == "k1 k2"
        assert stored.properties["a"] == "1"
        assert stored.properties[props.WAIT] == "true"
        assert result.status is SendStatus.SEND_OK
        assert result.msg_id == stored.properties[props.UNIQ_KEY]
        assert result.queue.topic == "T" and result.queue.queue_id == stored.header.queue_id
        assert result.queue_offset == 0
        assert len(result.offset_msg_id) == 32


async def test_bodies_from_4_kib_are_compressed() -> None:
    """zlib and the compressed sys flag bit from 4 KiB; smaller bodies as they are."""
    async with fake_cluster({"broker-a": 1}, topics={"T": 4}) as cluster, producer(cluster) as p:
        big = bytes(range(256)) * (COMPRESS_BODY_BYTES_MIN // 256)
        await p.send(Message("T", big))
        await p.send(Message("T", big[:-1]))
        compressed, plain = cluster.stored()
        assert compressed.header.sys_flag & SYS_FLAG_COMPRESSED
        assert zlib.decompress(compressed.body) == big
        assert not plain.header.sys_flag & SYS_FLAG_COMPRESSED and plain.body == big[:-1]


async def test_round_robin_over_every_write_queue() -> None:
    """Eight sends to a topic of 2 groups x 4 queues visit all eight queues."""
    async with fake_cluster(TWO_GROUPS, topics={"T": 4}) as cluster, producer(cluster) as p:
        results = [await p.send(Message("T", b"x")) for _ in range(8)]
        assert sorted(r.queue for r in results) == [
            MessageQueue("T", g, i) for g in ("broker-a", "broker-b") for i in range(4)
        ]


async def test_an_unknown_topic_is_sent_with_tbw102s_route_then_its_own() -> None:
    """The namesrv does not know the topic: the send uses TBW102's groups with at most 4 queues
    and defaultTopic TBW102, the broker creates it, and the producer then asks for its route."""
    async with fake_cluster(TWO_GROUPS) as cluster, producer(cluster) as p:
        result = await p.send(Message("NewTopic", b"x"))
        assert result.queue.queue_id < 4
        assert cluster.stored()[0].header.default_topic_queue_nums == 4
        with trio.fail_after(5):
            while p._live().cached_route("NewTopic") is None:
                await trio.sleep(0.01)
        assert cluster.route_queries.count("NewTopic") >= 2


async def test_a_refusing_group_is_left_for_another_and_then_avoided() -> None:
    """broker-a answers SERVICE_NOT_AVAILABLE from every replica: the send is stored on
    broker-b, and the next sends do not try broker-a while the tracker avoids it."""
    async with fake_cluster(TWO_GROUPS, topics={"T": 4}) as cluster, producer(cluster) as p:
        for replica in cluster.replicas["broker-a"]:
            replica.mode, replica.code = Mode.REFUSE, ResponseCode.SERVICE_NOT_AVAILABLE
        results = [await p.send(Message("T", b"x")) for _ in range(10)]
        assert {r.queue.broker_name for r in results} == {"broker-b"}
        assert cluster.sends("broker-a") <= 2  # one attempt, through both replicas
        assert "broker-a" in p.tracker.avoided()


async def test_a_dead_master_address_is_passed_over_for_a_replica() -> None:
    """The route's master does not listen; the group's other replica stores the message, and
    the route is asked for again at once."""
    async with (
        fake_cluster({"broker-a": 2}, topics={"T": 4}, down=("broker-a/0",)) as cluster,
        producer(cluster) as p,
    ):
        queries = len(cluster.route_queries)
        result = await p.send(Message("T", b"x"))
        assert result.status is SendStatus.SEND_OK
        assert len(cluster.replica("broker-a", 1).stored) == 1
        with trio.fail_after(5):
            while len(cluster.route_queries) == queries:
                await trio.sleep(0.01)


async def test_refused_everywhere_raises_the_brokers_error_naming_each_attempt() -> None:
    """Every attempt refused: MQBrokerError with the code and remark, and a text that says
    which group refused through which replica."""
    async with (
        fake_cluster(TWO_GROUPS, topics={"T": 4}) as cluster,
        producer(cluster, retry_times=2) as p,
    ):
        for group in cluster.replicas.values():
            for replica in group:
                replica.mode, replica.code = Mode.REFUSE, ResponseCode.SYSTEM_BUSY
        with pytest.raises(MQBrokerError) as info:
            await p.send(Message("T", b"x"))
        assert info.value.code == ResponseCode.SYSTEM_BUSY
        assert len(info.value.causes) == 3
        text = str(info.value)
        assert "broker-a: every replica refused or was unreachable" in text
        assert "broker-b: every replica refused or was unreachable" in text
        assert "SYSTEM_BUSY(2)" in text and "No route info" not in text


async def test_a_refusal_no_retry_can_change_is_raised_at_once() -> None:
    """MESSAGE_ILLEGAL: one request, then MQBrokerError."""
    async with fake_cluster(TWO_GROUPS, topics={"T": 4}) as cluster, producer(cluster) as p:
        for group in cluster.replicas.values():
            for replica in group:
                replica.mode, replica.code = Mode.REFUSE, ResponseCode.MESSAGE_ILLEGAL
        with pytest.raises(MQBrokerError, match="MESSAGE_ILLEGAL"):
            await p.send(Message("T", b"x"))
        assert cluster.sends() == 1


async def test_no_broker_reachable_raises_broker_unreachable() -> None:
    """Nothing listens at any address: BrokerUnreachable listing each attempt's cause."""
    down = ("broker-a/0", "broker-a/1", "broker-b/0", "broker-b/1")
    async with (
        fake_cluster(TWO_GROUPS, topics={"T": 4}, down=down) as cluster,
        producer(cluster) as p,
    ):
        with pytest.raises(BrokerUnreachable) as info:
            await p.send(Message("T", b"x"))
        assert len(info.value.causes) == 3
        assert all("cannot connect" in c for c in info.value.causes)


@pytest.mark.parametrize("mode", [Mode.SILENT, Mode.CLOSE])
async def test_no_answer_raises_outcome_unknown_with_the_uniq_key(mode: Mode) -> None:
    """The broker reads the request and never answers (or drops the connection): the send
    raises SendOutcomeUnknown carrying the UNIQ_KEY the broker received, within its timeout."""
    async with fake_cluster({"broker-a": 1}, topics={"T": 4}) as cluster, producer(cluster) as p:
        cluster.replica("broker-a", 0).mode = mode
        started = trio.current_time()
        with pytest.raises(SendOutcomeUnknown) as info:
            await p.send(Message("T", b"x"), timeout=0.5)
        assert trio.current_time() - started < 0.5 + 0.2
        sent = cluster.replica("broker-a", 0).requests[0]
        assert info.value.uniq_key == props.decode(sent.ext_fields["i"].encode())[props.UNIQ_KEY]
        assert info.value.uniq_key in str(info.value)


async def test_unknown_on_one_group_and_refused_on_the_other_is_unknown() -> None:
    """broker-a drops the connection after reading (maybe stored), broker-b refuses (surely
    not): the message may be stored, so the outcome is unknown whatever the order."""
    async with (
        fake_cluster({"broker-a": 1, "broker-b": 1}, topics={"T": 4}) as cluster,
        producer(cluster, retry_times=1) as p,
    ):
        cluster.replica("broker-a", 0).mode = Mode.CLOSE
        cluster.replica("broker-b", 0).mode = Mode.REFUSE
        cluster.replica("broker-b", 0).code = ResponseCode.SERVICE_NOT_AVAILABLE
        for _ in range(4):  # the first attempt goes to either group
            with pytest.raises(SendOutcomeUnknown):
                await p.send(Message("T", b"x"))


async def test_stored_but_not_durable_is_a_status_not_a_retry() -> None:
    """FLUSH_SLAVE_TIMEOUT: the message is stored; the status says so and nothing is resent."""
    async with fake_cluster(TWO_GROUPS, topics={"T": 4}) as cluster, producer(cluster) as p:
        for group in cluster.replicas.values():
            for replica in group:
                replica.code = ResponseCode.FLUSH_SLAVE_TIMEOUT
        result = await p.send(Message("T", b"x"))
        assert result.status is SendStatus.FLUSH_SLAVE_TIMEOUT
        assert cluster.sends() == 1


async def test_an_ordered_send_waits_for_its_group_and_never_moves() -> None:
    """broker-a refuses its first 5 requests: the ordered send keeps to its queue on broker-a
    (through either replica) and is stored there; broker-b never sees it."""
    async with fake_cluster(TWO_GROUPS, topics={"T": 4}) as cluster, producer(cluster) as p:
        queues = [MessageQueue("T", g, i) for g in ("broker-a", "broker-b") for i in range(4)]
        key = next(
            k for k in range(100) if hash_selector(queues, None, k).broker_name == "broker-a"
        )  # type: ignore[arg-type]
        expected = hash_selector(queues, Message("T", b"x"), key)
        for replica in cluster.replicas["broker-a"]:
            replica.mode, replica.code = Mode.REFUSE, ResponseCode.SERVICE_NOT_AVAILABLE
            replica.refusals_left = 3
        result = await p.send(Message("T", b"x"), selector=hash_selector, arg=key)
        assert result.queue == expected
        assert cluster.sends("broker-b") == 0
        assert cluster.sends("broker-a") == 7  # 6 refusals, then stored


async def test_an_ordered_send_to_a_group_that_never_recovers_fails_in_its_timeout() -> None:
    async with fake_cluster(TWO_GROUPS, topics={"T": 4}) as cluster, producer(cluster) as p:
        for replica in cluster.replicas["broker-a"]:
            replica.mode, replica.code = Mode.REFUSE, ResponseCode.SERVICE_NOT_AVAILABLE
        queue = MessageQueue("T", "broker-a", 2)
        started = trio.current_time()
        with pytest.raises(MQBrokerError, match="SERVICE_NOT_AVAILABLE"):
            await p.send(Message("T", b"x"), 0.5, selector=lambda qs, m, a: queue)
        assert 0.4 < trio.current_time() - started < 0.7
        assert cluster.sends("broker-b") == 0
        assert cluster.sends("broker-a") > 4


async def test_a_selector_must_return_one_of_the_queues() -> None:
    async with fake_cluster(TWO_GROUPS, topics={"T": 4}) as cluster, producer(cluster) as p:
        with pytest.raises(InvalidMessage, match="selector"):
            await p.send(Message("T", b"x"), selector=lambda qs, m, a: MessageQueue("T", "x", 0))


async def test_a_batch_is_one_request_per_split_batch() -> None:
    """Three 1.5 MiB messages: two SEND_BATCH_MESSAGE requests, every message stored once with
    its own UNIQ_KEY, results carrying the comma-joined keys."""
    async with fake_cluster({"broker-a": 1}, topics={"T": 4}) as cluster, producer(cluster) as p:
        messages = [Message("T", bytes([i]) * (3 << 19), keys=f"k{i}") for i in range(3)]
        results = await p.send_batch(messages)
        assert len(results) == 2
        stored = cluster.stored()
        assert [s.request_code for s in stored] == [RequestCode.SEND_BATCH_MESSAGE] * 3
        assert [s.body for s in stored] == [m.body for m in messages]
        keys = [s.properties[props.UNIQ_KEY] for s in stored]
        assert ",".join(r.msg_id for r in results) == ",".join(keys)
        assert [s.properties[props.KEYS] for s in stored] == ["k0", "k1", "k2"]


async def test_oneway_sets_the_oneway_flag_and_waits_for_nothing() -> None:
    async with fake_cluster({"broker-a": 1}, topics={"T": 4}) as cluster, producer(cluster) as p:
        cluster.replica("broker-a", 0).mode = Mode.SILENT
        await p.send_oneway(Message("T", b"x"))
        with trio.fail_after(5):
            while not cluster.replica("broker-a", 0).requests:
                await trio.sleep(0.01)
        assert cluster.replica("broker-a", 0).requests[0].flag & FLAG_ONEWAY


async def test_send_async_calls_back_with_results_and_errors_and_close_waits() -> None:
    """Callbacks get a SendResult or the exception; leaving the block waits for all."""
    outcomes: list[SendResult | BaseException] = []
    async with fake_cluster({"broker-a": 1}, topics={"T": 4}) as cluster:
        async with producer(cluster) as p:
            for i in range(20):
                await p.send_async(Message("T", str(i).encode()), outcomes.append)
            await p.send_async(Message("NoSuch-ButValid", b"x"), outcomes.append, 0.3)
            cluster.routes.pop("TBW102")
        assert len(outcomes) == 21, outcomes
        assert sum(isinstance(o, SendResult) for o in outcomes) == 20, outcomes
        assert sum(isinstance(o, Exception) for o in outcomes) == 1
        with pytest.raises(ClientClosed):
            await p.send(Message("T", b"x"))


async def test_the_blocking_producer_runs_the_same_sends_from_a_thread() -> None:
    """Producer (blocking) from a worker thread: send, ordered send, batch, oneway, and an
    async send whose callback runs on the client's own thread."""
    async with fake_cluster(TWO_GROUPS, topics={"T": 4}) as cluster:

        def blocking() -> tuple[list[SendResult], str]:
            done = threading.Event()
            seen: list[SendResult | BaseException] = []
            with Producer("pg_blocking", cluster.namesrv_addr) as p:
                results = [p.send(Message("T", b"1"))]
                results.append(p.send(Message("T", b"2"), selector=hash_selector, arg="key"))
                results += p.send_batch([Message("T", b"3"), Message("T", b"4")])
                p.send_oneway(Message("T", b"5"))

                def callback(outcome: SendResult | BaseException) -> None:
                    seen.append(outcome)
                    callback_thread.append(threading.current_thread().name)
                    done.set()

                callback_thread: list[str] = []
                p.send_async(Message("T", b"6"), callback)
                assert done.wait(5)
                results.append(seen[0])  # type: ignore[arg-type]
            with pytest.raises(ClientClosed):
                p.send(Message("T", b"x"))
            return results, callback_thread[0]

        results, thread_name = await trio.to_thread.run_sync(blocking)
        assert all(r.status is SendStatus.SEND_OK for r in results)
        assert thread_name.startswith("mq-producer") and thread_name != "MainThread"
        with trio.fail_after(5):
            while len(cluster.stored()) < 6:
                await trio.sleep(0.01)
        assert sorted(s.body for s in cluster.stored()) == [b"1", b"2", b"3", b"4", b"5", b"6"]


async def test_invalid_messages_are_refused_before_sending() -> None:
    async with fake_cluster({"broker-a": 1}, topics={"T": 4}) as cluster, producer(cluster) as p:
        with pytest.raises(InvalidMessage, match="topic"):
            await p.send(Message("bad topic", b"x"))
        with pytest.raises(InvalidMessage, match="body"):
            await p.send(Message("T", b""))
        with pytest.raises(InvalidMessage, match="properties"):
            await p.send(Message("T", b"x", properties={"k": "a\x01b"}))
        with pytest.raises(InvalidMessage, match="surrogate"):  # it raised UnicodeEncodeError
            await p.send(Message("T", b"x", properties={"k": "a\ud800"}))
        assert cluster.sends() == 0


async def test_ordered_sends_keep_their_queue_while_a_restarted_namesrv_lacks_a_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by the 30-minute broker soak: both name servers restarted, and broker-b registered
    with them a moment before broker-a; a route fetched in between had broker-b's 4 queues only,
    and hash_selector sent a broker-a key to broker-b (its order broken). An ordered send keeps
    choosing among the queues it chose among before, broker-a's through its last known
    addresses, until the group has been gone for ORDERED_GROUP_GRACE_S."""
    async with fake_cluster(TWO_GROUPS, topics={"T": 4}) as cluster, producer(cluster) as p:
        queues = [MessageQueue("T", g, i) for g in ("broker-a", "broker-b") for i in range(4)]
        key = next(
            k for k in range(100) if hash_selector(queues, None, k).broker_name == "broker-a"
        )  # type: ignore[arg-type]
        first = await p.send(Message("T", b"1"), selector=hash_selector, arg=key)
        assert first.queue.broker_name == "broker-a"
        full = cluster.routes["T"]
        cluster.routes["T"] = {  # what a name server that heard from broker-b only answers
            "queueDatas": [q for q in full["queueDatas"] if q["brokerName"] == "broker-b"],
            "brokerDatas": [b for b in full["brokerDatas"] if b["brokerName"] == "broker-b"],
        }
        assert await p._live().refresh("T", force=True) is not None
        again = await p.send(Message("T", b"2"), selector=hash_selector, arg=key)
        assert again.queue == first.queue
        assert cluster.sends("broker-b") == 0
        plain = await p.send(Message("T", b"3"))  # other sends use the route as it is
        assert plain.queue.broker_name == "broker-b"
        monkeypatch.setattr(limits, "ORDERED_GROUP_GRACE_S", 0.0)  # as if gone that long
        moved = await p.send(Message("T", b"4"), selector=hash_selector, arg=key)
        assert moved.queue.broker_name == "broker-b"


async def test_async_sends_in_flight_are_bounded_in_number_and_bytes() -> None:
    """_InFlight: an acquire past either bound waits for a release, and every waiter wakes."""
    from client.producer import _InFlight

    in_flight = _InFlight(2, 100)
    await in_flight.acquire(10)
    await in_flight.acquire(10)
    got: list[int] = []

    async def acquire(size: int) -> None:
        await in_flight.acquire(size)
        got.append(size)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(acquire, 5)
        nursery.start_soon(acquire, 6)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []  # two in flight: both wait
        in_flight.release(10)
        await trio.testing.wait_all_tasks_blocked()
        assert len(got) == 1 and in_flight.count == 2
        in_flight.release(10)
    assert sorted(got) == [5, 6] and (in_flight.count, in_flight.bytes) == (2, 11)
    in_flight.release(5)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(acquire, 95)  # would pass the byte bound: waits
        await trio.testing.wait_all_tasks_blocked()
        assert 95 not in got and (in_flight.count, in_flight.bytes) == (1, 6)
        nursery.cancel_scope.cancel()
    await in_flight.acquire(94)  # fits exactly
    assert (in_flight.count, in_flight.bytes) == (2, 100)
