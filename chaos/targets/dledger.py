"""The dledger target: a group of real `dledger-server` processes, one per network namespace,
started and stopped by pid through LocalGroup, watched and read back through dledger.client.

The harness's own client lives in the bridge namespace (chaos/net.py), so it reaches every
replica whatever the partition: partitions are between replicas.
"""

from __future__ import annotations

import random
import re
import signal
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from chaos.final import FinalState, LogEntry, ReplicaLog
from chaos.net import Network
from chaos.targets.base import Crash, TargetStartFailed
from chaos.targets.dledger_disk import damage_tail
from dledger import limits
from dledger.client import ClientError, DLedgerClient, Entry, open_client
from dledger.config import Address
from dledger.localgroup import LocalGroup

GROUP = "g"
PORT = 7000  # the same in every namespace: each replica is its own host
SEGMENT_BYTES = 4 * limits.MiB  # small segments: rollover happens during a run (~70k entries)
INDEX_RECORDS_PER_FILE = 1 << 16
SERVER_ARGS = [
    "--segment-bytes",
    str(SEGMENT_BYTES),
    "--index-records-per-file",
    str(INDEX_RECORDS_PER_FILE),
    "--cache-tail-bytes",  # small: catch-up reads what the store let go of, under faults
    str(1 * limits.MiB),
    "--log-level",
    "INFO",
]
SERVING_TIMEOUT_S = 30.0  # a replica starts (imports, opens its store) within this
STATUS_TIMEOUT_S = 0.5  # a status request a replica does not answer by then: paused or gone
CONNECT_PROBE_S = 0.5
POLL_S = 0.05
READ_TIMEOUT_S = 120.0  # reading one replica's whole committed log
LOG_TAIL_CHARS = 2000
RECOVERED = re.compile(r"store recovered: (.*)")


def node_names(count: int) -> list[str]:
    return [f"n{i}" for i in range(count)]


