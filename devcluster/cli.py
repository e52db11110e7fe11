"""dledger-dev: a whole local cluster under ./data for trying things out.

    dledger-dev up [--foreground]   2 name servers (9876, 9877) and broker groups broker-a and
                                    broker-b of 3 replicas each (clients 10911-10913 and
                                    11011-11013, Raft 40911-40913 and 41011-41013)
    dledger-dev up --dledger        milestone 1 instead: one dledger-server group "g" (40911-40913)
    dledger-dev status              one status table
    dledger-dev kill broker-a leader|n1   kill -9 one replica, to watch a failover
    dledger-dev down                stop what `up` started (by the pids it recorded)

`up` returns once every group has a master on every name server; `up --foreground` (what
./dev.sh up runs) then keeps a status table on screen and stops everything on Ctrl-C. Without
it, the processes keep running in the background until `down`. `--base-port P` puts every
port at P, P+1, ... instead.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from broker.localcluster import (
    BROKER_COMMAND,
    BrokerReplica,
    ClusterStatus,
    LocalCluster,
    cluster_status,
    master_of,
)
from dledger.cli import format_status
from dledger.client import ClientError, open_client
from dledger.config import Address, parse_peers
from dledger.localgroup import LocalGroup
from dledger.processes import SOURCE_ROOT

STATE_FILE = "dev.json"
REFRESH_S = 1.0
UP_TIMEOUT_S = 60.0  # until every group has a master on every name server
NAMESRV_PORT = 9876  # RocketMQ's
BROKER_CLIENT_PORT = 10911  # RocketMQ's; group i replica j listens on 10911 + 100 i + j
BROKER_PEER_PORT = 40911  # Raft; group i replica j on 40911 + 100 i + j
GROUP_PORT_STRIDE = 100
BROKER_MAIN = SOURCE_ROOT / "broker" / "__main__.py"  # what `python -m broker` runs


def state_path(data: Path) -> Path:
    return data / STATE_FILE


def read_state(data: Path) -> dict[str, Any] | None:
    path = state_path(data)
    return json.loads(path.read_text()) if path.exists() else None


def pid_alive(pid: int, marker: str) -> bool:
    """The pid runs and is still ours (its command line names our store): pids get reused."""
    try:
        cmdline = (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return False
    return marker in cmdline


async def statuses(peers: dict[str, Address]) -> list[dict[str, Any]]:
    rows = []
    async with open_client(peers) as client:
        for node in peers:
            try:
                rows.append(await client.status(node, timeout=1.0))
            except (ClientError, trio.TooSlowError) as err:
                rows.append({"node": node, "role": "down", "error": str(err) or "timeout"})
    return rows


def table(peers: dict[str, Address]) -> str:
    rows = trio.run(statuses, peers)
    lines = [format_status(rows)]
    leader = next((r for r in rows if r.get("role") == "leader"), None)
    if leader:
        lags = ", ".join(
            f"{p}: lag {s['lag']}"
            for p, s in leader.get("peers", {}).items()
            if s.get("lag") is not None
        )
        lines.append(f"leader {leader['node']} at {peers[leader['node']]}; followers {lags}")
    else:
        lines.append("no leader")
    return "\n".join(lines)


def already_running(data: Path) -> bool:
    state = read_state(data)
    if state and any(
        pid_alive(pid, marker_of(state, name, data)) for name, pid in state["pids"].items()
    ):
        print(
            f"dledger-dev: a cluster is already running from {data} (dledger-dev down stops it)",
            file=sys.stderr,
        )
        return True
    return False


def marker_of(state: dict[str, Any], name: str, data: Path) -> str:
    """Text the process's command line must hold for its pid to still be ours."""
    markers: dict[str, str] = state.get("markers", {})
    return markers.get(name, str(data))


def write_state(data: Path, state: dict[str, Any]) -> None:
    state_path(data).write_text(json.dumps(state, indent=2) + "\n")


def up(args: argparse.Namespace) -> int:
    if already_running(args.data):
        return 1
    return up_dledger(args) if args.dledger else up_cluster(args)


