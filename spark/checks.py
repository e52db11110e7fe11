"""The audit's rules, each a pure function from DataFrames to a DataFrame of findings.

Inputs: `entries` (spark/read.py ENTRY_SCHEMA: one row per written index slot, with what the
index record says and what the data holds there) and `replicas` (REPLICA_COLUMNS: one row per
replica, with its group's size, quorum and commit index). Every check returns FINDING_COLUMNS;
an empty result means the rule holds. A rule reads like the property it guards; broker-level
checks (ConsumeQueue, IndexFile) are added the same way.

Severity: "error" fails the audit (exit 1), "unreadable" means an input could not be read
(exit 2), "note" is reported and never fails it (an uncommitted tail, bytes after the end).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from functools import reduce

import attrs
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from spark import formats

FINDING_COLUMNS = ("kind", "severity", "group", "replica", "index", "file", "position", "detail")
FINDING_SCHEMA = (
    "kind string, severity string, group string, replica string, index long, file string, "
    "position long, detail string"
)
REPLICA_COLUMNS = (
    "group",
    "replica",
    "segment_bytes",
    "start_index",
    "start_prev_term",
    "start_position",
    "commit_index",
    "group_size",
    "quorum",
    "group_commit",
)
ERROR, NOTE, UNREADABLE = "error", "note", "unreadable"


def finding(
    frame: DataFrame,
    kind: str,
    severity: str,
    detail: Column,
    *,
    replica: Column | None = None,
    index: Column | None = None,
    file: Column | None = None,
    position: Column | None = None,
) -> DataFrame:
    """Rows of `frame` as findings; the named columns default to the frame's own."""

    def pick(given: Column | None, name: str, kind_: str) -> Column:
        if given is not None:
            return given.cast(kind_).alias(name)
        if name in frame.columns:
            return F.col(name).cast(kind_).alias(name)
        return F.lit(None).cast(kind_).alias(name)

    return frame.select(
        F.lit(kind).alias("kind"),
        F.lit(severity).alias("severity"),
        F.col("group"),
        pick(replica, "replica", "string"),
        pick(index, "index", "long"),
        pick(file, "file", "string"),
        pick(position, "position", "long"),
        detail.alias("detail"),
    )


def union(findings: Sequence[DataFrame]) -> DataFrame:
    return reduce(DataFrame.unionByName, findings)


REPORTED_SCHEMA = FINDING_SCHEMA + ", last_index long, count long"  # what merge_runs returns


def merge_runs(findings: DataFrame) -> DataFrame:
    """Findings of one kind on one replica at consecutive indexes as one finding: `index` and
    `last_index` the range, `count` how many it stands for (so counts stay exact), file,
    position and detail those of the first, the range said in the detail. A deleted segment
    is then one finding per replica and kind, not one per entry. Findings without an index
    stay as they are (count 1)."""
    by_run = Window.partitionBy("kind", "severity", "group", "replica").orderBy("index")
    indexed = findings.where(F.col("index").isNotNull()).withColumn(
        "run", F.col("index") - F.dense_rank().over(by_run)
    )
    runs = indexed.groupBy("kind", "severity", "group", "replica", "run").agg(
        F.min(F.struct("index", "position", "file", "detail")).alias("first"),
        F.max("index").alias("last_index"),
        F.count("*").alias("count"),
    )
    detail = F.when(F.col("count") == 1, F.col("first.detail")).otherwise(
        F.format_string(
            "%s [%d findings, indexes %d..%d]",
            F.col("first.detail"),
            F.col("count"),
            F.col("first.index"),
            F.col("last_index"),
        )
    )
    merged = runs.select(
        "kind",
        "severity",
        "group",
        "replica",
        F.col("first.index").alias("index"),
        F.col("first.file").alias("file"),
        F.col("first.position").alias("position"),
        detail.alias("detail"),
        F.when(F.col("count") > 1, F.col("last_index")).alias("last_index"),
        "count",
    )
    alone = findings.where(F.col("index").isNull()).select(
        *FINDING_COLUMNS,
        F.lit(None).cast("long").alias("last_index"),
        F.lit(1).cast("long").alias("count"),
    )
    return merged.unionByName(alone)


