"""`dledger-namesrv`: the name server process.

    dledger-namesrv --listen 127.0.0.1:9876 [--broker-expiry-s 10] [--log-level INFO]

Serves until SIGTERM or SIGINT, then exits 0. A bad flag exits 2 with one line; a port it
cannot bind exits 1 with one line. Port 0 picks a free port; the log line "serving on
host:port" says which.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from typing import NoReturn

import attrs
import trio

from dledger.exceptions import find
from namesrv import limits
from namesrv.registry import Registry
from namesrv.service import NameService
from remoting.server import RemotingServer, bound_port

log = logging.getLogger("namesrv.server")


@attrs.frozen
class NamesrvConfig:
    host: str
    port: int
    broker_expiry_s: float = limits.BROKER_EXPIRY_S_DEFAULT


class OneLineParser(argparse.ArgumentParser):
    """Errors as one line on stderr, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"expected host:port, got {text!r}")
    return host, int(port)


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="dledger-namesrv", description="RocketMQ-compatible name server")
    p.add_argument("--listen", type=parse_listen, default=parse_listen(limits.LISTEN_DEFAULT))
    p.add_argument(
        "--broker-expiry-s",
        type=positive_seconds,
        default=limits.BROKER_EXPIRY_S_DEFAULT,
        help="drop a broker not heard from for this long",
    )
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


async def run_expiry(registry: Registry) -> None:
    """Drop silent brokers, checking EXPIRY_CHECKS_PER_PERIOD times per expiry period."""
    period_s = registry.broker_expiry_s / limits.EXPIRY_CHECKS_PER_PERIOD
    while True:
        await trio.sleep(period_s)
        registry.expire(trio.current_time())


async def serve_namesrv(
    config: NamesrvConfig, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve until cancelled; started() with the bound port."""
    registry = Registry(config.broker_expiry_s)
    server = RemotingServer(NameService(registry).dispatcher())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_expiry, registry)
        listeners = await nursery.start(server.serve_tcp, config.host, config.port)
        port = bound_port(listeners)
        log.info("serving on %s:%d", config.host, port)
        task_status.started(port)


async def _main(config: NamesrvConfig) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stop_on_signal, nursery.cancel_scope)
        await nursery.start(serve_namesrv, config)


async def _stop_on_signal(scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("stopping on %s", signal.Signals(signum).name)
            scope.cancel()
            return


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    host, port = args.listen
    config = NamesrvConfig(host=host, port=port, broker_expiry_s=args.broker_expiry_s)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s namesrv %(levelname)s %(name)s: %(message)s"
    )
    try:
        trio.run(_main, config)
    except Exception as exc:  # one line for what an operator can fix, else re-raise
        os_error = find(exc, OSError)
        if os_error is None:
            raise
        print(f"dledger-namesrv: cannot listen on {host}:{port}: {os_error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
