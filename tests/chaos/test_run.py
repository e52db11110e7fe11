"""Real chaos runs through the command line: one short run that must pass, interrupted runs
that must leave nothing behind, and the refusal to run without what a run needs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from chaos import capabilities
from chaos.broker_run import broker_args
from chaos.cli import build_parser
from chaos.run import RunConfig, SetupFailed
from chaos.targets.broker import BROKER_ARGS

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "chaos.cli"]
RUN_TIMEOUT_S = 240.0  # the short run takes ~50 s on a quiet machine
START_TIMEOUT_S = 60.0  # until an interrupted run's first fault is in force
STOP_TIMEOUT_S = 60.0  # from the signal until the interrupted run has cleaned up and exited

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="chaos runs need root (network namespaces, veth, iptables)"
)


def leftovers(run_dir: Path) -> list[str]:
    """Anything of the run in `run_dir` still on this machine: its namespaces (by the names it
    gave them), links in the root namespace named after it, processes whose command line names
    its scratch directory, the scratch directory itself."""
    info = json.loads((run_dir / "run.json").read_text())
    run_id, scratch = info["run_id"], info["scratch"]
    found = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [f"namespace {line}" for line in netns.splitlines() if run_id in line]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    found += [f"link {line}" for line in links.splitlines() if run_id in line]
    chains = subprocess.run(["iptables", "-w", "-S"], capture_output=True, text=True).stdout
    found += [f"iptables {line}" for line in chains.splitlines() if "DLCHAOS" in line]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if scratch in cmdline:
            found.append(f"process {proc.name}: {cmdline[:200]}")
    if Path(scratch).exists():
        found.append(f"scratch directory {scratch}")
    return found


def chaos_run(out: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, "run", "--target", "dledger", "--out", str(out), *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@needs_root
@pytest.mark.chaos
def test_a_short_run_with_a_leader_kill_a_partition_and_a_pause_passes(tmp_path: Path) -> None:
    out = tmp_path / "mixed"
    p = chaos_run(out, "--scenario", "mixed", "--duration", "45", "--seed", "7")
    try:
        stdout, stderr = p.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        p.kill()
    report = json.loads((out / "report.json").read_text())
    assert p.returncode == 0, f"{stdout}\n{stderr[-3000:]}\n{report['reasons']}"
    assert report["verdict"] == "pass"
    assert {"kill-leader", "partition-leader", "pause-leader"} <= set(report["faults"])
    assert report["acked"] > 0 and report["acked_lost"] == 0
    assert report["order_violations"] == 0 and report["replicas_agree"] is True
    assert report["failover_ms"]["count"] >= 3  # reported, not asserted: the machine is shared
    assert "verdict PASS" in stdout
    assert leftovers(out) == []
    for name in ("history.jsonl", "final.json", "report.md", "timeline.png", "logs/g-n0.log"):
        assert (out / name).exists(), name
    rejudged = subprocess.run([*CLI, "check", str(out)], cwd=REPO, capture_output=True, text=True)
    assert rejudged.returncode == 0, rejudged.stderr
    assert json.loads((out / "report.json").read_text())["acked"] == report["acked"]


def wait_for_fault(out: Path, f: str, p: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    history = out / "history.jsonl"
    while not (history.exists() and f'"process":"nemesis","f":"{f}"' in history.read_text()):
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline, f"no {f} fault within {START_TIMEOUT_S} s"
        time.sleep(0.2)  # polling the run's own progress, with a deadline


@needs_root
@pytest.mark.chaos
@pytest.mark.parametrize(
    ("signum", "scenario", "fault"),
    [(signal.SIGINT, "partition-leader", "partition"), (signal.SIGTERM, "pause", "pause")],
)
def test_an_interrupted_run_leaves_nothing_behind(
    tmp_path: Path, signum: int, scenario: str, fault: str
) -> None:
    out = tmp_path / "interrupted"
    p = chaos_run(out, "--scenario", scenario, "--duration", "120", "--seed", "3")
    try:
        wait_for_fault(out, fault, p)  # rules in place, or a replica stopped
        p.send_signal(signum)
        _, stderr = p.communicate(timeout=STOP_TIMEOUT_S)
    finally:
        p.kill()
    assert p.returncode == 1, stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "unknown"
    assert (
        f"interrupted by {signal.Signals(signum).name} before the final read" in report["reasons"]
    )
    assert leftovers(out) == []


def test_a_missing_tool_is_named_and_nothing_runs(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("ip", "iptables-restore"):  # iptables itself is missing
        real = subprocess.run(["which", tool], capture_output=True, text=True).stdout.strip()
        if real:
            (bin_dir / tool).symlink_to(real)
    out = tmp_path / "run"
    env = {**os.environ, "PATH": str(bin_dir)}
    p = subprocess.run(
        [*CLI, "run", "--scenario", "leader-kill", "--duration", "5", "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2
    assert "`iptables` not found on PATH: install the iptables package" in p.stderr
    assert not (out / "history.jsonl").exists()


def test_capability_messages_say_exactly_what_is_missing() -> None:
    found = capabilities.check("test00", euid=lambda: 1000, which=lambda tool: None)
    assert not found.ok
    text = found.explain()
    assert "root: network namespaces, veth pairs, bridges and iptables need CAP_NET_ADMIN" in text
    assert "`ip` not found on PATH: install the iproute2 package" in text
    assert "`iptables-restore` not found on PATH" in text
    assert text.count("chaos cannot run here:") == len(found.missing) == 4


@needs_root
@pytest.mark.chaos
def test_cleanup_removes_what_a_killed_harness_left_behind(tmp_path: Path) -> None:
    out = tmp_path / "killed"
    p = chaos_run(out, "--scenario", "partition-halves", "--duration", "120", "--seed", "5")
    try:
        wait_for_fault(out, "partition", p)
        p.kill()  # no finally runs in the harness: its replicas and namespaces stay
        p.communicate(timeout=STOP_TIMEOUT_S)
        assert any(x.startswith("namespace") for x in leftovers(out))
        assert any(x.startswith("process") for x in leftovers(out))
    finally:
        cleaned = subprocess.run(
            [*CLI, "cleanup", str(out)], cwd=REPO, capture_output=True, text=True, timeout=60
        )
    assert cleaned.returncode == 0, cleaned.stderr
    assert "removed: dlc-" in cleaned.stdout
    assert leftovers(out) == []


def test_flush_reaches_every_broker_and_is_for_the_broker_target_only(tmp_path: Path) -> None:
    def config(**kwargs: Any) -> RunConfig:
        return RunConfig(scenario="random", duration_s=10, seed=1, out=tmp_path, **kwargs)

    sync = config(target="broker", flush="SYNC_FLUSH")
    sync.validate()
    assert broker_args(sync) == [*BROKER_ARGS, "--flush", "SYNC_FLUSH"]
    assert broker_args(config(target="broker")) == BROKER_ARGS  # the brokers' own default
    with pytest.raises(SetupFailed, match="--flush is for the broker target"):
        config(target="dledger", flush="SYNC_FLUSH").validate()
    with pytest.raises(SetupFailed, match="--flush must be one of"):
        config(target="broker", flush="LAZY").validate()
    args = ["run", "--target", "broker", "--scenario", "random", "--out", str(tmp_path)]
    assert build_parser().parse_args([*args, "--flush", "SYNC_FLUSH"]).flush == "SYNC_FLUSH"
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([*args, "--flush", "LAZY"])
    assert exited.value.code == 2
