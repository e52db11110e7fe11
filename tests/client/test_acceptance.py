"""Issue 30's acceptance run (slow: `pytest -m slow tests/client/test_acceptance.py`, part of
`./dev.sh soak`): a producer sends 50,000 messages over 16 sharding keys with hash_selector
while a group of three orderly push consumers consumes them; the leader of each broker group is
killed with kill -9 once during the run and restarted. Every message whose send returned
SEND_OK is consumed; per key, the consumed sequence with duplicates dropped is in send order;
no send took longer than its timeout. Duplicates and the longest send are printed."""

from __future__ import annotations

import pytest
import trio

from broker.localcluster import LocalCluster
from client import AsyncProducer, Message, MQClientError, hash_selector
from client.instance import open_instance
from client.push_consumer import AsyncPushConsumer
from tests.client.cluster_tools import create_topic
from tests.client.consuming import Recorder, started, wait_for
from tests.client.test_push_consumer import run_member

pytestmark = pytest.mark.slow

MESSAGES = 50_000
KEYS = 16
SEND_TIMEOUT_S = 3.0
DOWN_S = 1.0
CONSUME_S = 300.0


async def test_50000_ordered_messages_through_two_leader_kills(live_cluster: LocalCluster) -> None:
    ns, topic, group = live_cluster.namesrv_addr, "AcceptanceOrdered", "cg_acceptance"
    recorder = Recorder()
    leave = [trio.Event() for _ in range(3)]
    acked: dict[int, list[str]] = {k: [] for k in range(KEYS)}  # per key: UNIQ_KEYs in order
    failed = 0
    longest_s = 0.0
    sent_count = 0
    progress = {2: trio.Event(), 3: trio.Event()}  # a third and two thirds sent
    async with open_instance(ns) as instance:
        await create_topic(instance, live_cluster, topic, 4)
    async with trio.open_nursery() as nursery:
        consumers = []
        for n in range(3):
            consumer = AsyncPushConsumer(group, ns, consume_batch_size=8, consume_from="first")
            consumer.subscribe(topic)
            consumer.register_orderly_listener(recorder.orderly(f"m{n}"))
            consumers.append(await nursery.start(run_member, consumer, leave[n]))
        await wait_for(lambda: started(consumers), 30, "three consuming members")
        async with AsyncProducer("pg_acceptance", ns, send_timeout=SEND_TIMEOUT_S) as producer:

            async def sender(key: int) -> None:
                nonlocal failed, longest_s, sent_count
                for seq in range(key, MESSAGES, KEYS):
                    message = Message(topic, b"%d-%d" % (key, seq), keys=f"k{key}")
                    began = trio.current_time()
                    try:
                        result = await producer.send(message, selector=hash_selector, arg=key)
                    except MQClientError:
                        failed += 1
                    else:
                        acked[key].append(result.msg_id)
                    longest_s = max(longest_s, trio.current_time() - began)
                    sent_count += 1
                    if sent_count == MESSAGES // 3:
                        progress[2].set()
                    if sent_count == 2 * MESSAGES // 3:
                        progress[3].set()

            async def killer() -> None:
                for mark, group_name in ((2, "broker-a"), (3, "broker-b")):
                    await progress[mark].wait()
                    victim = await trio.to_thread.run_sync(live_cluster.leader_name, group_name)
                    assert victim is not None
                    live_cluster.kill(victim)
                    await trio.sleep(DOWN_S)
                    live_cluster.start(victim)

            async with trio.open_nursery() as senders:
                senders.start_soon(killer)
                for key in range(KEYS):
                    senders.start_soon(sender, key)
        expected = {u for keys in acked.values() for u in keys}
        await wait_for(lambda: recorder.unique() >= expected, CONSUME_S, "every acked message")
        for event in leave:
            event.set()
    duplicates = len(recorder.deliveries) - len(recorder.unique())
    print(
        f"\n{len(expected)} acked of {MESSAGES} ({failed} sends failed), {duplicates} "
        f"delivered twice, longest send {longest_s * 1000:.0f} ms"
    )
    assert longest_s <= SEND_TIMEOUT_S + 1.0  # a send ends within its timeout, give or take
    consumed: dict[str, list[str]] = {}
    seen: set[str] = set()
    for d in recorder.deliveries:
        if d.message.msg_id not in seen:
            seen.add(d.message.msg_id)
            consumed.setdefault(d.message.properties["KEYS"], []).append(d.message.msg_id)
    for key, in_order in acked.items():
        got = [u for u in consumed.get(f"k{key}", []) if u in set(in_order)]
        assert got == in_order, f"key {key}: consumed out of send order"
