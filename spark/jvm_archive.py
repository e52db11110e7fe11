"""A class-data-sharing archive of the Spark driver JVM's classes, so the audit starts faster.

A fresh Spark driver loads and verifies ~14,000 classes before and during its first jobs;
on this project's 2-core machine that was ~8 s of a ~30 s audit. JDK 17 can dump the classes
a JVM loaded into an archive when it exits (-XX:ArchiveClassesAtExit) and map that archive
into later JVMs (-XX:SharedArchiveFile). `dledger-audit-prepare` makes the archive once, with a
short run of the audit's kinds of Spark work on made-up rows; every later `dledger-audit`
(and the benchmark, and the tests' session) uses it when it exists.

The archive belongs to one JVM, one set of Spark jars and one set of JVM options, so its file
name carries a fingerprint of all three: after an upgrade the old file is simply not found
(run the command again). A JVM that still refuses an archive starts without it, silently.
Only the driver uses it: in local mode that is the whole of Spark.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pyspark
from pyspark import SparkContext
from pyspark.sql import SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

CACHE_ENV = "DLEDGER_AUDIT_CACHE"  # where archives live; default ~/.cache/dledger-audit
QUIET_OPTIONS = "-Xlog:cds=off -Xlog:cds+dynamic=off"  # a refused archive is not an error
EXIT_TIMEOUT_S = 300.0  # dumping the classes at the JVM's exit takes ~15 s here


def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dledger-audit"


def _java() -> Path | None:
    """The java binary Spark's launcher runs: $JAVA_HOME/bin/java, else java on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return Path(found).resolve() if found and os.path.exists(found) else None


def fingerprint(jvm_options: str) -> str:
    """What an archive is only valid for: the JVM, Spark's jars and the JVM options."""
    parts = [pyspark.__version__, jvm_options]
    java = _java()
    if java is not None:
        for path in (java, java.parent.parent / "lib" / "server" / "libjvm.so"):
            if path.exists():
                stat = path.stat()
                parts.append(f"{path}:{stat.st_size}:{stat.st_mtime_ns}")
    jars = Path(pyspark.__file__).parent / "jars"
    if jars.is_dir():
        parts += sorted(f"{p.name}:{p.stat().st_size}" for p in jars.iterdir())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def archive_path(jvm_options: str) -> Path:
    return cache_dir() / f"spark-driver-{fingerprint(jvm_options)}.jsa"


def use_options(jvm_options: str) -> str:
    """Options that map the archive for these JVM options into the driver, if there is one."""
    path = archive_path(jvm_options)
    return f"-XX:SharedArchiveFile={path} {QUIET_OPTIONS}" if path.is_file() else ""


def describe(jvm_options: str) -> str:
    path = archive_path(jvm_options)
    if path.is_file():
        return f"JVM class archive: {path}"
    return "no JVM class archive for this JVM and Spark (dledger-audit-prepare makes one)"


# --- making one -------------------------------------------------------------------------------
def _passthrough(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield from batches


def _made_up_entries() -> list[dict[str, object]]:
    """Entry rows of three replicas, one holding other bodies and one with a gap: nonsense as a
    log, but every check's joins, windows and aggregates get rows to work on."""
    from spark import read

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
            row["body_crc"] = index if replica != "b" else -index
            rows.append(row)
    return rows


def exercise(spark: SparkSession) -> None:
    """The audit's kinds of Spark work, small: a Python Arrow job (as the screen and the reader
    run), LocalRelations from Arrow (spark/frames.py), and every check over entry rows."""
    from spark import agreement, checks, frames, job, read

    spark.range(8, numPartitions=2).mapInArrow(_passthrough, "id long").collect()
    entries = frames.local(spark, _made_up_entries(), from_arrow_schema(read.ENTRY_SCHEMA))
    replicas = frames.local(
        spark,
        [("g", r, 4096, 1, 0, 0, 6, 3, 2, 8) for r in ("a", "b", "c")],
        job.REPLICA_SCHEMA,
    )
    spans = checks.replica_spans(entries)
    summary = agreement.bucket_summary(entries, replicas, 2)
    history = frames.local(spark, [("g", 3, "v", "p", 1), ("g", 9, "w", "p", 2)], job.ACKED_SCHEMA)
    bodies = frames.local(spark, [("g", 3, "a", b"v")], from_arrow_schema(read.BODY_SCHEMA))
    for found in (
        job.all_findings(entries, replicas, history, bodies, spans=spans, summary=summary),
        job.all_findings(
            entries.limit(0), replicas, None, None, spans=spans, summary=summary, rows=False
        ),
    ):
        found.limit(job.FINDINGS_COLLECT_MAX + 1).collect()


def prepare(path: Path) -> None:
    """Make the archive at `path`: run exercise() in a driver that dumps its classes at exit.
    Needs a process with no Spark JVM running yet (a gateway is kept for the process's life)."""
    from spark import session

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
    from spark import session

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
