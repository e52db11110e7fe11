"""The broker target: name servers and broker groups of real `dledger-broker` replicas, every
process a host of its own (a network namespace per process, chaos/net.py), started, signalled
and stopped by pid through broker.localcluster.LocalCluster.

    namesrv-0, namesrv-1                      hosts "namesrv-0", "namesrv-1"   port 9876
    broker-a/n0 .. broker-a/n2, broker-b/...  hosts "broker-a-n0", ...         clients 10911,
                                                                               Raft peers 40911

Faults name hosts (the namespace keys: a process name with "/" as "-"), so the nemesis's
partition planners cut between the replicas of one group exactly as they do for the dledger
target. The harness's clients live in the bridge namespace and reach every process whatever
the partition: partitions are between replicas.

Who leads a group, and whether the cluster has recovered, comes from each replica's
GET_BROKER_RUNTIME_INFO (raftRole, raftTerm, commitIndex, appliedIndex) and each name server's
GET_BROKER_CLUSTER_INFO (the address a group registered as master), as an operator sees them.
"""

from __future__ import annotations

import random
import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from broker.localcluster import LocalCluster, cluster_info, gather, master_of, runtime_table
from chaos.broker_final import BrokerFinal, ReadFailed, ReplicaRead, compare_group, read_replica
from chaos.net import Network
from chaos.targets.base import Crash, TargetStartFailed
from chaos.targets.dledger_disk import damage_tail
from dledger import limits
from dledger.config import Address

NAMESRV_PORT = 9876  # the same in every namespace: each process is its own host
CLIENT_PORT = 10911
PEER_PORT = 40911
GROUPS_DEFAULT = 2
REPLICAS_DEFAULT = 3
NAMESRVS_DEFAULT = 2
# Small files, so that log segments, ConsumeQueue files and IndexFiles roll over during a run.
BROKER_ARGS = [
    "--segment-bytes",
    str(4 * limits.MiB),
    "--max-message-bytes",  # a message must fit one segment; the workload's are tiny
    str(1 * limits.MiB),
    "--cq-file-bytes",
    str(20 * 4096),
    "--index-slots",
    "4096",
    "--index-items",
    "16384",
    # a small page-cache tail: a consumer or a follower behind by more than 1 MiB reads what the
    # store let go of (the read-in paths of broker/pull.py and broker/lookup.py) under faults
    "--cache-tail-bytes",
    str(1 * limits.MiB),
    "--log-level",
    "INFO",
]
SERVING_TIMEOUT_S = 60.0  # every process started, every group with a master on every namesrv
STATUS_TIMEOUT_S = 1.0  # a runtime-info request a replica does not answer by then: paused or gone
POLL_S = 0.1
LOG_TAIL_CHARS = 2000
RECOVERED = re.compile(r"store recovered: (.*)")


def group_names(count: int) -> list[str]:
    """broker-a, broker-b, ... (as RocketMQ's examples name them)."""
    assert 1 <= count <= 26, count
    return [f"broker-{chr(ord('a') + i)}" for i in range(count)]


def host_key(name: str) -> str:
    """The host (namespace key) of a process: "broker-a/n0" -> "broker-a-n0"."""
    return name.replace("/", "-")


def process_names(groups: Sequence[str], replicas: int, namesrvs: int) -> list[str]:
    """Every process of the cluster, name servers first, as LocalCluster names them."""
    names = [f"namesrv-{i}" for i in range(namesrvs)]
    names += [f"{g}/n{i}" for g in groups for i in range(replicas)]
    return names


def cluster_hosts(groups: Sequence[str], replicas: int, namesrvs: int) -> list[str]:
    """The hosts a run's network needs, one per process."""
    return [host_key(n) for n in process_names(groups, replicas, namesrvs)]


