"""mqbench: RocketMQ's benchmark command line (benchmark/producer.sh, consumer.sh) on our client.

    mqbench producer -n 127.0.0.1:9876 -t BenchmarkTest -s 1024 -w 32 -d 30 --mode async
    mqbench consumer -n 127.0.0.1:9876 -t BenchmarkTest --from first -d 30 --json

`producer` sends in a loop through the public AsyncProducer (sync, async or batch sends, with
RocketMQ 5's automatic batching on demand); `consumer` receives with a push consumer. Each
prints a line every second (`Send TPS: ... Max RT(ms): ... Average RT(ms): ... Send Failed: ...
Response Failed: ...`, or receive TPS with born-to-receive and store-to-receive RT) and a
`[Summary]` line at the end; `--json` prints the same as one JSON object per line. The run ends
after `-d` seconds or at Ctrl-C (SIGINT) or SIGTERM: what is in flight finishes, the summary is
printed, exit status 0 (a second Ctrl-C skips the wait). Exit status 2: a bad command line;
1: the run could not start (no name server answered, ...); each one line on stderr.
docs/mqbench.md has every flag and field.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
from collections.abc import Callable
from typing import Any

import trio

from client import limits
from client.errors import InvalidMessage, MQClientError
from client.mqadmin_args import Parser, UsageError, boolean, int_in, namesrv_list
from client.mqbench_producer import FirstFailures, Mode, ProducerOptions, produce
from client.mqbench_run import Run, supervise, topic_known
from client.mqbench_stats import (
    ReceiveStats,
    SendStats,
    receive_fields,
    receive_line,
    receive_summary_line,
    send_fields,
    send_line,
    send_summary_line,
)
from client.validation import check_group, check_topic
from remoting.errors import RemotingError

PROG = "mqbench"
EXIT_FAILED, EXIT_USAGE = 1, 2
NAMESRV_DEFAULT = "127.0.0.1:9876"
NAMESRV_ENV = "NAMESRV_ADDR"
TOPIC_DEFAULT = "BenchmarkTest"  # RocketMQ's benchmark topic
DURATION_S_DEFAULT = 60.0
DURATION_S_MAX = 24 * 3600.0  # a run is bounded; a day is longer than any benchmark wants
SIZE_DEFAULT = 128  # bytes, RocketMQ's producer.sh default
TASKS_DEFAULT = 64  # RocketMQ's producer.sh thread count
TASKS_MAX = 1000
BATCH_SIZE_DEFAULT = 32
IN_FLIGHT_DEFAULT = 256  # async mode: more only queues sends inside the client (RT grows)


def duration(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= DURATION_S_MAX:
        raise argparse.ArgumentTypeError(f"{text} is outside 0..{DURATION_S_MAX:.0f} seconds")
    return value


def _common(p: Parser) -> None:
    p.add_argument(
        "-n",
        "--namesrvAddr",
        dest="namesrv",
        metavar="ADDRS",
        type=namesrv_list,
        default=os.environ.get(NAMESRV_ENV) or NAMESRV_DEFAULT,
        help=f'name servers, "host:port;host:port" (default ${NAMESRV_ENV} or {NAMESRV_DEFAULT})',
    )
    p.add_argument(
        "-t", "--topic", default=TOPIC_DEFAULT, help=f"the topic (default {TOPIC_DEFAULT})"
    )
    p.add_argument(
        "-d",
        "--duration",
        dest="duration_s",
        type=duration,
        default=DURATION_S_DEFAULT,
        metavar="SECONDS",
        help=f"how long to run (default {DURATION_S_DEFAULT:.0f}; Ctrl-C stops earlier)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per line")


def parser() -> Parser:
    top = Parser(prog=PROG, description="RocketMQ's benchmark: send or receive, count, report.")
    commands = top.add_subparsers(dest="command", required=True, metavar="producer|consumer")
    producer = commands.add_parser("producer", help="send in a loop and report send TPS and RT")
    _common(producer)
    producer.add_argument(
        "-s",
        "--size",
        type=int_in(1, limits.MESSAGE_BODY_BYTES_MAX),
        default=SIZE_DEFAULT,
        help=f"message body bytes (default {SIZE_DEFAULT})",
    )
    producer.add_argument(
        "-w",
        "--tasks",
        type=int_in(1, TASKS_MAX),
        default=TASKS_DEFAULT,
        help=f"concurrent sending tasks, RocketMQ's threads (default {TASKS_DEFAULT})",
    )
    producer.add_argument(
        "--mode",
        choices=[m.value for m in Mode],
        default=Mode.SYNC.value,
        help="sync: each task waits for each answer; async: send_async with callbacks; "
        "batch: send_batch (default sync)",
    )
    producer.add_argument(
        "--batch-size",
        type=int_in(1, limits.BATCH_MESSAGES_MAX),
        default=BATCH_SIZE_DEFAULT,
        help=f"messages per send_batch in batch mode (default {BATCH_SIZE_DEFAULT})",
    )
    producer.add_argument(
        "--in-flight",
        type=int_in(1, limits.ASYNC_SENDS_MAX),
        default=IN_FLIGHT_DEFAULT,
        help=f"async mode: sends outstanding at once (default {IN_FLIGHT_DEFAULT})",
    )
    producer.add_argument(
        "--auto-batch",
        action="store_true",
        help="the producer batches concurrent sends automatically (sync and async modes)",
    )
    producer.add_argument("--tags", metavar="TAG", help="the tag of every message")
    producer.add_argument(
        "-k",
        "--keys",
        type=boolean,
        default=False,
        metavar="true|false",
        help="give each message a key (its sequence number) (default false)",
    )
    consumer = commands.add_parser("consumer", help="receive and report receive TPS and latency")
    _common(consumer)
    consumer.add_argument(
        "-g", "--group", help="consumer group (default benchmark_consumer_<random>: a new one)"
    )
    consumer.add_argument(
        "--from",
        dest="consume_from",
        choices=("first", "last"),
        default="last",
        help="where a group with no stored offset starts (default last)",
    )
    consumer.add_argument(
        "-e",
        "--expression",
        default="*",
        help='tag filter, e.g. "TagA || TagB" (default *: every message)',
    )
    return top


def parse(argv: list[str]) -> argparse.Namespace:
    args = parser().parse_args(argv)
    prog = f"{PROG} {args.command}"
    try:
        check_topic(args.topic)
        if args.command == "consumer":
            args.group = args.group or f"benchmark_consumer_{random.randrange(10_000):04d}"
            check_group(args.group)
    except InvalidMessage as err:
        raise UsageError(f"{prog}: {err}") from None
    if args.command == "producer":
        args.mode = Mode(args.mode)
        if args.auto_batch and args.mode is Mode.BATCH:
            raise UsageError(f"{prog}: --auto-batch batches single sends; not with --mode batch")
    return args


class Output:
    """Lines on stdout, flushed at once (a reader sees every second as it ends); a closed pipe
    (`mqbench ... | head`) ends the printing, not the run."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self._closed = False

    def emit(self, line: str, fields: dict[str, Any]) -> None:
        if self._closed:
            return
        try:
            print(json.dumps(fields) if self.as_json else line, flush=True)
        except BrokenPipeError:
            self._closed = True
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def warn(prog: str) -> Callable[[str], None]:
    def line(text: str) -> None:
        print(f"{prog}: {text}", file=sys.stderr, flush=True)

    return line


