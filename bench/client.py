"""What an application sees through our Python client, against one 3-replica broker group.

    python -m bench.client [--quick] [--live-peers nats_jetstream,rabbitmq_quorum]

Everything goes through the public client API (client.AsyncProducer, client.AsyncPushConsumer),
in this one Python process, as nats-py and pika are in the peers' scripts. A fresh cluster (1
namesrv, 1 group of three `python -m broker` replicas, ASYNC_FLUSH as NATS acks from memory) on
127.0.0.1; a topic of 8 queues; 1 KiB bodies. Measured:

- produce, acknowledged messages/s: `send` from 1 task and from 32 tasks (latency p50/p99 of
  each send), `send_async` with at most 256 sends outstanding (the NATS script's window),
  the same with `auto_batch=True` (concurrent sends share batch requests; each message is still
  acknowledged on its own), and `send_batch` of 128 messages from 2 tasks (in the first and the
  last window of the loads, as each peer runs once before them and once after); for each, the CPU
  each process spent per acknowledged message (`cpu_us_per_msg`: this client, the leader, the
  followers, all together, from /proc/<pid>/stat), since all of them share this host's cores;
- consume: a push consumer of a new group reading everything produced from the first offset;
- end to end: a message's send to its delivery to the listener, p50/p99, at a steady 500/s;
- failover as the sender sees it: one task sending without pause, `kill -9` of the leader, the
  time from the kill to the next SEND_OK, `--kills` times (default 20), the victim restarted
  and caught up between kills.

The JSON goes to bench/results/client.json. With `--live-peers` the NATS JetStream and RabbitMQ
quorum-queue scripts of ../shared/bench/peers run before and after our loads, in this session,
and the ratios use the mean of their two runs. Targets: >= 2x NATS JetStream's acked publish
rate, >= 3x RabbitMQ's, failover p99 < 500 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import trio

from bench.broker import cpu_snapshot, create_topic, leader_address, raft_terms, rejoined
from bench.dledger import live_summary, peer_figures, percentile, run_peer_or_record
from broker.localcluster import LocalCluster
from client import AsyncProducer, Message, MQClientError, SendResult

BODY_BYTES = 1024
TOPIC = "BenchTopic"
# end to end on a topic of its own: a new group's consume_from="last" starts a queue whose
# first message is still stored at offset 0, as RocketMQ 4.x brokers do, so on TOPIC it would
# get everything the loads sent
LATENCY_TOPIC = "BenchLatencyTopic"
GROUP = "broker-a"
PRODUCER_GROUP = "bench_pg"
ASYNC_WINDOW = 256  # the NATS script's --window: publishes awaiting their ack at once
SYNC_TASKS = (1, 32)
# send_batch: the NATS window's 256 messages outstanding as 2 batches of 128 (session 17, five
# alternating pairs: 46,711 msgs/s mean against 42,726 as 4 x 64; fewer, larger requests)
BATCH_TASKS, BATCH_SIZE = 2, 128
LATENCY_RATE_PER_S = 500
FAILOVER_WAIT_S = 20.0
CONSUME_WAIT_S = 300.0
LIVE_PEERS = ("nats_jetstream", "rabbitmq_quorum")
TARGET_VS_NATS = 2.0
TARGET_VS_RABBITMQ = 3.0
TARGET_FAILOVER_P99_MS = 500.0
SEGMENT_BYTES = 256 << 20


STAMP_BYTES = 20
# random once, as the NATS script's filler: a fresh os.urandom per message was a tenth of this
# process's CPU, work the peers' clients are not given
FILLER = os.urandom(BODY_BYTES - STAMP_BYTES)


def body_with_time() -> bytes:
    return b"%020d" % time.time_ns() + FILLER


def figures(acked: int, errors: int, seconds: float, latencies: list[float]) -> dict[str, Any]:
    row: dict[str, Any] = {
        "acked": acked,
        "errors": errors,
        "seconds": round(seconds, 2),
        "msgs_per_s": round(acked / seconds) if seconds > 0 else 0,
    }
    if latencies:
        row["latency_p50_ms"] = round(statistics.median(latencies) * 1000, 3)
        row["latency_p99_ms"] = round(percentile(latencies, 99) * 1000, 3)
    return row


# --- produce ---------------------------------------------------------------------------------


async def produce_sync(namesrv: str, tasks: int, seconds: float) -> dict[str, Any]:
    latencies: list[float] = []
    errors = 0
    async with AsyncProducer(PRODUCER_GROUP, namesrv) as producer:
        await producer.send(Message(TOPIC, body_with_time()))  # routes and connections warm
        started = time.monotonic()
        stop_at = started + seconds

        async def sender() -> None:
            nonlocal errors
            while time.monotonic() < stop_at:
                sent_at = time.monotonic()
                try:
                    await producer.send(Message(TOPIC, body_with_time()))
                except MQClientError:
                    errors += 1
                    continue
                latencies.append(time.monotonic() - sent_at)

        async with trio.open_nursery() as nursery:
            for _ in range(tasks):
                nursery.start_soon(sender)
        elapsed = time.monotonic() - started
    row = figures(len(latencies), errors, elapsed, latencies)
    return {"mode": f"send x{tasks}", **row, "warm_up_sends": 1}


async def produce_async(namesrv: str, seconds: float, *, auto_batch: bool) -> dict[str, Any]:
    acked = errors = 0
    last_ack = 0.0
    window = trio.Semaphore(ASYNC_WINDOW)

    def done(outcome: SendResult | BaseException) -> None:
        nonlocal acked, errors, last_ack
        window.release()
        if isinstance(outcome, SendResult):
            acked += 1
            last_ack = time.monotonic()
        else:
            errors += 1

    async with AsyncProducer(PRODUCER_GROUP, namesrv, auto_batch=auto_batch) as producer:
        await producer.send(Message(TOPIC, body_with_time()))
        started = time.monotonic()
        stop_at = started + seconds
        while time.monotonic() < stop_at:
            await window.acquire()
            await producer.send_async(Message(TOPIC, body_with_time()), done)
    mode = "send_async auto_batch" if auto_batch else "send_async"
    row = figures(acked, errors, last_ack - started, [])
    return {"mode": mode, "window": ASYNC_WINDOW, **row, "warm_up_sends": 1}


async def produce_batches(namesrv: str, seconds: float) -> dict[str, Any]:
    acked = errors = 0
    latencies: list[float] = []
    async with AsyncProducer(PRODUCER_GROUP, namesrv) as producer:
        started = time.monotonic()
        stop_at = started + seconds

        async def sender() -> None:
            nonlocal acked, errors
            while time.monotonic() < stop_at:
                batch = [Message(TOPIC, body_with_time()) for _ in range(BATCH_SIZE)]
                sent_at = time.monotonic()
                try:
                    await producer.send_batch(batch)
                except MQClientError:
                    errors += BATCH_SIZE
                    continue
                latencies.append(time.monotonic() - sent_at)
                acked += BATCH_SIZE

        async with trio.open_nursery() as nursery:
            for _ in range(BATCH_TASKS):
                nursery.start_soon(sender)
        elapsed = time.monotonic() - started
    mode = f"send_batch {BATCH_SIZE} x{BATCH_TASKS}"
    row = {"mode": mode, **figures(acked, errors, elapsed, latencies), "warm_up_sends": 0}
    return {**row, "latencies_s": latencies}  # both_windows merges them, then drops them


def both_windows(first: dict[str, Any], last: dict[str, Any]) -> dict[str, Any]:
    """One row for a load measured in two windows, the first and the last of the loads, as
    each peer is measured once before them and once after: the rate over both (the mean of
    equal windows), latency percentiles over both windows' sends, CPU weighted by messages."""
    acked = first["acked"] + last["acked"]
    latencies = first.pop("latencies_s") + last.pop("latencies_s")
    seconds = first["seconds"] + last["seconds"]
    row = {
        "mode": first["mode"],
        **figures(acked, first["errors"] + last["errors"], seconds, latencies),
    }
    row["windows_msgs_per_s"] = [first["msgs_per_s"], last["msgs_per_s"]]
    row["warm_up_sends"] = 0
    weights = (first["acked"] / max(1, acked), last["acked"] / max(1, acked))
    cpus = (first["cpu_us_per_msg"], last["cpu_us_per_msg"])
    row["cpu_us_per_msg"] = {
        key: (
            [
                round(weights[0] * a + weights[1] * b, 1)
                for a, b in zip(*(c[key] for c in cpus), strict=True)
            ]
            if key == "followers"
            else round(weights[0] * cpus[0][key] + weights[1] * cpus[1][key], 1)
        )
        for key in cpus[0]
    }
    return row