class BrokerTarget:
    def __init__(
        self,
        root: Path,
        network: Network,
        *,
        groups: Sequence[str],
        replicas: int = REPLICAS_DEFAULT,
        namesrvs: int = NAMESRVS_DEFAULT,
        broker_args: Sequence[str] = BROKER_ARGS,
    ) -> None:
        self.groups = list(groups)
        self.replicas = replicas
        self.network = network
        names = process_names(self.groups, replicas, namesrvs)
        assert network.nodes == [host_key(n) for n in names], network.nodes
        self.process_of = {host_key(n): n for n in names}
        self.cluster = LocalCluster(
            root,
            namesrvs=namesrvs,
            groups=self.groups,
            replicas=replicas,
            extra_broker_args=broker_args,
            namesrv_ports=[NAMESRV_PORT] * namesrvs,
            broker_ports={n: (PEER_PORT, CLIENT_PORT) for n in names if "/" in n},
            hosts={n: network.hosts[host_key(n)] for n in names},
            prefix=lambda name: network.prefix(host_key(name)),
        )
        self.host_at = {b.client_addr: host_key(n) for n, b in self.cluster.brokers.items()}
        self.expected_down: set[str] = set()  # hosts
        self.paused: set[str] = set()
        self.crashes: list[Crash] = []

    # --- names ---------------------------------------------------------------------------------

    @property
    def namesrv_addr(self) -> str:
        return self.cluster.namesrv_addr

    @property
    def namesrv_hosts(self) -> list[str]:
        return [host_key(n) for n in self.cluster.namesrvs]

    @property
    def hosts(self) -> list[str]:
        return list(self.process_of)

    def group_hosts(self, group: str) -> list[str]:
        return [host_key(b.name) for b in self.cluster.replicas_of(group)]

    def group_of(self, host: str) -> str | None:
        broker = self.cluster.brokers.get(self.process_of[host])
        return broker.group if broker is not None else None

    def client_address(self, host: str) -> Address:
        return self.cluster.brokers[self.process_of[host]].client_address

    def store_dir(self, host: str) -> Path:
        return self.cluster.brokers[self.process_of[host]].store_dir

    def raft_id(self, host: str) -> str:
        return self.cluster.brokers[self.process_of[host]].node

    def host_of_raft_id(self, group: str, raft_id: str) -> str:
        return host_key(f"{group}/{raft_id}")

    # --- processes -----------------------------------------------------------------------------

    @asynccontextmanager
    async def started(self) -> AsyncIterator[BrokerTarget]:
        """Start every process and wait until the cluster serves; stop all on the way out."""
        try:
            self.cluster.start_all()
            await self.wait_serving(SERVING_TIMEOUT_S)
            yield self
        finally:
            self.stop_all()

    def kill(self, host: str) -> None:
        self.expected_down.add(host)
        self.paused.discard(host)
        self.cluster.kill(self.process_of[host])

    def pause(self, host: str) -> None:
        if not self.running(host):  # it crashed (a finding of its own): nothing to pause
            return
        self.paused.add(host)
        self.cluster.pause(self.process_of[host])

    def resume(self, host: str) -> None:
        self.paused.discard(host)
        if self.running(host):
            self.cluster.resume(self.process_of[host])

    def start(self, host: str) -> None:
        self.cluster.start(self.process_of[host])
        self.expected_down.discard(host)

    def running(self, host: str) -> bool:
        return self.cluster.processes[self.process_of[host]].running

    def pids(self) -> dict[str, int]:
        return self.cluster.pids()

    def stop_all(self) -> None:
        self.cluster.stop_all()
        self.paused.clear()

    def log_text(self, host: str) -> str:
        return self.cluster.log_text(self.process_of[host])

    def log_paths(self) -> list[Path]:
        return [p.log_path for p in self.cluster.processes.values()]

    def check_crashes(self, now_ns: int) -> list[Crash]:
        found = []
        for host, name in self.process_of.items():
            process = self.cluster.processes[name].process
            if host in self.expected_down or process is None or process.poll() is None:
                continue
            self.expected_down.add(host)
            tail = self.log_text(host)[-LOG_TAIL_CHARS:]
            found.append(Crash(host, process.returncode, now_ns, tail))
        self.crashes.extend(found)
        return found

    def damage_tail(self, host: str, mode: str, rng: random.Random) -> dict[str, Any]:
        """The log's tail of a killed replica (its dledger store lives in <store>/dledger)."""
        assert not self.running(host), f"{host} must be killed before its disk is touched"
        return damage_tail(self.store_dir(host), mode, rng).describe()

    def recovery_note(self, host: str) -> str | None:
        found = RECOVERED.findall(self.log_text(host))
        return found[-1] if found else None

    # --- asking the processes ------------------------------------------------------------------

    def _answers(self, host: str) -> bool:
        return self.running(host) and host not in self.paused

    async def runtime(self, host: str) -> dict[str, str] | None:
        """The replica's runtime table; None when it is down, paused or silent."""
        if not self._answers(host):
            return None
        address = self.client_address(host)
        with trio.move_on_after(STATUS_TIMEOUT_S + 0.5):
            return await runtime_table(address)
        return None

    async def runtimes(self, hosts: Sequence[str]) -> dict[str, dict[str, str] | None]:
        return await gather({h: self.runtime(h) for h in hosts})

    async def namesrv_views(self) -> dict[str, dict[str, Any] | None]:
        """Each name server's cluster info; None where it is down or silent."""

        async def one(host: str) -> dict[str, Any] | None:
            if not self._answers(host):
                return None
            with trio.move_on_after(STATUS_TIMEOUT_S + 0.5):
                return await cluster_info(self.cluster.namesrvs[self.process_of[host]])
            return None

        return await gather({h: one(h) for h in self.namesrv_hosts})

    async def leader(self, group: str) -> str | None:
        """The host of the replica that leads `group` now (the highest term wins), or None."""
        found = await self.runtimes(self.group_hosts(group))
        return _leader(found)

    async def wait_leader(self, group: str, timeout_s: float) -> str | None:
        with trio.move_on_after(timeout_s):
            while (leader := await self.leader(group)) is None:
                await trio.sleep(POLL_S)
            return leader
        return None

    async def serving_problem(self, goals: dict[str, int] | None = None) -> str | None:
        """Why the cluster does not serve as it should, or None: a process down or paused, a
        name server silent, a group without a leader, a replica that has not applied what its
        leader had committed when first seen (`goals`, filled in on the first look), or a
        name server that does not list the leader as the group's master."""
        for host in self.hosts:
            if not self._answers(host):
                return f"{host} is {'paused' if host in self.paused else 'not running'}"
        views = await self.namesrv_views()
        for host, view in views.items():
            if view is None:
                return f"{host} does not answer"
        for group in self.groups:
            found = await self.runtimes(self.group_hosts(group))
            silent = [h for h, t in found.items() if t is None]
            if silent:
                return f"{', '.join(silent)} of {group} do not answer"
            leader = _leader(found)
            if leader is None:
                return f"{group} has no leader"
            table = found[leader]
            assert table is not None
            if goals is not None:
                goal = goals.setdefault(group, int(table.get("commitIndex", "0")))
                behind = [h for h, t in found.items() if t and int(t.get("appliedIndex", 0)) < goal]
                if behind:
                    return f"{', '.join(behind)} of {group} have not applied index {goal}"
            address = str(self.client_address(leader))
            wrong = [h for h, v in views.items() if master_of(v, group) != address]
            if wrong:
                return f"{', '.join(wrong)} do not list {leader} as the master of {group}"
        return None

    async def wait_serving(self, timeout_s: float) -> None:
        problem: str | None = "not looked at yet"
        with trio.move_on_after(timeout_s):
            while True:
                for crash in self.check_crashes(0):
                    raise TargetStartFailed(
                        f"{crash.node} exited with {crash.returncode} at start:\n{crash.log_tail}"
                    )
                problem = await self.serving_problem()
                if problem is None:
                    return
                await trio.sleep(POLL_S)
        raise TargetStartFailed(f"the cluster did not serve within {timeout_s} s: {problem}")

    async def wait_recovered(self, timeout_s: float) -> bool:
        """Every process back and answering, every group led, its replicas caught up with what
        the leader had committed when this was first seen, and every name server listing each
        leader as master; False at the deadline."""
        goals: dict[str, int] = {}
        with trio.move_on_after(timeout_s):
            while await self.serving_problem(goals) is not None:
                await trio.sleep(POLL_S)
            return True
        return False

    async def wait_converged(self, timeout_s: float) -> bool:
        """With no writes coming, every replica of each group has applied the same index as
        its leader has committed."""
        with trio.move_on_after(timeout_s):
            while not await self._converged():
                await trio.sleep(POLL_S)
            return True
        return False

    async def _converged(self) -> bool:
        for group in self.groups:
            found = await self.runtimes(self.group_hosts(group))
            if any(t is None for t in found.values()) or _leader(found) is None:
                return False
            marks = {(int(t["commitIndex"]), int(t["appliedIndex"])) for t in found.values() if t}
            if len(marks) != 1 or len(set(next(iter(marks)))) != 1:
                return False
        return True

    async def read_final(self, queues: Sequence[tuple[str, int]]) -> BrokerFinal:
        """Every queue of `queues` ((topic, queue id) of each group) from every replica."""
        groups = {}
        problems: list[str] = []
        for group in self.groups:
            hosts = self.group_hosts(group)
            tables = await self.runtimes(hosts)
            states: dict[str, ReplicaRead] = {}
            listings = {}
            for host in hosts:
                table = tables[host]
                if table is None:
                    states[host] = ReplicaRead(host, error="does not answer")
                    continue
                states[host] = ReplicaRead(
                    host,
                    role=table.get("raftRole", "unknown"),
                    term=int(table.get("raftTerm", 0)),
                    commit_index=int(table.get("commitIndex", 0)),
                    applied_index=int(table.get("appliedIndex", 0)),
                )
                try:
                    listings[host] = await read_replica(self.client_address(host), group, queues)
                except ReadFailed as err:
                    states[host] = attrs.evolve(states[host], error=str(err))
            problems += [f"{h}: {r.error}" for h, r in states.items() if r.error is not None]
            groups[group] = compare_group(group, listings, states)
        return BrokerFinal(groups=groups, complete=not problems, problems=tuple(problems))


