"""The audit as one Spark job: screen every group's chunks (spark/screen.py), read the chunks
that are not plainly healthy in detail, run every check, collect the results.

The detailed entries DataFrame is persisted as it is first read so that the checks, which each
scan it, do not read the files again. Findings are small in a healthy store and the driver
collects them in one action (at most FINDINGS_COLLECT_MAX); when a store is badly broken they can
be many, so the driver collects only counts and the first EXAMPLES_MAX of each kind, and the full
list is written by Spark as JSON lines under the output directory.
"""

from __future__ import annotations

import functools
import json
import posixpath
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from spark import agreement, broker_job, checks, frames, layout, read, screen, workers
from spark.history import Acked, AckedAppend
from spark.layout import Replica
from spark.progress import Progress

EXAMPLES_MAX = 20  # findings of one kind shown in report.json and report.html
FINDINGS_COLLECT_MAX = 10_000  # fewer are collected at once; more are counted by Spark


@attrs.frozen
class Outcome:
    """What the driver collected: enough for report.json, report.html and the summary."""

    spans: list[dict[str, Any]]  # per replica: entries, first_index, last_index, bytes
    counts: list[dict[str, Any]]  # per finding kind: kind, severity, count
    examples: list[dict[str, Any]]  # the first EXAMPLES_MAX findings of every kind
    entries_checked: int
    tasks: int
    acked: int
    broker: dict[str, Any] | None = None  # broker_job.tables: the broker stores' tables


