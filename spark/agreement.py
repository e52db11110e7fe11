"""Checks across the replicas of a group, and of a chaos history against the committed log.

Same contract as spark/checks.py: pure functions from DataFrames to findings. A group's commit
index is the highest commit index any of its replicas' checkpoints records (REPLICA_COLUMNS
`group_commit`); only entries up to it must agree and be held by a quorum. Only sound entries
(checks.good) count as held: a corrupt copy is reported once, as malformed, and does not also
show up as a divergence.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from spark import checks, formats
from spark.checks import ERROR, NOTE, finding

# What replicas must agree on per index: the body's SHA-256, which the reader computes itself
# (spark/parse.py), not the stored CRC-32. CRC-32 is linear: a body rewritten on one replica
# with four bytes chosen to keep its CRC would agree by CRC (docs/audit.md). The stored CRCs
# still check each copy for rot (`malformed_entry`).
VERSION_FIELDS = ("term", "size", "body_digest")


def committed(entries: DataFrame, replicas: DataFrame) -> DataFrame:
    """Sound entries at indexes up to their group's commit index."""
    commits = replicas.select("group", "group_commit").distinct()
    return (
        checks.good(entries)
        .join(F.broadcast(commits), "group")
        .where(F.col("index") <= F.col("group_commit"))
    )


def _version(prefix: str = "") -> Column:
    term, size, digest = (F.col(prefix + f) for f in VERSION_FIELDS)
    return F.format_string(
        "term %d size %d body sha256 %s", term, size, F.lower(F.substring(F.hex(digest), 1, 16))
    )


BUCKET_BITS = 12  # indexes are compared per bucket of 2^12 first; only differing buckets in detail


def _bucket(bits: int) -> Column:
    return F.shiftright(F.col("index"), bits).alias("bucket")


def bucket_summary(
    entries: DataFrame, replicas: DataFrame, bucket_bits: int = BUCKET_BITS
) -> DataFrame:
    """Per (group, bucket of 2^bucket_bits indexes, replica): how many sound committed entries
    the replica holds there (`n`) and the SHA-256 of their (index, term, size, body_digest)
    in index order (`digest`, hex). A cryptographic digest of the ordered list, not an XOR of
    per-row hashes: an XOR sum is linear, and edits on a few hundred entries can be chosen by
    Gaussian elimination to leave it unchanged. Both group checks start from it and take it as
    `summary` when the caller has it already (job.py collects it once), since Spark would
    otherwise scan the entries for it per use."""
    fields = F.struct("index", *VERSION_FIELDS)
    return (
        committed(entries, replicas)
        .groupBy("group", _bucket(bucket_bits), "replica")
        .agg(
            F.count("*").alias("n"),
            F.sha2(F.to_json(F.array_sort(F.collect_list(fields))), 256).alias("digest"),
        )
    )


def divergent_entries(
    entries: DataFrame,
    replicas: DataFrame,
    summary: DataFrame | None = None,
    bucket_bits: int = BUCKET_BITS,
) -> DataFrame:
    """Per replica, the first committed index where it holds another entry than the majority
    of the replicas holding that index (or where no version has a majority).

    Buckets whose holders all hold the same number of entries with the same digest agree
    index by index (unless SHA-256 collides); only the other buckets are compared index by
    index."""
    summary = _summary(entries, replicas, summary, bucket_bits)
    held = F.struct("n", "digest")
    suspect = (
        summary.groupBy("group", "bucket")
        .agg(F.min(held).alias("lo"), F.max(held).alias("hi"))
        .where(F.col("lo") != F.col("hi"))
        .select("group", "bucket")
    )
    c = (
        committed(entries, replicas)
        .withColumn("bucket", _bucket(bucket_bits))
        .join(F.broadcast(suspect), ["group", "bucket"])  # healthy logs: nothing joins
        .select("group", "replica", "index", "file", "position", *VERSION_FIELDS)
    )
    version = F.struct(*VERSION_FIELDS)
    per_index = c.groupBy("group", "index").agg(
        F.min(version).alias("lo"), F.max(version).alias("hi")
    )
    suspect_index = per_index.where(F.col("lo") != F.col("hi")).select("group", "index")
    rows = c.join(suspect_index, ["group", "index"])
    versions = rows.groupBy("group", "index", *VERSION_FIELDS).agg(
        F.count("*").alias("holders"), F.array_sort(F.collect_list("replica")).alias("names")
    )
    by_index = Window.partitionBy("group", "index")
    top = versions.withColumn("top", F.max("holders").over(by_index)).where(
        F.col("holders") == F.col("top")
    )
    majority = (
        top.withColumn("ties", F.count("*").over(by_index))
        .where(F.col("ties") == 1)
        .select("group", "index", *(F.col(f).alias("m_" + f) for f in VERSION_FIELDS), "names")
    )
    differing = rows.join(majority, ["group", "index"], "left").where(
        F.col("names").isNull() | reduce_or([F.col(f) != F.col("m_" + f) for f in VERSION_FIELDS])
    )
    first = differing.groupBy("group", "replica").agg(
        F.min(
            F.struct(
                "index",
                "file",
                "position",
                *VERSION_FIELDS,
                "names",
                *("m_" + f for f in VERSION_FIELDS),
            )
        ).alias("at"),
        F.count("*").alias("n"),
        F.max("index").alias("last"),
    )
    against = F.when(
        F.col("at.names").isNull(), F.lit("no version is held by a majority of the holders")
    ).otherwise(
        F.format_string("%s hold %s", F.array_join(F.col("at.names"), ", "), _version("at.m_"))
    )
    detail = F.format_string(
        "first divergent committed index: %s, but %s (%d divergent indexes, last %d)",
        _version("at."),
        against,
        F.col("n"),
        F.col("last"),
    )
    return finding(
        first,
        "divergent_entry",
        ERROR,
        detail,
        index=F.col("at.index"),
        file=F.col("at.file"),
        position=F.col("at.position"),
    )


