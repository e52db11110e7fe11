"""The broker part of the audit: for the replicas that are broker stores, read the log's
messages, the ConsumeQueues and the IndexFiles (spark/broker_read.py), run the broker rules
(spark/broker_checks.py), and collect the small tables the report shows.

The driver reads only listings, the broker-state checkpoints and the 40-byte IndexFile
headers; a file of the wrong size is a finding here and is not read further.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark import broker_checks, broker_read, checks, frames
from spark import broker_formats as bf
from spark.broker_history import ACKED_SCHEMA, CONSUMED_SCHEMA, BrokerHistory
from spark.broker_layout import BrokerStore
from spark.progress import Progress

FINDINGS_COLLECT_MAX = 10_000  # a rule's findings collected at once; more stay in Spark
RULES_AT_ONCE = 4  # rules whose Spark jobs run at the same time (each is a few small stages)
OFFSETS_SCHEMA = (
    "group string, replica string, consumer_group string, topic string, queue_id long, offset long"
)


@attrs.frozen
class BrokerInputs:
    """What the CLI found for the broker part: the broker stores, the broker history (when
    --history is a broker chaos run's), and the IndexFile geometry."""

    stores: list[BrokerStore]
    history: BrokerHistory | None
    geometry: broker_read.IndexGeometry | None  # None: no file told it (broker_read.infer_geometry)


@attrs.frozen
class BrokerPart:
    """What the broker part hands the audit: its findings (checks.FINDING_COLUMNS) and the
    tables of the report (`report.json` key `broker`), collected once the findings are."""

    findings: DataFrame
    cached: list[DataFrame]  # messages, units, index: unpersisted by `tables`
    counted: dict[tuple[str, str], dict[str, int]]  # (group, replica) -> rows of each kind


def _driver_findings(
    stores: Sequence[BrokerStore], geometry: broker_read.IndexGeometry | None
) -> tuple[list[dict[str, Any]], list[tuple[Any, ...]]]:
    """Findings about whole files (sizes, IndexFile headers) and the header rows of the
    IndexFiles that are read. Without a geometry no IndexFile can be read: each is
    unreadable (exit 2)."""
    found: list[dict[str, Any]] = []
    headers: list[tuple[Any, ...]] = []

    def add(store: BrokerStore, kind: str, severity: str, file: str | None, detail: str) -> None:
        found.append(
            {
                "kind": kind,
                "severity": severity,
                "group": store.replica.group,
                "replica": store.replica.name,
                "index": None,
                "file": file,
                "position": None,
                "detail": detail,
            }
        )

    by_group: dict[str, int] = {}
    for s in stores:
        for qf in s.queue_files:
            by_group[s.replica.group] = max(by_group.get(s.replica.group, 0), qf.bytes)
    for s in stores:
        if not s.has_state and (s.queue_files or s.index_files):
            add(
                s,
                "no_broker_state",
                checks.NOTE,
                bf.BROKER_STATE_FILE,
                "derived files without a broker-state checkpoint: nothing is known to be "
                "applied, so only what the files hold is checked",
            )
        full = by_group.get(s.replica.group, 0)
        for qf in s.queue_files:
            if qf.bytes != full or qf.bytes % bf.CQ_UNIT_BYTES:
                add(
                    s,
                    "cq_file_size",
                    checks.ERROR,
                    qf.name,
                    f"{qf.bytes} bytes; the group's ConsumeQueue files are {full} bytes "
                    "(created at full size): the file was cut",
                )
        for f in s.index_files:
            if geometry is None:
                add(
                    s,
                    "unreadable",
                    checks.UNREADABLE,
                    f.name,
                    f"{s.path(f.name)}: its slot and item counts could not be inferred; pass "
                    "the brokers' --index-slots and --index-items",
                )
                continue
            if f.bytes != geometry.file_bytes:
                add(
                    s,
                    "index_file_size",
                    checks.ERROR,
                    f.name,
                    f"{f.bytes} bytes, not the {geometry.file_bytes} of {geometry.slots} slots "
                    f"and {geometry.items} items (--index-slots, --index-items)",
                )
                continue
            try:
                h = broker_read.read_index_header(s, f)
            except OSError as err:
                add(s, "unreadable", checks.UNREADABLE, f.name, f"{s.path(f.name)}: {err}")
                continue
            defect = _header_defect(h, f.first, geometry)
            if defect is not None:
                add(s, "index_header", checks.ERROR, f.name, defect)
            headers.append((s.replica.group, s.replica.name, f.name, h.index_count))
    return found, headers


def _header_defect(h: bf.IndexHeader, name: int, geometry: broker_read.IndexGeometry) -> str | None:
    if not 1 <= h.index_count <= geometry.items:
        return f"index count {h.index_count} outside 1..{geometry.items}"
    if not 0 <= h.hash_slot_count <= min(geometry.slots, h.index_count - 1):
        return f"hash slot count {h.hash_slot_count} with {h.index_count - 1} items"
    if h.index_count > 1 and h.begin_phy_offset != name:
        return f"begin physical offset {h.begin_phy_offset}, but the file is named {name}"
    if h.index_count > 1 and h.end_phy_offset < h.begin_phy_offset:
        return f"end physical offset {h.end_phy_offset} below the begin {h.begin_phy_offset}"
    return None


def run(
    spark: SparkSession,
    stores: Sequence[BrokerStore],
    history: BrokerHistory | None,
    geometry: broker_read.IndexGeometry | None,
    group_commits: dict[str, int],
    progress: Progress,
) -> BrokerPart:
    """The broker findings of `stores`: each rule run and collected here (unless it finds
    more than FINDINGS_COLLECT_MAX), as a DataFrame to join the log's findings."""
    progress.step(f"broker stores: {len(stores)} replicas; reading messages, queues, index")
    found, headers = _driver_findings(stores, geometry)
    fewest: dict[tuple[str, str], int] = {}
    for group, _replica, name, count in headers:
        fewest[(group, name)] = min(fewest.get((group, name), count), count)
    hashed = {(g, r, name): fewest[(g, name)] for g, r, name, _ in headers}
    # Cached on disk, not in the JVM's heap: the heap is a fixed size (spark/session.py) and
    # these frames grow with the stores. A 30-minute broker soak's stores (7.6M entries over six
    # replicas) cached MEMORY_AND_DISK ran a 2 GiB driver out of heap (java.lang.OutOfMemoryError
    # in the memory store) instead of spilling; from disk (the page cache, in practice) every
    # rule still reads them without reading the stores again.
    messages = broker_read.messages(spark, stores).persist(StorageLevel.DISK_ONLY)
    units = broker_read.queue_units(spark, stores).persist(StorageLevel.DISK_ONLY)
    index = (
        broker_read.index_rows(spark, stores, geometry, hashed)
        if geometry is not None
        else frames.empty(spark, broker_read.INDEX_SCHEMA)
    ).persist(StorageLevel.DISK_ONLY)
    # a replica with an IndexFile that could not be read whole is not asked for every key
    unread = {
        (f["group"], f["replica"])
        for f in found
        if f["file"] is not None and f["file"].startswith(bf.INDEX_DIR + "/")
    }
    store_rows = [
        (
            s.replica.group,
            s.replica.name,
            s.applied_index,
            s.index_end,
            s.replica.start_position,
            _cq_file_bytes(stores, s.replica.group),
            s.key not in unread,
            s.has_state,
        )
        for s in stores
    ]
    stores_df = frames.local(spark, store_rows, broker_checks.STORE_SCHEMA)
    lengths = frames.local(
        spark,
        [(*s.key, t, q, n) for s in stores for (t, q), n in sorted(s.queue_lengths.items())],
        broker_checks.QUEUE_LENGTH_SCHEMA,
    )
    offsets = frames.local(
        spark, [(*s.key, *o) for s in stores for o in s.consumer_offsets], OFFSETS_SCHEMA
    )
    headers_df = frames.local(spark, headers, broker_checks.INDEX_HEADER_SCHEMA)
    parts = [
        frames.local(spark, found, checks.FINDING_SCHEMA),
        *broker_checks.all_broker_findings(
            messages, units, index, stores_df, lengths, headers_df, offsets
        ),
    ]
    if history is not None and not history.is_empty():
        commits = frames.local(
            spark, sorted(group_commits.items()), "group string, group_commit long"
        )
        acked = frames.local(spark, history.acked, ACKED_SCHEMA)
        consumed = frames.local(spark, history.consumed, CONSUMED_SCHEMA)
        parts.append(broker_checks.history_findings(acked, consumed, messages, commits))
    # read each once, now: every check scans them again, from the cache
    counted: dict[tuple[str, str], dict[str, int]] = {s.key: {} for s in stores}
    for name, frame in (
        ("messages", messages.where(F.col("body_kind") == "message")),
        ("units", units.where(F.col("io_error").isNull())),
        ("index_items", index.where(F.col("what") == "item")),
    ):
        for row in frame.groupBy("group", "replica").count().collect():
            counted[(row["group"], row["replica"])][name] = int(row["count"])
    progress.step(
        f"broker stores read: {sum(c.get('messages', 0) for c in counted.values())} messages"
    )
    findings = _collected(spark, parts)
    progress.step("broker rules checked")
    return BrokerPart(findings, [messages, units, index], counted)


def _collected(spark: SparkSession, parts: Sequence[DataFrame]) -> DataFrame:
    """The findings of every rule, each rule's collected on its own when few (the usual
    case), so they join the log's findings as one small relation; a rule with more than
    FINDINGS_COLLECT_MAX stays a lazy DataFrame in the union."""
    rows: list[dict[str, Any]] = []
    many: list[DataFrame] = []
    with ThreadPoolExecutor(RULES_AT_ONCE) as pool:  # small jobs: Spark runs them side by side
        collected = list(pool.map(lambda p: p.limit(FINDINGS_COLLECT_MAX + 1).collect(), parts))
    for part, got in zip(parts, collected, strict=True):
        if len(got) > FINDINGS_COLLECT_MAX:
            many.append(part)
        else:
            rows.extend(row.asDict() for row in got)
    return checks.union([frames.local(spark, rows, checks.FINDING_SCHEMA), *many])


def _cq_file_bytes(stores: Sequence[BrokerStore], group: str) -> int:
    """The size of a full ConsumeQueue file in `group` (every file is created at full size)."""
    return max(
        (q.bytes for s in stores if s.replica.group == group for q in s.queue_files), default=0
    )


def tables(part: BrokerPart, inputs: BrokerInputs) -> dict[str, Any]:
    """Counts per replica, the last consumer offsets per group, and the history's counts;
    releases the cached frames."""
    stores, history = inputs.stores, inputs.history
    counted = part.counted
    for frame in part.cached:
        frame.unpersist()
    replicas = []
    for s in stores:
        got = counted[s.key]
        replicas.append(
            {
                "group": s.replica.group,
                "replica": s.replica.name,
                "applied_index": s.applied_index if s.has_state else None,
                "messages": got.get("messages", 0),
                "queues": len({(q.topic, q.queue_id) for q in s.queue_files}),
                "cq_files": len(s.queue_files),
                "cq_units": got.get("units", 0),
                "index_files": len(s.index_files),
                "index_items": got.get("index_items", 0),
                "index_end": s.index_end,
            }
        )
    offsets: dict[str, list[list[Any]]] = {}
    newest: dict[str, BrokerStore] = {}
    for s in stores:
        if s.replica.group not in newest or s.applied_index > newest[s.replica.group].applied_index:
            newest[s.replica.group] = s
    for group, s in sorted(newest.items()):
        offsets[group] = [list(o) for o in sorted(s.consumer_offsets)]
    out: dict[str, Any] = {"replicas": replicas, "consumer_offsets": offsets}
    if history is not None:
        committed: dict[str, list[list[Any]]] = {}
        for (group, cg, topic, queue), offset in sorted(history.committed.items()):
            committed.setdefault(group, []).append([cg, topic, queue, offset])
        out["history"] = {
            "acknowledged_sends": len(history.acked),
            "consumed": len(history.consumed),
            "last_committed_offsets": committed,
        }
    return out
