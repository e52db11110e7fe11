"""Throughput, latency, pulls and failover of one 3-replica broker group, as RocketMQ clients
see it, on this machine.

    python -m bench.broker [--quick] [--out bench/results/broker.json]

For each flush policy (ASYNC_FLUSH, SYNC_FLUSH) and each sender count (1, 16, 128): a fresh
cluster (1 name server, 1 broker group of three `python -m broker` replicas on 127.0.0.1); the
senders, spread over load-generator processes (1 for one sender, 2 for 16, 4 for 128, each on one
connection, as a RocketMQ client instance's threads share one per broker), send 1 KiB bodies with SEND_MESSAGE to the leader back to back for a fixed
time, each its next message as soon as its last is acknowledged; acknowledged (SEND_OK) messages/s and send latency
p50/p99. Then everything sent is pulled back from the leader with PULL_MESSAGE, 32 per pull;
messages/s. Then failover as a sender sees it: senders sending continuously (one that loses its
broker asks the name server for the route and otherwise tries the next replica: any replica
forwards writes to the leader), kill -9 of the leader, time from the kill to the next SEND_OK,
20 times (5 with --quick), the victim restarted and caught up between kills.

Each load row is compared with bench/results/dledger.json's row for the same policy and count
(the replicated log alone): the broker should keep >= 60 % of it. On a busy host those stored
figures are from another machine, in effect: `--dledger-too` runs bench.dledger's load for the
same policy and count right after each row, and compares with that instead. Peer figures come from
../shared/bench/results/*.json; `--live-peers nats_jetstream,rabbitmq_quorum` also runs those
peers' scripts in this session, before and after our loads (bench.dledger's helpers), and
reports ratios to the mean of the two runs. Targets: >= 2x NATS JetStream R3 (ASYNC_FLUSH: NATS
acks from memory) and >= 3x RabbitMQ quorum queues (SYNC_FLUSH: a quorum queue fsyncs before it
confirms) in acked messages/s; failover p99 < 0.5 s.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import trio

from bench import dledger as bench_dledger
from bench.dledger import (
    LIVE_PEERS,
    SEGMENT_BYTES,
    cpu_ticks,
    live_summary,
    peer_figures,
    percentile,
    run_peer_or_record,
    steal_pct,
)
from broker.localcluster import LocalCluster
from netio.streams import receive_some
from remoting import limits as remoting_limits
from remoting.client import open_connection
from remoting.codes import RequestCode, ResponseCode
from remoting.command import RemotingCommand
from remoting.errors import RemotingError
from remoting.frame import PREFIX, encode_header, json_frame

BODY_BYTES = 1024
SENDER_COUNTS = (1, 16, 128)
POLICIES = ("ASYNC_FLUSH", "SYNC_FLUSH")
GROUP = "broker-a"
TOPIC = "BenchTopic"
QUEUES = 8
PULL_BATCH = 32
PULL_CONNECTIONS = 2
PULL_DEADLINE_S = 300.0
SEND_TIMEOUT_S = 10.0
FAILOVER_SEND_TIMEOUT_S = 3.0  # a write waits for an election within the broker's deadline
FAILOVER_SENDERS = 4
FAILOVER_WAIT_S = 20.0
REJOIN_WAIT_S = 60.0
WORKER_READY_S = 60.0
# per connection, over every queue: connections, topic, first segment, every queue's files (a
# broker creating ConsumeQueues while a checkpoint flushes them in a thread has crashed:
# "dictionary changed size during iteration" in ConsumeQueues.flush)
WORKER_WARMUP_SENDS = 20
DLEDGER_RESULTS = Path(__file__).resolve().parent / "results" / "dledger.json"
KEEP_OF_DLEDGER = 0.6  # the broker keeps >= 60 % of the replicated log's own figure
TARGET_VS_NATS = 2.0
TARGET_VS_RABBITMQ = 3.0
TARGET_FAILOVER_P99_MS = 500.0
LOG_EXCERPT_LINES = 60
REPO = Path(__file__).resolve().parents[1]
NET_ERRORS = (RemotingError, OSError, trio.TooSlowError, trio.BrokenResourceError)


# --- the load plan and the arithmetic (tests/benchmarks/test_broker_bench.py) -----------------


def plan(senders: int) -> list[tuple[int, int]]:
    """(senders, connections) for each load-generator process: 1 process for one sender, 2 up
    to 16, 4 beyond. A process is one client: its senders share one connection to the leader,
    as the threads of a RocketMQ client instance share its one channel to a broker
    (NettyRemotingClient keeps one per address; the C++ client one transport), and as the
    peers' scripts publish over one client connection."""
    processes = 1 if senders == 1 else 2 if senders <= 16 else 4
    processes = min(processes, senders)
    shares = [
        senders // processes + (1 if i < senders % processes else 0) for i in range(processes)
    ]
    return [(n, 1) for n in shares]