def reduce_or(columns: list[Column]) -> Column:
    out = columns[0]
    for column in columns[1:]:
        out = out | column
    return out


def _summary(
    entries: DataFrame | None, replicas: DataFrame, summary: DataFrame | None, bucket_bits: int
) -> DataFrame:
    """`summary` when given, else bucket_summary of the entries (which are then required)."""
    if summary is not None:
        return summary
    if entries is None:
        raise ValueError("a check without entry rows needs their bucket summary")
    return bucket_summary(entries, replicas, bucket_bits)


def _no_holders() -> Column:
    return F.array().cast("array<string>")


def _nowhere() -> Column:
    """A null where a holder's (replica, file, position) would be."""
    return F.lit(None).cast("struct<replica: string, file: string, position: bigint>")


def under_replicated(
    entries: DataFrame | None,
    replicas: DataFrame,
    summary: DataFrame | None = None,
    bucket_bits: int = BUCKET_BITS,
) -> DataFrame:
    """Committed indexes held by fewer replicas than a quorum of the group. An index below a
    replica's first retained index counts as held by it (retention only drops applied
    entries).

    Counted per bucket first (bucket_summary): a bucket where a quorum of replicas hold every
    committed index (by count, or by retention) is fine; only the other buckets are counted
    index by index, and indexes nobody holds are listed only there.

    `entries` None means no entry rows, as an empty frame would (the job's screen counted every
    entry into `summary`, which is then required): every index of a short bucket is held by
    nobody. Said in Python, the rows' branches are left out of the query instead of pruned by
    the optimizer, which saves seconds of building and planning in a fresh JVM."""
    groups = replicas.groupBy("group").agg(
        F.first("quorum").alias("quorum"),
        F.first("group_size").alias("group_size"),
        F.first("group_commit").alias("group_commit"),
        F.min("start_index").alias("lo"),
    )
    width = 1 << bucket_bits
    buckets = groups.where(F.col("group_commit") >= F.col("lo")).select(
        "group",
        "quorum",
        F.explode(
            F.sequence(F.shiftright("lo", bucket_bits), F.shiftright("group_commit", bucket_bits))
        ).alias("bucket"),
        "lo",
        "group_commit",
    )
    buckets = buckets.select(
        "group",
        "quorum",
        "bucket",
        F.greatest(F.col("lo"), F.col("bucket") * width).alias("b_lo"),
        F.least(F.col("group_commit"), F.col("bucket") * width + (width - 1)).alias("b_hi"),
    )
    summary = _summary(entries, replicas, summary, bucket_bits)
    counts = summary.select("group", "bucket", "replica", "n")
    grid = buckets.join(replicas.select("group", "replica", "start_index"), "group").join(
        counts, ["group", "bucket", "replica"], "left"
    )
    retained_away = F.greatest(
        F.lit(0), F.least(F.col("start_index"), F.col("b_hi") + 1) - F.col("b_lo")
    )
    full = F.coalesce(F.col("n"), F.lit(0)) + retained_away >= F.col("b_hi") - F.col("b_lo") + 1
    suspect = (
        grid.groupBy("group", "quorum", "bucket", "b_lo", "b_hi")
        .agg(F.sum(full.cast("long")).alias("full"))
        .where(F.col("full") < F.col("quorum"))
        .select("group", "bucket", "b_lo", "b_hi")
    )
    every = suspect.select("group", F.explode(F.sequence("b_lo", "b_hi")).alias("index"))
    sound = None
    if entries is None:
        short = every.select("group", "index", F.lit(0).cast("long").alias("held"))
    else:
        sound = (
            committed(entries, replicas)
            .withColumn("bucket", _bucket(bucket_bits))
            .join(F.broadcast(suspect.select("group", "bucket")), ["group", "bucket"])
            .drop("bucket")
        )  # healthy logs: nothing joins
        held = sound.groupBy("group", "index").agg(F.count("*").alias("held"))
        nobody = every.join(held, ["group", "index"], "left_anti").select(
            "group", "index", F.lit(0).cast("long").alias("held")
        )
        short = held.unionByName(nobody)
    short = short.join(groups, "group").where(F.col("held") < F.col("quorum"))
    starts = replicas.select("group", "start_index")
    away = (
        short.select("group", "index")
        .join(starts, "group")
        .where(F.col("start_index") > F.col("index"))
        .groupBy("group", "index")
        .agg(F.count("*").alias("away"))
    )
    short = short.join(away, ["group", "index"], "left").where(
        F.col("held") + F.coalesce(F.col("away"), F.lit(0)) < F.col("quorum")
    )
    if sound is None:
        short = short.select("*", _no_holders().alias("names"), _nowhere().alias("at"))
    else:  # who holds the few short indexes, and where: only now, for those rows alone
        holders = (
            sound.join(short.select("group", "index"), ["group", "index"])
            .groupBy("group", "index")
            .agg(
                F.array_sort(F.collect_list("replica")).alias("names"),
                F.min(F.struct("replica", "file", "position")).alias("at"),
            )
        )
        short = short.join(holders, ["group", "index"], "left").withColumn(
            "names", F.coalesce(F.col("names"), _no_holders())
        )
    names = F.when(F.size("names") > 0, F.array_join("names", ", ")).otherwise(F.lit("none"))
    detail = F.format_string(
        "committed (group commit %d) but held by %d of %d replicas (%s); a quorum is %d",
        F.col("group_commit"),
        F.col("held"),
        F.col("group_size"),
        names,
        F.col("quorum"),
    )
    return finding(
        short,
        "under_replicated",
        ERROR,
        detail,
        replica=F.col("at.replica"),
        file=F.col("at.file"),
        position=F.col("at.position"),
    )


