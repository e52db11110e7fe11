"""dledger-audit: do all replicas of every group hold the same committed log, and is every
acknowledged append in it? A thin main: flags, discovery, one Spark job, the report.

    dledger-audit --stores PATH [PATH ...] --out DIR [--history FILE] [--master local[*]]

Exit 0 when consistent, 1 when a check fails, 2 when an input is unreadable (the path and the
reason on stderr), a flag is wrong or Spark cannot start.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence

from pyspark.errors import PySparkRuntimeError
from pyspark.sql import SparkSession

from spark import (
    broker_formats,
    broker_job,
    broker_layout,
    broker_read,
    history,
    job,
    jvm_archive,
    layout,
    report,
    session,
)
from spark.broker_history import read as read_broker_history
from spark.progress import Progress

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def memory_size(text: str) -> str:
    """A JVM memory size as Spark takes it: digits and a unit, m or g (512m, 8g)."""
    if re.fullmatch(r"[1-9][0-9]*[mMgG]", text) is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a memory size such as 512m or 8g")
    return text.lower()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="dledger-audit",
        description="Audit the replicated logs of dledger stores with Spark.",
    )
    parser.add_argument(
        "--stores",
        nargs="+",
        required=True,
        metavar="PATH",
        help="store directories (searched for dledger/meta) or manifests",
    )
    parser.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="where report.json, report.html and findings/ go",
    )
    parser.add_argument(
        "--history",
        metavar="FILE",
        help="a chaos run's history.jsonl: check every acknowledged append",
    )
    parser.add_argument(
        "--master",
        default="local[*]",
        help="Spark master: local[*] (default), local[N], spark://host:7077",
    )
    parser.add_argument(
        "--index-slots",
        type=int,
        help="broker stores: IndexFile hash slots, as the brokers' --index-slots (maxHashSlotNum); "
        "default: inferred from the files (RocketMQ's 5000000 for files of its default size)",
    )
    parser.add_argument(
        "--index-items",
        type=int,
        help="broker stores: IndexFile items, as the brokers' --index-items (maxIndexNum); "
        "default: inferred, as --index-slots",
    )
    parser.add_argument(
        "--driver-memory",
        type=memory_size,
        default=session.DRIVER_MEMORY_DEFAULT,
        metavar="SIZE",
        help="heap of the Spark driver JVM, which is the executor too with local[...], e.g. 8g; "
        f"default a quarter of this machine's memory, 2g-16g (here {session.DRIVER_MEMORY_DEFAULT})",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return parser.parse_args(argv)


def index_geometry(
    args: argparse.Namespace, stores: Sequence[broker_layout.BrokerStore]
) -> broker_read.IndexGeometry | None:
    """The IndexFile geometry the flags give, or (neither given) the one the files show."""
    if args.index_slots is None and args.index_items is None:
        return broker_read.infer_geometry(stores)
    return broker_read.IndexGeometry(
        args.index_slots or broker_formats.INDEX_SLOTS_DEFAULT,
        args.index_items or broker_formats.INDEX_ITEMS_DEFAULT,
    )


def _ship_package(spark_context: object) -> None:
    """Give remote executors this package: a zip of spark/ added to the job's Python path."""
    staging = tempfile.mkdtemp(prefix="dledger-audit-")
    archive = shutil.make_archive(
        os.path.join(staging, "spark_audit"), "zip", os.path.dirname(PACKAGE_DIR), "spark"
    )
    spark_context.addPyFile(archive)  # type: ignore[attr-defined]


def main(argv: Sequence[str] | None = None, *, spark: SparkSession | None = None) -> int:
    """Run the audit; returns the exit code. With `spark`, that session is used and left
    running (tests share one JVM); otherwise one is started for --master and stopped."""
    args = parse_args(argv)
    started = time.monotonic()
    try:
        replicas = layout.discover(args.stores)
        stores = broker_layout.discover(replicas)
        broker_history = None
        if stores and args.history:
            broker_history = read_broker_history(args.history)
        broker = broker_job.BrokerInputs(stores, broker_history, index_geometry(args, stores))
        os.makedirs(args.out, exist_ok=True)
        # a large history is read by worker processes from here on, while the JVM starts
        reading = history.Reading(args.history) if args.history else None
    except layout.InputUnreadable as err:
        print(f"dledger-audit: unreadable input: {err}", file=sys.stderr)
        return report.EXIT_UNREADABLE
    except OSError as err:
        print(f"dledger-audit: cannot create --out {args.out}: {err}", file=sys.stderr)
        return report.EXIT_UNREADABLE
    owned = spark is None
    if spark is None:
        try:
            spark = session.start(args.master, driver_memory=args.driver_memory)
        except (PySparkRuntimeError, session.SessionInUse) as err:
            # no java, a bad JAVA_HOME, a JVM that will not start: an unreadable history, read
            # meanwhile, is still the first thing to tell
            try:
                if reading is not None:
                    reading.result()
            except layout.InputUnreadable as unreadable:
                print(f"dledger-audit: unreadable input: {unreadable}", file=sys.stderr)
                return report.EXIT_UNREADABLE
            print(f"dledger-audit: cannot start Spark ({args.master}): {err}", file=sys.stderr)
            return report.EXIT_UNREADABLE
    try:
        try:
            acked = None if reading is None else reading.result()
        except layout.InputUnreadable as err:
            print(f"dledger-audit: unreadable input: {err}", file=sys.stderr)
            return report.EXIT_UNREADABLE
        if not args.master.startswith("local"):
            _ship_package(spark.sparkContext)
        with Progress(spark.sparkContext, quiet=args.quiet) as progress:
            if owned:
                progress.step(jvm_archive.describe(session.JVM_OPTIONS))
            progress.step(
                f"found {len(replicas)} replicas in {len({r.group for r in replicas})} groups"
            )
            if acked is not None:
                progress.step(f"read {len(acked)} acknowledged appends from the history")
            outcome = job.run(
                spark, replicas, acked, os.path.abspath(args.out), progress, broker=broker
            )
    finally:
        if owned:
            spark.stop()
    result = report.build(
        outcome,
        replicas,
        master=args.master,
        stores=args.stores,
        history=args.history,
        elapsed_s=time.monotonic() - started,
    )
    report.write(result, args.out)
    print(report.summary(result))
    for found in result["findings"].values():
        if found["severity"] == "unreadable":
            for example in found["examples"]:
                print(f"dledger-audit: unreadable input: {example['detail']}", file=sys.stderr)
    return int(result["exit_code"])


if __name__ == "__main__":
    sys.exit(main())