def _leader(found: dict[str, dict[str, str] | None]) -> str | None:
    leaders = [(int(t.get("raftTerm", 0)), h) for h, t in found.items() if t and _leads(t)]
    return max(leaders)[1] if leaders else None


def _leads(table: dict[str, str]) -> bool:
    return table.get("raftRole", "").lower() == "leader"


class GroupView:
    """One broker group as the nemesis's Target: the group's replicas by host, faults on them,
    its leader; recovery is the whole cluster's."""

    def __init__(self, target: BrokerTarget, group: str) -> None:
        self.target = target
        self.group = group
        self.nodes = target.group_hosts(group)

    def kill(self, node: str) -> None:
        self.target.kill(node)

    def pause(self, node: str) -> None:
        self.target.pause(node)

    def resume(self, node: str) -> None:
        self.target.resume(node)

    def start(self, node: str) -> None:
        self.target.start(node)

    def running(self, node: str) -> bool:
        return self.target.running(node)

    async def leader(self) -> str | None:
        return await self.target.leader(self.group)

    async def wait_leader(self, timeout_s: float) -> str | None:
        return await self.target.wait_leader(self.group, timeout_s)

    async def wait_recovered(self, timeout_s: float) -> bool:
        return await self.target.wait_recovered(timeout_s)

    async def wait_converged(self, timeout_s: float) -> bool:
        return await self.target.wait_converged(timeout_s)

    async def read_final(self) -> Any:
        raise NotImplementedError("the broker run reads every group at once (chaos.broker_final)")

    def damage_tail(self, node: str, mode: str, rng: random.Random) -> dict[str, Any]:
        return self.target.damage_tail(node, mode, rng)

    def recovery_note(self, node: str) -> str | None:
        return self.target.recovery_note(node)

    def check_crashes(self, now_ns: int) -> list[Crash]:
        return self.target.check_crashes(now_ns)

    def stop_all(self) -> None:
        raise NotImplementedError("the run stops the whole cluster")
