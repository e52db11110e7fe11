"""Real processes: 1 name server and broker-a of 3 `dledger-broker` replicas on 127.0.0.1, with
delay levels shortened by configuration (issue 32's acceptance for delays and retries).

Delayed messages at several levels, and timer messages, are delivered once each and never
before their time although the group's leader is killed with SIGKILL between the sends and the
deliveries. A message given back again and again (CONSUMER_SEND_MSG_BACK, sent to the store
host the message names, as the C++ client does) comes back from %RETRY% with growing
reconsumeTimes, across a leader kill too, and lands in %DLQ% after maxReconsumeTimes, where a
pull reads it. Run under `flock /tmp/heavy.lock`.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

import pytest
import trio

from broker.delays import format_levels
from broker.localcluster import LocalCluster, running_cluster
from remoting.client import open_connection
from remoting.codes import RequestCode, ResponseCode
from remoting.connection import Connection
from remoting.stored_message import StoredMessage
from tests.broker import rmq

GROUP_NAME = "broker-a"
LEVELS = (1000, 1500, 2000, 2500, 3000)  # level 3 + reconsumeTimes: 2 s, 2.5 s, 3 s
BROKER_ARGS = ["--segment-bytes", str(16 << 20), "--cq-file-bytes", str(20 * 1000),
               "--index-slots", "1000", "--index-items", "4000",
               "--message-delay-level", format_levels(LEVELS)]  # fmt: skip
TOPIC = "Later"
QUEUES = 4
CONSUMER = "cg_later"
WAIT_S = 30.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("schedule-cluster")
    with running_cluster(
        root, namesrvs=1, groups=(GROUP_NAME,), extra_broker_args=BROKER_ARGS
    ) as c:
        yield c


def wall_ms() -> int:
    return int(time.time() * 1000)


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


async def leader(cluster: LocalCluster, not_: str | None = None) -> str:
    """The group's leader replica name, as the name server shows it."""
    with trio.fail_after(WAIT_S):
        while True:
            name = await trio.to_thread.run_sync(cluster.leader_name, GROUP_NAME)
            if name is not None and name != not_:
                return name
            await trio.sleep(0.05)


def client_address(cluster: LocalCluster, name: str) -> tuple[str, int]:
    address = cluster.brokers[name].client_address
    return address.host, address.port


async def pull_queue(conn: Connection, topic: str, queue_id: int) -> list[StoredMessage]:
    got: list[StoredMessage] = []
    offset = 0
    while True:
        response, messages = await rmq.pull(conn, topic, queue_id, offset, group=CONSUMER)
        if response.code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.TOPIC_NOT_EXIST):
            return got
        assert response.code == ResponseCode.SUCCESS, (response.code, response.remark)
        got.extend(messages)
        offset = int(response.ext_fields["nextBeginOffset"])


async def wait_schedules_done(cluster: LocalCluster, name: str) -> dict[str, str]:
    """Until replica `name` (the leader) has delivered every schedule record it holds."""
    with trio.fail_after(WAIT_S):
        while True:
            info = await trio.to_thread.run_sync(cluster.runtime_info, name)
            if info is not None:
                marks = {
                    k: v
                    for k, v in info.items()
                    if k.startswith("scheduleMessageOffset_") or k == "timerMessageOffset"
                }
                done = all(len(set(v.split(","))) == 1 for v in marks.values())
                if marks and done and info["appliedIndex"] == info["commitIndex"]:
                    return marks
            await trio.sleep(0.1)


