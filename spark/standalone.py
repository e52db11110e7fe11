"""A Spark standalone master and workers on 127.0.0.1, for trying and testing the audit on a
real cluster without downloading Spark: it runs the launcher classes from the pyspark
package's own jars.

    python -m spark.standalone start --workers 2 --dir DIR   # prints the master URL
    python -m spark.standalone status --dir DIR
    python -m spark.standalone stop --dir DIR

Everything binds 127.0.0.1 (SPARK_LOCAL_IP, --host; the web UIs bind to SPARK_LOCAL_IP) on
ports the JVMs choose (port 0), so two clusters never collide. Each JVM's pid is written to
DIR/<name>.pid and `stop` signals exactly those pids (and the process groups they lead, which
hold the executors a worker launched). Readiness is polled with a deadline, never slept on.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

import pyspark

LOOPBACK = "127.0.0.1"
START_DEADLINE_S = 120.0  # a JVM on a loaded 2-core machine can take tens of seconds
STOP_DEADLINE_S = 30.0  # after SIGTERM; then SIGKILL
POLL_S = 0.2
DAEMON_HEAP = "-Xmx256m"  # master and worker JVMs only schedule; executors get their own heap
MASTER_URL = re.compile(r"Starting Spark master at (spark://[\w.:-]+)")
MASTER_UI = re.compile(r"Bound MasterWebUI to [\d.]+, and started at (http://[\w.:-]+)")
NO_REST = ["-Dspark.master.rest.enabled=false"]  # it would listen on a fixed port (6066)
SPARK_HOME = Path(pyspark.__file__).parent  # pip's pyspark is a Spark home: jars/, bin/


class ClusterError(Exception):
    """A cluster that did not start or stop in time; the message names the log to read."""


def _scala_version() -> str:
    """From the spark-core jar's name; the worker's executor launcher needs it (pip's pyspark
    has no RELEASE file for it to look at)."""
    for jar in (SPARK_HOME / "jars").glob("spark-core_*.jar"):
        return jar.name.split("_", 1)[1].split("-", 1)[0]
    raise ClusterError(f"no spark-core jar under {SPARK_HOME / 'jars'}")


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env["SPARK_SCALA_VERSION"] = _scala_version()
    env.update(
        SPARK_LOCAL_IP=LOOPBACK,
        SPARK_HOME=str(SPARK_HOME),
        PYSPARK_PYTHON=sys.executable,
        SPARK_NO_DAEMONIZE="1",
    )
    return env


def _launch(directory: Path, name: str, main_class: str, args: Sequence[str]) -> int:
    command = ["java", DAEMON_HEAP, *NO_REST, "-cp", f"{SPARK_HOME / 'jars'}/*", main_class, *args]
    with open(directory / f"{name}.log", "ab") as log:
        proc = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_environment(),
            cwd=directory,
            start_new_session=True,
        )
    (directory / f"{name}.pid").write_text(f"{proc.pid}\n")
    return proc.pid


def _wait_for(what: str, check: Callable[[], str | None], log: Path, deadline_s: float) -> str:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(POLL_S)  # polling interval of a deadline-bounded wait, not a wait itself
    raise ClusterError(f"{what} not ready within {deadline_s:.0f}s; see {log}")


def _grep(log: Path, pattern: re.Pattern[str]) -> Callable[[], str | None]:
    def check() -> str | None:
        match = pattern.search(log.read_text(errors="replace")) if log.exists() else None
        return match.group(1) if match else None

    return check


def alive_workers(ui_url: str) -> int:
    with urllib.request.urlopen(f"{ui_url}/json/", timeout=5) as reply:
        return int(json.load(reply).get("aliveworkers", 0))


def start(directory: Path, workers: int, cores: int = 1, memory: str = "1g") -> str:
    """Start a master and `workers` workers; returns the master URL once all registered."""
    directory.mkdir(parents=True, exist_ok=True)
    if any(_alive(pid) for pid in _pids(directory).values()):
        raise ClusterError(f"a cluster is already running under {directory}; stop it first")
    for stale in directory.glob("*.log"):
        stale.unlink()
    _launch(
        directory,
        "master",
        "org.apache.spark.deploy.master.Master",
        ["--host", LOOPBACK, "--port", "0", "--webui-port", "0"],
    )
    master_log = directory / "master.log"
    try:
        url = _wait_for("master", _grep(master_log, MASTER_URL), master_log, START_DEADLINE_S)
        ui = _wait_for("master UI", _grep(master_log, MASTER_UI), master_log, START_DEADLINE_S)
        for n in range(workers):
            work = directory / f"worker-{n}"
            work.mkdir(exist_ok=True)
            _launch(
                directory,
                f"worker-{n}",
                "org.apache.spark.deploy.worker.Worker",
                [
                    "--host",
                    LOOPBACK,
                    "--port",
                    "0",
                    "--webui-port",
                    "0",
                    "--cores",
                    str(cores),
                    "--memory",
                    memory,
                    "--work-dir",
                    str(work),
                    url,
                ],
            )

        def registered() -> str | None:
            try:
                return "yes" if alive_workers(ui) >= workers else None
            except OSError:
                return None

        _wait_for(f"{workers} workers", registered, master_log, START_DEADLINE_S)
    except BaseException:
        stop(directory)
        raise
    (directory / "master.url").write_text(url + "\n")
    (directory / "master.ui").write_text(ui + "\n")
    return url


def _pids(directory: Path) -> dict[str, int]:
    pids = {}
    for pid_file in sorted(directory.glob("*.pid")):
        text = pid_file.read_text().strip()
        if text.isdigit():
            pids[pid_file.stem] = int(text)
    return pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of this process has exited; reap it so it stops looking alive
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return Path(f"/proc/{pid}").exists() and "Z" not in _state(pid)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1]
    except (OSError, IndexError):
        return "Z"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def stop(directory: Path) -> list[int]:
    """SIGTERM the recorded pids (workers first), SIGKILL what outlives STOP_DEADLINE_S, and
    the same for the process groups they lead (executors). Returns the pids stopped."""
    pids = _pids(directory)
    order = sorted(pids, key=lambda name: name == "master")  # workers, then the master
    stopped = []
    for name in order:
        pid = pids[name]
        for target, signal_fn, alive in (
            (pid, os.kill, _alive),
            (pid, os.killpg, _group_alive),  # executors a worker launched, in its group
        ):
            if not alive(target):
                continue
            signal_fn(target, signal.SIGTERM)
            deadline = time.monotonic() + STOP_DEADLINE_S
            while alive(target) and time.monotonic() < deadline:
                time.sleep(POLL_S)
            if alive(target):
                signal_fn(target, signal.SIGKILL)
        stopped.append(pid)
        (directory / f"{name}.pid").unlink(missing_ok=True)
    for name in ("master.url", "master.ui"):
        (directory / name).unlink(missing_ok=True)
    return stopped


def status(directory: Path) -> dict[str, object]:
    pids = _pids(directory)
    url_file, ui_file = directory / "master.url", directory / "master.ui"
    result: dict[str, object] = {
        "processes": {name: {"pid": pid, "alive": _alive(pid)} for name, pid in pids.items()},
        "master": url_file.read_text().strip() if url_file.exists() else None,
    }
    if ui_file.exists():
        try:
            result["alive_workers"] = alive_workers(ui_file.read_text().strip())
        except OSError as err:
            result["alive_workers"] = f"master UI unreachable: {err}"
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark.standalone")
    parser.add_argument("command", choices=["start", "stop", "status"])
    parser.add_argument("--dir", required=True, type=Path, help="pid files, logs, work dirs")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1, help="cores per worker")
    parser.add_argument("--memory", default="1g", help="memory per worker for executors")
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            print(start(args.dir, args.workers, args.cores, args.memory))
        elif args.command == "stop":
            print(f"stopped pids {stop(args.dir)}")
        else:
            print(json.dumps(status(args.dir), indent=2))
    except ClusterError as err:
        print(f"spark.standalone: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
