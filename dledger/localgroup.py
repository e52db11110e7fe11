"""A group of real `dledger-server` processes on this machine, for tests, benchmarks, chaos and
`dledger-dev`. Every process it starts it records by pid and stops by pid; nothing is found or
killed by name.

Process helpers (spawn, stop by pid, free ports, polling with a deadline) live in
`dledger/processes.py`, shared with `broker.localcluster.LocalCluster`.

A replica may run under a command prefix (chaos runs each one inside its own network
namespace with `ip netns exec <name>`, which execs, so the pid stays the server's).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import attrs

from dledger.config import Address, format_peers
from dledger.processes import (
    STOP_TIMEOUT_S,
    free_port,
    kill_process,
    spawn,
    stop_process,
    wait_until,
)

__all__ = ["STOP_TIMEOUT_S", "LocalGroup", "Replica", "free_port", "running_group", "wait_until"]


@attrs.define
class Replica:
    node: str
    address: Address
    store_dir: Path
    log_path: Path
    prefix: list[str] = attrs.field(factory=list)
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def pid(self) -> int | None:
        return (
            self.process.pid if self.process is not None and self.process.poll() is None else None
        )

    @property
    def running(self) -> bool:
        return self.pid is not None


class LocalGroup:
    def __init__(
        self,
        root: Path,
        *,
        group: str = "g",
        nodes: int = 3,
        hosts: Sequence[str] | None = None,
        ports: Sequence[int] | None = None,
        extra_args: Sequence[str] = (),
        prefix: Callable[[str], list[str]] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.root = root
        self.group = group
        self.extra_args = list(extra_args)
        self.env = env
        hosts = list(hosts) if hosts else ["127.0.0.1"] * nodes
        ports = list(ports) if ports else [free_port(h) for h in hosts]
        self.replicas: dict[str, Replica] = {}
        for i in range(nodes):
            node = f"n{i}"
            self.replicas[node] = Replica(
                node=node,
                address=Address(hosts[i], ports[i]),
                store_dir=root / group / node,
                log_path=root / "logs" / f"{group}-{node}.log",
                prefix=prefix(node) if prefix else [],
            )

    @property
    def peers(self) -> dict[str, Address]:
        return {r.node: r.address for r in self.replicas.values()}

    @property
    def peers_arg(self) -> str:
        return format_peers(self.peers)

    def command(self, node: str) -> list[str]:
        r = self.replicas[node]
        return [
            *r.prefix,
            sys.executable,
            "-m",
            "dledger.server",
            "--group",
            self.group,
            "--self-id",
            node,
            "--peers",
            self.peers_arg,
            "--store",
            str(r.store_dir),
            *self.extra_args,
        ]

    def start(self, node: str) -> Replica:
        r = self.replicas[node]
        assert not r.running, f"{node} is already running as pid {r.pid}"
        r.process = spawn(self.command(node), r.log_path, self.env)
        r.starts += 1
        return r

    def start_all(self) -> None:
        for node in self.replicas:
            if not self.replicas[node].running:
                self.start(node)

    def signal(self, node: str, signum: int) -> None:
        pid = self.replicas[node].pid
        assert pid is not None, f"{node} is not running"
        os.kill(pid, signum)

    def kill(self, node: str) -> None:
        """kill -9, and reap it."""
        r = self.replicas[node]
        if r.process is not None:
            kill_process(r.process)

    def stop(self, node: str) -> None:
        """SIGTERM (after SIGCONT, in case it is paused), then SIGKILL if it lingers."""
        r = self.replicas[node]
        if r.process is not None:
            stop_process(r.process)

    def stop_all(self) -> None:
        for node in self.replicas:
            self.stop(node)

    def serving(self, node: str) -> bool:
        """The replica accepts connections."""
        address = self.replicas[node].address
        try:
            with socket.create_connection((address.host, address.port), timeout=0.5):
                return True
        except OSError:
            return False

    def wait_serving(self, nodes: Sequence[str] | None = None, timeout: float = 20.0) -> None:
        for node in nodes or list(self.replicas):
            wait_until(lambda node=node: self.serving(node), timeout, what=f"{node} serving")  # type: ignore[misc]

    def pids(self) -> dict[str, int]:
        return {n: r.pid for n, r in self.replicas.items() if r.pid is not None}

    def log_text(self, node: str) -> str:
        path = self.replicas[node].log_path
        return path.read_text(errors="replace") if path.exists() else ""

    def __enter__(self) -> LocalGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


@contextlib.contextmanager
def running_group(root: Path, **kwargs: object) -> Iterator[LocalGroup]:
    group = LocalGroup(root, **kwargs)  # type: ignore[arg-type]
    try:
        group.start_all()
        yield group
    finally:
        group.stop_all()