class DLedgerTarget:
    def __init__(
        self,
        root: Path,
        network: Network,
        *,
        server_args: Sequence[str] = SERVER_ARGS,
    ) -> None:
        self.nodes = list(network.nodes)
        assert self.nodes == node_names(len(self.nodes)), self.nodes
        self.group = GROUP
        self.network = network
        self.local = LocalGroup(
            root,
            group=GROUP,
            nodes=len(self.nodes),
            hosts=[network.hosts[n] for n in self.nodes],
            ports=[PORT] * len(self.nodes),
            extra_args=server_args,
            prefix=network.prefix,
        )
        self.expected_down: set[str] = set()
        self.paused: set[str] = set()
        self.crashes: list[Crash] = []
        self._client: DLedgerClient | None = None

    @property
    def peers(self) -> dict[str, Address]:
        return self.local.peers

    @property
    def client(self) -> DLedgerClient:
        assert self._client is not None, "the target is not running"
        return self._client

    @asynccontextmanager
    async def started(self) -> AsyncIterator[DLedgerTarget]:
        """Start every replica, wait until each serves, hold a control client; stop all on
        the way out, whatever the way."""
        try:
            self.local.start_all()
            await self.wait_serving(self.nodes)
            async with open_client(self.peers) as client:
                self._client = client
                try:
                    yield self
                finally:
                    self._client = None
        finally:
            self.stop_all()

    # --- processes -----------------------------------------------------------------------------

    def kill(self, node: str) -> None:
        self.expected_down.add(node)
        self.paused.discard(node)
        self.local.kill(node)

    def pause(self, node: str) -> None:
        self.paused.add(node)
        self.local.signal(node, signal.SIGSTOP)

    def resume(self, node: str) -> None:
        self.paused.discard(node)
        if self.running(node):
            self.local.signal(node, signal.SIGCONT)

    def start(self, node: str) -> None:
        self.local.start(node)
        self.expected_down.discard(node)

    def running(self, node: str) -> bool:
        return self.local.replicas[node].running

    def pids(self) -> dict[str, int]:
        return self.local.pids()

    def stop_all(self) -> None:
        self.local.stop_all()
        self.paused.clear()

    def check_crashes(self, now_ns: int) -> list[Crash]:
        found = []
        for node, replica in self.local.replicas.items():
            process = replica.process
            if node in self.expected_down or process is None or process.poll() is None:
                continue
            self.expected_down.add(node)
            tail = self.local.log_text(node)[-LOG_TAIL_CHARS:]
            found.append(Crash(node, process.returncode, now_ns, tail))
        self.crashes.extend(found)
        return found

    def damage_tail(self, node: str, mode: str, rng: random.Random) -> dict[str, Any]:
        assert not self.running(node), f"{node} must be killed before its disk is touched"
        return damage_tail(self.local.replicas[node].store_dir, mode, rng).describe()

    def recovery_note(self, node: str) -> str | None:
        found = RECOVERED.findall(self.local.log_text(node))
        return found[-1] if found else None

    # --- asking the replicas -------------------------------------------------------------------

    async def wait_serving(
        self, nodes: Sequence[str], timeout_s: float = SERVING_TIMEOUT_S
    ) -> None:
        for node in nodes:
            with trio.move_on_after(timeout_s):
                while not await self._accepts(node):
                    replica = self.local.replicas[node]
                    if replica.process is not None and replica.process.poll() is not None:
                        tail = self.local.log_text(node)[-LOG_TAIL_CHARS:]
                        raise TargetStartFailed(
                            f"{node} exited with {replica.process.returncode} at start:\n{tail}"
                        )
                    await trio.sleep(POLL_S)
                continue
            raise TargetStartFailed(f"{node} did not accept connections within {timeout_s} s")

    async def _accepts(self, node: str) -> bool:
        address = self.peers[node]
        try:
            with trio.fail_after(CONNECT_PROBE_S):
                stream = await trio.open_tcp_stream(address.host, address.port)
        except (OSError, trio.TooSlowError):
            return False
        await stream.aclose()
        return True

    async def status(self, node: str) -> dict[str, Any] | None:
        if not self.running(node) or node in self.paused:
            return None
        try:
            return await self.client.status(node, timeout=STATUS_TIMEOUT_S)
        except (ClientError, trio.TooSlowError):
            return None

    async def statuses(self) -> dict[str, dict[str, Any] | None]:
        found: dict[str, dict[str, Any] | None] = {}

        async def ask(node: str) -> None:
            found[node] = await self.status(node)

        async with trio.open_nursery() as nursery:
            for node in self.nodes:
                nursery.start_soon(ask, node)
        return found

    async def leader(self) -> str | None:
        leaders = [s for s in (await self.statuses()).values() if s and s["role"] == "leader"]
        if not leaders:
            return None
        return str(max(leaders, key=lambda s: s["term"])["node"])

    async def wait_leader(self, timeout_s: float) -> str | None:
        with trio.move_on_after(timeout_s):
            while (leader := await self.leader()) is None:
                await trio.sleep(POLL_S)
            return leader
        return None

    async def wait_recovered(self, timeout_s: float) -> bool:
        """Every replica answers, one leads, and each has committed what the leader had
        committed when this was first seen (so catch-up under load ends)."""
        goal: int | None = None
        with trio.move_on_after(timeout_s):
            while True:
                found = await self.statuses()
                answered = [s for s in found.values() if s is not None]
                leaders = [s for s in answered if s["role"] == "leader"]
                if len(answered) == len(self.nodes) and leaders:
                    leader = max(leaders, key=lambda s: s["term"])
                    if goal is None:
                        goal = int(leader["commit_index"])
                    if all(int(s["commit_index"]) >= goal for s in answered):
                        return True
                await trio.sleep(POLL_S)
        return False

    async def wait_converged(self, timeout_s: float) -> bool:
        with trio.move_on_after(timeout_s):
            while True:
                found = await self.statuses()
                answered = [s for s in found.values() if s is not None]
                if len(answered) == len(self.nodes) and any(
                    s["role"] == "leader" for s in answered
                ):
                    indexes = {(s["commit_index"], s["last_index"]) for s in answered}
                    if len(indexes) == 1 and len(set(next(iter(indexes)))) == 1:
                        return True
                await trio.sleep(POLL_S)
        return False

    async def read_final(self) -> FinalState:
        replicas = {node: await self._read_replica(node) for node in self.nodes}
        problems = tuple(f"{n}: {r.error}" for n, r in replicas.items() if r.error is not None)
        return FinalState(replicas=replicas, complete=not problems, problems=problems)

    async def _read_replica(self, node: str) -> ReplicaLog:
        if not self.running(node):
            return ReplicaLog(node, error="not running")
        try:
            with trio.fail_after(READ_TIMEOUT_S):
                status = await self.client.status(node, timeout=READ_TIMEOUT_S)
                commit, last = int(status["commit_index"]), int(status["last_index"])
                committed = await self.client.read_log(node, last=commit, timeout=READ_TIMEOUT_S)
                uncommitted = await self._read_uncommitted(node, commit + 1, last)
        except (ClientError, trio.TooSlowError, KeyError) as err:
            return ReplicaLog(node, error=f"read failed: {err!r}")
        return ReplicaLog(
            node=node,
            committed=tuple(_entry(e) for e in committed),
            uncommitted=tuple(_entry(e) for e in uncommitted),
            commit_index=commit,
            last_index=last,
            first_index=int(status["first_index"]),
            term=int(status["term"]),
            role=str(status["role"]),
        )

    async def _read_uncommitted(self, node: str, first: int, last: int) -> list[Entry]:
        entries: list[Entry] = []
        index = first
        while index <= last:
            count = min(limits.GET_BATCH_ENTRIES_MAX, last - index + 1)
            page = await self.client.get(index, count, node=node, committed=False)
            if not page:
                break
            entries.extend(page)
            index = page[-1].index + 1
        return entries


def _entry(e: Entry) -> LogEntry:
    return LogEntry(e.index, e.term, e.kind, bytes(e.body))