# --- consume and end to end ---------------------------------------------------------------------


async def consume_all(namesrv: str, expected: int) -> dict[str, Any]:
    from client import AsyncPushConsumer, ConsumeStatus

    got = 0
    enough = trio.Event()
    first_at: list[float] = []
    last_at = 0.0

    def listener(messages: list[Any]) -> ConsumeStatus:
        nonlocal got, last_at
        if not first_at:
            first_at.append(time.monotonic())
        got += len(messages)
        last_at = time.monotonic()
        if got >= expected:  # the listener runs in a worker thread of the consumer
            trio.from_thread.run_sync(enough.set)
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = AsyncPushConsumer(
        f"bench_cg_{time.monotonic_ns()}", namesrv, consume_from="first", consume_batch_size=32
    )
    consumer.subscribe(TOPIC, "*")
    consumer.register_listener(listener)
    started = time.monotonic()
    async with consumer:
        with trio.move_on_after(CONSUME_WAIT_S):
            await enough.wait()
    elapsed = (last_at if got else time.monotonic()) - (first_at[0] if first_at else started)
    return {"expected": expected, **figures(got, 0, elapsed, [])}


async def end_to_end(namesrv: str, seconds: float) -> dict[str, Any]:
    from client import AsyncPushConsumer, ConsumeStatus

    latencies: list[float] = []

    def listener(messages: list[Any]) -> ConsumeStatus:
        now = time.time_ns()
        for m in messages:
            latencies.append((now - int(m.body[:20])) / 1e9)
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = AsyncPushConsumer(f"bench_e2e_{time.monotonic_ns()}", namesrv, consume_from="last")
    consumer.subscribe(LATENCY_TOPIC, "*")
    consumer.register_listener(listener)
    async with consumer, AsyncProducer(PRODUCER_GROUP, namesrv) as producer:
        await trio.sleep(3.0)  # the consumer's first rebalance takes its queues
        sent = 0
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            await producer.send(Message(LATENCY_TOPIC, body_with_time()))
            sent += 1
            await trio.sleep_until(started + sent / LATENCY_RATE_PER_S)
        with trio.move_on_after(10):
            while len(latencies) < sent:
                await trio.sleep(0.05)
    return {
        "rate_per_s": LATENCY_RATE_PER_S,
        "sent": sent,
        **figures(len(latencies), 0, seconds, latencies),
    }