# --- chaos history ---------------------------------------------------------------------------
HELD_SCHEMA = (
    "group string, index long, replica string, file string, position long, size long, "
    "body_digest binary"
)


def missing_appends(
    acked: DataFrame,
    entries: DataFrame | None,
    replicas: DataFrame,
    heads: Callable[[DataFrame], DataFrame] | None = None,
) -> DataFrame:
    """Acknowledged appends (job.ACKED_SCHEMA: group, index, value (escaped head), value_bytes,
    digest, process, time_ns) whose value's SHA-256 is not the digest of any sound committed
    body at the acknowledged index. The screen (spark/screen.py) has compared the appends in
    plain chunks already; `acked` holds the others, and `entries` the detailed rows (None: no
    rows). A finding names the replicas holding the index, the first one's file and position
    and, through `heads` (read.body_heads bound to the session), the first bytes there."""
    groups = replicas.groupBy("group").agg(F.first("group_commit").alias("group_commit"))
    if entries is None:
        held = acked.sparkSession.createDataFrame([], HELD_SCHEMA)
    else:
        held = committed(entries, replicas).select(
            "group", "index", "replica", "file", "position", "size", "body_digest"
        )
    compared = (
        acked.join(held, ["group", "index"], "left")
        .groupBy("group", "index", "value", "value_bytes", "digest", "process", "time_ns")
        .agg(
            F.max(F.coalesce(F.col("body_digest") == F.col("digest"), F.lit(False))).alias("found"),
            F.count("body_digest").alias("copies"),
            F.array_sort(F.collect_list("replica")).alias("holders"),
            F.min(F.struct("replica", "file", "position", "size")).alias("at"),
        )
        .join(groups, "group", "left")
    )
    missing = compared.where(~F.col("found") & F.col("index").isNotNull())
    there = F.lit("")
    if heads is not None:
        wanted = missing.where(F.col("copies") > 0).select(
            "group", "index", "at.replica", "at.file", "at.position", "at.size"
        )
        shown = heads(wanted).select("group", "index", F.col("head"))
        missing = missing.join(shown, ["group", "index"], "left")
        there = F.coalesce(F.concat(F.lit(" "), F.col("head")), F.lit(""))
    why = (
        F.when(F.col("group_commit").isNull(), F.lit("no replica of this group was audited"))
        .when(
            F.col("index") > F.col("group_commit"),
            F.format_string("past the group commit index %d", F.col("group_commit")),
        )
        .when(F.col("copies") == 0, F.lit("no replica holds a sound committed entry there"))
        .otherwise(
            F.format_string(
                "%s hold another body there:%s (%d bytes) in %s at position %d",
                F.array_join("holders", ", "),
                there,
                F.col("at.size") - F.lit(formats.ENTRY_HEADER_BYTES),
                F.col("at.file"),
                F.col("at.position"),
            )
        )
    )
    detail = F.format_string(
        "acknowledged append %s (%d bytes; process %s, time_ns %d) at index %d: %s",
        F.col("value"),
        F.col("value_bytes"),
        F.col("process"),
        F.col("time_ns"),
        F.col("index"),
        why,
    )
    unchecked = acked.where(F.col("index").isNull())
    return finding(
        missing,
        "missing_append",
        ERROR,
        detail,
        replica=F.col("at.replica"),
        file=F.col("at.file"),
        position=F.col("at.position"),
    ).unionByName(
        finding(
            unchecked,
            "unchecked_append",
            NOTE,
            F.format_string(
                "acknowledged append from process %s records no index", F.col("process")
            ),
        )
    )
