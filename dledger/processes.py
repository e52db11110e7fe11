"""Local processes for tests, benchmarks, chaos and `dledger-dev`: started with their output in a
log file, signalled, and stopped by the pid we recorded; nothing is found or killed by name.

`LocalGroup` (dledger-server groups) and `broker.localcluster.LocalCluster` (namesrvs and
broker groups) are both built on these. A child runs the code of the tree this module was
imported from (`SOURCE_ROOT` leads its PYTHONPATH, and PYTHONSAFEPATH keeps the working
directory from going before it), so a git worktree's tests start the worktree's servers, not
those of the tree the virtualenv was installed from or of the directory it was started in.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs

STOP_TIMEOUT_S = 5.0  # SIGTERM, then SIGKILL after this long
SOURCE_ROOT = Path(__file__).resolve().parents[1]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
STABLE_PORT_LOW = 10000  # stable ports are picked from here up to the ephemeral range
PORT_PICK_TRIES_MAX = 1000


def ephemeral_low() -> int:
    """The first port the kernel hands to outgoing connections (32768 if unknown)."""
    try:
        return int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def bindable(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port_block(count: int, host: str = "127.0.0.1") -> int:
    """The first of `count` consecutive free ports below the ephemeral range.

    Ports from `free_port()` are ephemeral: until a server binds one, any outgoing connection
    on the machine may take it, and while a server is down (killed, before its restart) too. A
    cluster that kills and restarts servers, or asks for consecutive ports, takes its ports from
    below that range instead, where only a bind can take them."""
    high = ephemeral_low() - count
    assert high > STABLE_PORT_LOW, f"no room below the ephemeral range for {count} ports"
    rng = random.Random()
    for _ in range(PORT_PICK_TRIES_MAX):
        first = rng.randrange(STABLE_PORT_LOW, high)
        if all(bindable(first + i, host) for i in range(count)):
            return first
    raise RuntimeError(f"no {count} consecutive free ports in {STABLE_PORT_LOW}..{high}")


def wait_until(
    predicate: Callable[[], bool], timeout: float, interval: float = 0.02, what: str = "condition"
) -> None:
    """Poll with a deadline (never a bare sleep to wait for something)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout} s")
        time.sleep(interval)


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default: ours) with SOURCE_ROOT first on PYTHONPATH. PYTHONSAFEPATH is set
    because `python -m broker` otherwise puts its working directory on sys.path before
    PYTHONPATH: started from inside another checkout, the children ran that checkout's code
    (a benchmark comparing two trees compared one). A child started as `python script.py` then
    does not see its script's directory either: it imports from SOURCE_ROOT like the rest."""
    out = dict(os.environ if env is None else env)
    rest = out.get("PYTHONPATH", "")
    out["PYTHONPATH"] = str(SOURCE_ROOT) + (os.pathsep + rest if rest else "")
    out["PYTHONSAFEPATH"] = "1"
    return out


def spawn(
    command: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start `command` with stdout and stderr appended to log_path, in a session of its own
    (a Ctrl-C in the terminal is for us, not for it)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        process = subprocess.Popen(
            list(command),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=child_env(env),
            start_new_session=True,
        )
    _SPAWNED.add(process)
    return process


# Every process `spawn` started here (while its Popen lives), for kill_spawned.
_SPAWNED: weakref.WeakSet[subprocess.Popen[bytes]] = weakref.WeakSet()


def kill_spawned() -> None:
    """kill -9 (and reap) every process `spawn` started in this process that still runs,
    paused ones too. They run in sessions of their own, so nothing else stops them when we
    die without stopping them ourselves."""
    for process in list(_SPAWNED):
        kill_process(process)


def kill_spawned_on_sigterm() -> None:
    """From now on a SIGTERM to this process first kills what `spawn` started, then ends it
    as the SIGTERM would have. For a test runner: pytest runs no teardown on SIGTERM, so a
    killed run left its clusters running."""

    def on_sigterm(signum: int, _frame: object) -> None:
        kill_spawned()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, on_sigterm)


def kill_process(process: subprocess.Popen[bytes]) -> None:
    """kill -9, and reap it."""
    if process.poll() is None:
        process.kill()
        process.wait()


def stop_process(process: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM (after SIGCONT, in case it is paused), then SIGKILL if it lingers; reaped."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGCONT)
        process.terminate()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        kill_process(process)


@attrs.define
class ManagedProcess:
    """One named process that can be started again after it stops (same command, same log)."""

    name: str
    command: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0  # how many times it was started

    @property
    def pid(self) -> int | None:
        """The pid while it runs (a paused process runs)."""
        p = self.process
        return p.pid if p is not None and p.poll() is None else None

    @property
    def running(self) -> bool:
        return self.pid is not None

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def start(self) -> None:
        assert not self.running, f"{self.name} is already running as pid {self.pid}"
        self.process = spawn(self.command, self.log_path, self.env)
        self.starts += 1

    def signal(self, signum: int) -> None:
        pid = self.pid
        assert pid is not None, f"{self.name} is not running"
        os.kill(pid, signum)

    def kill(self) -> None:
        if self.process is not None:
            kill_process(self.process)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        if self.process is not None:
            stop_process(self.process, timeout_s)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