def up_dledger(args: argparse.Namespace) -> int:
    data: Path = args.data
    base_port = args.base_port or BROKER_PEER_PORT
    ports = [base_port + i for i in range(args.nodes)]
    group = LocalGroup(
        data, group=args.group, nodes=args.nodes, ports=ports, extra_args=["--log-level", "INFO"]
    )
    group.start_all()
    try:
        group.wait_serving(timeout=30)
    except TimeoutError:
        group.stop_all()
        logs = {n: group.replicas[n].log_path for n in group.replicas}
        print(f"dledger-dev: the servers did not come up; see {logs}", file=sys.stderr)
        return 1
    write_state(
        data,
        {"mode": "dledger", "group": args.group, "peers": group.peers_arg, "pids": group.pids()},
    )
    print(f'group {args.group} started: --peers "{group.peers_arg}"')
    print(
        f'data and logs under {data}; try: dledger-client --peers "{group.peers_arg}" append hello'
    )
    if args.foreground:
        foreground(lambda: table(group.peers), group.stop_all, "group", data)
    return 0


def cluster_ports(
    args: argparse.Namespace, groups: list[str]
) -> tuple[list[int], dict[str, tuple[int, int]]]:
    """(namesrv ports, {"group/node": (Raft port, client port)}): RocketMQ's usual ports, or
    everything consecutive from --base-port."""
    names = [f"{g}/n{j}" for g in groups for j in range(args.replicas)]
    if args.base_port:
        namesrv_ports = [args.base_port + i for i in range(args.namesrvs)]
        first = args.base_port + args.namesrvs
        return namesrv_ports, {n: (first + 2 * k, first + 2 * k + 1) for k, n in enumerate(names)}
    brokers = {}
    for i, g in enumerate(groups):
        for j in range(args.replicas):
            step = GROUP_PORT_STRIDE * i + j
            brokers[f"{g}/n{j}"] = (BROKER_PEER_PORT + step, BROKER_CLIENT_PORT + step)
    return [NAMESRV_PORT + i for i in range(args.namesrvs)], brokers


def up_cluster(args: argparse.Namespace) -> int:
    data: Path = args.data
    groups = [g for g in args.groups.split(",") if g]
    if shlex.split(args.broker_command) == list(BROKER_COMMAND) and not BROKER_MAIN.exists():
        print(
            f"dledger-dev: the broker is not here yet ({BROKER_MAIN} is missing); "
            "`dledger-dev up --dledger` starts the milestone-1 dledger-server group",
            file=sys.stderr,
        )
        return 1
    namesrv_ports, broker_ports = cluster_ports(args, groups)
    cluster = LocalCluster(
        data,
        namesrvs=args.namesrvs,
        groups=groups,
        replicas=args.replicas,
        extra_broker_args=["--flush", args.flush, "--log-level", "INFO"],
        broker_command=shlex.split(args.broker_command),
        namesrv_ports=namesrv_ports,
        broker_ports=broker_ports,
    )
    cluster.start_all()
    try:
        cluster.wait_serving(timeout=UP_TIMEOUT_S)
    except (TimeoutError, RuntimeError) as err:
        cluster.stop_all()
        print(
            f"dledger-dev: the cluster did not come up: {err}; logs under {data / 'logs'}",
            file=sys.stderr,
        )
        return 1
    markers = {name: f"--listen {addr}" for name, addr in cluster.namesrvs.items()}
    markers.update({name: str(b.store_dir) for name, b in cluster.brokers.items()})
    write_state(
        data,
        {
            "mode": "cluster",
            "namesrvs": {name: str(addr) for name, addr in cluster.namesrvs.items()},
            "brokers": {
                name: {
                    "group": b.group,
                    "node": b.node,
                    "client": b.client_addr,
                    "peer": str(b.peer_address),
                    "store": str(b.store_dir),
                }
                for name, b in cluster.brokers.items()
            },
            "pids": cluster.pids(),
            "markers": markers,
        },
    )
    print(f"name servers: {cluster.namesrv_addr}")
    for group in groups:
        print(
            f"{group}: master {cluster.leader_of(group)}; replicas {cluster.broker_addresses(group)}"
        )
    print(
        f"data and logs under {data}; clients take --namesrv / NAMESRV_ADDR {cluster.namesrv_addr}"
    )
    if args.foreground:
        brokers = dict(cluster.brokers)
        namesrvs = dict(cluster.namesrvs)
        pids = cluster.pids()
        foreground(
            lambda: cluster_table(namesrvs, brokers, pids), cluster.stop_all, "cluster", data
        )
    return 0


