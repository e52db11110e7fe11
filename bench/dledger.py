"""Throughput, latency and failover of a 3-replica dledger-server group on this machine.

    python -m bench.dledger [--quick] [--out bench/results/dledger.json]

For each flush policy (ASYNC_FLUSH, SYNC_FLUSH) and each client count (1, 16, 128): a fresh
group of three server processes on 127.0.0.1, one load process (this one) running that many
concurrent appenders of 1 KiB entries for a fixed time over one client; acked entries/s and
append latency p50/p99. Then failover: appenders running, the leader is killed with -9, and
the time from the kill to the first append acknowledged after it is taken, 20 times (the
victim restarts and catches up between kills). Peer figures come from
../shared/bench/results/*.json and are printed as ratios.

    python -m bench.dledger --live-peers nats_jetstream,etcd

also runs those peers' own scripts (../shared/bench/peers/) in this session, once before our
loads and once after, and reports ratios to the mean of the two runs as `live_ratios`. The
stored figures may come from another hour or another machine; on a shared VM only figures of
one session compare, and the before/after pair shows how far the host moved meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from dledger.client import AppendFailed, ClientError, OutcomeUnknown, open_client
from dledger.localgroup import LocalGroup

ENTRY_BYTES = 1024
CLIENT_COUNTS = (1, 16, 128)
POLICIES = ("ASYNC_FLUSH", "SYNC_FLUSH")
PEERS_DIR = Path(__file__).resolve().parents[2] / "shared" / "bench" / "results"
PEER_SCRIPTS = PEERS_DIR.parent / "peers"
# A live peer run measures throughput and a few failovers: each script's own figures, with the
# counts cut so a run takes about a minute. The key names the script and its stored result.
LIVE_PEERS: dict[str, list[str]] = {
    "nats_jetstream": ["nats_jetstream.py", "--failover-rounds", "3"],
    "etcd": ["etcd_kv.py", "--failovers", "3", "--no-check-perf"],
    "rabbitmq_quorum": ["rabbitmq_quorum.py", "--failovers", "3"],
    "pysyncobj": ["pysyncobj_log.py", "--failovers", "3"],
}
PEER_RUN_TIMEOUT_S = 900.0
PEER_STOP_TIMEOUT_S = 30.0
SEGMENT_BYTES = 256 << 20  # smaller than the 1 GiB default so runs leave less behind


def cpu_ticks() -> list[int]:
    """The machine's cumulative CPU time by state (/proc/stat): user nice system idle iowait
    irq softirq steal ... On a VM, `steal` is time the host gave our vCPUs to someone else."""
    try:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return []


def steal_pct(before: list[int], after: list[int]) -> float | None:
    """Percent of CPU time stolen by the hypervisor between two cpu_ticks() readings: a load
    measured while the host was busy says more about the host than about us."""
    if len(before) < 8 or len(after) < 8:
        return None
    delta = [b - a for a, b in zip(before, after, strict=False)]
    total = sum(delta[:8])
    return round(100 * delta[7] / total, 1) if total else None


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


async def load(group: LocalGroup, clients: int, seconds: float) -> dict[str, Any]:
    body = os.urandom(ENTRY_BYTES)
    latencies: list[float] = []
    acked = errors = 0
    async with open_client(group.peers) as client:
        leader = await client.find_leader(timeout=20)
        assert leader is not None
        for _ in range(50):  # warm up: connections, first segment
            await client.append(body)
        term_before = (await client.status(leader))["term"]
        stop_at = trio.current_time() + seconds

        async def appender() -> None:
            nonlocal acked, errors
            while trio.current_time() < stop_at:
                t0 = time.perf_counter()
                try:
                    await client.append(body, timeout=10)
                except (AppendFailed, OutcomeUnknown):
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - t0)
                acked += 1

        t0 = time.perf_counter()
        ticks = cpu_ticks()
        async with trio.open_nursery() as nursery:
            for _ in range(clients):
                nursery.start_soon(appender)
        elapsed = time.perf_counter() - t0
        steal = steal_pct(ticks, cpu_ticks())
        terms_after = [(await client.status(n))["term"] for n in group.peers]
    return {
        "clients": clients,
        "elections_during_load": max(terms_after) - term_before,  # 0: no flapping
        "acked": acked,
        "errors": errors,
        "seconds": round(elapsed, 2),
        "entries_per_s": round(acked / elapsed),
        "mb_per_s": round(acked * ENTRY_BYTES / elapsed / 1e6, 2),
        "latency_p50_ms": round(percentile(latencies, 50) * 1000, 3),
        "latency_p99_ms": round(percentile(latencies, 99) * 1000, 3),
        "cpu_steal_pct": steal,
    }


async def rejoined(client: Any, node: str, timeout: float = 60.0) -> None:
    """Poll until a restarted replica follows a leader and has caught up with its commit
    index: the next kill must find a full group, or it would measure a lost majority."""
    with trio.fail_after(timeout):
        while True:
            try:
                s = await client.status(node, timeout=1.0)
                leader = s.get("leader")
                if s["role"] == "follower" and leader:
                    lead = await client.status(leader, timeout=1.0)
                    if s["last_index"] >= lead["commit_index"]:
                        return
            except (ClientError, trio.TooSlowError):
                pass
            await trio.sleep(0.05)


async def failover(group: LocalGroup, kills: int, appenders: int) -> dict[str, Any]:
    body = os.urandom(ENTRY_BYTES)
    times_ms: list[float] = []
    async with open_client(group.peers) as client:
        acks: list[float] = []

        async def appender() -> None:
            while True:
                try:
                    await client.append(body, timeout=5)
                    acks.append(time.monotonic())
                except (AppendFailed, OutcomeUnknown):
                    pass

        async with trio.open_nursery() as nursery:
            for _ in range(appenders):
                nursery.start_soon(appender)
            for _ in range(kills):
                leader = await client.find_leader(timeout=20)
                assert leader is not None
                with trio.fail_after(20):  # the group is healthy: appends flow
                    n = len(acks)
                    while len(acks) < n + 50:
                        await trio.sleep(0.01)
                killed_at = time.monotonic()
                group.kill(leader)
                with trio.fail_after(20):
                    while not acks or acks[-1] <= killed_at:
                        await trio.sleep(0.001)
                first = min(t for t in acks[-200:] if t > killed_at)
                times_ms.append((first - killed_at) * 1000)
                group.start(leader)
                await rejoined(client, leader)
            nursery.cancel_scope.cancel()
    return {
        "kills": kills,
        "appenders": appenders,
        "failover_ms_p50": round(statistics.median(times_ms), 1),
        "failover_ms_p99": round(percentile(times_ms, 99), 1),
        "failover_ms_max": round(max(times_ms), 1),
        "failover_ms_all": [round(t, 1) for t in times_ms],
    }


def run_group(root: Path, policy: str, body: Any, *args: Any) -> dict[str, Any]:
    group = LocalGroup(
        root / policy / str(time.monotonic_ns()),
        extra_args=[
            "--flush",
            policy,
            "--segment-bytes",
            str(SEGMENT_BYTES),
            "--log-level",
            os.environ.get("BENCH_LOG_LEVEL", "WARNING"),
        ],
    )
    group.start_all()
    try:
        group.wait_serving()
        return trio.run(body, group, *args)
    finally:
        group.stop_all()


def figures_of(d: dict[str, Any]) -> dict[str, Any]:
    """The comparison figures from one peer result file."""
    return {
        "append_msgs_s": d.get("publish_async_msgs_s") or d.get("append_msgs_s"),
        "failover_ms_p50": d.get("failover_ms_p50"),
        "failover_ms_max": d.get("failover_ms_max"),
        "when": d.get("when"),
    }


def peer_figures() -> dict[str, Any]:
    figures = {}
    for name in LIVE_PEERS:
        path = PEERS_DIR / f"{name}.json"
        if path.exists():
            figures[name] = figures_of(json.loads(path.read_text()))
    return figures


class PeerTimedOut(RuntimeError):
    """A peer's script was stopped at PEER_RUN_TIMEOUT_S."""


