"""Each replica as its own host: a network namespace per replica, joined by a veth pair to a
bridge that lives in a namespace of its own, where the harness's client lives too.

    dlc-<run>-br:  br0 10.77.0.1/24, ports v0 v1 v2 ...     (the client and the bridge)
    dlc-<run>-n0:  eth0 10.77.0.10/24 (peer of v0), chain DLCHAOS jumped to from INPUT
    dlc-<run>-n1:  eth0 10.77.0.11/24 ...

Addresses exist only inside namespaces this module creates, and no namespace has a route out
(the bridge has no uplink). A partition is applied as DROP rules in the destination's own
DLCHAOS chain, one per source it must not hear from, and healed by flushing those chains.
Everything is found again by the names given here: teardown deletes exactly the namespaces
it registered (which takes their links and rules with them), after killing any process still
inside one of them.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from collections.abc import Iterator, Sequence

from chaos import commands
from chaos.partition import CLIENT, Partition, drops_by_destination

NAME_PREFIX = "dlc"  # every namespace of a run is named dlc-<run id>-<role>
SUBNET_PREFIX = "10.77.0"  # a /24 that exists only inside our namespaces
SUBNET_BITS = 24
CLIENT_HOST = 1  # the bridge namespace's address: where the workload and nemesis connect from
REPLICA_HOST_FIRST = 10  # replica i is .10+i
REPLICAS_MAX = 200
BRIDGE = "br0"
REPLICA_IFNAME = "eth0"
CHAIN = "DLCHAOS"  # our chain in every replica namespace
NETNS_DIR = "/run/netns"
CLONE_NEWNET = 0x40000000


class NetworkError(Exception):
    """The network could not be set up or changed; the message names the command."""


def run_namespaces(run_id: str) -> list[str]:
    """Names of namespaces that exist now and belong to run `run_id`."""
    prefix = f"{NAME_PREFIX}-{run_id}-"
    out = commands.run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in out.splitlines() if line.startswith(prefix)]


class Network:
    def __init__(self, run_id: str, nodes: Sequence[str]) -> None:
        assert len(nodes) <= REPLICAS_MAX, nodes
        self.run_id = run_id
        self.nodes = list(nodes)
        self.bridge_namespace = f"{NAME_PREFIX}-{run_id}-br"
        self.namespaces = {n: f"{NAME_PREFIX}-{run_id}-{n}" for n in self.nodes}
        self.hosts = {
            n: f"{SUBNET_PREFIX}.{REPLICA_HOST_FIRST + i}" for i, n in enumerate(self.nodes)
        }
        self.client_host = f"{SUBNET_PREFIX}.{CLIENT_HOST}"
        self.created: list[str] = []  # registered before each `ip netns add`, so a failed
        self.partition: Partition | None = None  # setup still cleans up what it made

    # --- setup ---------------------------------------------------------------------------------

    def setup(self) -> None:
        try:
            self._add_namespace(self.bridge_namespace)
            br = ["ip", "-n", self.bridge_namespace]
            commands.run([*br, "link", "add", BRIDGE, "type", "bridge"])
            commands.run([*br, "addr", "add", f"{self.client_host}/{SUBNET_BITS}", "dev", BRIDGE])
            commands.run([*br, "link", "set", BRIDGE, "up"])
            for i, node in enumerate(self.nodes):
                self._add_replica_host(i, node)
        except commands.CommandFailed as err:
            raise NetworkError(f"setting up the network: {err}") from err

    def _add_namespace(self, name: str) -> None:
        self.created.append(name)
        commands.run(["ip", "netns", "add", name])
        commands.run(["ip", "-n", name, "link", "set", "lo", "up"])

    def _add_replica_host(self, i: int, node: str) -> None:
        ns = self.namespaces[node]
        self._add_namespace(ns)
        br = ["ip", "-n", self.bridge_namespace]
        port = f"v{i}"
        commands.run(
            [*br, "link", "add", port, "type", "veth", "peer", "name", REPLICA_IFNAME, "netns", ns]
        )
        commands.run([*br, "link", "set", port, "master", BRIDGE])
        commands.run([*br, "link", "set", port, "up"])
        inside = ["ip", "-n", ns]
        commands.run(
            [*inside, "addr", "add", f"{self.hosts[node]}/{SUBNET_BITS}", "dev", REPLICA_IFNAME]
        )
        commands.run([*inside, "link", "set", REPLICA_IFNAME, "up"])
        iptables = ["ip", "netns", "exec", ns, "iptables", "-w"]
        commands.run([*iptables, "-N", CHAIN])
        commands.run([*iptables, "-I", "INPUT", "1", "-j", CHAIN])

    def prefix(self, node: str) -> list[str]:
        """Command prefix that runs a replica inside its host (`ip netns exec` execs, so the
        pid is the server's)."""
        return ["ip", "netns", "exec", self.namespaces[node]]

    # --- faults --------------------------------------------------------------------------------

    async def apply(self, partition: Partition) -> None:
        """Replace whatever partition is in force by `partition`."""
        await self.heal()
        self.partition = partition
        for dst, rules in drop_rules(partition, self.hosts, self.client_host).items():
            await self._restore(dst, f"*filter\n{rules}COMMIT\n")

    async def heal(self) -> None:
        self.partition = None
        for node in self.nodes:
            await commands.arun(
                ["ip", "netns", "exec", self.namespaces[node], "iptables", "-w", "-F", CHAIN]
            )

    async def _restore(self, node: str, rules: str) -> None:
        ns = self.namespaces[node]
        await commands.arun(
            ["ip", "netns", "exec", ns, "iptables-restore", "-w", "--noflush"], stdin=rules
        )

    def rules(self, node: str) -> list[str]:
        """The DROP rules now in force in `node`'s host, as iptables -S prints them."""
        out = commands.run(
            ["ip", "netns", "exec", self.namespaces[node], "iptables", "-w", "-S", CHAIN]
        )
        return [line for line in out.splitlines() if line.startswith(f"-A {CHAIN}")]

    # --- teardown ------------------------------------------------------------------------------

    def teardown(self) -> list[str]:
        """Delete every namespace this network registered, killing (-9) any process still in
        one first (only processes of this run can be there). Returns what could not be done."""
        problems: list[str] = []
        for name in reversed(self.created):
            problems.extend(kill_namespace_processes(name))
            try:
                commands.run(["ip", "netns", "del", name])
            except commands.CommandFailed as err:
                if os.path.exists(os.path.join(NETNS_DIR, name)):
                    problems.append(str(err))
        self.created = [n for n in self.created if os.path.exists(os.path.join(NETNS_DIR, n))]
        return problems


def drop_rules(partition: Partition, hosts: dict[str, str], client_host: str) -> dict[str, str]:
    """Per destination node, the iptables-restore lines of its DLCHAOS chain that enforce
    `partition`: one DROP per source, a replica's address or the client host's (CLIENT)."""
    out = {}
    for dst, srcs in drops_by_destination(partition).items():
        addresses = [client_host if src == CLIENT else hosts[src] for src in srcs]
        out[dst] = "".join(f"-A {CHAIN} -s {a}/32 -j DROP\n" for a in addresses)
    return out


def remove_run_namespaces(run_id: str) -> tuple[list[str], list[str]]:
    """After a harness that could not clean up (kill -9): delete run `run_id`'s namespaces,
    killing what is still inside. Returns (names removed, problems)."""
    removed, problems = [], []
    for name in run_namespaces(run_id):
        problems.extend(kill_namespace_processes(name))
        try:
            commands.run(["ip", "netns", "del", name])
            removed.append(name)
        except commands.CommandFailed as err:
            problems.append(str(err))
    return removed, problems


def kill_namespace_processes(name: str) -> list[str]:
    if not os.path.exists(os.path.join(NETNS_DIR, name)):
        return []
    try:
        out = commands.run(["ip", "netns", "pids", name])
    except commands.CommandFailed as err:
        return [str(err)]
    problems = []
    for pid in (int(p) for p in out.split()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        except OSError as err:
            problems.append(f"cannot kill pid {pid} in namespace {name}: {err}")
    return problems


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns: {os.strerror(errno)}")


@contextlib.contextmanager
def entered_namespace(name: str) -> Iterator[None]:
    """Move this thread (the one trio runs on) into namespace `name`, and back on the way out.
    Sockets made meanwhile stay in `name`; threads started meanwhile start there."""
    with (
        open("/proc/thread-self/ns/net", "rb") as home,
        open(os.path.join(NETNS_DIR, name), "rb") as target,
    ):
        _setns(target.fileno())
        try:
            yield
        finally:
            _setns(home.fileno())