def combine(workers: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from the load processes' reports: acked / (last end - first start), latencies
    merged before taking percentiles."""
    acked = sum(w["acked"] for w in workers)
    elapsed = max(w["t_end"] for w in workers) - min(w["t_start"] for w in workers)
    latencies = [x for w in workers for x in w["latencies_ms"]]
    error_codes: dict[str, int] = {}
    for w in workers:
        for code, n in w["error_codes"].items():
            error_codes[code] = error_codes.get(code, 0) + n
    return {
        "acked": acked,
        "errors": sum(w["errors"] for w in workers),
        "error_codes": error_codes,
        "seconds": round(elapsed, 2),
        "msgs_per_s": round(acked / elapsed) if elapsed > 0 else 0,
        "mb_per_s": round(acked * BODY_BYTES / elapsed / 1e6, 2) if elapsed > 0 else 0.0,
        "latency_p50_ms": round(percentile(latencies, 50), 3),
        "latency_p99_ms": round(percentile(latencies, 99), 3),
    }


def dledger_rows(report: dict[str, Any] | None) -> dict[tuple[str, int], int]:
    """bench.dledger's entries/s by (flush, clients)."""
    rows = (report or {}).get("throughput") or []
    return {(r["flush"], r["clients"]): r["entries_per_s"] for r in rows}


def of_dledger(
    msgs_per_s: int, flush: str, senders: int, rows: dict[tuple[str, int], int]
) -> float | None:
    base = rows.get((flush, senders))
    return round(msgs_per_s / base, 2) if base else None


def ratios_to(
    peers: dict[str, Any], best: dict[str, int], fo: dict[str, Any] | None
) -> dict[str, float]:
    """Our best acked messages/s against the peers' acked publishes/s, policy for like
    durability (NATS acks from memory: ASYNC_FLUSH; a RabbitMQ quorum queue fsyncs: SYNC_FLUSH),
    and failover p50 against RabbitMQ's."""
    ratios = {}
    nats = peers.get("nats_jetstream", {}).get("append_msgs_s")
    if nats and best.get("ASYNC_FLUSH"):
        ratios["async_vs_nats_jetstream"] = round(best["ASYNC_FLUSH"] / nats, 2)
    rabbit = peers.get("rabbitmq_quorum", {}).get("append_msgs_s")
    if rabbit and best.get("SYNC_FLUSH"):
        ratios["sync_vs_rabbitmq_quorum"] = round(best["SYNC_FLUSH"] / rabbit, 2)
    rabbit_fo = peers.get("rabbitmq_quorum", {}).get("failover_ms_p50")
    if rabbit_fo and fo is not None:
        ratios["failover_p50_vs_rabbitmq"] = round(fo["failover_ms_p50"] / rabbit_fo, 2)
    return ratios


def targets(
    ratios: dict[str, float], rows: list[dict[str, Any]], fo: dict[str, Any] | None
) -> dict[str, bool | None]:
    """Each target: met, missed, or None where there was nothing to compare."""
    kept = [r["of_dledger"] for r in rows if r.get("of_dledger") is not None]
    nats = ratios.get("async_vs_nats_jetstream")
    rabbit = ratios.get("sync_vs_rabbitmq_quorum")
    return {
        "vs_nats_jetstream_2x": None if nats is None else nats >= TARGET_VS_NATS,
        "vs_rabbitmq_quorum_3x": None if rabbit is None else rabbit >= TARGET_VS_RABBITMQ,
        "keeps_60pct_of_dledger": min(kept) >= KEEP_OF_DLEDGER if kept else None,
        "failover_p99_under_500ms": (
            None if fo is None else fo["failover_ms_p99"] < TARGET_FAILOVER_P99_MS
        ),
    }


# --- remoting ---------------------------------------------------------------------------------


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def send_request(queue_id: int, body: bytes) -> RemotingCommand:
    fields = {
        "producerGroup": "bench_pg",
        "topic": TOPIC,
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": QUEUES,
        "queueId": queue_id,
        "sysFlag": 0,
        "bornTimestamp": int(time.time() * 1000),
        "flag": 0,
        "properties": "",
        "reconsumeTimes": 0,
        "unitMode": "false",
    }
    return RemotingCommand.request(
        RequestCode.SEND_MESSAGE, {k: str(v) for k, v in fields.items()}, body
    )


def pull_request(queue_id: int, offset: int) -> RemotingCommand:
    fields = {
        "consumerGroup": "bench_cg",
        "topic": TOPIC,
        "queueId": queue_id,
        "queueOffset": offset,
        "maxMsgNums": PULL_BATCH,
        "sysFlag": 4,  # subscription given; no commit offset, no suspend
        "commitOffset": 0,
        "suspendTimeoutMillis": 0,
        "subscription": "*",
        "subVersion": 0,
    }
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, {k: str(v) for k, v in fields.items()})


