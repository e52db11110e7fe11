"""A real `python -m namesrv` process on 127.0.0.1, driven over TCP by the remoting client."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import trio

from remoting.client import open_connection
from remoting.codes import RequestCode, ResponseCode
from remoting.command import RemotingCommand

from .helpers import register_request

ROOT = Path(__file__).resolve().parents[2]
SERVING = re.compile(rb"serving on 127\.0\.0\.1:(\d+)")


async def wait_serving(process: trio.Process, timeout_s: float = 20.0) -> int:
    """The port from the process's "serving on" log line."""
    assert process.stderr is not None
    seen = b""
    with trio.fail_after(timeout_s):
        while (match := SERVING.search(seen)) is None:
            chunk = await process.stderr.receive_some()
            assert chunk, f"namesrv exited before serving: {seen.decode(errors='replace')}"
            seen += chunk
    return int(match.group(1))


async def test_namesrv_process_routes_a_registered_broker() -> None:
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "namesrv", "--listen", "127.0.0.1:0", "--broker-expiry-s", "30"],
        cwd=ROOT,
        stderr=subprocess.PIPE,
    )
    try:
        port = await wait_serving(process)
        async with open_connection("127.0.0.1", port) as conn:
            registered = await conn.request(register_request("127.0.0.1:10911", 0, 3))
            assert registered.code == ResponseCode.SUCCESS
            answer = await conn.request(
                RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicTest"})
            )
            assert answer.code == ResponseCode.SUCCESS
            route = json.loads(answer.body)
            assert route["brokerDatas"][0]["brokerAddrs"] == {"0": "127.0.0.1:10911"}
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(20):
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            with trio.move_on_after(10):
                await process.wait()
        assert process.stderr is not None
        await process.stderr.aclose()


def test_bad_flag_exits_2_with_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "namesrv", "--listen", "no-port"],
        cwd=ROOT,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.decode().splitlines() == [
        "dledger-namesrv: error: argument --listen: expected host:port, got 'no-port'"
    ]
