"""dledger-audit-prepare: make the JVM class archive that spark/jvm_archive.py finds.

    dledger-audit-prepare [--cache DIR] [--force]

It runs the audit's kinds of Spark work, small, in a driver JVM that dumps the classes it
loaded when it exits (-XX:ArchiveClassesAtExit), and moves the dump to the name
jvm_archive.archive_path gives. Kept apart from jvm_archive.py, which spark/session.py
imports: this command starts a session, so the two would otherwise import each other.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa
from pyspark import SparkContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from spark import agreement, checks, frames, job, read, session
from spark.jvm_archive import CACHE_ENV, QUIET_OPTIONS, archive_path, cache_dir

EXIT_TIMEOUT_S = 300.0  # dumping the classes at the JVM's exit takes ~15 s here


def _passthrough(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield from batches


def _made_up_entries() -> list[dict[str, object]]:
    """Entry rows of three replicas, one holding other bodies and one with a gap: nonsense as a
    log, but every check's joins, windows and aggregates get rows to work on."""
    rows = []
    for replica in ("a", "b", "c"):
        for index in range(1, 9):
            if replica == "c" and index == 4:
                continue
            row: dict[str, object] = {}
            for field in read.ENTRY_SCHEMA:
                if pa.types.is_string(field.type):
                    row[field.name] = f"{field.name}/{index}"
                elif pa.types.is_boolean(field.type):
                    row[field.name] = True
                else:
                    row[field.name] = index
            row.update(group="g", replica=replica, index=index, defect=None, io_error=None)
            row["body_digest"] = bytes([index if replica != "b" else 255 - index]) * 32
            rows.append(row)
    return rows


def exercise(spark: SparkSession) -> None:
    """The audit's kinds of Spark work, small: a Python Arrow job (as the screen and the reader
    run), LocalRelations from Arrow (spark/frames.py), and every check over entry rows."""
    spark.range(8, numPartitions=2).mapInArrow(_passthrough, "id long").collect()
    entries = frames.local(spark, _made_up_entries(), from_arrow_schema(read.ENTRY_SCHEMA))
    replicas = frames.local(
        spark,
        [("g", r, 4096, 1, 0, 0, 6, 3, 2, 8) for r in ("a", "b", "c")],
        job.REPLICA_SCHEMA,
    )
    spans = checks.replica_spans(entries)
    summary = agreement.bucket_summary(entries, replicas, 2)
    acked = [("g", 3, "b'v'", "p", 1, bytes(32), 1), ("g", 9, "b'w'", "p", 2, bytes(32), 1)]
    history = frames.local(spark, acked, job.ACKED_SCHEMA)

    def heads(wanted: DataFrame) -> DataFrame:  # read.body_heads without files to read
        return wanted.select("group", "index", "replica", F.lit("b'v'").alias("head"))

    for found in (
        job.all_findings(entries, replicas, history, heads, spans=spans, summary=summary),
        job.all_findings(
            entries.limit(0), replicas, None, None, spans=spans, summary=summary, rows=False
        ),
    ):
        found.limit(job.FINDINGS_COLLECT_MAX + 1).collect()


def prepare(path: Path) -> None:
    """Make the archive at `path`: run exercise() in a driver that dumps its classes at exit.
    Needs a process with no Spark JVM running yet (a gateway is kept for the process's life)."""
    if SparkContext._gateway is not None:
        raise RuntimeError("a Spark JVM already runs in this process: run dledger-audit-prepare")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.unlink(missing_ok=True)
    spark = session.start(
        "local[2]", archive_options=f"-XX:ArchiveClassesAtExit={partial} {QUIET_OPTIONS}"
    )
    try:
        exercise(spark)
    finally:
        spark.stop()
        # the gateway JVM lives until its stdin closes; the classes are dumped as it exits
        proc = SparkContext._gateway.proc  # type: ignore[attr-defined]
        proc.stdin.close()
        proc.wait(timeout=EXIT_TIMEOUT_S)
    if not partial.is_file():
        raise RuntimeError(f"the JVM exited ({proc.returncode}) without writing {partial}")
    os.replace(partial, path)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="dledger-audit-prepare",
        description="Make the JVM class archive that cuts ~8 s off every dledger-audit start.",
    )
    parser.add_argument(
        "--cache", type=Path, help=f"where archives live (default ${CACHE_ENV} or {cache_dir()})"
    )
    parser.add_argument("--force", action="store_true", help="make it again even if it exists")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cache is not None:
        os.environ[CACHE_ENV] = str(args.cache)
    path = archive_path(session.JVM_OPTIONS)
    if path.is_file() and not args.force:
        print(f"dledger-audit-prepare: {path} exists")
        return 0
    began = time.monotonic()
    try:
        prepare(path)
    except (OSError, RuntimeError) as err:
        print(f"dledger-audit-prepare: no archive made: {err}", file=sys.stderr)
        return 1
    size_mb = path.stat().st_size / 1e6
    print(f"dledger-audit-prepare: {path} ({size_mb:.0f} MB) in {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