async def create_topic(address: str, topic: str = TOPIC) -> None:
    fields = {"topic": topic, "readQueueNums": QUEUES, "writeQueueNums": QUEUES, "perm": 6}
    request = RemotingCommand.request(
        RequestCode.UPDATE_AND_CREATE_TOPIC, {k: str(v) for k, v in fields.items()}
    )
    async with open_connection(*host_port(address)) as conn:
        response = await conn.request(request, timeout_s=10.0)
    if response.code != ResponseCode.SUCCESS:
        raise RuntimeError(f"UPDATE_AND_CREATE_TOPIC: {response.code} {response.remark}")


async def leader_address(cluster: LocalCluster, not_: str | None = None) -> str:
    with trio.fail_after(FAILOVER_WAIT_S):
        while True:
            address = await trio.to_thread.run_sync(cluster.leader_of, GROUP)
            if address is not None and address != not_:
                return address
            await trio.sleep(0.02)


def raft_terms(cluster: LocalCluster) -> list[int]:
    tables = [cluster.runtime_info(b.name) for b in cluster.replicas_of(GROUP)]
    return [int(t["raftTerm"]) for t in tables if t]


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) process `pid` has used so far, from /proc/<pid>/stat."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_snapshot(cluster: LocalCluster) -> dict[str, float]:
    """CPU seconds used so far by this process (the client) and by each of the cluster's."""
    found = {"client": time.process_time()}
    for name, pid in cluster.pids().items():
        used = process_cpu_s(pid)
        if used is not None:
            found[name] = used
    return found


def cpu_per_message(
    before: dict[str, float], after: dict[str, float], acked: int, leader: str, load_s: float
) -> dict[str, Any]:
    """What each process spent per acknowledged message, in us, from two cpu_snapshot()s and
    the load processes' own CPU (`load_s`): on a host whose cores they all share, the total
    decides the rate. "client" is this process (idle while the load processes send)."""
    acked = max(1, acked)
    spent = {n: (after[n] - before[n]) * 1e6 / acked for n in after if n in before}
    spent["load"] = load_s * 1e6 / acked
    return {
        "load": round(spent["load"], 1),
        "leader": round(spent.get(leader, 0.0), 1),
        "followers": sorted(
            round(v, 1) for n, v in spent.items() if n.startswith(GROUP) and n != leader
        ),
        "total": round(sum(spent.values()), 1),
    }


LEADER_COUNTERS = ("sendRequests", "sendAppends", "raftProposals", "raftProposedEntries")


def leader_counters(cluster: LocalCluster, address: str) -> dict[str, int]:
    """The send and raft counters of GET_BROKER_RUNTIME_INFO at `address` (empty if it does not
    answer, or has none of them)."""
    replica = cluster.replica_at(address)
    table = cluster.runtime_info(replica.name) if replica is not None else None
    return {k: int(table[k]) for k in LEADER_COUNTERS if table is not None and k in table}


def batching_per_request(before: dict[str, int], after: dict[str, int]) -> dict[str, float | None]:
    """How the leader grouped a load, from two leader_counters(): send requests per append (the
    requests one read of a connection delivered together) and entries per raft proposal (the
    appends of every connection one raft round carried); None where a counter is missing."""

    def ratio(top: str, bottom: str) -> float | None:
        if not all(k in before and k in after for k in (top, bottom)):
            return None
        done = after[bottom] - before[bottom]
        return round((after[top] - before[top]) / done, 2) if done > 0 else None

    return {
        "requests_per_append": ratio("sendRequests", "sendAppends"),
        "entries_per_proposal": ratio("raftProposedEntries", "raftProposals"),
    }


# --- a load-generator process: python -m bench.broker --worker '{"address": ...}' -------------


async def worker(spec: dict[str, Any]) -> dict[str, Any]:
    """A load process: its senders over a few connections. A sender sends its next message as
    soon as its last one is acknowledged, as a RocketMQ producer's thread calling send() does;
    here each connection carries its senders' requests itself (`_pipeline`), one task per
    connection, writing the requests that the responses of one read make due in one write, so
    that the load process costs the shared cores little (bench.broker's docstring)."""
    body = os.urandom(BODY_BYTES)
    connections = spec["connections"]
    counts = {"acked": 0, "errors": 0}
    latencies: list[float] = []
    error_codes: dict[str, int] = {}
    async with AsyncExitStack() as stack:
        streams = [
            await stack.enter_async_context(await trio.open_tcp_stream(*host_port(spec["address"])))
            for _ in range(connections)
        ]
        warm_up = {"acked": 0, "errors": 0}
        warm_up_codes: dict[str, int] = {}
        with trio.fail_after(WORKER_READY_S):
            for i, stream in enumerate(streams):  # every queue: its files exist before "go"
                queue_ids = [(i + n) % QUEUES for n in range(WORKER_WARMUP_SENDS)]
                await _pipeline(stream, queue_ids, body, 0.0, warm_up, [], warm_up_codes)
        if warm_up["errors"]:
            raise RuntimeError(f"warm-up sends failed: {warm_up_codes}")
        print("ready", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)  # "go", once every process is ready
        stop_at = time.perf_counter() + spec["seconds"]
        t_start = time.time()
        cpu_start = time.process_time()
        async with trio.open_nursery() as nursery:
            for c, stream in enumerate(streams):
                queue_ids = [
                    (spec["first"] + k) % QUEUES for k in range(c, spec["senders"], connections)
                ]
                nursery.start_soon(
                    _pipeline, stream, queue_ids, body, stop_at, counts, latencies, error_codes
                )
        t_end = time.time()
        cpu_s = time.process_time() - cpu_start
    return {
        "acked": counts["acked"],
        "errors": counts["errors"],
        "cpu_s": cpu_s,
        "error_codes": error_codes,
        "t_start": t_start,
        "t_end": t_end,
        "latencies_ms": [round(x * 1000, 3) for x in latencies],
    }