# --- failover ----------------------------------------------------------------------------------


async def failover(cluster: LocalCluster, kills: int) -> dict[str, Any]:
    """Kill -9 the leader `kills` times under one sequential sender: each figure is from the
    kill to the SEND_OK of the first message the sender sent after it (a send already in
    flight may still be answered by the dying leader, which says nothing of the failover)."""
    acks: list[tuple[float, float]] = []  # (send invoked, SEND_OK)
    errors: list[str] = []
    times_ms: list[float] = []
    async with AsyncProducer(PRODUCER_GROUP, cluster.namesrv_addr) as producer:

        async def sender() -> None:
            while True:
                invoked = time.monotonic()
                try:
                    await producer.send(Message(TOPIC, body_with_time()))
                except MQClientError as err:
                    errors.append(str(err)[:200])
                    continue
                acks.append((invoked, time.monotonic()))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sender)
            for _ in range(kills):
                leader = cluster.replica_at(await leader_address(cluster))
                assert leader is not None
                with trio.fail_after(FAILOVER_WAIT_S):  # the group is healthy: sends flow
                    n = len(acks)
                    while len(acks) < n + 50:
                        await trio.sleep(0.01)
                killed_at = time.monotonic()
                cluster.kill(leader.name)
                with trio.fail_after(FAILOVER_WAIT_S):
                    while not acks or acks[-1][0] <= killed_at:
                        await trio.sleep(0.001)
                first = min(acked for invoked, acked in acks[-200:] if invoked > killed_at)
                times_ms.append((first - killed_at) * 1000)
                print(
                    f"  kill {len(times_ms)}: next SEND_OK after {times_ms[-1]:.0f} ms", flush=True
                )
                cluster.start(leader.name)
                await rejoined(cluster, leader.name)
            nursery.cancel_scope.cancel()
    return {
        "kills": kills,
        "failed_sends": len(errors),
        "failed_send_examples": errors[:5],
        "failover_ms_p50": round(statistics.median(times_ms), 1),
        "failover_ms_p99": round(percentile(times_ms, 99), 1),
        "failover_ms_max": round(max(times_ms), 1),
        "failover_ms_all": [round(t, 1) for t in times_ms],
    }


