"""How fast the producer leaves a replica that does not answer, against fake brokers in this
trio run (tests/client/fake_cluster.py): each request waits at most the send's RequestBudget,
a failed address is tried last for a while, and answers that show a stale route refresh it.
Outcome-unknown semantics are kept: a send nothing acknowledged raises SendOutcomeUnknown with
its UNIQ_KEY."""

from __future__ import annotations

import pytest
import trio

from client import AsyncProducer, Message, MessageQueue, SendOutcomeUnknown, SendStatus, limits
from remoting import properties as props
from tests.client.fake_cluster import FakeCluster, Mode, fake_cluster

SLACK_S = 0.3  # scheduling on a shared machine, on top of what the producer may wait


def producer(cluster: FakeCluster, **kwargs: object) -> AsyncProducer:
    return AsyncProducer("pg_test", cluster.namesrv_addr, **kwargs)  # type: ignore[arg-type]


async def wait_route_queries(cluster: FakeCluster, more_than: int) -> None:
    with trio.fail_after(5):
        while len(cluster.route_queries) <= more_than:
            await trio.sleep(0.01)


async def test_a_silent_master_costs_one_request_budget_then_a_replica_stores() -> None:
    """The master reads the send and never answers (paused, or cut off from the client): the
    group's other replica stores it after REQUEST_S_FIRST, not after the 3 s send timeout; the
    route is asked for again, and the next send goes to the replica first."""
    async with (
        fake_cluster({"broker-a": 2}, topics={"T": 4}) as cluster,
        producer(cluster) as p,
    ):
        cluster.replica("broker-a", 0).mode = Mode.SILENT
        queries = len(cluster.route_queries)
        started = trio.current_time()
        result = await p.send(Message("T", b"x"))
        took_s = trio.current_time() - started
        assert result.status is SendStatus.SEND_OK
        assert limits.REQUEST_S_FIRST <= took_s < limits.REQUEST_S_FIRST + SLACK_S, took_s
        assert len(cluster.replica("broker-a", 1).stored) == 1
        await wait_route_queries(cluster, queries)
        started = trio.current_time()
        await p.send(Message("T", b"y"))
        assert trio.current_time() - started < SLACK_S
        assert len(cluster.replica("broker-a", 0).requests) == 1  # not asked again
        assert len(cluster.replica("broker-a", 1).stored) == 2


async def test_an_ordered_send_passes_a_silent_master_within_its_queue() -> None:
    """An ordered send stays on its queue, and reaches it through the group's other replica
    after one request budget."""
    async with (
        fake_cluster({"broker-a": 2, "broker-b": 2}, topics={"T": 4}) as cluster,
        producer(cluster) as p,
    ):
        cluster.replica("broker-a", 0).mode = Mode.SILENT
        queue = MessageQueue("T", "broker-a", 3)
        started = trio.current_time()
        result = await p.send(Message("T", b"x"), selector=lambda qs, m, a: queue)
        assert trio.current_time() - started < limits.REQUEST_S_FIRST + SLACK_S
        assert result.queue == queue
        assert cluster.sends("broker-b") == 0
        (stored,) = cluster.replica("broker-a", 1).stored
        assert stored.queue_offset == result.queue_offset


async def test_nobody_answering_is_still_an_unknown_outcome_with_the_uniq_key() -> None:
    """Every replica reads and never answers: each request waits twice as long as the one
    before, the send ends with its timeout, and SendOutcomeUnknown carries the UNIQ_KEY that
    every replica received."""
    async with (
        fake_cluster({"broker-a": 2}, topics={"T": 4}) as cluster,
        producer(cluster) as p,
    ):
        for replica in cluster.replicas["broker-a"]:
            replica.mode = Mode.SILENT
        started = trio.current_time()
        with pytest.raises(SendOutcomeUnknown) as info:
            await p.send(Message("T", b"x"), timeout=2.0)
        assert trio.current_time() - started < 2.0 + SLACK_S
        sent = [r for x in cluster.replicas["broker-a"] for r in x.requests]
        assert len(sent) >= 3  # 0.5 s, then 1 s, then what is left
        keys = {props.decode(r.ext_fields["i"].encode())[props.UNIQ_KEY] for r in sent}
        assert keys == {info.value.uniq_key}
        assert "sent, but no answer within" in str(info.value)


async def test_a_slow_group_still_stores_within_the_send_timeout() -> None:
    """A lone replica that answers after 0.7 s: the first request runs out of its 0.5 s, the
    second waits twice that and is answered; the message may be stored twice (the first
    request was written), never reported lost."""
    async with (
        fake_cluster({"broker-a": 1}, topics={"T": 4}) as cluster,
        producer(cluster) as p,
    ):
        replica = cluster.replica("broker-a", 0)
        replica.mode, replica.delay_s = Mode.SLOW, 0.7
        result = await p.send(Message("T", b"x"))
        assert result.status is SendStatus.SEND_OK
        assert len(replica.requests) == 2
        with trio.fail_after(2):
            while len(replica.stored) < 2:  # the first, late, is stored as well
                await trio.sleep(0.01)
        assert {s.properties[props.UNIQ_KEY] for s in replica.stored} == {result.msg_id}


async def test_a_group_that_answered_slowly_is_given_more_time_at_once() -> None:
    """After a 0.7 s answer the group's requests wait three times that from the first: the
    next sends are stored by one request each, none abandoned and sent again."""
    async with (
        fake_cluster({"broker-a": 1}, topics={"T": 4}) as cluster,
        producer(cluster) as p,
    ):
        replica = cluster.replica("broker-a", 0)
        replica.mode, replica.delay_s = Mode.SLOW, 0.7
        await p.send(Message("T", b"x"))
        assert len(replica.requests) == 2  # the first send learnt it the hard way
        for _ in range(2):
            await p.send(Message("T", b"y"))
        assert len(replica.requests) == 4


async def test_a_forwarded_answer_refreshes_the_route_at_most_every_so_often() -> None:
    """Answers of a replica that forwarded the write (raftForwarded) say the route names an old
    master: the route is asked for again at once, and no more often than FORWARDED_REFRESH_S
    while every answer says so."""
    async with (
        fake_cluster({"broker-a": 1}, topics={"T": 4}) as cluster,
        producer(cluster) as p,
    ):
        await p.send(Message("T", b"warm"))
        queries = len(cluster.route_queries)
        cluster.replica("broker-a", 0).forwarded = True
        started = trio.current_time()
        await p.send(Message("T", b"x"))
        await wait_route_queries(cluster, queries)
        while trio.current_time() - started < limits.FORWARDED_REFRESH_S / 2:
            await p.send(Message("T", b"y"))
        await trio.sleep(0.05)  # a second refresh, were there one, would be asked by now
        assert len(cluster.route_queries) == queries + 1
        await trio.sleep(limits.FORWARDED_REFRESH_S)
        await p.send(Message("T", b"z"))
        await wait_route_queries(cluster, queries + 1)