def foreground(
    render: Callable[[], str], stop_all: Callable[[], None], what: str, data: Path
) -> None:
    """Show render() every REFRESH_S until SIGINT or SIGTERM, then stop_all() and forget the
    state file."""
    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        while not stop:
            text = render()
            if sys.stdout.isatty():
                print(
                    "\x1b[2J\x1b[H"
                    + time.strftime("%H:%M:%S")
                    + f"  (Ctrl-C stops the {what})\n"
                    + text,
                    flush=True,
                )
            else:
                print(text, flush=True)
            deadline = time.monotonic() + REFRESH_S
            while not stop and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        stop_all()
        state_path(data).unlink(missing_ok=True)
        print(f"{what} stopped")


def cluster_table(
    namesrvs: dict[str, Address], brokers: dict[str, BrokerReplica], pids: dict[str, int]
) -> str:
    return format_cluster_status(trio.run(cluster_status, namesrvs, brokers), brokers, pids)


def format_cluster_status(
    status: ClusterStatus, brokers: dict[str, BrokerReplica], pids: dict[str, int]
) -> str:
    """One row per replica: role, Raft term, leader, commit and applied index as the broker's
    runtime info reports them ('?' where it lacks a key, 'down' when it does not answer), lag
    (its group leader's lastIndex minus its own), the brokerId the name servers list it under;
    then one line per group (its master at the name servers) and per name server."""
    infos = status.cluster_infos
    answering = [info for info in infos.values() if info is not None]
    head = (
        *("group", "replica", "role", "term", "leader", "ns id"),
        *("commit", "applied", "lag", "client", "raft", "pid"),
    )
    leader_last: dict[str, int] = {}
    for name, b in brokers.items():
        table = status.runtime_infos.get(name) or {}
        if table.get("raftRole") == "leader" and table.get("lastIndex", "").isdigit():
            leader_last[b.group] = int(table["lastIndex"])
    rows: list[tuple[str, ...]] = [head]
    for name, b in brokers.items():
        runtime = status.runtime_infos.get(name)
        ids = sorted({i for info in answering if (i := registered_id(info, b)) is not None})

        def cell(key: str, runtime: dict[str, str] | None = runtime) -> str:
            return "" if runtime is None else runtime.get(key, "?")

        last = cell("lastIndex")
        lag = (
            str(leader_last[b.group] - int(last))
            if last.isdigit() and b.group in leader_last
            else "?"
        )
        rows.append(
            (
                b.group,
                b.node,
                "down" if runtime is None else runtime.get("raftRole", "?"),
                cell("raftTerm"),
                cell("raftLeader"),
                ",".join(ids) or "-",
                cell("commitIndex"),
                cell("appliedIndex"),
                "" if runtime is None else lag,
                b.client_addr,
                str(b.peer_address),
                str(pids.get(name, "")),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    for group in dict.fromkeys(b.group for b in brokers.values()):
        masters = {master_of(info, group) for info in answering}
        if len(masters) == 1 and None not in masters:
            (addr,) = masters
            node = next((b.node for b in brokers.values() if b.client_addr == addr), "?")
            lines.append(f"{group}: master {addr} ({node})")
        elif masters - {None}:
            lines.append(f"{group}: name servers disagree: {sorted(m or '-' for m in masters)}")
        else:
            lines.append(f"{group}: no master")
    for ns, info in infos.items():
        lines.append(f"{ns}: {'up' if info is not None else 'down'}")
    return "\n".join(lines)


def registered_id(info: dict[str, Any], b: BrokerReplica) -> str | None:
    addrs = (info.get("brokerAddrTable") or {}).get(b.group, {}).get("brokerAddrs") or {}
    return next((i for i, addr in addrs.items() if addr == b.client_addr), None)


def parse_address(text: str) -> Address:
    host, _, port = text.rpartition(":")
    return Address(host, int(port))


def brokers_of(state: dict[str, Any]) -> dict[str, BrokerReplica]:
    return {
        name: BrokerReplica(
            group=b["group"],
            node=b["node"],
            peer_address=parse_address(b["peer"]),
            client_address=parse_address(b["client"]),
            store_dir=Path(b["store"]),
        )
        for name, b in state["brokers"].items()
    }


def down(args: argparse.Namespace) -> int:
    state = read_state(args.data)
    if state is None:
        print(f"dledger-dev: nothing started from {args.data}")
        return 0
    # brokers before name servers, so the brokers' last words reach them
    for name, pid in reversed(state["pids"].items()):
        marker = marker_of(state, name, args.data)
        if not pid_alive(pid, marker):
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while pid_alive(pid, marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        if pid_alive(pid, marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        print(f"stopped {name} (pid {pid})")
    state_path(args.data).unlink(missing_ok=True)
    return 0


def status(args: argparse.Namespace) -> int:
    state = read_state(args.data)
    if state is None:
        print(f"dledger-dev: nothing started from {args.data}", file=sys.stderr)
        return 1
    if state.get("mode", "dledger") == "dledger":
        print(table(parse_peers(state["peers"])))
        return 0
    namesrvs = {name: parse_address(a) for name, a in state["namesrvs"].items()}
    pids = {
        name: pid
        for name, pid in state["pids"].items()
        if pid_alive(pid, marker_of(state, name, args.data))
    }
    print(cluster_table(namesrvs, brokers_of(state), pids))
    return 0


def kill(args: argparse.Namespace) -> int:
    """kill -9 one broker replica: `kill broker-a leader` or `kill broker-a n1`."""
    state = read_state(args.data)
    if state is None or state.get("mode") != "cluster":
        print(f"dledger-dev: no cluster started from {args.data}", file=sys.stderr)
        return 1
    brokers = brokers_of(state)
    name = f"{args.group}/{args.replica}"
    if args.replica == "leader":
        namesrvs = {ns: parse_address(a) for ns, a in state["namesrvs"].items()}
        infos = trio.run(cluster_status, namesrvs, {}).cluster_infos
        masters = {master_of(info, args.group) for info in infos.values() if info is not None}
        masters.discard(None)
        if len(masters) != 1:
            print(f"dledger-dev: no single master of {args.group}: {masters}", file=sys.stderr)
            return 1
        (addr,) = masters
        name = next((n for n, b in brokers.items() if b.client_addr == addr), name)
    pid = state["pids"].get(name)
    if name not in brokers or pid is None:
        print(f"dledger-dev: no replica {name}; replicas: {sorted(brokers)}", file=sys.stderr)
        return 1
    if not pid_alive(pid, marker_of(state, name, args.data)):
        print(f"dledger-dev: {name} (pid {pid}) is not running", file=sys.stderr)
        return 1
    os.kill(pid, signal.SIGKILL)
    print(f"killed {name} (pid {pid}) with SIGKILL")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="dledger-dev",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--data", type=Path, default=Path("data"), help="where stores, logs and dev.json go"
    )
    sub = p.add_subparsers(dest="command", required=True)
    u = sub.add_parser("up", help="start the cluster")
    u.add_argument(
        "--foreground", action="store_true", help="show a status table; Ctrl-C stops everything"
    )
    u.add_argument(
        "--dledger", action="store_true", help="milestone 1: one dledger-server group instead"
    )
    u.add_argument("--base-port", type=int, help="consecutive ports from here")
    u.add_argument("--namesrvs", type=int, default=2)
    u.add_argument(
        "--groups", default="broker-a,broker-b", help="broker group names, comma-separated"
    )
    u.add_argument("--replicas", type=int, default=3, choices=[1, 3, 5])
    u.add_argument("--flush", default="ASYNC_FLUSH", choices=["ASYNC_FLUSH", "SYNC_FLUSH"])
    u.add_argument(
        "--broker-command",
        default=shlex.join(BROKER_COMMAND),
        help="what starts a broker replica (tests pass a stand-in); the flags follow it",
    )
    u.add_argument("--group", default="g", help="with --dledger: the group's name")
    u.add_argument("--nodes", type=int, default=3, choices=[1, 3, 5], help="with --dledger")
    sub.add_parser("down", help="stop everything `up` started")
    sub.add_parser("status", help="print the status table once")
    k = sub.add_parser("kill", help="kill -9 one broker replica")
    k.add_argument("group", help="broker-a")
    k.add_argument("replica", help="'leader' or a replica id (n0)")
    args = p.parse_args(argv)
    args.data = args.data.resolve()
    return {"up": up, "down": down, "status": status, "kill": kill}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
