"""Running the system tools chaos needs (ip, iptables), with errors that say which command
failed and what it printed. Blocking calls are for setup and teardown; `arun` is for faults
applied while the workload runs, so the event loop never stalls on a fork."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Sequence

import attrs
import trio

COMMAND_TIMEOUT_S = 20.0  # an ip or iptables call that takes longer is stuck


@attrs.define
class CommandFailed(Exception):
    argv: list[str]
    returncode: int | None  # None: it did not finish in time, or could not be started
    output: str

    def __str__(self) -> str:
        status = "timed out" if self.returncode is None else f"exit {self.returncode}"
        output = self.output.strip() or "no output"
        return f"`{shlex.join(self.argv)}` failed ({status}): {output}"


def run(argv: Sequence[str], *, stdin: str | None = None, check: bool = True) -> str:
    """Run a command to completion; its stdout, or CommandFailed with its stderr."""
    args = list(argv)
    try:
        done = subprocess.run(
            args,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as err:
        raise CommandFailed(args, None, str(err)) from err
    except OSError as err:
        raise CommandFailed(args, None, str(err)) from err
    if check and done.returncode != 0:
        raise CommandFailed(args, done.returncode, done.stderr or done.stdout)
    return done.stdout


async def arun(argv: Sequence[str], *, stdin: str | None = None) -> str:
    args = list(argv)
    try:
        with trio.fail_after(COMMAND_TIMEOUT_S):
            done = await trio.run_process(
                args,
                stdin=stdin.encode() if stdin is not None else b"",
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    except trio.TooSlowError as err:
        raise CommandFailed(args, None, "timed out") from err
    except OSError as err:
        raise CommandFailed(args, None, str(err)) from err
    if done.returncode != 0:
        raise CommandFailed(args, done.returncode, (done.stderr or done.stdout).decode())
    return str(done.stdout.decode())