class _Requests:
    """A load process's SEND_MESSAGE frames, made from one template per queue: only the opaque
    and bornTimestamp differ from one to the next, written into the header's JSON text
    (`encode(send_request(...))` made each from scratch: ~3 us a message, a sixth of a load
    process's CPU)."""

    OPAQUE, BORN = 2_000_000_001, 9_000_000_000_001  # placeholders found in the template

    def __init__(self, body: bytes) -> None:
        self._body = body
        self._templates: dict[int, bytes] = {}

    def frame(self, queue_id: int, opaque: int) -> bytes:
        template = self._templates.get(queue_id)
        if template is None:
            template = self._templates[queue_id] = self._template(queue_id)
        header = template % (opaque, int(time.time() * 1000))
        return json_frame(header, self._body)

    def _template(self, queue_id: int) -> bytes:
        command = send_request(queue_id, b"").with_opaque(self.OPAQUE)
        command = command._replace(
            ext_fields={**command.ext_fields, "bornTimestamp": str(self.BORN)}
        )
        header = encode_header(command).replace(b"%", b"%%")
        for placeholder in (self.OPAQUE, self.BORN):
            assert header.count(str(placeholder).encode()) == 1, header
        return header.replace(str(self.OPAQUE).encode(), b"%d").replace(
            str(self.BORN).encode(), b"%d"
        )


# what a load process reads of an answer's JSON header (our broker's, or any JSON header)
_CODE = re.compile(rb'"code":(-?\d+)')
_OPAQUE = re.compile(rb'"opaque":(-?\d+)')


def _answers(buffer: bytearray) -> list[tuple[int, int]]:
    """(opaque, code) of every whole JSON-header frame at the front of `buffer`, taken out of
    it; a frame of another serialization or without both fields raises RemotingError."""
    found = []
    at = 0
    while len(buffer) - at >= 8:
        length, mark = PREFIX.unpack_from(buffer, at)  # length, header mark
        if len(buffer) - at < 4 + length:
            break
        if mark >> 24 != 0:
            raise RemotingError(f"an answer with header serialization {mark >> 24}, not JSON")
        header = bytes(buffer[at + 8 : at + 8 + (mark & 0xFFFFFF)])
        code, opaque = _CODE.search(header), _OPAQUE.search(header)
        if code is None or opaque is None:
            raise RemotingError(f"an answer without code or opaque: {header[:200]!r}")
        found.append((int(opaque.group(1)), int(code.group(1))))
        at += 4 + length
    del buffer[:at]
    return found


async def _pipeline(
    stream: trio.SocketStream,
    queue_ids: list[int],
    body: bytes,
    stop_at: float,
    counts: dict[str, int],
    latencies: list[float],
    error_codes: dict[str, int],
) -> None:
    """Senders sharing one connection, one per entry of `queue_ids`: each has one SEND_MESSAGE
    outstanding until `stop_at`; the connection's answers are matched by opaque. A sender whose
    answer does not come within SEND_TIMEOUT_S ends the connection's load with an error."""
    frames = _Requests(body)
    buffer = bytearray()
    waiting: dict[int, tuple[int, float]] = {}  # opaque -> (sender, sent at)
    opaques = itertools.count(1)

    def request(sender: int) -> bytes:
        opaque = next(opaques)
        waiting[opaque] = (sender, time.perf_counter())
        return frames.frame(queue_ids[sender], opaque)

    try:
        await stream.send_all(b"".join(request(k) for k in range(len(queue_ids))))
        while waiting:
            with trio.fail_after(SEND_TIMEOUT_S):
                data = await receive_some(stream, remoting_limits.RECEIVE_BYTES)
            if not data:
                raise trio.BrokenResourceError("the broker closed the connection")
            buffer += data
            now = time.perf_counter()
            due = []
            for opaque, code in _answers(buffer):
                sender, sent_at = waiting.pop(opaque)
                if code == ResponseCode.SUCCESS:
                    latencies.append(now - sent_at)
                    counts["acked"] += 1
                else:
                    counts["errors"] += 1
                    error_codes[str(code)] = error_codes.get(str(code), 0) + 1
                if now < stop_at:
                    due.append(request(sender))
            if due:
                await stream.send_all(b"".join(due))
    except NET_ERRORS as err:
        counts["errors"] += len(waiting)
        name = type(err).__name__
        error_codes[name] = error_codes.get(name, 0) + len(waiting)


