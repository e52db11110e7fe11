"""Running tests/compat/cpp_driver.py in a subprocess, with the C++ client's logs (it writes
them under $HOME/logs/rocketmq-cpp) kept in the test's temp directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

DRIVER = Path(__file__).with_name("cpp_driver.py")
DRIVER_TIMEOUT_S = 180.0  # a whole scenario, consumers' own --timeout included


def driver_command(namesrv: str, *args: str) -> list[str]:
    return [sys.executable, str(DRIVER), "--namesrv", namesrv, *args]


def driver_env(home: Path) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "HOME": str(home)}


def result_of(stdout: str, stderr: str, returncode: int | None) -> dict[str, Any]:
    """The driver's JSON line: the last stdout line that starts with "{"."""
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert lines, f"cpp_driver gave no result (exit {returncode}):\n{stderr[-3000:]}"
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def drive(namesrv: str, home: Path, *args: str) -> dict[str, Any]:
    """Run one scenario to its end and return its result."""
    done = subprocess.run(
        driver_command(namesrv, *args),
        capture_output=True,
        text=True,
        timeout=DRIVER_TIMEOUT_S,
        env=driver_env(home),
    )
    return result_of(done.stdout, done.stderr, done.returncode)


class Running:
    """A scenario running in the background; `result()` waits for it."""

    def __init__(self, namesrv: str, home: Path, *args: str) -> None:
        self.process = subprocess.Popen(
            driver_command(namesrv, *args),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=driver_env(home),
        )

    def result(self, timeout_s: float = DRIVER_TIMEOUT_S) -> dict[str, Any]:
        try:
            out, err = self.process.communicate(timeout=timeout_s)
        finally:
            self.stop()
        return result_of(out, err, self.process.returncode)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate()
