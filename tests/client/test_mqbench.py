"""`mqbench` as users run it: the real command line in a subprocess against a real local cluster
(1 name server, 1 broker group x 3 replicas, started once for the module) for a few seconds per
run: the producer's sync, async and batch modes print a line a second and a summary with a
nonzero TPS, `--json` prints objects that parse, Ctrl-C prints the summary and exits 0, a
consumer receives every message a producer stored, and a bad command line (exit 2) or an
unreachable name server (exit 1) gives one line on stderr, never a traceback."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from broker.localcluster import SMALL_STORE_ARGS, LocalCluster, running_cluster

CLI_TIMEOUT_S = 60.0
RUN_S = "2"  # each producer run's -d
LINE_WAIT_S = 30.0  # for each line of a run started in the background


@attrs.frozen
class Result:
    code: int
    out: str
    err: str

    def lines(self) -> list[str]:
        assert self.code == 0, self.err
        return self.out.splitlines()

    def objects(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.lines()]

    def one_error_line(self) -> str:
        lines = self.err.strip().splitlines()
        assert len(lines) == 1, self.err
        assert "Traceback" not in self.err and not self.out
        return lines[0]


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "client.mqbench", *args]


def mqbench(*args: str) -> Result:
    env = {k: v for k, v in os.environ.items() if k != "NAMESRV_ADDR"}
    done = subprocess.run(
        command(*args), capture_output=True, text=True, timeout=CLI_TIMEOUT_S, env=env, check=False
    )
    return Result(done.returncode, done.stdout, done.stderr)


def fields(line: str) -> dict[str, float]:
    """`Send TPS: 12 Max RT(ms): 3 ...` as {"Send TPS": 12.0, "Max RT(ms)": 3.0, ...}."""
    out: dict[str, float] = {}
    words = line.removeprefix("[Summary] ").split(" ")
    name: list[str] = []
    for word in words:
        if word.endswith(":"):
            name.append(word[:-1])
            continue
        try:
            out[" ".join(name)] = float(word)
        except ValueError:
            name.append(word)
            continue
        name = []
    return out


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Lines:
    """The stdout of a running process, line by line, each awaited with a deadline (select on
    the pipe: a silent process fails the test instead of hanging it)."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        self._fd = process.stdout.fileno()
        self._buffer = b""
        self.seen: list[str] = []

    def next(self, timeout_s: float = LINE_WAIT_S) -> str:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left_s = deadline - time.monotonic()
            assert left_s > 0, f"no line within {timeout_s} s; before: {self.seen}"
            ready, _, _ = select.select([self._fd], [], [], left_s)
            if ready:
                chunk = os.read(self._fd, 65536)
                assert chunk, f"the process ended early; its lines: {self.seen}"
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        self.seen.append(line.decode())
        return self.seen[-1]

    def rest(self, process: subprocess.Popen[bytes]) -> tuple[list[str], str]:
        """Every line still to come and stderr, once the process has ended."""
        out, err = process.communicate(timeout=CLI_TIMEOUT_S)
        return (self._buffer + out).decode().splitlines(), err.decode()


