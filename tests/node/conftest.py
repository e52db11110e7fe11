from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from dledger.client import DLedgerClient, open_client
from dledger.localgroup import LocalGroup

# Small segments so that rollover happens during the tests; default timeouts otherwise.
SERVER_ARGS = [
    "--segment-bytes",
    str(1 << 20),
    "--index-records-per-file",
    "4096",
    "--log-level",
    "INFO",
]


def _running(root: Path) -> Iterator[LocalGroup]:
    g = LocalGroup(root, extra_args=SERVER_ARGS)
    g.start_all()
    try:
        g.wait_serving()
        yield g
    finally:
        pids = [r.process.pid for r in g.replicas.values() if r.process is not None]
        g.stop_all()
        for pid in pids:  # everything we started is gone
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)


@pytest.fixture
def group(tmp_path: Path) -> Iterator[LocalGroup]:
    """A fresh group per test, for tests that kill, pause or wipe replicas."""
    yield from _running(tmp_path)


@pytest.fixture(scope="module")
def shared_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGroup]:
    """One group for a module's tests that leave it as they found it."""
    yield from _running(tmp_path_factory.mktemp("shared"))


async def wait_for_leader(client: DLedgerClient, timeout: float = 10.0) -> str:
    leader = await client.find_leader(timeout=timeout)
    assert leader is not None, "no leader elected"
    return leader


async def wait_converged(
    client: DLedgerClient, nodes: list[str], timeout: float = 20.0
) -> dict[str, dict]:
    """Poll until every node applied the same commit index (and a leader exists)."""
    with trio.fail_after(timeout):
        while True:
            statuses = {}
            for node in nodes:
                try:
                    statuses[node] = await client.status(node, timeout=1.0)
                except Exception:  # a node still starting: poll again
                    break
            else:
                commits = {s["commit_index"] for s in statuses.values()}
                applied = {s["applied_index"] for s in statuses.values()}
                lasts = {s["last_index"] for s in statuses.values()}
                leaders = [s for s in statuses.values() if s["role"] == "leader"]
                if leaders and len(commits) == 1 and applied == commits and lasts == commits:
                    return statuses
            await trio.sleep(0.05)


__all__ = ["SERVER_ARGS", "open_client", "wait_converged", "wait_for_leader"]