# --- running --------------------------------------------------------------------------------------


def with_cluster(
    root: Path, body: Callable[[LocalCluster], Awaitable[dict[str, Any]]]
) -> dict[str, Any]:
    cluster = LocalCluster(
        root / str(time.monotonic_ns()),
        namesrvs=1,
        groups=(GROUP,),
        replicas=3,
        extra_broker_args=["--flush", "ASYNC_FLUSH", "--segment-bytes", str(SEGMENT_BYTES),
                           "--log-level", os.environ.get("BENCH_LOG_LEVEL", "WARNING")],
    )  # fmt: skip
    cluster.start_all()
    try:
        cluster.wait_serving()

        async def run() -> dict[str, Any]:
            await create_topic(await leader_address(cluster))
            await create_topic(await leader_address(cluster), LATENCY_TOPIC)
            terms = await trio.to_thread.run_sync(raft_terms, cluster)
            result = await body(cluster)
            after = await trio.to_thread.run_sync(raft_terms, cluster)
            result["elections_during_load"] = max(after) - max(terms)
            return result

        return trio.run(run)
    finally:
        cluster.stop_all()


async def with_cpu(
    cluster: LocalCluster, load: Callable[[], Awaitable[dict[str, Any]]]
) -> dict[str, Any]:
    """Run `load` and add what each process spent on it, in us per acknowledged message: the
    client, the group's leader, its followers and everything together (the name server too).
    On a host whose cores all our processes share, the total decides the rate."""
    leader = cluster.replica_at(await leader_address(cluster))
    before = cpu_snapshot(cluster)
    row = await load()
    after = cpu_snapshot(cluster)
    acked = max(1, row["acked"])
    spent = {n: (after[n] - before[n]) * 1e6 / acked for n in after if n in before}
    leader_name = leader.name if leader is not None else ""
    row["cpu_us_per_msg"] = {
        "client": round(spent.get("client", 0.0), 1),
        "leader": round(spent.get(leader_name, 0.0), 1),
        "followers": sorted(
            round(v, 1) for n, v in spent.items() if n.startswith(GROUP) and n != leader_name
        ),
        "total": round(sum(spent.values()), 1),
    }
    return row