def run_workers(
    address: str, senders: int, seconds: float, cluster: LocalCluster
) -> tuple[
    list[dict[str, Any]],
    float | None,
    tuple[dict[str, float], dict[str, float]],
    dict[str, float | None],
]:
    """Start the load processes, let them connect and warm up, start them together; their
    reports, the cpu steal over the load, the cluster's cpu_snapshot()s at its start and
    end, and how the leader batched the load (batching_per_request)."""
    procs: list[subprocess.Popen[str]] = []
    first = 0
    try:
        for n, connections in plan(senders):
            spec = {"address": address, "senders": n, "connections": connections,
                    "seconds": seconds, "first": first}  # fmt: skip
            first += n
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "bench.broker", "--worker", json.dumps(spec)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    cwd=REPO,
                )
            )
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()  # the worker gives up by itself after WORKER_READY_S
            if line.strip() != "ready":
                raise RuntimeError(f"a load process did not get ready: {line!r}")
        ticks = cpu_ticks()
        cpu_before = cpu_snapshot(cluster)
        counters_before = leader_counters(cluster, address)
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        reports = []
        for p in procs:
            out, _ = p.communicate(timeout=seconds + SEND_TIMEOUT_S + 60)
            if p.returncode != 0:
                raise RuntimeError(f"a load process exited {p.returncode}")
            reports.append(json.loads(out.strip().splitlines()[-1]))
        cpu_after = cpu_snapshot(cluster)
        batching = batching_per_request(counters_before, leader_counters(cluster, address))
        return reports, steal_pct(ticks, cpu_ticks()), (cpu_before, cpu_after), batching
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


# --- pulls ------------------------------------------------------------------------------------


async def pull_all(address: str) -> dict[str, Any]:
    """Pull every queue from offset 0 to its max offset, PULL_BATCH a pull, a task per queue
    over PULL_CONNECTIONS connections; messages/s."""
    pulled = errors = 0
    async with AsyncExitStack() as stack:
        conns = [
            await stack.enter_async_context(open_connection(*host_port(address)))
            for _ in range(PULL_CONNECTIONS)
        ]
        ends = []
        for q in range(QUEUES):
            request = RemotingCommand.request(
                RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": str(q)}
            )
            response = await conns[0].request(request, timeout_s=10.0)
            ends.append(int(response.ext_fields.get("offset", "0")))

        async def drain(q: int) -> None:
            nonlocal pulled, errors
            conn = conns[q % len(conns)]
            offset = 0
            while offset < ends[q]:
                response = await conn.request(pull_request(q, offset), timeout_s=30.0)
                if response.code != ResponseCode.SUCCESS:
                    errors += 1
                    if response.code != ResponseCode.PULL_RETRY_IMMEDIATELY:
                        return
                    continue
                following = int(response.ext_fields["nextBeginOffset"])
                pulled += following - offset
                offset = following

        t0 = time.perf_counter()
        ticks = cpu_ticks()
        with trio.move_on_after(PULL_DEADLINE_S):
            async with trio.open_nursery() as nursery:
                for q in range(QUEUES):
                    nursery.start_soon(drain, q)
        elapsed = time.perf_counter() - t0
    return {
        "pulled": pulled,
        "expected": sum(ends),
        "pull_errors": errors,
        "pull_msgs_per_s": round(pulled / elapsed) if elapsed > 0 else 0,
        "pull_cpu_steal_pct": steal_pct(ticks, cpu_ticks()),
    }


def load(cluster: LocalCluster, senders: int, seconds: float) -> dict[str, Any]:
    address = trio.run(leader_address, cluster)
    trio.run(create_topic, address)
    terms_before = raft_terms(cluster)
    load_before = os.getloadavg()[0]
    leader = cluster.replica_at(address)
    reports, steal, (cpu_before, cpu_after), batching = run_workers(
        address, senders, seconds, cluster
    )
    load_after = os.getloadavg()[0]
    terms_after = raft_terms(cluster)
    row = {"senders": senders, "processes": len(reports), **combine(reports)}
    row["elections_during_load"] = max(terms_after) - max(terms_before)
    row["cpu_us_per_msg"] = cpu_per_message(
        cpu_before,
        cpu_after,
        row["acked"],
        leader.name if leader is not None else "",
        sum(w.get("cpu_s", 0.0) for w in reports),
    )
    row["leader_batching"] = batching
    row["cpu_steal_pct"] = steal
    # steal misses other work inside this VM (other agents, a soak): its run queue shows it
    row["loadavg_1m"] = [round(load_before, 1), round(load_after, 1)]
    row.update(trio.run(pull_all, address))
    return row


