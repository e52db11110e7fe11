"""Three real dledger-server processes on 127.0.0.1: kills, pauses, a wiped replica."""

from __future__ import annotations

import contextlib
import itertools
import signal
import time

import trio

from dledger.client import AppendFailed, DLedgerClient, Entry, OutcomeUnknown, open_client
from dledger.localgroup import LocalGroup
from tests.node.conftest import wait_converged, wait_for_leader

WORKERS = 16
APPENDS = 10_000
KILLS = 5


async def read_all(client: DLedgerClient, nodes: list[str]) -> dict[str, list[Entry]]:
    return {node: await client.read_log(node) for node in nodes}


def check_replicas_agree(logs: dict[str, list[Entry]]) -> list[Entry]:
    nodes = sorted(logs)
    reference = logs[nodes[0]]
    for node in nodes[1:]:
        assert [(e.index, e.term, e.kind, e.position, e.body) for e in logs[node]] == [
            (e.index, e.term, e.kind, e.position, e.body) for e in reference
        ], f"{node} differs from {nodes[0]}"
    return reference


def check_acked(log: list[Entry], acked: dict[bytes, int]) -> None:
    by_index = {e.index: e.body for e in log}
    lost = [v for v, i in acked.items() if by_index.get(i) != v]
    assert not lost, f"{len(lost)} acknowledged appends missing, e.g. {lost[:5]}"


async def test_concurrent_appends_survive_repeated_leader_kills(group: LocalGroup) -> None:
    """10,000 appends from 16 concurrent clients while the leader is killed with -9 five times
    (never the same victim twice running); every acknowledged append is afterwards on every
    replica at its acknowledged index, the replicas agree byte for byte, per-client order holds,
    and each killed node restarted and caught up."""
    nodes = list(group.replicas)
    acked: dict[bytes, int] = {}
    order: dict[int, list[int]] = {w: [] for w in range(WORKERS)}
    unknown = 0
    victims: list[str] = []
    async with open_client(group.peers) as client:
        await wait_for_leader(client)

        async def worker(w: int) -> None:
            nonlocal unknown
            n = 0
            while len(acked) < APPENDS:
                value = f"w{w}-{n}".encode()
                n += 1
                try:
                    index = await client.append(value, timeout=5)
                except OutcomeUnknown:
                    unknown += 1
                    continue
                except AppendFailed:
                    continue
                acked[value] = index
                order[w].append(index)

        async def nemesis() -> None:
            for k in range(KILLS):
                target = (k + 1) * APPENDS // (KILLS + 2)
                with trio.fail_after(60):
                    while len(acked) < target:
                        await trio.sleep(0.02)
                leader = await wait_for_leader(client)
                if victims and leader == victims[-1]:
                    other = next(n for n in nodes if n != leader)
                    await client.transfer(other)
                    with trio.fail_after(10):
                        while (leader := await wait_for_leader(client)) == victims[-1]:
                            await trio.sleep(0.02)
                group.kill(leader)
                victims.append(leader)
                new_leader = await wait_for_leader(client, timeout=10)
                assert new_leader != leader
                group.start(leader)  # restarts and catches up from the new leader

        with trio.fail_after(240):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(nemesis)
                for w in range(WORKERS):
                    nursery.start_soon(worker, w)

        assert len(victims) == KILLS
        assert all(a != b for a, b in itertools.pairwise(victims))
        statuses = await wait_converged(client, nodes)
        logs = await read_all(client, nodes)
    log = check_replicas_agree(logs)
    check_acked(log, acked)
    for w, indexes in order.items():
        assert indexes == sorted(indexes), f"client {w}'s acked appends are out of order"
    digests = {
        s["applied_digest"] for s in statuses.values() if s["applied_digest"].startswith("0:")
    }
    assert len(digests) <= 1, digests
    print(f"acked {len(acked)}, unknown {unknown}, victims {victims}")


async def test_paused_leader_steps_down_and_its_uncommitted_suffix_is_never_applied(
    group: LocalGroup,
) -> None:
    nodes = list(group.replicas)
    async with open_client(group.peers) as client:
        old = await wait_for_leader(client)
        for i in range(50):
            await client.append(f"before-{i}".encode())
        before = await client.status(old)
        group.signal(old, signal.SIGSTOP)
        try:
            # A client that only knows the paused leader keeps writing to it: these frames wait
            # in its socket and are handled as if it still led once it runs again.
            stale = {old: group.peers[old]}
            async with open_client(stale) as stale_client, trio.open_nursery() as nursery:

                async def write_to_paused() -> None:
                    for i in range(20):
                        nursery.start_soon(_append_quietly, stale_client, f"stale-{i}".encode())

                await write_to_paused()
                new = None
                with trio.fail_after(10):
                    while new in (None, old):
                        new = await client.find_leader(timeout=5)
                for i in range(50):
                    await client.append(f"after-{i}".encode())
                group.signal(old, signal.SIGCONT)
        finally:
            group.signal(old, signal.SIGCONT)
        with trio.fail_after(15):
            while (s := await client.status(old))["term"] <= before["term"] or s[
                "role"
            ] == "leader":
                await trio.sleep(0.05)
        assert s["role"] == "follower"
        statuses = await wait_converged(client, nodes)
        logs = await read_all(client, nodes)
    log = check_replicas_agree(logs)
    bodies = [e.body for e in log]
    assert [b for b in bodies if b.startswith(b"after-")] == [
        f"after-{i}".encode() for i in range(50)
    ]
    # Same applied index and digest everywhere: the old leader applied nothing it later cut.
    assert len({(s["applied_index"], s["applied_digest"]) for s in statuses.values()}) == 1


async def _append_quietly(client: DLedgerClient, value: bytes) -> None:
    with contextlib.suppress(OutcomeUnknown, AppendFailed):
        await client.append(value, timeout=3)


async def test_wiped_follower_rejoins_and_catches_up(group: LocalGroup) -> None:
    nodes = list(group.replicas)
    async with open_client(group.peers) as client:
        leader = await wait_for_leader(client)
        for i in range(0, 3000, 100):
            await client.append([f"e{j}".encode() * 20 for j in range(i, i + 100)])
        follower = next(n for n in nodes if n != leader)
        group.stop(follower)
        import shutil

        shutil.rmtree(group.replicas[follower].store_dir)
        group.start(follower)
        await wait_converged(client, nodes, timeout=30)
        logs = await read_all(client, nodes)
    assert len(check_replicas_agree(logs)) >= 3000


async def test_leadership_transfer_and_status(group: LocalGroup) -> None:
    async with open_client(group.peers) as client:
        leader = await wait_for_leader(client)
        target = next(n for n in group.replicas if n != leader)
        await client.append(b"x")
        await client.transfer(target)
        deadline = time.monotonic() + 10
        while (await client.find_leader()) != target:
            assert time.monotonic() < deadline, "transfer did not complete"
            await trio.sleep(0.02)
        status = await client.status(target)
    assert status["role"] == "leader"
    for key in (
        "term",
        "leader",
        "first_index",
        "last_index",
        "commit_index",
        "applied_index",
        "peers",
    ):
        assert key in status
    for peer in status["peers"].values():
        assert {"match_index", "lag", "connected"} <= set(peer)
    # SYNC_FLUSH (the default): the target fsynced what it appended, counting each round
    assert status["flush"] == "SYNC_FLUSH"
    assert status["flushes"] >= 1 and status["fsyncs"] >= status["flushes"]
