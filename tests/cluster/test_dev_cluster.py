"""`dledger-dev up|status|kill|down` with the default layout (2 name servers, 2 groups x 3),
brokers stood in for by fake_broker.py (`--broker-command`)."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from broker.localcluster import BrokerReplica, ClusterStatus
from devcluster.cli import format_cluster_status
from dledger.config import Address
from dledger.processes import free_port_block, wait_until

from .test_localcluster import FAKE_BROKER, gone


def dev_command(data: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "devcluster", "--data", str(data), *args]


def dev(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(dev_command(data, *args), capture_output=True, text=True, timeout=120)


def answering_and_registered(row: str) -> bool:
    """A replica's status row shows its role and the brokerId the name servers list it under."""
    fields = row.split()
    return len(fields) >= 6 and fields[2] in ("leader", "follower") and fields[5] != "-"


def up_args() -> list[str]:
    base = free_port_block(2 + 2 * 2 * 3)
    return ["up", "--base-port", str(base), "--broker-command", shlex.join(FAKE_BROKER)]


def test_up_status_kill_down(tmp_path: Path) -> None:
    data = tmp_path / "data"
    up = dev(data, *up_args())
    assert up.returncode == 0, up.stderr
    state = json.loads((data / "dev.json").read_text())
    pids = state["pids"]
    try:
        assert len(pids) == 8 and state["mode"] == "cluster"
        assert "broker-a: master" in up.stdout and "broker-b: master" in up.stdout
        # `up` returns once each group has a master on every name server; a follower's own
        # registration (every 0.3 s from the fake broker) may come a moment later
        wait_until(
            lambda: all(
                map(answering_and_registered, dev(data, "status").stdout.splitlines()[1:7])
            ),
            20,
            interval=0.2,
            what="every replica answering and registered with the name servers",
        )
        lines = dev(data, "status").stdout.splitlines()
        assert lines[0].split()[:6] == ["group", "replica", "role", "term", "leader", "ns"]
        assert lines[1].split()[:6] == ["broker-a", "n0", "leader", "1", "n0", "0"]
        assert lines[2].split()[:6] == ["broker-a", "n1", "follower", "1", "n0", "2"]
        assert "namesrv-1: up" in lines

        assert dev(data, *up_args()).returncode == 1  # already running

        killed = dev(data, "kill", "broker-a", "leader")
        assert killed.returncode == 0, killed.stderr
        assert killed.stdout.startswith(f"killed broker-a/n0 (pid {pids['broker-a/n0']})")
        wait_until(
            lambda: (
                "broker-a: master" in (out := dev(data, "status").stdout)
                and "(n1)" in out.split("broker-a: master")[1].splitlines()[0]
            ),
            20,
            interval=0.2,
            what="n1 master of broker-a",
        )
        assert dev(data, "kill", "broker-a", "n0").returncode == 1  # not running
    finally:
        down = dev(data, "down")
    assert down.returncode == 0
    assert gone(list(pids.values()))
    assert not (data / "dev.json").exists()


def test_foreground_shows_the_table_and_stops_everything_on_ctrl_c(tmp_path: Path) -> None:
    data = tmp_path / "data"
    p = subprocess.Popen(
        dev_command(data, *up_args(), "--foreground"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert p.stdout is not None
        deadline = time.monotonic() + 60
        seen = []
        while time.monotonic() < deadline:
            line = p.stdout.readline()
            if not line:
                break  # it exited
            seen.append(line)
            if line.startswith("broker-b n2") or line.split()[:3] == ["broker-b", "n2", "follower"]:
                break
        assert any(line.split()[:3] == ["broker-b", "n2", "follower"] for line in seen), "".join(
            seen
        )
        pids = json.loads((data / "dev.json").read_text())["pids"]
        p.send_signal(signal.SIGINT)
        assert p.wait(30) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert gone(list(pids.values()))
    assert not (data / "dev.json").exists()


def test_status_table_shows_indexes_and_lag_when_the_broker_reports_them() -> None:
    def replica(node: str, port: int) -> BrokerReplica:
        return BrokerReplica(
            "broker-a", node, Address("127.0.0.1", port + 100), Address("127.0.0.1", port), Path()
        )

    brokers = {"broker-a/n0": replica("n0", 10911), "broker-a/n1": replica("n1", 10912)}
    common = {"raftTerm": "3", "raftLeader": "n1"}
    status = ClusterStatus(
        cluster_infos={"namesrv-0": None},
        runtime_infos={
            "broker-a/n0": {
                **common,
                "raftRole": "follower",
                "commitIndex": "90",
                "appliedIndex": "88",
                "lastIndex": "95",
            },
            "broker-a/n1": {
                **common,
                "raftRole": "leader",
                "commitIndex": "99",
                "appliedIndex": "99",
                "lastIndex": "100",
            },
        },
    )
    lines = format_cluster_status(status, brokers, {}).splitlines()
    assert lines[1].split()[:9] == ["broker-a", "n0", "follower", "3", "n1", "-", "90", "88", "5"]
    assert lines[2].split()[:9] == ["broker-a", "n1", "leader", "3", "n1", "-", "99", "99", "0"]
    assert lines[3] == "broker-a: no master"


def test_status_table_shows_question_marks_for_what_a_broker_does_not_report() -> None:
    def replica(node: str, port: int) -> BrokerReplica:
        return BrokerReplica(
            "broker-a", node, Address("127.0.0.1", port + 100), Address("127.0.0.1", port), Path()
        )

    brokers = {"broker-a/n0": replica("n0", 10911), "broker-a/n1": replica("n1", 10912)}
    info = {
        "brokerAddrTable": {
            "broker-a": {"brokerName": "broker-a", "brokerAddrs": {"0": "127.0.0.1:10911"}}
        },
        "clusterAddrTable": {"DefaultCluster": ["broker-a"]},
    }
    status = ClusterStatus(
        cluster_infos={"namesrv-0": info, "namesrv-1": None},
        runtime_infos={"broker-a/n0": {"brokerVersion": "x"}, "broker-a/n1": None},
    )
    lines = format_cluster_status(status, brokers, {"broker-a/n0": 42}).splitlines()
    assert lines[1].split() == [
        *("broker-a", "n0", "?", "?", "?", "0", "?", "?", "?"),
        *("127.0.0.1:10911", "127.0.0.1:11011", "42"),
    ]
    assert lines[2].split() == ["broker-a", "n1", "down", "-", "127.0.0.1:10912", "127.0.0.1:11012"]
    assert lines[3:] == [
        "broker-a: master 127.0.0.1:10911 (n0)",
        "namesrv-0: up",
        "namesrv-1: down",
    ]
