"""mqadmin's command line pieces: the argparse parser that reports a bad command line in one
line, and the readers of flag values (counts, booleans, times, name server lists)."""

from __future__ import annotations

import argparse
import datetime
from collections.abc import Callable
from typing import NoReturn

from client.admin import now_ms
from client.connections import split_address

INT64_MAX = (1 << 63) - 1


class UsageError(Exception):
    """A bad command line: printed as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse that reports a bad command line as UsageError (one line) instead of printing
    its usage block."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def int_in(low: int, high: int) -> Callable[[str], int]:
    """A reader of integers in low..high."""

    def read(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is outside {low}..{high}")
        return value

    return read


def boolean(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"not true or false: {text!r}")


TIME_FORMATS = ("%Y-%m-%d#%H:%M:%S:%f", "%Y-%m-%d#%H:%M:%S", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d")


def timestamp(text: str) -> int:
    """ "now", milliseconds since the epoch, or RocketMQ's local "yyyy-MM-dd#HH:mm:ss:SSS"
    (ISO "yyyy-MM-ddTHH:mm:ss" too), to milliseconds since the epoch."""
    if text == "now":
        return now_ms()
    if text.isdigit():
        return int(text)
    for form in TIME_FORMATS:
        try:
            moment = datetime.datetime.strptime(text, form)
        except ValueError:
            continue
        return int(moment.timestamp() * 1000)
    raise argparse.ArgumentTypeError(
        f"not a time: {text!r} (now, milliseconds, or yyyy-MM-dd#HH:mm:ss:SSS)"
    )


def namesrv_list(text: str) -> str:
    """ "host:port;host:port", checked, blanks dropped."""
    addresses = [a.strip() for a in text.split(";") if a.strip()]
    if not addresses:
        raise argparse.ArgumentTypeError("empty name server list")
    for address in addresses:
        try:
            split_address(address)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not host:port: {address!r}") from None
    return ";".join(addresses)


COUNT = int_in(1, 1024)  # queue counts: the broker's bound
QUEUE_ID = int_in(0, 1023)
OFFSET = int_in(0, INT64_MAX)  # queue offsets


def cluster_or_broker(p: Parser, what: str) -> None:
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "-c",
        "--clusterName",
        dest="cluster",
        metavar="CLUSTER",
        help=f"{what} every group of this cluster",
    )
    target.add_argument(
        "-b", "--brokerAddr", dest="broker", metavar="ADDR", help=f"{what} the broker at host:port"
    )


def broker_or_cluster(p: Parser) -> None:
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "-b", "--brokerAddr", dest="broker", metavar="ADDR", help="one broker (host:port)"
    )
    target.add_argument(
        "-c", "--clusterName", dest="cluster", metavar="CLUSTER", help="every replica of a cluster"
    )