# --- what a row is ----------------------------------------------------------------------------
def is_good() -> Column:
    """An entry that is what its slot says: a sound header and body, the slot's index, found
    where the header says. Only these count as held by a replica in the group checks."""
    return (
        F.col("io_error").isNull()
        & F.col("header_ok")
        & F.col("body_ok")
        & (F.col("h_index") == F.col("index"))
        & (F.col("h_position") == F.col("position"))
        & F.col("kind").isin(*formats.ENTRY_KINDS)
    )


def good(entries: DataFrame) -> DataFrame:
    """The entries that are good (is_good)."""
    return entries.where(is_good())


def _with_expected_position(entries: DataFrame, replicas: DataFrame) -> DataFrame:
    """Add `expected`: where the data says entry `index` starts (null when unknown): the log
    start for the first retained index, else the end of the entry before, moved past a blank
    record or to the next segment when that entry ends its segment."""
    seg = F.col("segment_bytes")
    prev_end = F.col("prev_end")
    expected = (
        F.when(F.col("index") == F.col("start_index"), F.col("start_position"))
        .when(prev_end.isNull(), F.lit(None))
        .when(prev_end % seg == 0, prev_end)
        .when(F.col("prev_after_magic") == formats.BLANK_MAGIC, prev_end + F.col("prev_after_size"))
        .otherwise(prev_end)
    )
    sizes = replicas.select(
        "group", "replica", "segment_bytes", "start_index", "start_position", "start_prev_term"
    )
    return entries.join(F.broadcast(sizes), ["group", "replica"]).withColumn("expected", expected)


def _points_elsewhere() -> Column:
    """The record's position is not where the data says the entry starts."""
    return F.col("expected").isNotNull() & (F.col("expected") != F.col("rec_position"))


# --- per replica ------------------------------------------------------------------------------
def unreadable_files(entries: DataFrame) -> DataFrame:
    """Entries whose file could not be read at all (permissions, I/O errors): exit 2."""
    bad = entries.where(F.col("io_error").isNotNull())
    first = bad.groupBy("group", "replica", F.col("io_error")).agg(
        F.min(F.struct("index", "file", "position")).alias("at"), F.count("*").alias("n")
    )
    return finding(
        first,
        "unreadable",
        UNREADABLE,
        F.format_string("%s (%d entries not read)", F.col("io_error"), F.col("n")),
        index=F.col("at.index"),
        file=F.col("at.file"),
        position=F.col("at.position"),
    )


@attrs.frozen(eq=False)
class RowRule:
    """A rule judged on each entry row alone (which carries the facts of the slot before it)
    and its replica's start: `hit` is true on the rows that break it, `detail` says how."""

    kind: str
    severity: str
    hit: Column
    detail: Column
    file: Column | None = None  # default: the row's own `file` (its data segment)


def row_findings(
    entries: DataFrame, replicas: DataFrame, rules: Sequence[RowRule] | None = None
) -> DataFrame:
    """The findings of row rules (default: every one, row_rules()) in one pass over the
    entries: rows that break no rule are dropped by one filter, and each remaining row yields
    a finding per rule it breaks."""
    e = _with_expected_position(entries, replicas)
    chosen = row_rules() if rules is None else list(rules)
    found = [
        F.when(
            rule.hit,
            F.struct(
                F.lit(rule.kind).alias("kind"),
                F.lit(rule.severity).alias("severity"),
                F.col("group").alias("group"),
                F.col("replica").cast("string").alias("replica"),
                F.col("index").cast("long").alias("index"),
                (F.col("file") if rule.file is None else rule.file).cast("string").alias("file"),
                F.col("position").cast("long").alias("position"),
                rule.detail.cast("string").alias("detail"),
            ),
        )
        for rule in chosen
    ]
    broken = reduce(operator.or_, [F.coalesce(rule.hit, F.lit(False)) for rule in chosen])
    return e.where(broken).select(F.inline(F.filter(F.array(*found), lambda f: f.isNotNull())))


def row_rules() -> list[RowRule]:
    return [malformed_rule(), index_mismatch_rule(), position_break_rule(), term_regression_rule()]


def malformed_entries(entries: DataFrame, replicas: DataFrame) -> DataFrame:
    """Entries that are not well-formed where the data says they are (malformed_rule)."""
    return row_findings(entries, replicas, [malformed_rule()])