# --- failover ---------------------------------------------------------------------------------


async def route_master(cluster: LocalCluster) -> str | None:
    """brokerAddrs["0"] of the topic's route, from the first name server that answers."""
    for ns in cluster.namesrvs.values():
        request = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPIC})
        body = None
        try:  # errors inside the connection's block come out in an ExceptionGroup
            with trio.fail_after(0.5):
                async with open_connection(ns.host, ns.port, connect_timeout_s=0.5) as conn:
                    response = await conn.request(request, timeout_s=0.5)
            if response.code == ResponseCode.SUCCESS:
                body = response.body
        except* NET_ERRORS:
            pass
        try:
            route = json.loads(body) if body else {}
        except ValueError:
            continue
        for data in route.get("brokerDatas", []):
            master = (data.get("brokerAddrs") or {}).get("0")
            if data.get("brokerName") == GROUP and isinstance(master, str):
                return master
    return None


def next_target(failed: str, master: str | None, replicas: list[str]) -> str:
    """Where a sender goes after `failed` let it down: the route's master if that is another
    broker, else the replica after `failed` (any replica forwards writes to the leader)."""
    if master is not None and master != failed:
        return master
    i = replicas.index(failed) if failed in replicas else -1
    return replicas[(i + 1) % len(replicas)]


async def rejoined(cluster: LocalCluster, name: str) -> None:
    """Until the restarted replica follows a leader and has applied the leader's commit index."""
    with trio.fail_after(REJOIN_WAIT_S):
        while True:
            mine = await trio.to_thread.run_sync(cluster.runtime_info, name)
            if mine and mine.get("raftRole") == "follower" and mine.get("raftLeader"):
                lead_name = f"{GROUP}/{mine['raftLeader']}"
                lead = await trio.to_thread.run_sync(cluster.runtime_info, lead_name)
                mine = await trio.to_thread.run_sync(cluster.runtime_info, name)
                if lead and mine and int(mine["appliedIndex"]) >= int(lead["commitIndex"]):
                    return
            await trio.sleep(0.05)


async def failover(cluster: LocalCluster, kills: int) -> dict[str, Any]:
    replicas = cluster.broker_addresses(GROUP)
    await create_topic(await leader_address(cluster))
    body = os.urandom(BODY_BYTES)
    # (send invoked, SEND_OK): a figure counts the first send invoked after the kill (one in
    # flight may still be answered by the dying leader, which says nothing of the failover)
    acks: list[tuple[float, float]] = []
    times_ms: list[float] = []

    async def sender(k: int) -> None:
        target = await leader_address(cluster)
        while True:
            try:
                async with open_connection(*host_port(target), connect_timeout_s=0.5) as conn:
                    while True:
                        request = send_request(k % QUEUES, body)
                        invoked = time.monotonic()
                        response = await conn.request(request, FAILOVER_SEND_TIMEOUT_S)
                        if response.code != ResponseCode.SUCCESS:
                            break
                        acks.append((invoked, time.monotonic()))
            except* NET_ERRORS:  # from inside the connection's block: in an ExceptionGroup
                pass
            target = next_target(target, await route_master(cluster), replicas)

    async with trio.open_nursery() as nursery:
        for k in range(FAILOVER_SENDERS):
            nursery.start_soon(sender, k)
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
            cluster.start(leader.name)
            await rejoined(cluster, leader.name)
        nursery.cancel_scope.cancel()
    return {
        "kills": kills,
        "senders": FAILOVER_SENDERS,
        "failover_ms_p50": round(statistics.median(times_ms), 1),
        "failover_ms_p99": round(percentile(times_ms, 99), 1),
        "failover_ms_max": round(max(times_ms), 1),
        "failover_ms_all": [round(t, 1) for t in times_ms],
    }


# --- clusters and the report ------------------------------------------------------------------


def broker_args(policy: str) -> list[str]:
    return [
        "--flush", policy,
        "--segment-bytes", str(SEGMENT_BYTES),
        "--log-level", os.environ.get("BENCH_LOG_LEVEL", "WARNING"),
    ]  # fmt: skip


def log_problems(cluster: LocalCluster) -> dict[str, dict[str, Any]]:
    """ERROR and Traceback lines in each process's log (how many, the first few): anything the
    load made a broker say. The logs go with the temporary directory."""
    found: dict[str, dict[str, Any]] = {}
    for name in cluster.processes:
        text = cluster.log_text(name).splitlines()
        hits = [i for i, line in enumerate(text) if "ERROR" in line or "Traceback" in line]
        if hits:  # the first one with what follows it: a traceback's last lines say what
            excerpt = [line[:300] for line in text[hits[0] : hits[0] + LOG_EXCERPT_LINES]]
            found[name] = {"count": len(hits), "first": excerpt}
    return found


