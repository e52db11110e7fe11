"""dledger-dev up --dledger: the milestone-1 group (tests/cluster/test_dev_cluster.py has the
default, a whole broker cluster)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from dledger.cli import format_status
from dledger.localgroup import wait_until
from dledger.processes import free_port_block


def dev(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "devcluster", "--data", str(data), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def gone(pid: int) -> bool:
    """Exited: no such process, or a zombie (its parent, `dledger-dev up`, exited long ago)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_up_status_down(tmp_path: Path) -> None:
    data = tmp_path / "data"
    port = free_port_block(3)
    up = dev(data, "up", "--dledger", "--base-port", str(port))
    assert up.returncode == 0, up.stderr
    pids = json.loads((data / "dev.json").read_text())["pids"]
    try:
        assert len(pids) == 3
        wait_until(
            lambda: "leader n" in dev(data, "status").stdout, 20, interval=0.2, what="a leader"
        )
        again = dev(data, "up", "--dledger", "--base-port", str(port))
        assert again.returncode == 1 and "already running" in again.stderr
    finally:
        down = dev(data, "down")
    assert down.returncode == 0
    assert all(gone(pid) for pid in pids.values())
    assert not (data / "dev.json").exists()


def test_foreground_shows_a_table_and_stops_the_group_on_ctrl_c(tmp_path: Path) -> None:
    data = tmp_path / "data"
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "devcluster",
            "--data",
            str(data),
            "up",
            "--foreground",
            "--dledger",
            "--base-port",
            str(free_port_block(3)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert p.stdout is not None
        deadline = time.monotonic() + 30
        seen = []
        while time.monotonic() < deadline:
            line = p.stdout.readline()
            seen.append(line)
            if line.startswith("leader n"):
                break
        assert any(line.startswith("leader n") for line in seen), "".join(seen)
        pids = json.loads((data / "dev.json").read_text())["pids"]
        p.send_signal(signal.SIGINT)
        assert p.wait(30) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert all(gone(pid) for pid in pids.values())


def test_status_table_says_when_a_node_was_told_it_is_out_of_the_group() -> None:
    rows = [
        {"node": "n0", "role": "leader", "term": 4, "removed_at": 0},
        {"node": "n3", "role": "follower", "term": 6, "removed_at": 12},
        {"node": "n1", "role": "down", "error": "timeout"},
    ]
    lines = format_status(rows).splitlines()
    assert lines[1].split()[:3] == ["n0", "leader", "4"]
    assert lines[2].split()[:5] == ["n3", "follower", "(removed", "at", "12)"]
    assert lines[3].split()[:2] == ["n1", "down"]
