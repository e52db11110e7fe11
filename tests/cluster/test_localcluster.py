"""LocalCluster with real name servers, and with stand-in brokers (fake_broker.py) that register
as a Raft group would, until the real broker exists (tests/compat/ drives the real one)."""

from __future__ import annotations

import shlex
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.localcluster import LocalCluster
from dledger.processes import wait_until

FAKE_BROKER = [sys.executable, str(Path(__file__).with_name("fake_broker.py"))]


def gone(pids: list[int]) -> bool:
    """Every pid exited: no such process, or a zombie (its parent, a `dledger-dev up` that
    returned, exited; nobody reaps it here)."""
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[0] != "Z":
            return False
    return True


@pytest.fixture
def fake_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path, namesrvs=2, broker_command=FAKE_BROKER)
    try:
        cluster.start_all()
        cluster.wait_serving(timeout=30)
        yield cluster
    finally:
        pids = list(cluster.pids().values())
        cluster.stop_all()
        assert gone(pids)


def test_broker_command_line_is_the_fixed_one(tmp_path: Path) -> None:
    cluster = LocalCluster(
        tmp_path,
        namesrv_ports=[9876, 9877],
        broker_ports={"broker-a/n1": (40912, 10912)},
        extra_broker_args=["--flush", "SYNC_FLUSH"],
    )
    args = cluster.broker_args("broker-a/n1")
    assert args[:3] == [sys.executable, "-m", "broker"]
    flags = dict(zip(args[3::2], args[4::2], strict=True))
    peers = flags["--peers"].split(";")
    assert flags["--group"] == "broker-a" and flags["--self-id"] == "n1"
    assert peers[1] == "n1-127.0.0.1:40912" and len(peers) == 3
    assert flags["--listen"] == "127.0.0.1:10912"
    assert flags["--namesrv"] == cluster.namesrv_addr == "127.0.0.1:9876;127.0.0.1:9877"
    assert flags["--store"] == str(tmp_path / "broker-a" / "n1")
    assert flags["--flush"] == "SYNC_FLUSH"
    assert list(cluster.processes) == [
        "namesrv-0",
        "namesrv-1",
        *(f"{g}/n{i}" for g in ("broker-a", "broker-b") for i in range(3)),
    ]
    assert cluster.processes["broker-b/n2"].log_path == tmp_path / "logs" / "broker-b-n2.log"
    assert shlex.join(cluster.processes["namesrv-1"].command).endswith("--listen 127.0.0.1:9877")


def test_name_servers_alone_kill_pause_resume_restart(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, namesrvs=2, groups=())
    try:
        cluster.start_all()
        cluster.wait_serving(timeout=30)
        infos = cluster.cluster_infos()
        assert set(infos) == {"namesrv-0", "namesrv-1"}
        assert all(info is not None and info["brokerAddrTable"] == {} for info in infos.values())

        cluster.pause("namesrv-0")
        assert cluster.serving_problem() == "namesrv-0 does not answer GET_BROKER_CLUSTER_INFO"
        cluster.resume("namesrv-0")
        cluster.wait_serving(timeout=10)

        first = cluster.pids()["namesrv-1"]
        cluster.kill("namesrv-1")
        assert "namesrv-1" not in cluster.pids() and gone([first])
        problem = cluster.serving_problem()
        assert problem is not None and problem.startswith("namesrv-1 exited with -9")
        with pytest.raises(RuntimeError, match="namesrv-1 exited"):
            cluster.wait_serving(timeout=10)
        cluster.restart("namesrv-1")
        cluster.wait_serving(timeout=30)
        assert cluster.processes["namesrv-1"].starts == 2
        assert "serving on 127.0.0.1" in cluster.log_text("namesrv-1")
    finally:
        pids = list(cluster.pids().values())
        cluster.stop_all()
    assert gone(pids) and cluster.pids() == {}
    # SIGTERM, not SIGKILL: the name servers exited 0
    assert {p.returncode for p in cluster.processes.values()} == {0}


def test_wait_serving_names_a_broker_that_exits(tmp_path: Path) -> None:
    cluster = LocalCluster(
        tmp_path,
        namesrvs=1,
        groups=("broker-a",),
        replicas=1,
        broker_command=[sys.executable, "-c", "import sys; sys.exit(3)"],
    )
    with cluster, pytest.raises(RuntimeError, match=r"broker-a/n0 exited with 3"):
        cluster.start_all()
        cluster.wait_serving(timeout=30)


def test_leaders_come_from_the_name_servers(fake_cluster: LocalCluster) -> None:
    c = fake_cluster
    for group in ("broker-a", "broker-b"):
        assert c.leader_of(group) == c.broker_addresses(group)[0]
        assert c.leader_name(group) == f"{group}/n0"
    info = c.runtime_info("broker-a/n1")
    assert info == {"raftRole": "follower", "raftTerm": "1", "raftLeader": "n0"}

    c.kill("broker-a/n0")
    new = c.broker_addresses("broker-a")[1]
    wait_until(lambda: c.leader_of("broker-a") == new, 15, interval=0.1, what="n1 master")
    assert c.masters("broker-a") == {"namesrv-0": new, "namesrv-1": new}
    assert c.leader_of("broker-b") == c.broker_addresses("broker-b")[0]
    assert c.runtime_info("broker-a/n0") is None

    c.pause("namesrv-1")  # a name server that does not answer does not hide the master
    assert c.masters("broker-a") == {"namesrv-0": new, "namesrv-1": None}
    assert c.leader_of("broker-a") == new
    c.resume("namesrv-1")

    c.restart("broker-a/n2")
    c.kill("broker-b/n1", signal.SIGTERM)
    wait_until(lambda: "broker-b/n1" not in c.pids(), 10, what="broker-b/n1 exited")
    assert c.processes["broker-a/n2"].starts == 2
