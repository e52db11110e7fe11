"""A process killed with SIGTERM (a CI timeout, a test loop stopped by hand) takes what it
spawned with it: the servers run in sessions of their own, and pytest runs no fixture teardown
on SIGTERM, so a killed test run used to leave its clusters running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from dledger.processes import SOURCE_ROOT, child_env, wait_until

SCRIPT = """
import sys, time
from pathlib import Path
from dledger.processes import kill_spawned_on_sigterm, spawn
kill_spawned_on_sigterm()
child = spawn([sys.executable, "-c", "import time; time.sleep(60)"], Path(sys.argv[1]))
print(child.pid, flush=True)
time.sleep(60)
"""


def running(pid: int) -> bool:
    """Whether `pid` runs (a zombie, killed but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_sigterm_kills_what_spawn_started_and_still_ends_the_process(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "child.log")],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    child = None
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert running(child)
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(10) == -signal.SIGTERM  # it still dies of the SIGTERM
        wait_until(lambda: not running(child), 10, what="the spawned child gone")
    finally:
        parent.kill()
        parent.wait()
        if child is not None and running(child):
            os.kill(child, signal.SIGKILL)


def test_a_child_imports_this_tree_even_when_started_inside_another(tmp_path: Path) -> None:
    """`python -m broker` puts its working directory first on sys.path; started from inside
    another checkout, a child ran that checkout's broker (an A/B benchmark compared one tree
    with itself). With child_env it imports from SOURCE_ROOT whatever its directory."""
    decoy = tmp_path / "dledger"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("raise SystemExit('the decoy tree was imported')\n")
    (decoy / "processes.py").write_text("print('the decoy processes')\n")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *args], cwd=tmp_path, env=child_env(), capture_output=True, text=True
        )

    as_module = run("-m", "dledger.processes")  # this tree's module prints nothing
    assert (as_module.returncode, as_module.stdout, as_module.stderr) == (0, "", "")
    located = run("-c", "import dledger.processes as p; print(p.__file__)")
    assert Path(located.stdout.strip()) == SOURCE_ROOT / "dledger" / "processes.py"
