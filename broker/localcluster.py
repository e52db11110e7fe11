"""A whole local cluster as real processes: name servers and broker groups of `python -m broker`
replicas on 127.0.0.1, for tests, `dledger-dev` and benchmarks.

    cluster = LocalCluster(root, namesrvs=2, groups=("broker-a", "broker-b"), replicas=3)
    cluster.start_all()
    cluster.wait_serving(timeout=30)     # every namesrv answers; every group has a master "0"
    old = cluster.leader_of("broker-a")  # "127.0.0.1:L", the address registered as brokerId 0
    cluster.kill(cluster.leader_name("broker-a"))          # kill -9 one process by name
    wait_until(lambda: cluster.leader_of("broker-a") not in (None, old), 10)
    cluster.stop_all()

Processes are named "namesrv-0", "namesrv-1", ... and "<group>/<node>" ("broker-a/n0"); each
writes its output to root/logs/<name with / as ->.log and a replica stores under
root/<group>/<node>. Every process is started, signalled and stopped by the pid recorded when
it was started (dledger/processes.py); nothing is found by name.

Who leads comes from the name servers (GET_BROKER_CLUSTER_INFO: the address a group registered
as brokerId 0), as a RocketMQ client would see it; a broker's own view comes from its
GET_BROKER_RUNTIME_INFO table (`runtime_info`), which our broker fills with raftRole,
raftTerm and raftLeader.

The broker command is a prefix (`broker_command`), so tests can start a stand-in.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from dledger.config import Address, format_peers
from dledger.processes import STOP_TIMEOUT_S, ManagedProcess, free_port_block, wait_until
from remoting.client import open_connection
from remoting.codes import RequestCode, ResponseCode
from remoting.command import RemotingCommand
from remoting.errors import RemotingError

HOST = "127.0.0.1"
NAMESRV_COMMAND = (sys.executable, "-m", "namesrv")
BROKER_COMMAND = (sys.executable, "-m", "broker")
# Stores for tests: a replica preallocates its log segment (1 GiB by default) and each queue's
# ConsumeQueue file (6 MB); a test suite starting dozens of replicas would write tens of GB.
SMALL_STORE_ARGS = ("--segment-bytes", str(64 << 20), "--cq-file-bytes", str(20 * 1000),
                    "--index-slots", "1000", "--index-items", "4000")  # fmt: skip
QUERY_TIMEOUT_S = 1.0  # one remoting request of a status poll
WAIT_SERVING_S_DEFAULT = 30.0
MASTER_ID = "0"  # brokerAddrs key of a group's master (its Raft leader)


@attrs.frozen
class BrokerReplica:
    group: str  # broker name, e.g. "broker-a"
    node: str  # Raft id, e.g. "n0"
    peer_address: Address  # Raft
    client_address: Address  # RocketMQ remoting: what clients and the name servers see
    store_dir: Path

    @property
    def name(self) -> str:
        return f"{self.group}/{self.node}"

    @property
    def client_addr(self) -> str:
        return f"{self.client_address.host}:{self.client_address.port}"


def process_log_name(name: str) -> str:
    return name.replace("/", "-") + ".log"


class LocalCluster:
    def __init__(
        self,
        root: Path,
        *,
        namesrvs: int = 2,
        groups: Sequence[str] = ("broker-a", "broker-b"),
        replicas: int = 3,
        extra_broker_args: Sequence[str] = (),
        extra_namesrv_args: Sequence[str] = (),
        broker_command: Sequence[str] = BROKER_COMMAND,
        namesrv_command: Sequence[str] = NAMESRV_COMMAND,
        namesrv_ports: Sequence[int] | None = None,
        broker_ports: Mapping[str, tuple[int, int]] | None = None,
        env: Mapping[str, str] | None = None,
        hosts: Mapping[str, str] | None = None,
        prefix: Callable[[str], Sequence[str]] | None = None,
    ) -> None:
        """`broker_ports` maps "group/node" to (Raft peer port, client port); ports not given
        are picked free, below the ephemeral range. `env` is the children's environment
        (default: ours). `hosts` maps a process name ("namesrv-0", "broker-a/n1") to the
        address it binds (default 127.0.0.1), and `prefix(name)` is put before its command:
        chaos runs each process in a network namespace of its own with
        `ip netns exec <namespace>` (which execs, so the pid stays the process's)."""
        assert namesrvs >= 1, namesrvs
        self.root = root
        self.groups = tuple(groups)
        self.extra_broker_args = list(extra_broker_args)
        self.broker_command = list(broker_command)
        self.prefix = prefix
        host_of = dict(hosts or {})
        # Ports not given come from one block below the ephemeral range, so no outgoing
        # connection takes a killed broker's port before its restart (dledger/processes.py).
        needed = (0 if namesrv_ports else namesrvs) + 2 * len(self.groups) * replicas
        block = iter(range(free_port_block(needed, HOST), 65536) if needed else ())
        ports = list(namesrv_ports) if namesrv_ports else [next(block) for _ in range(namesrvs)]
        assert len(ports) == namesrvs, (ports, namesrvs)
        child_env = dict(env) if env is not None else None
        self.namesrvs: dict[str, Address] = {
            f"namesrv-{i}": Address(host_of.get(f"namesrv-{i}", HOST), port)
            for i, port in enumerate(ports)
        }
        self.brokers: dict[str, BrokerReplica] = {}
        for group in self.groups:
            for i in range(replicas):
                name = f"{group}/n{i}"
                peer, client = (broker_ports or {}).get(name) or (next(block), next(block))
                host = host_of.get(name, HOST)
                self.brokers[name] = BrokerReplica(
                    group=group,
                    node=f"n{i}",
                    peer_address=Address(host, peer),
                    client_address=Address(host, client),
                    store_dir=root / group / f"n{i}",
                )
        self.processes: dict[str, ManagedProcess] = {}
        for name, address in self.namesrvs.items():
            command = [
                *namesrv_command,
                "--listen",
                f"{address.host}:{address.port}",
                *extra_namesrv_args,
            ]
            self.processes[name] = self._managed(name, command, child_env)
        for name in self.brokers:
            self.processes[name] = self._managed(name, self.broker_args(name), child_env)

    def _managed(self, name: str, command: list[str], env: dict[str, str] | None) -> ManagedProcess:
        log_path = self.root / "logs" / process_log_name(name)
        prefix = list(self.prefix(name)) if self.prefix is not None else []
        return ManagedProcess(name=name, command=[*prefix, *command], log_path=log_path, env=env)

    # --- addresses -------------------------------------------------------------------------

    @property
    def namesrv_addr(self) -> str:
        """The namesrv list as clients take it: "127.0.0.1:N0;127.0.0.1:N1"."""
        return ";".join(f"{a.host}:{a.port}" for a in self.namesrvs.values())

    def replicas_of(self, group: str) -> list[BrokerReplica]:
        return [b for b in self.brokers.values() if b.group == group]

    def peers_arg(self, group: str) -> str:
        return format_peers({b.node: b.peer_address for b in self.replicas_of(group)})

    def broker_addresses(self, group: str) -> list[str]:
        """Client addresses ("127.0.0.1:L") of the group's replicas, n0 first."""
        return [b.client_addr for b in self.replicas_of(group)]

    def replica_at(self, client_addr: str) -> BrokerReplica | None:
        return next((b for b in self.brokers.values() if b.client_addr == client_addr), None)

    def broker_args(self, name: str) -> list[str]:
        b = self.brokers[name]
        return [
            *self.broker_command,
            "--group",
            b.group,
            "--self-id",
            b.node,
            "--peers",
            self.peers_arg(b.group),
            "--listen",
            b.client_addr,
            "--namesrv",
            self.namesrv_addr,
            "--store",
            str(b.store_dir),
            *self.extra_broker_args,
        ]

    # --- processes -------------------------------------------------------------------------

    def start(self, name: str) -> None:
        self.processes[name].start()

    def start_all(self) -> None:
        """Name servers first, then every broker replica; those already running are left be."""
        for p in self.processes.values():
            if not p.running:
                p.start()

    def kill(self, name: str, signum: int = signal.SIGKILL) -> None:
        """Send `signum` to one process; for SIGKILL also reap it, so it is gone on return."""
        p = self.processes[name]
        if signum == signal.SIGKILL:
            p.kill()
        else:
            p.signal(signum)

    def pause(self, name: str) -> None:
        self.kill(name, signal.SIGSTOP)

    def resume(self, name: str) -> None:
        self.kill(name, signal.SIGCONT)

    def stop(self, name: str, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM, then SIGKILL after timeout_s."""
        self.processes[name].stop(timeout_s)

    def restart(self, name: str, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop it if it runs (SIGTERM, then SIGKILL), and start it again with the same store."""
        self.stop(name, timeout_s)
        self.start(name)

    def stop_all(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM to every process at once (brokers first), SIGKILL whatever is left after
        timeout_s; every one reaped."""
        running = [p for p in reversed(self.processes.values()) if p.process is not None]
        for p in running:
            if p.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGCONT)
                    os.kill(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for p in running:
            assert p.process is not None
            with contextlib.suppress(Exception):
                p.process.wait(max(0.0, deadline - time.monotonic()))
            p.kill()

    def exited(self) -> dict[str, int | None]:
        """Processes started and no longer running (killed ones too), with their exit codes."""
        return {n: p.returncode for n, p in self.processes.items() if p.starts and not p.running}

    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self.processes.items() if p.pid is not None}

    def log_text(self, name: str) -> str:
        return self.processes[name].log_text()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()

    # --- what the cluster says -------------------------------------------------------------

    def cluster_infos(self) -> dict[str, dict[str, Any] | None]:
        """Each name server's GET_BROKER_CLUSTER_INFO body, None where it did not answer."""
        return trio.run(_cluster_infos, dict(self.namesrvs))

    def masters(self, group: str) -> dict[str, str | None]:
        """Per name server, the address `group` registered as brokerId 0 (None: none, or the
        name server did not answer)."""
        return {ns: master_of(info, group) for ns, info in self.cluster_infos().items()}

    def leader_of(self, group: str) -> str | None:
        """The client address of `group`'s master, when every name server that answers names
        the same one (a name server that is down does not count; one without a master does)."""
        infos = [info for info in self.cluster_infos().values() if info is not None]
        masters = {master_of(info, group) for info in infos}
        return masters.pop() if len(masters) == 1 else None

    def leader_name(self, group: str) -> str | None:
        """The process name ("broker-a/n1") of `group`'s master, as leader_of."""
        addr = self.leader_of(group)
        replica = self.replica_at(addr) if addr else None
        return replica.name if replica else None

    def status(self) -> ClusterStatus:
        """Every name server's cluster info and every broker's runtime table, asked at once."""
        return trio.run(cluster_status, dict(self.namesrvs), dict(self.brokers))

    def runtime_info(self, name: str) -> dict[str, str] | None:
        """The broker's GET_BROKER_RUNTIME_INFO table, None if it did not answer."""
        return trio.run(_runtime_info, self.brokers[name].client_address)

    def serving_problem(self) -> str | None:
        """Why the cluster is not serving yet, or None: a process exited, a name server does not
        answer GET_BROKER_CLUSTER_INFO, or (with brokers) a group has no master on one."""
        for name, code in self.exited().items():
            return f"{name} exited with {code}; see {self.processes[name].log_path}"
        for ns, info in self.cluster_infos().items():
            if info is None:
                return f"{ns} does not answer GET_BROKER_CLUSTER_INFO"
            for group in self.groups:
                if not self.replicas_of(group) or master_of(info, group) is not None:
                    continue
                return f"{ns} shows no master for {group}"
        return None

    def wait_serving(self, timeout: float = WAIT_SERVING_S_DEFAULT) -> None:
        """Poll until serving_problem() is None; TimeoutError naming the last problem, or
        RuntimeError at once when a process exited."""
        problem: list[str | None] = [None]

        def serving() -> bool:
            problem[0] = self.serving_problem()
            if problem[0] is not None and " exited with " in problem[0]:
                raise RuntimeError(problem[0])
            return problem[0] is None

        try:
            wait_until(serving, timeout, interval=0.1, what="the cluster serving")
        except TimeoutError:
            raise TimeoutError(f"not serving within {timeout} s: {problem[0]}") from None


def master_of(info: Mapping[str, Any] | None, group: str) -> str | None:
    """brokerAddrTable[group].brokerAddrs["0"] of a cluster info body."""
    if info is None:
        return None
    addrs = (info.get("brokerAddrTable") or {}).get(group, {}).get("brokerAddrs") or {}
    master = addrs.get(MASTER_ID)
    return master if isinstance(master, str) else None


async def request_json(
    address: Address, code: int, timeout_s: float = QUERY_TIMEOUT_S
) -> dict[str, Any] | None:
    """One remoting request with no header fields; its JSON body, or None for no answer, an
    error code or a body that is not a JSON object."""
    answer: RemotingCommand | None = None
    try:
        with trio.fail_after(timeout_s):
            async with open_connection(
                address.host, address.port, connect_timeout_s=timeout_s
            ) as conn:
                answer = await conn.request(RemotingCommand.request(code), timeout_s=timeout_s)
    except* (OSError, RemotingError, trio.TooSlowError, trio.BrokenResourceError):
        pass  # also from inside the connection's block, where they come in an ExceptionGroup
    if answer is None:
        return None
    if answer.code != ResponseCode.SUCCESS:
        return None
    try:
        body = json.loads(answer.body)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


async def cluster_info(address: Address) -> dict[str, Any] | None:
    return await request_json(address, RequestCode.GET_BROKER_CLUSTER_INFO)


async def runtime_table(address: Address) -> dict[str, str] | None:
    body = await request_json(address, RequestCode.GET_BROKER_RUNTIME_INFO)
    table = body.get("table") if body is not None else None
    return {str(k): str(v) for k, v in table.items()} if isinstance(table, dict) else None


async def gather(calls: Mapping[str, Any]) -> dict[str, Any]:
    """Await every coroutine of `calls` at once; their results by key."""
    results: dict[str, Any] = {}

    async def one(key: str, coro: Any) -> None:
        results[key] = await coro

    async with trio.open_nursery() as nursery:
        for key, coro in calls.items():
            nursery.start_soon(one, key, coro)
    return {key: results[key] for key in calls}


async def _cluster_infos(namesrvs: dict[str, Address]) -> dict[str, dict[str, Any] | None]:
    return await gather({ns: cluster_info(a) for ns, a in namesrvs.items()})


async def _runtime_info(address: Address) -> dict[str, str] | None:
    return await runtime_table(address)


@attrs.frozen
class ClusterStatus:
    cluster_infos: dict[str, dict[str, Any] | None]  # by name server; None: no answer
    runtime_infos: dict[str, dict[str, str] | None]  # by "group/node"; None: no answer


async def cluster_status(
    namesrvs: Mapping[str, Address], brokers: Mapping[str, BrokerReplica]
) -> ClusterStatus:
    both = await gather(
        {
            "infos": gather({ns: cluster_info(a) for ns, a in namesrvs.items()}),
            "tables": gather({n: runtime_table(b.client_address) for n, b in brokers.items()}),
        }
    )
    return ClusterStatus(cluster_infos=both["infos"], runtime_infos=both["tables"])


@contextlib.contextmanager
def running_cluster(root: Path, **kwargs: Any) -> Iterator[LocalCluster]:
    """Started, waited for, and stopped on the way out."""
    cluster = LocalCluster(root, **kwargs)
    try:
        cluster.start_all()
        cluster.wait_serving()
        yield cluster
    finally:
        cluster.stop_all()