def run_cluster(
    root: Path, keep_logs: Path | None, policy: str, body: Any, *args: Any
) -> dict[str, Any]:
    """A fresh cluster for one row; `body(cluster, *args)`'s result with the logs' ERROR lines;
    the logs copied under `keep_logs`/<policy>-<body>-<first arg> if given."""
    cluster = LocalCluster(
        root / policy / str(time.monotonic_ns()),
        namesrvs=1,
        groups=(GROUP,),
        replicas=3,
        extra_broker_args=broker_args(policy),
    )
    cluster.start_all()
    try:
        cluster.wait_serving()
        result = body(cluster, *args)
    finally:
        cluster.stop_all()
        if keep_logs is not None:
            where = keep_logs / f"{policy}-{body.__name__}-{args[0]}"
            shutil.copytree(cluster.root / "logs", where, dirs_exist_ok=True)
    result["log_problems"] = log_problems(cluster)
    # The row's files go, and the disk is quiet, before the next row (or a peer) starts: the
    # pages a row left dirty (an ASYNC_FLUSH row's broker files) were written back during the
    # rows after it, and a SYNC_FLUSH row at 128 senders after the ASYNC rows ran at 29k
    # msgs/s against 35.5k after SYNC rows (docs/decisions.md). Deleted files need no
    # writeback; the sync commits the deletion (and its discards) now.
    shutil.rmtree(cluster.root, ignore_errors=True)
    os.sync()
    return result


