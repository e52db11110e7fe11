"""Orderly push consumers (client/consume_service.py, OrderlyConsumeService) against a real
local cluster, with broker-a's leader killed (kill -9) and restarted while messages are sent
and consumed: every message sent is consumed, each queue's messages in send order once
duplicates are dropped, and no queue is consumed by two members at the same time."""

from __future__ import annotations

import trio

from broker.localcluster import LocalCluster
from client.instance import open_instance
from client.message import MessageQueue
from client.push_consumer import AsyncPushConsumer
from tests.client.cluster_tools import Sent, create_topic, send, wait_answering
from tests.client.consuming import Delivery, Recorder, partition, started, wait_for
from tests.client.test_push_consumer import assert_one_at_a_time, run_member

PER_QUEUE = 50  # messages per queue, 8 queues
CONSUME_S = 60.0
DOWN_S = 1.0  # how long the killed leader stays down


def first_occurrences(deliveries: list[Delivery]) -> list[Delivery]:
    seen: set[str] = set()
    out = []
    for d in deliveries:
        if d.message.msg_id not in seen:
            seen.add(d.message.msg_id)
            out.append(d)
    return out


async def test_orderly_consumption_keeps_queue_order_through_a_leader_kill(
    live_cluster: LocalCluster,
) -> None:
    ns, topic, group = live_cluster.namesrv_addr, "OrderTopic", "cg_orderly"
    recorder = Recorder()
    leave = [trio.Event(), trio.Event()]
    async with open_instance(ns) as instance:
        queues = await create_topic(instance, live_cluster, topic, 4)
        sent: dict[MessageQueue, list[Sent]] = {q: [] for q in queues}
        third = trio.Event()

        async def sender(queue: MessageQueue) -> None:
            for n in range(PER_QUEUE):
                body = f"{queue.broker_name}-{queue.queue_id}-{n}".encode()
                sent[queue].append(await send(instance, queue, body))
                if sum(map(len, sent.values())) >= PER_QUEUE * len(queues) // 3:
                    third.set()
                await trio.sleep(0.02)

        async with trio.open_nursery() as nursery:
            consumers = []
            for n in range(2):
                consumer = AsyncPushConsumer(group, ns, consume_batch_size=2)
                consumer.subscribe(topic)
                consumer.register_orderly_listener(recorder.orderly(f"m{n}", work_s=0.002))
                consumers.append(await nursery.start(run_member, consumer, leave[n]))
            await wait_for(
                lambda: partition(consumers, queues) and started(consumers), 15, "a stable split"
            )
            async with trio.open_nursery() as senders:
                for queue in queues:
                    senders.start_soon(sender, queue)
                await third.wait()
                victim = await trio.to_thread.run_sync(live_cluster.leader_name, "broker-a")
                assert victim is not None
                live_cluster.kill(victim)
                killed_at = trio.current_time()
                await trio.sleep(DOWN_S)
                live_cluster.start(victim)
            expected = {s.uniq_key for q in queues for s in sent[q]}
            await wait_for(lambda: recorder.unique() >= expected, CONSUME_S, "every message")
            done_s = trio.current_time() - killed_at
            await wait_answering(live_cluster, victim)  # whole again for the next test
            for event in leave:
                event.set()

    duplicates = len(recorder.deliveries) - len(recorder.unique())
    print(
        f"\norderly: {len(expected)} messages, {duplicates} delivered twice, all consumed "
        f"{done_s:.1f} s after the kill of {victim}"
    )
    assert recorder.unique() == expected
    for queue in queues:
        mine = [d for d in recorder.deliveries if d.message.queue == queue]
        in_order = [d.message.body for d in first_occurrences(mine)]
        assert in_order == [s.body for s in sent[queue]], queue
        assert_one_at_a_time(mine, queue)