async def test_delayed_messages_arrive_once_and_in_time_across_a_leader_kill(
    cluster: LocalCluster,
) -> None:
    first = await leader(cluster)
    earliest: dict[str, int] = {}
    async with open_connection(*client_address(cluster, first)) as conn:
        for n in range(40):
            uniq = f"d{n}"
            if n % 5 == 4:  # a delivery time 1.5-3 s ahead
                delay_ms = 1500 + 50 * (n % 30)
                extra = {"TIMER_DELAY_MS": str(delay_ms)}
            else:  # levels 2..5
                level = 2 + n % 5
                delay_ms, extra = LEVELS[level - 1], {"DELAY": str(level)}
            earliest[uniq] = wall_ms() + delay_ms
            properties = rmq.properties(UNIQ_KEY=uniq, **extra)
            response = await rmq.send(conn, TOPIC, n % QUEUES, uniq.encode(), props=properties)
            assert response.code == ResponseCode.SUCCESS, response.remark
    killed_ms = wall_ms()
    await trio.to_thread.run_sync(cluster.kill, first)
    assert killed_ms < min(earliest.values()), "the kill came after a delivery was due"
    second = await leader(cluster, not_=first)
    await trio.to_thread.run_sync(cluster.start, first)
    async with open_connection(*client_address(cluster, second)) as conn:
        with trio.fail_after(WAIT_S):
            while True:
                got = [m for q in range(QUEUES) for m in await pull_queue(conn, TOPIC, q)]
                if len(got) >= len(earliest):
                    break
                await trio.sleep(0.1)
    marks = await wait_schedules_done(cluster, second)
    assert set(marks) >= {f"scheduleMessageOffset_{level}" for level in (2, 3, 4, 5)}
    for name in [r.name for r in cluster.replicas_of(GROUP_NAME)]:
        async with open_connection(*client_address(cluster, name)) as conn:
            with trio.fail_after(WAIT_S):  # the restarted replica catches up
                while True:
                    got = [m for q in range(QUEUES) for m in await pull_queue(conn, TOPIC, q)]
                    if len(got) >= len(earliest):
                        break
                    await trio.sleep(0.1)
        assert Counter(m.properties["UNIQ_KEY"] for m in got) == Counter(earliest.keys()), name
        for message in got:
            assert message.store_timestamp_ms >= earliest[message.properties["UNIQ_KEY"]]
            assert message.topic == TOPIC and "DELAY" not in message.properties


async def give_back(conn: Connection, message: StoredMessage, max_times: int) -> None:
    fields = {
        "offset": message.physical_offset,
        "group": CONSUMER,
        "delayLevel": 0,
        "maxReconsumeTimes": max_times,
    }
    response = await rmq.call(conn, RequestCode.CONSUMER_SEND_MSG_BACK, fields)
    assert response.code == ResponseCode.SUCCESS, response.remark


async def message_at(address: tuple[str, int], topic: str, offset: int) -> StoredMessage:
    async with open_connection(*address) as conn:
        with trio.fail_after(WAIT_S):
            while True:
                _, messages = await rmq.pull(conn, topic, 0, offset, group=CONSUMER)
                if messages:
                    return messages[0]
                await trio.sleep(0.05)


async def test_a_message_given_back_retries_with_growing_times_then_dies(
    cluster: LocalCluster,
) -> None:
    first = await leader(cluster)
    async with open_connection(*client_address(cluster, first)) as conn:
        properties = rmq.properties(UNIQ_KEY="r1", KEYS="order-7")
        response = await rmq.send(conn, "Failing", 0, b"charge", props=properties)
        assert response.code == ResponseCode.SUCCESS, response.remark
    current = await message_at(client_address(cluster, first), "Failing", 0)
    seen = [current]
    killed = None
    for times in (1, 2, 3):
        # as the C++ client: to the store host the message names (another replica if dead)
        store_host = current.store_host
        if killed is not None and client_address(cluster, killed) == store_host:
            store_host = client_address(cluster, await leader(cluster))
        given_ms = wall_ms()
        async with open_connection(*store_host) as conn:
            await give_back(conn, current, max_times=3)
        if times == 1:  # between the give-back and its delivery
            killed = await leader(cluster)
            await trio.to_thread.run_sync(cluster.kill, killed)
        reader = client_address(cluster, await leader(cluster, not_=killed))
        current = await message_at(reader, f"%RETRY%{CONSUMER}", times - 1)
        assert current.store_timestamp_ms >= given_ms + LEVELS[2 + times - 1]
        seen.append(current)
    assert killed is not None
    await trio.to_thread.run_sync(cluster.start, killed)
    async with open_connection(*client_address(cluster, await leader(cluster))) as conn:
        await give_back(conn, current, max_times=3)
    dead = await message_at(client_address(cluster, await leader(cluster)), f"%DLQ%{CONSUMER}", 0)
    async with open_connection(*client_address(cluster, await leader(cluster))) as conn:
        retries = await pull_queue(conn, f"%RETRY%{CONSUMER}", 0)
    assert [m.reconsume_times for m in [*seen, dead]] == [0, 1, 2, 3, 4]
    assert len(retries) == 3  # each retry once
    for message in [*seen[1:], dead]:
        assert message.body == b"charge"
        assert message.properties["UNIQ_KEY"] == "r1"
        assert message.properties["RETRY_TOPIC"] == "Failing"