def index_mismatches(entries: DataFrame, replicas: DataFrame) -> DataFrame:
    """Index records that disagree with the data (index_mismatch_rule)."""
    return row_findings(entries, replicas, [index_mismatch_rule()])


def position_breaks(entries: DataFrame, replicas: DataFrame) -> DataFrame:
    """Sound entries not where the entry before them ends (position_break_rule)."""
    return row_findings(entries, replicas, [position_break_rule()])


def term_regressions(entries: DataFrame, replicas: DataFrame) -> DataFrame:
    """Sound entries with a lower term than the entry before (term_regression_rule)."""
    return row_findings(entries, replicas, [term_regression_rule()])


def malformed_rule() -> RowRule:
    """Entries that are not well-formed where the data says they are: magic, header CRC, size,
    position in the header, kind, body CRC. (A bad header where the record points but the data
    does not is the index's fault: see index_mismatch_rule.)"""
    no_header = F.col("defect").isNotNull() | ~F.col("header_ok")
    # a data file cut short (a follower killed mid-write, a torn copy): its last entry is cut,
    # and every record after it points past the end; said so, not as bad CRCs and magics
    at = F.col("rec_position") % F.col("segment_bytes")
    claimed = F.greatest(F.col("rec_size"), F.lit(formats.ENTRY_HEADER_BYTES))
    reason = (
        F.when(F.col("defect").isNotNull(), F.col("defect"))
        .when(
            (at < F.col("file_bytes")) & (at + claimed > F.col("file_bytes")),
            F.format_string(
                "%s ends at byte %d, inside this entry (bytes %d..%d of it): it and every "
                "entry after it in the file are unreadable",
                F.col("file"),
                F.col("file_bytes"),
                at,
                at + claimed - 1,
            ),
        )
        .when(
            at >= F.col("file_bytes"),
            F.format_string("past the end of %s (%d bytes)", F.col("file"), F.col("file_bytes")),
        )
        .when(
            F.col("magic") != formats.ENTRY_MAGIC,
            F.format_string("magic 0x%08X is not an entry's", F.col("magic")),
        )
        .when(
            ~F.col("header_ok")
            & (F.col("size") >= formats.ENTRY_HEADER_BYTES)
            & (F.col("size") <= formats.ENTRY_BYTES_MAX)
            & (F.col("position") % F.col("segment_bytes") + F.col("size") > F.col("segment_bytes")),
            F.format_string("size %d runs past the segment end", F.col("size")),
        )
        .when(
            ~F.col("header_ok")
            & (
                (F.col("size") < formats.ENTRY_HEADER_BYTES)
                | (F.col("size") > formats.ENTRY_BYTES_MAX)
            ),
            F.format_string("size %d out of bounds", F.col("size")),
        )
        .when(~F.col("header_ok"), F.lit("header crc mismatch"))
        .when(
            F.col("h_position") != F.col("position"),
            F.format_string("header says position %d", F.col("h_position")),
        )
        .when(
            ~F.col("kind").isin(*formats.ENTRY_KINDS),
            F.format_string("unknown kind %d", F.col("kind")),
        )
        .when(~F.col("body_ok"), F.lit("body crc mismatch"))
    )
    own_index = F.col("h_index") == F.col("index")
    hit = F.col("io_error").isNull() & (
        (no_header & ~_points_elsewhere()) | (~no_header & own_index & reason.isNotNull())
    )
    return RowRule("malformed_entry", ERROR, hit, reason)


