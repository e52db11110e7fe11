"""mqadmin: RocketMQ's admin command line, for our cluster and any RocketMQ 4.x cluster.

    mqadmin clusterList -n "127.0.0.1:9876;127.0.0.1:9877"
    mqadmin updateTopic -c DefaultCluster -t Orders -r 8 -w 8
    mqadmin consumerProgress -g order_consumers --json
    mqadmin leadershipTransfer -g broker-a -t n1

Every command takes `-n` (name servers, "a:9876;b:9876"; default $NAMESRV_ADDR, else
127.0.0.1:9876), `-h` and `--json`. Flag letters are RocketMQ's. Output is a table by default
(RocketMQ's columns, aligned), one JSON document with `--json`. Exit status: 0 done; 1 the
operation failed (a refusal, nothing reachable), one line on stderr; 2 a bad command line
(unknown command, missing flag, bad value), one line on stderr. docs/mqadmin.md has every
command with an example. The commands (client/mqadmin_commands.py) run on the admin API,
client/admin.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import trio

from client.admin import open_admin
from client.errors import MQClientError
from client.mqadmin_args import Parser, UsageError, namesrv_list
from client.mqadmin_commands import COMMANDS, Command
from client.mqadmin_output import jsonable
from remoting.errors import RemotingError

PROG = "mqadmin"
EXIT_FAILED, EXIT_USAGE = 1, 2
NAMESRV_DEFAULT = "127.0.0.1:9876"
NAMESRV_ENV = "NAMESRV_ADDR"


BY_NAME = {c.name: c for c in COMMANDS}


def overview() -> str:
    lines = [
        f"usage: {PROG} <command> [-n namesrv] [options] [--json]",
        "",
        "The mqadmin commands are:",
        *(f"   {c.name:<22}{c.summary}" for c in COMMANDS),
        "",
        f"See '{PROG} <command> -h' (or '{PROG} help <command>') for a command's options.",
        f"-n defaults to ${NAMESRV_ENV}, else {NAMESRV_DEFAULT}.",
    ]
    return "\n".join(lines)


def command_parser(command: Command) -> Parser:
    p = Parser(prog=f"{PROG} {command.name}", description=command.summary)
    p.add_argument(
        "-n",
        "--namesrvAddr",
        dest="namesrv",
        metavar="ADDRS",
        type=namesrv_list,
        default=os.environ.get(NAMESRV_ENV) or NAMESRV_DEFAULT,
        help=f'name servers, "host:port;host:port" (default ${NAMESRV_ENV} or {NAMESRV_DEFAULT})',
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    command.configure(p)
    return p


async def execute(command: Command, args: argparse.Namespace) -> str:
    async with open_admin(args.namesrv) as admin:
        result = await command.run(admin, args)
    if args.json:
        return json.dumps(jsonable(result), indent=2, ensure_ascii=False)
    return command.show(result, args)


def parse(argv: list[str]) -> tuple[Command, argparse.Namespace] | str:
    """The command and its arguments, or text to print for a help request."""
    if not argv or argv[0] in ("-h", "--help"):
        return overview()
    name, rest = argv[0], argv[1:]
    if name == "help":
        if not rest:
            return overview()
        name, rest = rest[0], ["-h"]
    command = BY_NAME.get(name)
    if command is None and name.startswith("-"):
        raise UsageError(f"{PROG}: the command comes first: {PROG} <command> {name} ...")
    if command is None:
        raise UsageError(f"{PROG}: unknown command {name!r} ('{PROG} -h' lists the commands)")
    return command, command_parser(command).parse_args(rest)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        parsed = parse(argv)
    except UsageError as err:
        print(err, file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as done:  # -h of a command: argparse printed the help
        return done.code if isinstance(done.code, int) else 0
    if isinstance(parsed, str):
        print(parsed)
        return 0
    command, args = parsed
    try:
        text = trio.run(execute, command, args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        from dledger.exceptions import find  # loads the dledger package: only on failure

        failure = find(exc, (MQClientError, RemotingError, OSError, trio.TooSlowError))
        if failure is None:
            raise
        line = " ".join((str(failure) or "timed out").split())  # one line, whatever the remark
        print(f"{PROG} {command.name}: {line}", file=sys.stderr)
        return EXIT_FAILED
    try:
        if text:
            print(text, flush=True)
    except BrokenPipeError:  # `mqadmin ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