async def loads(cluster: LocalCluster, seconds: float, consume: bool) -> dict[str, Any]:
    namesrv = cluster.namesrv_addr
    rows = []
    # send_batch, the figure the peers are compared with, in the first and the last window
    batches = [await with_cpu(cluster, partial(produce_batches, namesrv, seconds))]
    for tasks in SYNC_TASKS:
        rows.append(await with_cpu(cluster, partial(produce_sync, namesrv, tasks, seconds)))
        print(json.dumps(rows[-1]), flush=True)
    for auto_batch in (False, True):
        load = partial(produce_async, namesrv, seconds, auto_batch=auto_batch)
        rows.append(await with_cpu(cluster, load))
        print(json.dumps(rows[-1]), flush=True)
    batches.append(await with_cpu(cluster, partial(produce_batches, namesrv, seconds)))
    rows.append(both_windows(*batches))
    print(json.dumps(rows[-1]), flush=True)
    result: dict[str, Any] = {"produce": rows}
    if consume:
        total = sum(r["acked"] + r["warm_up_sends"] for r in rows)
        result["consume"] = await consume_all(namesrv, total)
        print("consume", json.dumps(result["consume"]), flush=True)
        result["end_to_end"] = await end_to_end(namesrv, seconds)
        print("end to end", json.dumps(result["end_to_end"]), flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.client",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="3 s per load, 5 kills")
    p.add_argument("--seconds", type=float)
    p.add_argument("--kills", type=int, help="leader kills (default 20, 5 with --quick; 0: none)")
    p.add_argument("--no-consume", action="store_true", help="produce and failover only")
    p.add_argument(
        "--live-peers",
        default="",
        metavar="NAMES",
        help=f"comma list of peers to run in this session: {', '.join(LIVE_PEERS)}",
    )
    p.add_argument("--out", type=Path, default=Path("bench/results/client.json"))
    args = p.parse_args(argv)  # fmt: skip
    seconds = args.seconds or (3.0 if args.quick else 10.0)
    kills = args.kills if args.kills is not None else (5 if args.quick else 20)
    live = [n for n in args.live_peers.split(",") if n]
    unknown = [n for n in live if n not in LIVE_PEERS]
    if unknown or seconds <= 0 or kills < 0:
        p.error(f"bad arguments: unknown peers {unknown}" if unknown else "bad --seconds/--kills")
    report: dict[str, Any] = {"what": "client", "body_bytes": BODY_BYTES, "quick": args.quick,
                              "seconds_per_load": seconds}  # fmt: skip
    live_runs: dict[str, list[dict[str, Any]]] = {n: [] for n in live}
    with tempfile.TemporaryDirectory(prefix="bench-client-") as tmp:
        root = Path(tmp)
        for name in live:
            live_runs[name].append(run_peer_or_record(name, root / f"{name}-before.json"))
        report.update(with_cluster(root, lambda c: loads(c, seconds, consume=not args.no_consume)))
        for name in live:
            live_runs[name].append(run_peer_or_record(name, root / f"{name}-after.json"))
        if kills:
            report["failover"] = with_cluster(root, lambda c: failover(c, kills))
    best = max(r["msgs_per_s"] for r in report["produce"])
    per_message = max(
        r["msgs_per_s"] for r in report["produce"] if not r["mode"].startswith("send_batch")
    )
    peers = {n: live_summary(runs) for n, runs in live_runs.items()} or peer_figures()
    ratios = {}
    for name in LIVE_PEERS:
        rate = (peers.get(name) or {}).get("append_msgs_s")
        if rate:
            ratios[f"best_vs_{name}"] = round(best / rate, 2)
            ratios[f"per_message_sends_vs_{name}"] = round(per_message / rate, 2)
    fo = report.get("failover")
    report.update(
        peers=peers,
        peers_source="live, this session" if live else "stored ../shared/bench/results",
        ratios=ratios,
        targets={
            "vs_nats_jetstream": {"target": TARGET_VS_NATS, "ratio": ratios.get("best_vs_nats_jetstream")},
            "vs_rabbitmq_quorum": {"target": TARGET_VS_RABBITMQ, "ratio": ratios.get("best_vs_rabbitmq_quorum")},
            "failover_p99_ms": {"target": TARGET_FAILOVER_P99_MS, "value": fo and fo["failover_ms_p99"]},
        },
        loadavg_1m=round(os.getloadavg()[0], 1),
        cpu_count=os.cpu_count(),
        when=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(
        json.dumps(
            {
                "ratios": ratios,
                "failover": fo and {k: v for k, v in fo.items() if k.startswith("failover_ms_p")},
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