def index_mismatch_rule() -> RowRule:
    """Index records that disagree with the data: a field differs from the entry's header, or
    the record points where the data holds no entry while the data holds it elsewhere."""
    sound = F.col("defect").isNull() & F.col("header_ok")

    def differs(field: str, record: str, header: str) -> Column:
        return F.when(
            F.col(record) != F.col(header),
            F.format_string(f"{field}: record %d, entry %d", F.col(record), F.col(header)),
        )

    fields = F.concat_ws(
        "; ",
        F.when(
            F.col("rec_index") != F.col("index"),
            F.format_string("index: record %d in slot %d", F.col("rec_index"), F.col("index")),
        ),
        differs("index", "index", "h_index"),
        differs("term", "rec_term", "term"),
        differs("size", "rec_size", "size"),
        differs("kind", "rec_kind", "kind"),
    )
    moved = F.format_string(
        "position: record %d, but the data holds the entry at %d",
        F.col("rec_position"),
        F.col("expected"),
    )
    hit = F.col("io_error").isNull() & ((sound & (fields != "")) | (~sound & _points_elsewhere()))
    first_slot = F.substring_index(F.col("index_file"), "/", -1).cast("long")
    detail = F.format_string(
        "record at byte %d: %s",
        (F.col("index") - first_slot) * formats.INDEX_RECORD_BYTES,
        F.when(sound, fields).otherwise(moved),
    )
    return RowRule("index_mismatch", ERROR, hit, detail, file=F.col("index_file"))


def position_break_rule() -> RowRule:
    """Sound entries that do not start where the entry before them ends (allowing one blank
    record that fills the rest of a segment), and blank records of the wrong size."""
    seg = F.col("segment_bytes")
    left = seg - F.col("prev_end") % seg  # bytes left in the segment after the entry before
    blank = F.col("prev_after_magic") == formats.BLANK_MAGIC
    reason = (
        F.when(
            blank & (F.col("prev_after_size") != left),
            F.format_string(
                "blank record at %d has size %d, the segment has %d left",
                F.col("prev_end"),
                F.col("prev_after_size"),
                left,
            ),
        )
        .when(
            F.col("prev_end").isNotNull() & (left < seg) & (left < formats.BLANK_BYTES_MIN),
            F.format_string("entry before leaves %d bytes in its segment", left),
        )
        .when(
            F.col("expected").isNotNull() & (F.col("position") != F.col("expected")),
            F.format_string("starts at %d, expected %d", F.col("position"), F.col("expected")),
        )
    )
    return RowRule("position_break", ERROR, is_good() & reason.isNotNull(), reason)


def term_regression_rule() -> RowRule:
    """Sound entries whose term is lower than the term of the entry before."""
    before = F.when(F.col("index") == F.col("start_index"), F.col("start_prev_term")).otherwise(
        F.col("prev_term")
    )
    hit = is_good() & before.isNotNull() & (F.col("term") < before)
    detail = F.format_string("term %d after term %d", F.col("term"), before)
    return RowRule("term_regression", ERROR, hit, detail)


def index_gaps(
    entries: DataFrame | None, replicas: DataFrame, spans: DataFrame | None = None
) -> DataFrame:
    """Slots without a record between the first retained index and the last written one.
    Healthy replicas are ruled out by counting (replica_spans, shared with other checks); only
    broken ones are searched (a shuffle of their rows alone). `entries` None: no entry rows,
    as an empty frame (facts_only)."""
    spans = _spans(entries, spans).select(
        "group",
        "replica",
        F.col("entries").alias("n"),
        F.col("first_index").alias("lo"),
        F.col("last_index").alias("hi"),
    )
    spans = spans.join(replicas.select("group", "replica", "start_index"), ["group", "replica"])
    head = spans.where(F.col("lo") > F.col("start_index"))
    head_gaps = head.select(
        "group", "replica", F.col("start_index").alias("gap_lo"), (F.col("lo") - 1).alias("gap_hi")
    )
    gaps = head_gaps if entries is None else head_gaps.unionByName(_gaps_between(entries, spans))
    return finding(
        gaps,
        "index_gap",
        ERROR,
        F.format_string(
            "indexes %d..%d have no index record (%d missing)",
            F.col("gap_lo"),
            F.col("gap_hi"),
            F.col("gap_hi") - F.col("gap_lo") + 1,
        ),
        index=F.col("gap_lo"),
    )


def _gaps_between(entries: DataFrame, spans: DataFrame) -> DataFrame:
    """(group, replica, gap_lo, gap_hi) between the rows of replicas whose span (n, lo, hi)
    counts fewer rows than indexes."""
    broken = spans.where(F.col("n") != F.col("hi") - F.col("lo") + 1).select("group", "replica")
    rows = entries.join(F.broadcast(broken), ["group", "replica"]).select(
        "group", "replica", "index"
    )
    # within a broken replica, a gap lies between two consecutive rows more than 1 apart (a
    # window over those rows only: the join above runs first, so healthy replicas add nothing)
    before = F.lag("index").over(Window.partitionBy("group", "replica").orderBy("index"))
    return (
        rows.select("group", "replica", "index", before.alias("before"))
        .where(F.col("index") - F.col("before") > 1)
        .select(
            "group",
            "replica",
            (F.col("before") + 1).alias("gap_lo"),
            (F.col("index") - 1).alias("gap_hi"),
        )
    )