def run_peer(name: str, out: Path) -> dict[str, Any]:
    """One run of a peer's own benchmark script, now; its figures. The script installs what it
    is missing (as root) and stops its servers on exit; a failed run raises."""
    script, *options = LIVE_PEERS[name]
    python = shutil.which("python3") or sys.executable
    command = [python, str(PEER_SCRIPTS / script), *options, "--out", str(out)]
    print(f"... peer {name}: {' '.join(command[1:])}", flush=True)
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as script_process:
        timed_out = False
        try:
            output, _ = script_process.communicate(timeout=PEER_RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            timed_out = True
            # SIGTERM first: the peer scripts stop their own servers on it, not on SIGKILL
            script_process.terminate()
            try:
                output, _ = script_process.communicate(timeout=PEER_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                script_process.kill()
                output, _ = script_process.communicate()
    code = script_process.returncode
    if code != 0 or not out.exists():
        tail = "\n".join(output.splitlines()[-15:])
        error = PeerTimedOut if timed_out else RuntimeError
        raise error(f"peer {name} exited {code}:\n{tail}")
    return figures_of(json.loads(out.read_text()))


def run_peer_or_record(name: str, out: Path) -> dict[str, Any]:
    """run_peer, but a failed run is tried once more, and a second failure is recorded (its
    error, no figures) instead of raised: a peer script failing after our loads must not
    throw our figures away. The NATS script's cluster sometimes fails to start ("Duplicate
    Route"); its next start usually works. A run stopped at its deadline is not tried again.
    A figure from a second try says so (`first_try_error`)."""
    try:
        return run_peer(name, out)
    except PeerTimedOut as err:
        print(f"... peer {name} ran past its deadline; recorded, the run goes on", flush=True)
        return {"error": str(err)}
    except RuntimeError as err:
        first_error = str(err)
        print(f"... peer {name} failed; trying it once more:\n{err}", flush=True)
    try:
        figures = run_peer(name, out)
    except RuntimeError as err:
        print(f"... peer {name} failed again; recorded, the run goes on:\n{err}", flush=True)
        return {"error": str(err), "first_try_error": first_error}
    figures["first_try_error"] = first_error
    return figures


def live_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A peer's before and after runs: each figure's mean, and the runs themselves."""
    summary: dict[str, Any] = {"runs": runs}
    for key in ("append_msgs_s", "failover_ms_p50", "failover_ms_max"):
        values = [r[key] for r in runs if r.get(key) is not None]
        summary[key] = round(statistics.fmean(values), 1) if values else None
    return summary


def ratios_to(
    peers: dict[str, Any], best: dict[str, int], fo: dict[str, Any] | None
) -> dict[str, float]:
    """Our best acked entries/s per policy, and failover p50, against the peers' figures."""
    ratios = {}
    nats = peers.get("nats_jetstream", {}).get("append_msgs_s")
    if nats and "ASYNC_FLUSH" in best:
        ratios["async_vs_nats_jetstream"] = round(best["ASYNC_FLUSH"] / nats, 2)
    etcd = peers.get("etcd", {}).get("append_msgs_s")
    if etcd and "SYNC_FLUSH" in best:
        ratios["sync_vs_etcd"] = round(best["SYNC_FLUSH"] / etcd, 2)
    rabbit = peers.get("rabbitmq_quorum", {}).get("failover_ms_p50")
    if rabbit and fo is not None:
        ratios["failover_p50_vs_rabbitmq"] = round(fo["failover_ms_p50"] / rabbit, 2)
    return ratios


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.dledger", description=__doc__)
    p.add_argument("--quick", action="store_true", help="3 s per load, 5 kills")
    p.add_argument("--seconds", type=float)
    p.add_argument("--kills", type=int, help="leader kills (default 20, 5 with --quick; 0: none)")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--clients", default=",".join(map(str, CLIENT_COUNTS)))
    p.add_argument("--out", type=Path, default=Path("bench/results/dledger.json"))
    p.add_argument(
        "--live-peers",
        default="",
        metavar="NAMES",
        help=f"comma list of peers to run in this session, before and after our loads: {', '.join(LIVE_PEERS)}",
    )
    args = p.parse_args(argv)
    seconds = args.seconds or (3.0 if args.quick else 10.0)
    kills = args.kills if args.kills is not None else (5 if args.quick else 20)
    if kills < 0:
        p.error("--kills must be >= 0")
    live = [name for name in args.live_peers.split(",") if name]
    unknown = [name for name in live if name not in LIVE_PEERS]
    if unknown:
        p.error(f"--live-peers: unknown {', '.join(unknown)} (known: {', '.join(LIVE_PEERS)})")
    policies = args.policies.split(",")
    client_counts = [int(c) for c in args.clients.split(",")]
    results: dict[str, Any] = {"throughput": [], "failover": None}
    live_runs: dict[str, list[dict[str, Any]]] = {name: [] for name in live}
    with tempfile.TemporaryDirectory(prefix="bench-dledger-") as tmp:
        root = Path(tmp)
        for name in live:
            live_runs[name].append(run_peer_or_record(name, root / f"{name}-before.json"))
        print(
            f"{'flush':<12} {'clients':>7} {'entries/s':>10} {'MB/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'elections':>9} {'steal %':>7}"
        )
        for policy in policies:
            for clients in client_counts:
                r = run_group(root, policy, load, clients, seconds)
                r["flush"] = policy
                results["throughput"].append(r)
                print(
                    f"{policy:<12} {clients:>7} {r['entries_per_s']:>10,} {r['mb_per_s']:>7} {r['latency_p50_ms']:>8} {r['latency_p99_ms']:>8} {r['elections_during_load']:>9} {r['cpu_steal_pct']!s:>7}"
                )
        for name in live:
            live_runs[name].append(run_peer_or_record(name, root / f"{name}-after.json"))
        if kills:
            fo = run_group(root, "SYNC_FLUSH", failover, kills, 16)
            results["failover"] = fo
            print(
                f"failover (kill -9 of the leader -> first ack after it), {kills} kills: "
                f"p50 {fo['failover_ms_p50']} ms, p99 {fo['failover_ms_p99']} ms, max {fo['failover_ms_max']} ms"
            )
    peers = peer_figures()
    best = {
        pol: max(
            (r["entries_per_s"] for r in results["throughput"] if r["flush"] == pol), default=0
        )
        for pol in policies
    }
    ratios = ratios_to(peers, best, results["failover"])
    live_peers = {name: live_summary(runs) for name, runs in live_runs.items()}
    live_ratios = ratios_to(live_peers, best, results["failover"])
    for name, summary in live_peers.items():
        before, after = (r["append_msgs_s"] for r in summary["runs"])
        print(f"peer {name} in this session: {before:,.0f} before, {after:,.0f} after our loads")
    report = {
        "what": "dledger",
        "replicas": 3,
        "entry_bytes": ENTRY_BYTES,
        "quick": args.quick,
        "seconds_per_load": seconds,
        **results,
        "peers": peers,
        "ratios": ratios,
        "live_peers": live_peers,
        "live_ratios": live_ratios,
        "cpu_count": os.cpu_count(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "method": "3 dledger-server processes on 127.0.0.1 (default timeouts, 256 MiB segments), a fresh "
        "group per row; one load process with N trio tasks sharing one DLedgerClient, each appending 1 KiB "
        "entries back to back; entries/s = acknowledged appends / wall time. Failover: 16 appenders, "
        "kill -9 of the leader, time to the first append acknowledged after the kill; the victim restarts. "
        "cpu_steal_pct: share of CPU time the hypervisor gave to other guests during the load; "
        "on this shared 2-vCPU VM it ranges 0-35 % and throughput falls with it, so compare rows "
        "with low steal.",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print("ratios to the stored peer figures:", ratios)
    if live_ratios:
        print("ratios to the peers run in this session:", live_ratios)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
