"""Real processes: 1 name server and 2 broker groups x 3 `dledger-broker` replicas on 127.0.0.1.

The acceptance of the broker issue: 20,000 messages sent through the remoting protocol come
back from every queue once each and in order; a kill -9 of broker-a's leader moves the route
to a new master; sends and pulls go on with queue offsets continuing exactly; committed
consumer offsets survive; a send to a follower's address is forwarded; every replica's
ConsumeQueue and IndexFile bytes agree; held pulls wake on a message and time out cleanly.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from broker.localcluster import LocalCluster, running_cluster
from remoting.client import open_connection
from remoting.codes import RequestCode, ResponseCode
from remoting.connection import Connection
from tests.broker import rmq

TOPIC = "Orders"
QUEUES = 4
SENDERS_PER_QUEUE = 4
MESSAGES = 20_000  # over both groups
GROUP = "cg_cluster"
# small files: rollovers happen, and comparing replicas' files reads little
BROKER_ARGS = ["--segment-bytes", str(64 << 20), "--cq-file-bytes", str(20 * 1000),
               "--index-slots", "1000", "--index-items", "4000", "--log-level", "INFO"]  # fmt: skip


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("cluster")
    with running_cluster(root, namesrvs=1, extra_broker_args=BROKER_ARGS) as c:
        pids = list(c.pids().values())
        yield c
    for pid in pids:  # everything we started is gone
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


async def leader_address(cluster: LocalCluster, group: str, not_: str | None = None) -> str:
    with trio.fail_after(20):
        while True:
            address = await trio.to_thread.run_sync(cluster.leader_of, group)
            if address is not None and address != not_:
                return address
            await trio.sleep(0.02)


async def create_topic(conn: Connection) -> None:
    response = await rmq.call(
        conn,
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        {"topic": TOPIC, "readQueueNums": QUEUES, "writeQueueNums": QUEUES, "perm": 6},
    )
    assert response.code == ResponseCode.SUCCESS, response.remark


async def send_all(address: str, group: str, count: int) -> dict[int, list[list[bytes]]]:
    """count messages to `group`, SENDERS_PER_QUEUE sequential senders per queue; the bodies
    each queue was sent, by sender, in order."""
    sent: dict[int, list[list[bytes]]] = {
        q: [[] for _ in range(SENDERS_PER_QUEUE)] for q in range(QUEUES)
    }
    per_sender = count // (QUEUES * SENDERS_PER_QUEUE)

    async def sender(conn: Connection, queue_id: int, k: int) -> None:
        for n in range(per_sender):
            body = f"{group}-{queue_id}-{k}-{n}".encode()
            response = await rmq.send(
                conn, TOPIC, queue_id, body, props=rmq.properties(KEYS=body.decode())
            )
            assert response.code == ResponseCode.SUCCESS, response.remark
            assert response.ext_fields["queueId"] == str(queue_id)
            sent[queue_id][k].append(body)

    async with (
        open_connection(*host_port(address)) as a,
        open_connection(*host_port(address)) as b,
        trio.open_nursery() as nursery,
    ):
        for q in range(QUEUES):
            for k in range(SENDERS_PER_QUEUE):
                nursery.start_soon(sender, a if k % 2 else b, q, k)
    return sent


async def pull_queue(conn: Connection, queue_id: int, start: int = 0) -> list[tuple[int, bytes]]:
    got: list[tuple[int, bytes]] = []
    offset = start
    while True:
        response, messages = await rmq.pull(conn, TOPIC, queue_id, offset, group=GROUP)
        if response.code == ResponseCode.PULL_NOT_FOUND:
            return got
        assert response.code == ResponseCode.SUCCESS, (response.code, response.remark)
        got.extend((m.queue_offset, m.body) for m in messages)
        offset = int(response.ext_fields["nextBeginOffset"])


def check_queue(got: list[tuple[int, bytes]], by_sender: list[list[bytes]], first: int = 0) -> None:
    offsets = [o for o, _ in got]
    assert offsets == list(range(first, first + len(got))), "queue offsets contiguous"
    bodies = [b for _, b in got]
    assert sorted(bodies) == sorted(b for s in by_sender for b in s), "each message once"
    for mine in by_sender:  # every sender's messages in the order it sent them
        position = {b: i for i, b in enumerate(bodies)}
        assert [position[b] for b in mine] == sorted(position[b] for b in mine)


async def wait_replicas_applied(cluster: LocalCluster, group: str) -> None:
    names = [r.name for r in cluster.replicas_of(group)]
    with trio.fail_after(30):
        while True:
            infos = [await trio.to_thread.run_sync(cluster.runtime_info, n) for n in names]
            if all(infos):
                applied = {i["appliedIndex"] for i in infos if i}
                commits = {i["commitIndex"] for i in infos if i}
                if len(applied) == 1 and applied == commits:
                    return
            await trio.sleep(0.05)


def derived_files(root: Path) -> dict[str, bytes]:
    found = {}
    for sub in ("consumequeue", "index"):
        for path in sorted((root / sub).rglob("*")):
            if path.is_file():
                found[str(path.relative_to(root))] = path.read_bytes()
    return found


def test_twenty_thousand_messages_a_leader_kill_and_identical_replicas(
    cluster: LocalCluster,
) -> None:
    trio.run(_scenario, cluster)


async def _scenario(cluster: LocalCluster) -> None:
    leaders = {g: await leader_address(cluster, g) for g in cluster.groups}
    for address in leaders.values():
        async with open_connection(*host_port(address)) as conn:
            await create_topic(conn)
    sent: dict[str, dict[int, list[list[bytes]]]] = {}
    async with trio.open_nursery() as nursery:

        async def run(g: str) -> None:
            sent[g] = await send_all(leaders[g], g, MESSAGES // len(cluster.groups))

        for g in cluster.groups:
            nursery.start_soon(run, g)
    for g, address in leaders.items():
        async with open_connection(*host_port(address)) as conn:
            for q in range(QUEUES):
                check_queue(await pull_queue(conn, q), sent[g][q])
    # broker-a: commit offsets, see them on a follower (so in the log), kill the leader
    group = "broker-a"
    old = leaders[group]
    per_queue = MESSAGES // len(cluster.groups) // QUEUES
    async with open_connection(*host_port(old)) as conn:
        for q in range(QUEUES):
            fields = {
                "consumerGroup": GROUP,
                "topic": TOPIC,
                "queueId": q,
                "commitOffset": per_queue - 1,
            }
            response = await rmq.call(conn, RequestCode.UPDATE_CONSUMER_OFFSET, fields)
            assert response.code == ResponseCode.SUCCESS
    follower = next(a for a in cluster.broker_addresses(group) if a != old)
    async with open_connection(*host_port(follower)) as conn:
        with trio.fail_after(10):
            for q in range(QUEUES):
                while True:
                    fields = {"consumerGroup": GROUP, "topic": TOPIC, "queueId": q}
                    response = await rmq.call(conn, RequestCode.QUERY_CONSUMER_OFFSET, fields)
                    if response.ext_fields.get("offset") == str(per_queue - 1):
                        break
                    await trio.sleep(0.02)
    victim = cluster.replica_at(old)
    assert victim is not None
    killed_at = trio.current_time()
    cluster.kill(victim.name, signal.SIGKILL)
    new = await leader_address(cluster, group, not_=old)
    route_moved_s = trio.current_time() - killed_at
    # a figure, not an assertion: failover time is measured by bench.broker, not by a test
    print(f"route moved to {new} {route_moved_s * 1000:.0f} ms after the kill")
    # sends go on, through the new leader and through its follower (the old leader's slave)
    slave = next(a for a in cluster.broker_addresses(group) if a not in (old, new))
    after: list[bytes] = []
    async with (
        open_connection(*host_port(new)) as lead,
        open_connection(*host_port(slave)) as other,
    ):
        for n in range(40):
            body = f"after-{n}".encode()
            response = await rmq.send(lead if n % 2 else other, TOPIC, 0, body)
            assert response.code == ResponseCode.SUCCESS, response.remark
            after.append(body)
        got = await pull_queue(lead, 0, start=per_queue)
        assert [o for o, _ in got] == list(range(per_queue, per_queue + 40))
        assert [b for _, b in got] == after
        for q in range(QUEUES):
            fields = {"consumerGroup": GROUP, "topic": TOPIC, "queueId": q}
            response = await rmq.call(lead, RequestCode.QUERY_CONSUMER_OFFSET, fields)
            assert response.ext_fields.get("offset") == str(per_queue - 1)
    # the killed replica comes back, catches up, and all three hold the same derived files
    await trio.to_thread.run_sync(cluster.start, victim.name)
    await wait_replicas_applied(cluster, group)
    files = [derived_files(r.store_dir) for r in cluster.replicas_of(group)]
    assert files[0] == files[1] == files[2]
    assert any(name.startswith("consumequeue/Orders/3/") for name in files[0])


def test_held_pull_wakes_on_a_message_and_other_requests_go_on(cluster: LocalCluster) -> None:
    trio.run(_long_poll, cluster)


async def _long_poll(cluster: LocalCluster) -> None:
    address = await leader_address(cluster, "broker-b")
    topic = "LongPoll"
    async with (
        open_connection(*host_port(address)) as conn,
        open_connection(*host_port(address)) as sender,
    ):
        response = await rmq.send(sender, topic, 1, b"first")  # auto-creates the topic
        assert response.code == ResponseCode.SUCCESS, response.remark
        answered: dict[str, float] = {}

        async def held_pull() -> None:
            response, messages = await rmq.pull(conn, topic, 1, 1, suspend_ms=15_000)
            answered["pull"] = trio.current_time()
            assert response.code == ResponseCode.SUCCESS
            assert [m.body for m in messages] == [b"second"]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(held_pull)
            await trio.sleep(0.2)  # let the pull be held (it is answered only after a send)
            response = await rmq.call(
                conn, RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": 1}
            )
            assert response.ext_fields["offset"] == "1"  # the same connection is not blocked
            assert "pull" not in answered
            response = await rmq.send(sender, topic, 1, b"second")
            sent_ok = trio.current_time()
            assert response.code == ResponseCode.SUCCESS
        woke_ms = (answered["pull"] - sent_ok) * 1000
        print(f"held pull answered {woke_ms:.1f} ms after SEND_OK")
        assert woke_ms < 50, woke_ms
        started = trio.current_time()
        response, _ = await rmq.pull(conn, topic, 1, 2, suspend_ms=500)
        assert response.code == ResponseCode.PULL_NOT_FOUND
        assert trio.current_time() - started >= 0.45