def start(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.fixture(scope="module")
def namesrv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root: Path = tmp_path_factory.mktemp("mqbench")
    with running_cluster(
        root, groups=("broker-a",), replicas=3, namesrvs=1, extra_broker_args=SMALL_STORE_ARGS
    ) as running:
        cluster: LocalCluster = running
        yield cluster.namesrv_addr


# --- the producer ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async", "batch"])
def test_producer_prints_a_line_a_second_and_a_summary(namesrv: str, mode: str) -> None:
    lines = mqbench(
        "producer", "-n", namesrv, "-t", "BenchModes", "-d", RUN_S, "-w", "8", "--mode", mode
    ).lines()
    *seconds, summary = lines
    assert seconds and all(s.startswith("Send TPS: ") for s in seconds), lines
    for second in seconds:
        assert set(fields(second)) == {
            "Send TPS",
            "Max RT(ms)",
            "Average RT(ms)",
            "Send Failed",
            "Response Failed",
        }
    assert summary.startswith("[Summary] Send Total: ")
    total = fields(summary)
    assert total["Send Total"] > 0 and total["Send TPS"] > 0, summary
    assert total["Send Failed"] == 0 and total["Response Failed"] == 0, summary
    assert 0 < total["Average RT(ms)"] <= total["Max RT(ms)"], summary
    assert total["Duration(s)"] >= float(RUN_S), summary
    if mode == "batch":
        assert total["Send Total"] % 32 == 0, summary  # whole batches of the default size


def test_producer_json_with_auto_batch_keys_and_tags(namesrv: str) -> None:
    objects = mqbench(
        "producer",
        "-n",
        namesrv,
        "-t",
        "BenchJson",
        "-d",
        RUN_S,
        "-w",
        "16",
        "-s",
        "1024",
        "--mode",
        "async",
        "--auto-batch",
        "-k",
        "true",
        "--tags",
        "TagA",
        "--json",
    ).objects()
    *seconds, summary = objects
    assert seconds and {s["type"] for s in seconds} == {"second"}
    assert [s["elapsed_s"] for s in seconds] == sorted(s["elapsed_s"] for s in seconds)
    assert summary["type"] == "summary" and summary["command"] == "producer"
    assert summary["mode"] == "async" and summary["auto_batch"] is True
    assert summary["stored"] >= sum(s["stored"] for s in seconds) > 0
    assert summary["send_tps"] > 0 and summary["send_failed"] == summary["response_failed"] == 0
    assert 0 < summary["rt_ms_avg"] <= summary["rt_ms_max"]
    assert summary["interrupted"] is False


def test_producer_ctrl_c_prints_the_summary_and_exits_0(namesrv: str) -> None:
    process = start("producer", "-n", namesrv, "-t", "BenchStop", "-d", "60", "-w", "4")
    try:
        lines = Lines(process)
        assert lines.next().startswith("Send TPS: ")
        began = time.monotonic()
        process.send_signal(signal.SIGINT)
        rest, err = lines.rest(process)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 0, err
    assert time.monotonic() - began < 10, "the run did not stop soon after Ctrl-C"
    summary = rest[-1]
    assert summary.startswith("[Summary] Send Total: ") and fields(summary)["Send Total"] > 0
    assert "Traceback" not in err


# --- the consumer ------------------------------------------------------------------------------


def test_consumer_receives_what_the_producer_stored(namesrv: str) -> None:
    sent = mqbench(
        "producer", "-n", namesrv, "-t", "BenchE2E", "-d", RUN_S, "-w", "4", "--json"
    ).objects()[-1]
    assert sent["stored"] > 0 and sent["send_failed"] == sent["response_failed"] == 0
    process = start(
        "consumer", "-n", namesrv, "-t", "BenchE2E", "--from", "first", "-d", "60", "--json"
    )
    received = 0
    try:
        lines = Lines(process)
        while received < sent["stored"]:
            second = json.loads(lines.next())
            assert second["type"] == "second", second
            received += second["received"]
        process.send_signal(signal.SIGINT)
        rest, err = lines.rest(process)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 0, err
    summary = json.loads(rest[-1])
    assert summary["type"] == "summary" and summary["interrupted"] is True, summary
    assert summary["received"] == sent["stored"], (summary, sent)
    # born before stored, on the same host: born-to-receive covers store-to-receive
    assert summary["b2c_ms_avg"] >= summary["s2c_ms_avg"] > 0, summary
    assert summary["b2c_ms_max"] >= summary["s2c_ms_max"], summary


def test_consumer_prints_a_line_a_second_and_a_summary(namesrv: str) -> None:
    mqbench("producer", "-n", namesrv, "-t", "BenchConsumeText", "-d", "1", "-w", "2").lines()
    lines = mqbench(
        "consumer", "-n", namesrv, "-t", "BenchConsumeText", "--from", "first", "-d", "3"
    ).lines()
    *seconds, summary = lines
    assert seconds and all(s.startswith("Receive TPS: ") for s in seconds), lines
    assert summary.startswith("[Summary] Receive Total: ")
    got = fields(summary)
    assert got["Receive Total"] > 0 and got["Receive TPS"] > 0, summary
    assert got["Max(B2C) RT(ms)"] >= got["Average(B2C) RT(ms)"] > 0, summary


# --- errors ------------------------------------------------------------------------------------


BAD_COMMAND_LINES = [
    ((), "producer|consumer"),
    (("publish",), "publish"),
    (("producer", "--bogus"), "--bogus"),
    (("producer", "-s", "0"), "-s"),
    (("producer", "-s", "5000000"), "-s"),
    (("producer", "-d", "0"), "-d"),
    (("producer", "-d", "soon"), "soon"),
    (("producer", "-w", "0"), "-w"),
    (("producer", "--mode", "fast"), "fast"),
    (("producer", "-k", "maybe"), "maybe"),
    (("producer", "-n", "nohost"), "nohost"),
    (("producer", "-t", "bad topic!"), "topic"),
    (("producer", "-t", "TBW102"), "TBW102"),
    (("producer", "--mode", "batch", "--auto-batch"), "--auto-batch"),
    (("consumer", "-g", "bad group"), "group"),
    (("consumer", "--from", "middle"), "middle"),
]
STARTED_AT_ONCE = 4  # CLI processes of the test below running together (2 cores, shared)


def test_a_bad_command_line_exits_2_with_one_line() -> None:
    """Every case in its own process, a few at a time (each is mostly Python's start-up)."""
    results: dict[tuple[str, ...], Result] = {}
    cases = [args for args, _ in BAD_COMMAND_LINES]
    for start in range(0, len(cases), STARTED_AT_ONCE):
        running = {
            args: subprocess.Popen(
                command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            for args in cases[start : start + STARTED_AT_ONCE]
        }
        for args, process in running.items():
            out, err = process.communicate(timeout=CLI_TIMEOUT_S)
            results[args] = Result(process.returncode, out, err)
    for args, says in BAD_COMMAND_LINES:
        done = results[args]
        assert done.code == 2, (args, done)
        line = done.one_error_line()
        assert line.startswith("mqbench") and says in line, (args, line)


def test_help_exits_0() -> None:
    for args in (("-h",), ("producer", "-h"), ("consumer", "-h")):
        done = mqbench(*args)
        assert done.code == 0 and "usage: mqbench" in done.out and not done.err


@pytest.mark.parametrize("command_name", ["producer", "consumer"])
def test_an_unreachable_name_server_exits_1_with_one_line(command_name: str) -> None:
    nobody = f"127.0.0.1:{free_port()}"
    done = mqbench(command_name, "-n", nobody, "-d", "1")
    assert done.code == 1
    line = done.one_error_line()
    assert line.startswith(f"mqbench {command_name}: ") and nobody in line, line