class Bench:
    """One command's run: its stats, its report lines and its summary."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.prog = f"{PROG} {args.command}"
        self.out = Output(args.json)
        self.send_stats = SendStats()
        self.receive_stats = ReceiveStats()
        self.run_state: Run | None = None

    async def run(self) -> None:
        args = self.args
        known = await topic_known(args.namesrv, args.topic)
        if not known and args.command == "consumer":
            warn(self.prog)(
                f"no name server knows topic {args.topic} yet; the consumer looks again every 20 s"
            )
        run = self.run_state = Run(args.duration_s)
        if args.command == "producer":
            options = ProducerOptions(
                args.namesrv,
                args.topic,
                args.size,
                args.tasks,
                args.mode,
                args.batch_size,
                args.in_flight,
                args.auto_batch,
                args.tags,
                args.keys,
            )
            failures = FirstFailures(warn(self.prog))
            await supervise(
                run, lambda r: produce(options, r, self.send_stats, failures), self.tick
            )
        else:
            # the consumer is on branch h-consumer; imported here so the producer runs without it
            from client.mqbench_consumer import ConsumerOptions, consume

            consumer_options = ConsumerOptions(
                args.namesrv,
                args.topic,
                args.group,
                args.consume_from,
                args.expression,
            )
            await supervise(
                run, lambda r: consume(consumer_options, r, self.receive_stats), self.tick
            )

    def tick(self, interval_s: float) -> None:
        elapsed_s = round(self.run_state.elapsed_s() if self.run_state else 0.0, 3)
        head = {"type": "second", "command": self.args.command, "elapsed_s": elapsed_s}
        if self.args.command == "producer":
            window = self.send_stats.take_second()
            self.out.emit(send_line(window, interval_s), head | send_fields(window, interval_s))
        else:
            got = self.receive_stats.take_second()
            self.out.emit(receive_line(got, interval_s), head | receive_fields(got, interval_s))

    def summary(self) -> None:
        run = self.run_state
        elapsed_s = run.elapsed_s() if run is not None else 0.0
        head: dict[str, Any] = {
            "type": "summary",
            "command": self.args.command,
            "duration_s": round(elapsed_s, 3),
            "interrupted": run is None or run.interrupted,
        }
        if self.args.command == "producer":
            head["mode"] = self.args.mode.value
            head["auto_batch"] = self.args.auto_batch
            total = self.send_stats.total
            self.out.emit(send_summary_line(total, elapsed_s), head | send_fields(total, elapsed_s))
        else:
            head["group"] = self.args.group
            got = self.receive_stats.total
            line = receive_summary_line(got, elapsed_s)
            self.out.emit(line, head | receive_fields(got, elapsed_s))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse(argv)
    except UsageError as err:
        print(err, file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as done:  # -h: argparse printed the help
        return done.code if isinstance(done.code, int) else 0
    prog = f"{PROG} {args.command}"
    logging.basicConfig(
        level=logging.WARNING, format=f"{prog}: %(levelname)s %(name)s: %(message)s"
    )
    bench = Bench(args)
    try:
        trio.run(bench.run)
    except KeyboardInterrupt:  # Ctrl-C outside the run's own signal handling (start-up)
        if bench.run_state is not None:
            bench.run_state.interrupted = True
    except Exception as exc:
        from dledger.exceptions import find  # loads the dledger package: only on failure

        failure = find(exc, (MQClientError, RemotingError, OSError, trio.TooSlowError))
        if failure is None:
            raise
        line = " ".join((str(failure) or type(failure).__name__).split())
        print(f"{bench.prog}: {line}", file=sys.stderr)
        return EXIT_FAILED
    bench.summary()
    return 0


if __name__ == "__main__":
    sys.exit(main())
