"""The audit as one Spark job: read every replica once, run every check, collect the results.

The entries DataFrame is persisted after the first action so that the checks, which each scan
it, do not read the files again. Findings are small in a healthy store; when a store is badly
broken they can be many, so the driver collects only counts and the first EXAMPLES_MAX of each
kind, and the full list is written by Spark as JSON lines under the output directory.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from spark import agreement, checks, read
from spark.history import AckedAppend
from spark.layout import Replica
from spark.progress import Progress

EXAMPLES_MAX = 20  # findings of one kind shown in report.json and report.html


@attrs.frozen
class Outcome:
    """What the driver collected: enough for report.json, report.html and the summary."""

    spans: list[dict[str, Any]]  # per replica: entries, first_index, last_index, bytes
    counts: list[dict[str, Any]]  # per finding kind: kind, severity, count
    examples: list[dict[str, Any]]  # the first EXAMPLES_MAX findings of every kind
    entries_checked: int
    tasks: int
    acked: int


def max_per_group(pairs: Iterable[tuple[str, int]]) -> dict[str, int]:
    """group -> the highest index among (group, index) pairs."""
    highest: dict[str, int] = {}
    for group, index in pairs:
        highest[group] = max(highest.get(group, 0), index)
    return highest


def replica_rows(
    replicas: Sequence[Replica],
    acked: Sequence[AckedAppend] | None = None,
    held: Mapping[str, int] | None = None,
) -> list[tuple[Any, ...]]:
    """REPLICA_COLUMNS for each replica: its group's size, quorum and commit index. A group's
    commit index is the highest any replica's checkpoint records, or the highest index the
    history says was acknowledged, whichever is higher: an acknowledgement is a commit, and
    checkpoints lag (they are written periodically, and a replica killed with -9 writes none).
    `held` (group -> highest index any replica's log holds) caps that raise: an acknowledged
    index no replica holds is a `missing_append`, not also an `under_replicated` index."""
    acked_max = max_per_group((a.group, a.index) for a in acked or () if a.index is not None)
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
ACKED_SCHEMA = "group string, index long, value string, process string, time_ns long"


def all_findings(
    entries: DataFrame,
    replicas: DataFrame,
    history: DataFrame | None,
    bodies: DataFrame | None,
    *,
    spans: DataFrame | None = None,
    summary: DataFrame | None = None,
) -> DataFrame:
    """Every check's findings in one DataFrame (checks.FINDING_COLUMNS). `spans`
    (checks.replica_spans) and `summary` (agreement.bucket_summary), when given, are used
    instead of computing them again: Spark does not reuse them across the checks."""
    found = [
        checks.unreadable_files(entries),
        checks.row_findings(entries, replicas),  # malformed, index, position, term: one pass
        checks.index_gaps(entries, replicas, spans),
        checks.checkpoints_outside_log(entries, replicas, spans),
        checks.uncommitted_tails(entries, replicas),
        checks.unindexed_data(entries, spans),
        agreement.divergent_entries(entries, replicas, summary),
        agreement.under_replicated(entries, replicas, summary),
    ]
    if history is not None and bodies is not None:
        found.append(agreement.missing_appends(history, bodies, replicas))
    return checks.union(found)


def run(
    spark: SparkSession,
    replicas: Sequence[Replica],
    acked: Sequence[AckedAppend] | None,
    out_dir: str,
    progress: Progress,
) -> Outcome:
    tasks = len(read.plan(replicas))
    progress.step(f"reading {len(replicas)} replicas in {tasks} tasks")
    entries = read.entries(spark, replicas).persist(StorageLevel.MEMORY_AND_DISK)
    spans_plan = checks.replica_spans(entries)
    span_rows = spans_plan.collect()  # reads every replica once, filling the cache
    spans = [row.asDict() for row in span_rows]
    held = max_per_group(
        (s["group"], int(s["last_index"])) for s in spans if s["last_index"] is not None
    )
    replicas_df = spark.createDataFrame(replica_rows(replicas, acked, held), REPLICA_SCHEMA)
    entries_checked = sum(int(s["entries"]) for s in spans)
    progress.step(f"read {entries_checked} entries; checking")
    # the small facts several checks start from, computed once and handed to them as data
    spans_df = spark.createDataFrame(span_rows, spans_plan.schema)
    summary_plan = agreement.bucket_summary(entries, replicas_df)
    summary_df = spark.createDataFrame(summary_plan.collect(), summary_plan.schema)
    history = bodies = None
    if acked is not None:
        rows = [(a.group, a.index, a.value, a.process, a.time_ns) for a in acked]
        history = spark.createDataFrame(rows, ACKED_SCHEMA)
        wanted = agreement.history_wanted(history, entries, replicas_df)
        bodies = read.bodies(spark, replicas, wanted)
    findings = all_findings(
        entries, replicas_df, history, bodies, spans=spans_df, summary=summary_df
    )
    # the union has a partition per input partition of every check: merge them before caching
    findings = findings.coalesce(spark.sparkContext.defaultParallelism).persist()
    counts = [
        row.asDict()
        for row in findings.groupBy("kind", "severity").count().orderBy("kind").collect()
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
    if counts:
        findings.orderBy("kind", "group", "replica", "index").coalesce(1).write.mode(
            "overwrite"
        ).json(posixpath.join(out_dir, "findings"))
    findings.unpersist()
    entries.unpersist()
    return Outcome(spans, counts, examples, entries_checked, tasks, len(acked or ()))
