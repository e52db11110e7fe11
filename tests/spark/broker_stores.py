"""Broker stores for the broker audit's tests: one short real cluster (1 name server, one
group of 3 `dledger-broker` replicas with small files) that takes plain, tagged, keyed and
delayed messages and a consumer offset commit, stopped cleanly; and a broker chaos history
(docs/formats.md#broker-chaos-history) of what it acknowledged and what a pull got.

Run under `flock /tmp/heavy.lock`: it starts real processes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import trio

from broker.localcluster import SMALL_STORE_ARGS, LocalCluster, running_cluster
from remoting.client import open_connection
from remoting.codes import RequestCode, ResponseCode
from tests.broker import rmq

GROUP = "broker-a"
TOPIC = "AuditTopic"
QUEUES = 2
MESSAGES = 120  # plain, tagged and keyed, over both queues
DELAYED = 4  # DELAY level 1: a schedule record, then (after 1 s) the delivered message
CONSUMER_GROUP = "cg_audit"
INDEX_ARGS = ["--index-slots", "1000", "--index-items", "4000"]  # SMALL_STORE_ARGS' geometry
assert all(arg in SMALL_STORE_ARGS for arg in INDEX_ARGS)
APPLIED_WAIT_S = 30.0


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


async def _leader(cluster: LocalCluster) -> str:
    with trio.fail_after(20):
        while (address := await trio.to_thread.run_sync(cluster.leader_of, GROUP)) is None:
            await trio.sleep(0.05)
    return address


async def _wait_applied(cluster: LocalCluster, at_least: int) -> None:
    """Until every replica applied the same index, at least `at_least` (polling)."""
    names = [r.name for r in cluster.replicas_of(GROUP)]
    with trio.fail_after(APPLIED_WAIT_S):
        while True:
            infos = [await trio.to_thread.run_sync(cluster.runtime_info, n) for n in names]
            applied = {int(i["appliedIndex"]) for i in infos if i}
            if all(infos) and len(applied) == 1 and min(applied) >= at_least:
                return
            await trio.sleep(0.05)


async def _workload(cluster: LocalCluster) -> list[dict[str, object]]:
    """Send, delay, pull and commit; the history records of what was acknowledged and got."""
    history: list[dict[str, object]] = []
    address = await _leader(cluster)
    async with open_connection(*host_port(address)) as conn:
        created = await rmq.call(
            conn,
            RequestCode.UPDATE_AND_CREATE_TOPIC,
            {"topic": TOPIC, "readQueueNums": QUEUES, "writeQueueNums": QUEUES, "perm": 6},
        )
        assert created.code == ResponseCode.SUCCESS, created.remark
        for n in range(MESSAGES + DELAYED):
            value = f"p0-{n}"
            extra: dict[str, str] = {"UNIQ_KEY": f"AUDIT{n:08d}"}
            if n % 3 == 0:
                extra["TAGS"] = f"tag{n % 5}"
            if n % 4 == 0:
                extra["KEYS"] = f"order-{n} shared"
            if n >= MESSAGES:
                extra["DELAY"] = "1"
            queue_id = n % QUEUES
            response = await rmq.send(
                conn, TOPIC, queue_id, value.encode(), props=rmq.properties(**extra)
            )
            assert response.code == ResponseCode.SUCCESS, response.remark
            history.append(
                {"type": "ok", "f": "send", "process": "p0", "group": GROUP, "time_ns": n,
                 "value": {"v": value, "t": TOPIC, "k": None, "id": extra["UNIQ_KEY"],
                           "q": int(response.ext_fields["queueId"]),
                           "o": int(response.ext_fields["queueOffset"]), "status": "SEND_OK"}}
            )  # fmt: skip
        got: list[list[object]] = []
        response, pulled = await rmq.pull(conn, TOPIC, 0, 0, group=CONSUMER_GROUP, max_nums=16)
        assert response.code == ResponseCode.SUCCESS, response.remark
        got = [[m.queue_offset, m.body.decode(), ""] for m in pulled]
        history.append(
            {"type": "ok", "f": "consume", "process": "pull/0", "group": GROUP, "time_ns": 0,
             "value": {"cg": CONSUMER_GROUP, "t": TOPIC, "q": 0, "m": got}}
        )  # fmt: skip
        committed = await rmq.call(
            conn,
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {"consumerGroup": CONSUMER_GROUP, "topic": TOPIC, "queueId": 0,
             "commitOffset": len(got)},
        )  # fmt: skip
        assert committed.code == ResponseCode.SUCCESS, committed.remark
        # the delayed messages come back to TOPIC after ~1 s: wait for the last of them
        with trio.fail_after(20):
            last_queue = (MESSAGES + DELAYED - 1) % QUEUES
            expected = sum(1 for n in range(MESSAGES + DELAYED) if n % QUEUES == last_queue)
            while True:
                response, _ = await rmq.pull(
                    conn, TOPIC, last_queue, expected - 1, group="cg_probe", max_nums=1
                )
                if response.code == ResponseCode.SUCCESS:
                    break
                await trio.sleep(0.1)
    infos = [
        await trio.to_thread.run_sync(cluster.runtime_info, r.name)
        for r in cluster.replicas_of(GROUP)
    ]
    await _wait_applied(cluster, max(int(i["appliedIndex"]) for i in infos if i))
    return history


def build(root: Path) -> tuple[Path, Path]:
    """Run the cluster once: (a directory holding the 3 stopped replicas' stores, a broker
    history of the run)."""
    with running_cluster(
        root / "cluster", groups=(GROUP,), replicas=3, namesrvs=1,
        extra_broker_args=[*SMALL_STORE_ARGS, "--log-level", "INFO"],
    ) as cluster:  # fmt: skip
        history = trio.run(_workload, cluster)
        replicas = [(r.node, r.store_dir) for r in cluster.replicas_of(GROUP)]
    stores = root / "stores"
    for node, store in replicas:
        shutil.copytree(store, stores / node)
    path = root / "history.jsonl"
    path.write_text("".join(json.dumps(op) + "\n" for op in history))
    return stores, path
