"""End to end: a real 3-replica dledger-server group takes appends through a leader kill, then
dledger-audit passes on its stores (with the acknowledged appends as a history) on local[2];
and (marked slow) on a standalone master with two workers, finding the same."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import attrs
import pytest
import trio

from dledger.client import AppendFailed, OutcomeUnknown, open_client
from dledger.localgroup import LocalGroup
from spark import standalone

pytestmark = pytest.mark.spark

REPO = Path(__file__).parents[2]
WORKERS = 8
APPENDS = 3000


def run_group_with_a_leader_kill(root: Path) -> tuple[LocalGroup, list[dict[str, object]], int]:
    group = LocalGroup(
        root, extra_args=["--segment-bytes", str(256 << 10), "--index-records-per-file", "512"]
    )
    group.start_all()
    group.wait_serving()
    history: list[dict[str, object]] = []
    t0 = time.monotonic_ns()

    def record(op: dict[str, object], kind: str, **outcome: object) -> None:
        history.append({**op, "type": kind, **outcome, "time_ns": time.monotonic_ns() - t0})

    async def drive() -> int:
        acked = 0
        async with open_client(group.peers) as client:
            assert await client.find_leader(timeout=20)

            async def worker(w: int) -> None:
                nonlocal acked
                n = 0
                while acked < APPENDS:
                    value = f"w{w}-{n}-" + "x" * 300
                    n += 1
                    op = {"process": w, "f": "append", "value": value, "group": group.group}
                    record(op, "invoke")
                    try:
                        index = await client.append(value.encode(), timeout=5)
                    except (OutcomeUnknown, AppendFailed) as err:
                        kind = "info" if isinstance(err, OutcomeUnknown) else "fail"
                        record(op, kind, error=str(err))
                        continue
                    record(op, "ok", index=index)
                    acked += 1

            async def nemesis() -> None:
                with trio.fail_after(60):
                    while acked < APPENDS // 2:
                        await trio.sleep(0.02)
                leader = await client.find_leader(timeout=10)
                assert leader is not None
                group.kill(leader)
                group.start(leader)

            with trio.fail_after(180):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(nemesis)
                    for w in range(WORKERS):
                        nursery.start_soon(worker, w)
            with trio.fail_after(60):  # every replica caught up and applied everything
                while True:
                    statuses = [await client.status(n) for n in group.replicas]
                    commits = {s["commit_index"] for s in statuses}
                    if len(commits) == 1 and {s["last_index"] for s in statuses} == commits:
                        return commits.pop()
                    await trio.sleep(0.05)

    try:
        commit = trio.run(drive)
    finally:
        group.stop_all()  # a clean stop writes each replica's final checkpoint
    return group, history, commit


def audit(stores: Path, history: Path | None, out: Path, master: str) -> dict[str, object]:
    """dledger-audit in its own process; without a history the job screens chunks first."""
    given = [] if history is None else ["--history", str(history)]
    result = subprocess.run(
        [sys.executable, "-m", "spark.audit", "--stores", str(stores), *given,
         "--out", str(out), "--master", master, "--quiet"],
        capture_output=True, text=True, timeout=600, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    report: dict[str, object] = json.loads((out / "report.json").read_text())
    return report


@attrs.frozen
class KilledGroupRun:
    stores: Path
    history: Path
    acked: int
    commit: int


@pytest.fixture(scope="module")
def killed_group_run(tmp_path_factory: pytest.TempPathFactory) -> KilledGroupRun:
    root = tmp_path_factory.mktemp("e2e")
    group, ops, commit = run_group_with_a_leader_kill(root / "run")
    history = root / "history.jsonl"
    history.write_text("".join(json.dumps(op) + "\n" for op in ops))
    acked = sum(1 for op in ops if op["type"] == "ok")
    assert acked >= APPENDS
    return KilledGroupRun(root / "run" / group.group, history, acked, commit)


def test_audit_passes_on_a_real_group_after_a_leader_kill(
    killed_group_run: KilledGroupRun, tmp_path: Path, archive: Path
) -> None:
    """The audits' drivers map the run's JVM class archive (conftest.archive)."""
    run = killed_group_run
    local = audit(run.stores, run.history, tmp_path / "audit-local", "local[2]")
    assert local["verdict"] == "consistent", local
    replicas = local["replicas"]
    assert isinstance(replicas, list) and len(replicas) == 3
    # every replica holds at least what was committed (stopping the group may add a no-op or
    # two: once the leader stops first, the others elect a new one)
    assert all(r["last_index"] >= run.commit for r in replicas)
    assert local["entries_checked"] == sum(r["entries"] for r in replicas) >= 3 * run.commit
    assert local["history"] == {"file": str(run.history), "acknowledged": run.acked}


@pytest.mark.slow  # three more JVMs (~30 s): the default run has a 20-minute budget
def test_a_standalone_master_audits_the_same_stores_unchanged(
    killed_group_run: KilledGroupRun, tmp_path: Path, archive: Path
) -> None:
    run = killed_group_run
    local = audit(run.stores, None, tmp_path / "audit-local", "local[2]")
    cluster = tmp_path / "cluster"
    url = standalone.start(cluster, workers=2)
    try:
        # no history: the screening pass runs on the workers, from the package shipped to them
        remote = audit(run.stores, None, tmp_path / "audit-standalone", url)
    finally:
        standalone.stop(cluster)
    assert remote["verdict"] == "consistent", remote
    assert remote["entries_checked"] == local["entries_checked"]
    assert remote["replicas"] == local["replicas"]  # spans from screening equal the rows read
    assert not list(cluster.glob("*.pid"))