def _spans(entries: DataFrame | None, spans: DataFrame | None) -> DataFrame:
    """`spans` when given, else replica_spans of the entries (which are then required)."""
    if spans is not None:
        return spans
    if entries is None:
        raise ValueError("a check without entry rows needs their spans")
    return replica_spans(entries)


def replica_spans(entries: DataFrame) -> DataFrame:
    """Per replica: rows read, first and last index, and bytes of the entries. Several checks
    start from it; they take it as `spans` when the caller has it already (job.py collects it
    once), since Spark would otherwise scan the entries for it once per check."""
    return entries.groupBy("group", "replica").agg(
        F.count("*").alias("entries"),
        F.min("index").alias("first_index"),
        F.max("index").alias("last_index"),
        F.sum(F.coalesce(F.col("size"), F.lit(0))).alias("bytes"),
    )


def checkpoints_outside_log(
    entries: DataFrame | None, replicas: DataFrame, spans: DataFrame | None = None
) -> DataFrame:
    """A checkpoint whose commit index lies outside [first retained index - 1, last index]:
    the replica claims commits it does not hold. Only the spans are needed: `entries` may be
    None when they are given."""
    spans = replicas.join(_spans(entries, spans), ["group", "replica"], "left")
    last = F.coalesce(F.col("last_index"), F.col("start_index") - 1)
    bad = spans.where(
        (F.col("commit_index") > last) | (F.col("commit_index") < F.col("start_index") - 1)
    )
    return finding(
        bad,
        "checkpoint_outside_log",
        ERROR,
        F.format_string(
            "checkpoint commit index %d is outside the log %d..%d",
            F.col("commit_index"),
            F.col("start_index"),
            last,
        ),
        index=F.col("commit_index"),
        file=F.lit("checkpoint"),
    )


def uncommitted_tails(entries: DataFrame, replicas: DataFrame) -> DataFrame:
    """Entries past the replica's own commit index: normal after a crash or a lost leadership,
    and truncated by the next leader if they conflict. A note, never an error."""
    commits = replicas.select("group", "replica", "commit_index")
    tail = entries.join(F.broadcast(commits), ["group", "replica"])
    tail = tail.where(F.col("index") > F.col("commit_index"))
    spans = tail.groupBy("group", "replica", "commit_index").agg(
        F.min(F.struct("index", "file", "position")).alias("first"),
        F.max("index").alias("last"),
        F.count("*").alias("n"),
    )
    return finding(
        spans,
        "uncommitted_tail",
        NOTE,
        F.format_string(
            "%d entries %d..%d past this replica's commit index %d",
            F.col("n"),
            F.col("first.index"),
            F.col("last"),
            F.col("commit_index"),
        ),
        index=F.col("first.index"),
        file=F.col("first.file"),
        position=F.col("first.position"),
    )


def unindexed_data(entries: DataFrame, spans: DataFrame | None = None) -> DataFrame:
    """Bytes after the last indexed entry that are neither zero nor a blank record: a torn or
    unindexed write that recovery will cut. A note: nothing acknowledged can be there."""
    spans = _spans(entries, spans)
    last = spans.select("group", "replica", F.col("last_index").alias("index"))
    tail = good(entries).join(F.broadcast(last), ["group", "replica", "index"])
    stray = tail.where(~F.col("after_magic").isin(formats.END_MAGIC, formats.BLANK_MAGIC))
    what = F.when(F.col("after_magic") == formats.ENTRY_MAGIC, F.lit("an entry header")).otherwise(
        F.format_string("bytes 0x%08X", F.col("after_magic"))
    )
    return finding(
        stray,
        "unindexed_data",
        NOTE,
        F.format_string(
            "%s at %d after the last indexed entry", what, F.col("position") + F.col("size")
        ),
        position=F.col("position") + F.col("size"),
    )