def _summarise(
    found: list[dict[str, Any]], out_dir: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Counts per (kind, severity) and the first EXAMPLES_MAX findings of each kind, ordered as
    the Spark path orders them (nulls first); writes findings/ as Spark's JSON writer would
    (one object per line, null fields left out), replacing what an earlier run left there."""

    def key(f: dict[str, Any], fields: Sequence[str]) -> tuple[Any, ...]:
        return tuple((f[name] is not None, f[name]) for name in fields)

    found.sort(key=lambda f: key(f, ("kind", "group", "replica", "index", "position", "detail")))
    tally: dict[tuple[str, str], int] = {}
    shown: dict[str, int] = {}
    examples: list[dict[str, Any]] = []
    for f in found:
        tally[(f["kind"], f["severity"])] = tally.get((f["kind"], f["severity"]), 0) + f["count"]
        shown[f["kind"]] = shown.get(f["kind"], 0) + 1
        if shown[f["kind"]] <= EXAMPLES_MAX:
            examples.append(f)
    counts = [{"kind": k, "severity": v, "count": n} for (k, v), n in sorted(tally.items())]
    fs, path = layout.filesystem(posixpath.join(out_dir, "findings"))
    fs.delete_dir_contents(path, missing_dir_ok=True)  # as Spark's overwrite would
    if found:
        fs.create_dir(path, recursive=True)
        lines = "".join(
            json.dumps({k: v for k, v in f.items() if v is not None}) + "\n" for f in found
        )
        with fs.open_output_stream(posixpath.join(path, "part-00000.json")) as out:
            out.write(lines.encode())
    return counts, examples


def max_per_group(pairs: Iterable[tuple[str, int]]) -> dict[str, int]:
    """group -> the highest index among (group, index) pairs."""
    highest: dict[str, int] = {}
    for group, index in pairs:
        highest[group] = max(highest.get(group, 0), index)
    return highest


def replica_rows(
    replicas: Sequence[Replica],
    acked_max: Mapping[str, int] | None = None,
    held: Mapping[str, int] | None = None,
) -> list[tuple[Any, ...]]:
    """REPLICA_COLUMNS for each replica: its group's size, quorum and commit index. A group's
    commit index is the highest any replica's checkpoint records, or the highest index the
    history says was acknowledged (`acked_max`: group -> that index, Acked.highest), whichever
    is higher: an acknowledgement is a commit, and checkpoints lag (they are written
    periodically, and a replica killed with -9 writes none). `held` (group -> highest index any
    replica's log holds) caps that raise: an acknowledged index no replica holds is a
    `missing_append`, not also an `under_replicated` index."""
    acked_max = dict(acked_max or {})
    if held is not None:
        acked_max = {g: min(i, held.get(g, 0)) for g, i in acked_max.items()}
    rows = []
    for r in replicas:
        group = [x for x in replicas if x.group == r.group]
        rows.append(
            (
                r.group,
                r.name,
                r.segment_bytes,
                r.start_index,
                r.start_prev_term,
                r.start_position,
                r.commit_index,
                len(group),
                len(group) // 2 + 1,
                max(max(x.commit_index for x in group), acked_max.get(r.group, 0)),
            )
        )
    return rows


REPLICA_SCHEMA = (
    "group string, replica string, segment_bytes long, start_index long, start_prev_term long, "
    "start_position long, commit_index long, group_size long, quorum long, group_commit long"
)
ACKED_SCHEMA = (  # history.AckedAppend, for the appends the screen did not compare
    "group string, index long, value string, process string, time_ns long, digest binary, "
    "value_bytes long"
)


def all_findings(
    entries: DataFrame,
    replicas: DataFrame,
    history: DataFrame | None,
    heads: Callable[[DataFrame], DataFrame] | None,
    *,
    spans: DataFrame | None = None,
    summary: DataFrame | None = None,
    bucket_bits: int = agreement.BUCKET_BITS,
    rows: bool = True,
) -> DataFrame:
    """Every check's findings in one DataFrame (checks.FINDING_COLUMNS). `spans`
    (checks.replica_spans) and `summary` (agreement.bucket_summary with `bucket_bits`), when
    given, are used instead of computing them again: Spark does not reuse them across the
    checks. `rows` False says `entries` holds no rows (the screen found every chunk plain):
    the checks that can only find something in entry rows are then left out, because building
    and planning them costs seconds in a fresh JVM to find nothing."""
    # these also judge the per-replica facts: spans, checkpoints, bucket counts; without rows
    # they are told so (None), and leave the rows' branches out of the query
    facts_from = entries if rows else None
    found = [
        checks.index_gaps(facts_from, replicas, spans),
        checks.checkpoints_outside_log(facts_from, replicas, spans),
        agreement.under_replicated(facts_from, replicas, summary, bucket_bits),
    ]
    if rows:
        found += [
            checks.unreadable_files(entries),
            checks.row_findings(entries, replicas),  # malformed, index, position, term
            checks.uncommitted_tails(entries, replicas),
            checks.unindexed_data(entries, spans),
            agreement.divergent_entries(entries, replicas, summary, bucket_bits),
        ]
    if history is not None:
        found.append(agreement.missing_appends(history, facts_from, replicas, heads))
    return checks.union(found)


def _add_sound(
    spans: list[dict[str, Any]],
    screened: screen.Screened | None,
    ranges: Mapping[tuple[str, str], Sequence[tuple[int, int]]] | None,
    entries: DataFrame | None,
) -> None:
    """Give each span the entries read and sound (checks.good) and the last of them, beside
    what the index files claim (`entries`, `last_index`): a cut tail shows as the difference.
    Plain chunks are sound throughout; detailed rows are counted by one small Spark job."""
    sound: dict[tuple[str, str], list[int]] = {}  # entries, first, last
    for c in screened.chunks if screened is not None else ():
        detailed = any(
            lo <= c.lo and c.hi <= hi for lo, hi in (ranges or {}).get((c.group, c.replica), ())
        )  # a plain chunk of a group with a gap is read in detail too: counted there
        if c.plain and not detailed and c.first_index is not None and c.last_index is not None:
            got = sound.setdefault((c.group, c.replica), [0, c.first_index, 0])
            got[0] += c.rows
            got[1], got[2] = min(got[1], c.first_index), max(got[2], c.last_index)
    if entries is not None:
        rows = (
            checks.good(entries)
            .groupBy("group", "replica")
            .agg(F.count("*").alias("n"), F.min("index").alias("lo"), F.max("index").alias("hi"))
            .collect()
        )
        for row in rows:
            got = sound.setdefault((row["group"], row["replica"]), [0, int(row["lo"]), 0])
            got[0] += int(row["n"])
            got[1], got[2] = min(got[1], int(row["lo"])), max(got[2], int(row["hi"]))
    for span in spans:
        n, first, last = sound.get((span["group"], span["replica"]), [0, 0, 0])
        span["sound_entries"] = n
        span["sound_first_index"], span["sound_last_index"] = (first, last) if n else (None, None)


def screened_out(screened: screen.Screened | None, acked: Acked) -> list[AckedAppend]:
    """The acknowledged appends the screen did not compare, in full (read again from the
    history): without an index, or at an index outside the chunks it found plain (those
    matched the committed body's digest); all of them without a screen."""
    out = np.ones(len(acked), dtype=bool)
    if screened is not None:
        for code, group in enumerate(acked.groups):
            rows = np.flatnonzero((acked.group == code) & (acked.index > 0))
            out[rows] = ~screened.in_plain_chunks(group, acked.index[rows])
    return acked.details(out)


def run(
    spark: SparkSession,
    replicas: Sequence[Replica],
    acked: Acked | None,
    out_dir: str,
    progress: Progress,
    *,
    chunk_bits: int | None = screen.CHUNK_BITS_DEFAULT,
    broker: broker_job.BrokerInputs | None = None,
) -> Outcome:
    """The audit. First a screening pass (spark/screen.py) over chunks of 2^chunk_bits indexes
    finds the plainly healthy ones; only the others are read into the entries DataFrame the
    checks run on. With a history, the screen also compares each acknowledged value's SHA-256
    with the digest of the committed body at its index, and only the appends of chunks that
    are not plain reach the Spark check. After a screening error, or with chunk_bits None,
    every entry is read in detail and every append checked in Spark."""
    warm_up = workers.start(spark)  # while the driver plans the first query
    try:
        return _run(spark, replicas, acked, out_dir, progress, chunk_bits, broker)
    finally:
        warm_up.join()


def _run(
    spark: SparkSession,
    replicas: Sequence[Replica],
    acked: Acked | None,
    out_dir: str,
    progress: Progress,
    chunk_bits: int | None,
    broker: broker_job.BrokerInputs | None = None,
) -> Outcome:
    screened, screen_tasks = None, 0
    acked_count = 0 if acked is None else len(acked)
    acked_max = None if acked is None else acked.highest()
    # an acknowledgement is a commit: the screen judges up to the raised commit (replica_rows)
    commits = {row[0]: row[-1] for row in replica_rows(replicas, acked_max)}
    if chunk_bits is not None:
        screen_tasks = len(screen.plan(replicas, chunk_bits))
        progress.step(f"screening {len(replicas)} replicas in {screen_tasks} tasks")
        digests = None
        if acked is not None:  # read once per Python worker, not shipped with every task
            digests = spark.sparkContext.broadcast(acked.digests_by_group())
        screened = screen.Screened.collect(spark, replicas, chunk_bits, commits, digests)
        if digests is not None:
            digests.unpersist()
        if screened.failed is not None:
            progress.step(f"screening stopped ({screened.failed}): reading every entry")
            screened, screen_tasks = None, 0
    bucket_bits = agreement.BUCKET_BITS if screened is None else screened.chunk_bits
    ranges = None if screened is None else screened.detail_ranges(replicas)
    detail_tasks = len(read.plan(replicas, ranges))
    tasks = detail_tasks + screen_tasks
    progress.step(f"reading entries in detail in {detail_tasks} tasks")
    entries = read.entries(spark, replicas, ranges)
    if detail_tasks:  # an empty frame stays a known-empty relation the optimizer prunes with
        entries = entries.persist(StorageLevel.MEMORY_AND_DISK)
    if screened is None:
        span_rows = [tuple(row) for row in checks.replica_spans(entries).collect()]
    else:  # every chunk was counted by the screening pass
        span_rows = list(screened.spans())
    spans_df = frames.local(spark, span_rows, screen.SPANS_SCHEMA)
    spans = [dict(zip(spans_df.columns, row, strict=True)) for row in span_rows]
    _add_sound(spans, screened, ranges, entries if detail_tasks else None)
    held = max_per_group(
        (s["group"], int(s["last_index"])) for s in spans if s["last_index"] is not None
    )
    replica_facts = replica_rows(replicas, acked_max, held)
    replicas_df = frames.local(spark, replica_facts, REPLICA_SCHEMA)
    entries_checked = sum(int(s["entries"]) for s in spans)
    progress.step(f"read {entries_checked} entries; checking")
    # the small facts several checks start from, computed once and handed to them as data
    summary_rows = []
    if detail_tasks:
        summary = agreement.bucket_summary(entries, replicas_df, bucket_bits)
        summary_rows = [tuple(row) for row in summary.collect()]
    if screened is not None:
        summary_rows += screened.plain_summary(replicas, {r[0]: r[-1] for r in replica_facts})
    summary_df = frames.local(spark, summary_rows, screen.SUMMARY_SCHEMA)
    history = None
    if acked is not None:
        unscreened = screened_out(screened, acked)
        progress.step(
            f"{len(acked) - len(unscreened)} of {len(acked)} acknowledged appends matched "
            "in plain chunks"
        )
        if unscreened:  # else the Spark check has nothing to compare: not built at all
            history = frames.local(spark, [attrs.astuple(a) for a in unscreened], ACKED_SCHEMA)
    findings = all_findings(
        entries,
        replicas_df,
        history,
        functools.partial(read.body_heads, spark, replicas),
        spans=spans_df,
        summary=summary_df,
        bucket_bits=bucket_bits,
        rows=detail_tasks > 0,
    )
    part = None
    if broker is not None and broker.stores:
        commits = {row[0]: int(row[-1]) for row in replica_facts}
        for store in broker.stores:
            group = store.replica.group
            commits[group] = max(commits.get(group, 0), store.applied_index)
        part = broker_job.run(
            spark, broker.stores, broker.history, broker.geometry, commits, progress
        )
        findings = checks.union([findings, part.findings])
    findings = checks.merge_runs(findings)
    # one action: a store with few findings (the usual case) has them all on the driver at once
    few = findings.limit(FINDINGS_COLLECT_MAX + 1).collect()
    if len(few) <= FINDINGS_COLLECT_MAX:
        counts, examples = _summarise([row.asDict() for row in few], out_dir)
        progress.step(f"{sum(c['count'] for c in counts)} findings")
        entries.unpersist()
        tables = None if part is None or broker is None else broker_job.tables(part, broker)
        return Outcome(spans, counts, examples, entries_checked, tasks, acked_count, tables)
    # the union has a partition per input partition of every check: merge them before caching
    findings = findings.coalesce(spark.sparkContext.defaultParallelism).persist()
    counts = [
        row.asDict()
        for row in findings.groupBy("kind", "severity")
        .agg(F.sum("count").alias("count"))
        .orderBy("kind")
        .collect()
    ]
    progress.step(f"{sum(c['count'] for c in counts)} findings; writing them")
    order = Window.partitionBy("kind").orderBy("group", "replica", "index", "position", "detail")
    examples = [
        row.asDict()
        for row in findings.withColumn("n", F.row_number().over(order))
        .where(F.col("n") <= EXAMPLES_MAX)
        .drop("n")
        .orderBy("kind", "group", "replica", "index", "position", "detail")
        .collect()
    ]
    findings.orderBy("kind", "group", "replica", "index").coalesce(1).write.mode("overwrite").json(
        posixpath.join(out_dir, "findings")
    )
    findings.unpersist()
    entries.unpersist()
    tables = None if part is None or broker is None else broker_job.tables(part, broker)
    return Outcome(spans, counts, examples, entries_checked, tasks, acked_count, tables)