def run_failover(cluster: LocalCluster, kills: int) -> dict[str, Any]:
    return trio.run(failover, cluster, kills)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.broker", description=__doc__)
    p.add_argument("--quick", action="store_true", help="3 s per load, 5 kills")
    p.add_argument("--seconds", type=float)
    p.add_argument("--kills", type=int, help="leader kills (default 20, 5 with --quick; 0: none)")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--senders", default=",".join(map(str, SENDER_COUNTS)))
    p.add_argument("--out", type=Path, default=Path("bench/results/broker.json"))
    p.add_argument(
        "--live-peers",
        default="",
        metavar="NAMES",
        help=f"comma list of peers to run in this session, before and after our loads: {', '.join(LIVE_PEERS)}",
    )
    p.add_argument(
        "--dledger-too",
        action="store_true",
        help="after each row, bench.dledger's load for the same policy and count in this session "
        "(a loaded host makes the stored bench/results/dledger.json figures incomparable)",
    )
    p.add_argument("--keep-logs", type=Path, metavar="DIR", help="copy every process log here")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # a load-generator process's spec
    args = p.parse_args(argv)
    args.seconds = args.seconds or (3.0 if args.quick else 10.0)
    if args.seconds <= 0:
        p.error("--seconds must be > 0")
    args.kills = args.kills if args.kills is not None else (5 if args.quick else 20)
    if args.kills < 0:
        p.error("--kills must be >= 0")
    args.live = [name for name in args.live_peers.split(",") if name]
    unknown = [name for name in args.live if name not in LIVE_PEERS]
    if unknown:
        p.error(f"--live-peers: unknown {', '.join(unknown)} (known: {', '.join(LIVE_PEERS)})")
    args.policies = [x for x in args.policies.split(",") if x]  # "": failover only
    bad = [x for x in args.policies if x not in POLICIES]
    if bad:
        p.error(f"--policies: unknown {', '.join(bad)} (known: {', '.join(POLICIES)})")
    try:
        args.senders = [int(c) for c in args.senders.split(",")]
    except ValueError:
        p.error("--senders: a comma list of counts")
    if any(c < 1 for c in args.senders):
        p.error("--senders: every count >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(trio.run(worker, json.loads(args.worker))), flush=True)
        return 0
    dledger = dledger_rows(
        json.loads(DLEDGER_RESULTS.read_text()) if DLEDGER_RESULTS.exists() else None
    )
    results: dict[str, Any] = {"throughput": [], "failover": None}
    live_runs: dict[str, list[dict[str, Any]]] = {name: [] for name in args.live}
    with tempfile.TemporaryDirectory(prefix="bench-broker-") as tmp:
        root = Path(tmp)
        for name in args.live:
            live_runs[name].append(run_peer_or_record(name, root / f"{name}-before.json"))
        print(
            f"{'flush':<12} {'senders':>7} {'procs':>5} {'msgs/s':>8} {'of dledger':>10} {'p50 ms':>8} "
            f"{'p99 ms':>8} {'errors':>6} {'elections':>9} {'steal %':>7} {'load':>5} {'pull msgs/s':>11}"
        )
        for policy in args.policies:
            for senders in args.senders:
                r = run_cluster(root, args.keep_logs, policy, load, senders, args.seconds)
                r["flush"] = policy
                r["of_dledger"] = of_dledger(r["msgs_per_s"], policy, senders, dledger)
                if args.dledger_too:
                    base = bench_dledger.run_group(
                        root, policy, bench_dledger.load, senders, args.seconds
                    )
                    r["dledger_same_session"] = base
                    same = {(policy, senders): base["entries_per_s"]}
                    r["of_dledger"] = of_dledger(r["msgs_per_s"], policy, senders, same)
                results["throughput"].append(r)
                print(
                    f"{policy:<12} {senders:>7} {r['processes']:>5} {r['msgs_per_s']:>8,} {r['of_dledger']!s:>10} "
                    f"{r['latency_p50_ms']:>8} {r['latency_p99_ms']:>8} {r['errors']:>6} "
                    f"{r['elections_during_load']:>9} {r['cpu_steal_pct']!s:>7} {r['loadavg_1m'][1]:>5} {r['pull_msgs_per_s']:>11,}",
                    flush=True,
                )
                print(f"  cpu us per acked message: {r['cpu_us_per_msg']}", flush=True)
                if r.get("leader_batching"):
                    print(f"  leader batching: {r['leader_batching']}", flush=True)
                if r["log_problems"]:
                    counts = {k: v["count"] for k, v in r["log_problems"].items()}
                    print(f"  ERROR lines in process logs: {counts}", flush=True)
        for name in args.live:
            live_runs[name].append(run_peer_or_record(name, root / f"{name}-after.json"))
        if args.kills:
            fo = run_cluster(root, args.keep_logs, "SYNC_FLUSH", run_failover, args.kills)
            results["failover"] = fo
            print(
                f"failover (kill -9 of the leader -> the sender's next SEND_OK), {args.kills} kills: "
                f"p50 {fo['failover_ms_p50']} ms, p99 {fo['failover_ms_p99']} ms, max {fo['failover_ms_max']} ms"
            )
    peers = peer_figures()
    best = {
        pol: max((r["msgs_per_s"] for r in results["throughput"] if r["flush"] == pol), default=0)
        for pol in args.policies
    }
    ratios = ratios_to(peers, best, results["failover"])
    live_peers = {name: live_summary(runs) for name, runs in live_runs.items()}
    live_ratios = ratios_to(live_peers, best, results["failover"])
    met = targets(live_ratios or ratios, results["throughput"], results["failover"])
    met_source = {
        "peers": "live, this session" if live_ratios else "stored ../shared/bench/results",
        "dledger": "this session" if args.dledger_too else str(DLEDGER_RESULTS.name),
    }
    for name, summary in live_peers.items():
        shown = [
            f"{r['append_msgs_s']:,.0f}" if r.get("append_msgs_s") else "failed"
            for r in summary["runs"]
        ]
        print(f"peer {name} in this session: {shown[0]} before, {shown[-1]} after our loads")
    report = {
        "what": "broker",
        "replicas": 3,
        "body_bytes": BODY_BYTES,
        "quick": args.quick,
        "seconds_per_load": args.seconds,
        **results,
        "peers": peers,
        "ratios": ratios,
        "live_peers": live_peers,
        "live_ratios": live_ratios,
        "targets": met,
        "targets_compared_with": met_source,
        "cpu_count": os.cpu_count(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "method": "1 name server and 3 `python -m broker` replicas of one group on 127.0.0.1 (default "
        "timeouts, 256 MiB log segments), a fresh cluster per row; a topic of 8 queues; N senders in "
        "1 (N=1), 2 (N<=16) or 4 load processes, each process one connection to the leader (before "
        "session 20: up to 4), "
        "sending 1 KiB bodies with SEND_MESSAGE back to back, each sender its next as soon as its "
        "last is acknowledged (one task per connection carries its senders, pipelined: session 19; "
        "before, a trio task per sender through remoting.Connection.request); msgs/s = SEND_OK responses "
        "/ wall time from the first process's start to the last one's end. Pull: every queue read "
        "back from the leader with PULL_MESSAGE, 32 a pull, a task per queue. Failover (SYNC_FLUSH): "
        "4 senders; kill -9 of the leader; time to the first SEND_OK after the kill; a sender that "
        "loses its broker asks the name server for the route, else tries the next replica. "
        "of_dledger: msgs/s over bench/results/dledger.json's entries/s for the same policy and "
        "count (with --dledger-too: bench.dledger's load run just before the row, this session). cpu_us_per_msg: CPU per acknowledged message of the load processes (their own measure of the load), the leader, each follower and all together (the name server and this process too): where the time goes. cpu_steal_pct as in bench.dledger: compare rows with low steal; loadavg_1m (before, "
        "after the load) shows other work inside this VM, which steal does not.",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print("ratios to the stored peer figures:", ratios)
    if live_ratios:
        print("ratios to the peers run in this session:", live_ratios)
    print("targets:", met, "compared with:", met_source)
    return 0


if __name__ == "__main__":
    sys.exit(main())
