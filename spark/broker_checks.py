"""The broker-level rules: ConsumeQueues and IndexFiles against the log they are derived from,
and against the other replicas. Each is a function from DataFrames to findings
(checks.FINDING_COLUMNS), like spark/checks.py.

Inputs (spark/broker_read.py): `messages` (MESSAGE_SCHEMA), `units` (UNIT_SCHEMA), `index`
(INDEX_SCHEMA), and `stores` (STORE_SCHEMA below: one row per broker replica with what its
broker-state checkpoint says and where its log starts). A finding's `file` is relative to the
replica's store root (`consumequeue/T/0/000...0`, `index/000...`, `dledger/data/000...`) and
`position` a byte in that file.

What "must" means: the broker-state checkpoint records what the derived files hold at least
(`applied_index`, each queue's length, `index_end`); files may hold more (written after it).
So every message at or below the checkpoint's applied index must have its ConsumeQueue unit,
and its keys must be in the IndexFiles when its physical offset is at or below `index_end`;
whatever the files hold, checkpointed or not, must be right. Messages below the log's start
(deleted by retention) cannot be checked: units and items that point there are passed over.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from spark import checks
from spark.broker_formats import SCHEDULE_TOPICS
from spark.checks import ERROR, NOTE, UNREADABLE, finding

STORE_SCHEMA = (
    "group string, replica string, applied_index long, index_end long, start_position long, "
    "cq_file_bytes long, index_read boolean, has_state boolean"
)
QUEUE_LENGTH_SCHEMA = "group string, replica string, topic string, queue_id long, length long"
INDEX_HEADER_SCHEMA = "group string, replica string, file string, index_count long"
HEADER_BYTES = 44  # a record's physical offset is its entry's position plus the entry header


def _messages(messages: DataFrame) -> DataFrame:
    return messages.where(F.col("body_kind") == "message")


def message_defects(messages: DataFrame) -> DataFrame:
    """Bodies that claim to be messages and do not parse (error); entries that are neither
    message nor metadata (note: every replica skips them); a record whose physical offset is
    not its entry's position + 44 (error)."""
    bad = finding(
        messages.where(F.col("body_kind") == "bad"),
        "message_unreadable",
        ERROR,
        F.concat(F.lit("the entry's body is not a stored message: "), F.col("detail")),
    )
    other = finding(
        messages.where(F.col("body_kind") == "other"),
        "unknown_entry",
        NOTE,
        F.lit("a DATA entry that is neither a message nor a metadata entry"),
    )
    misplaced = _messages(messages).where(
        F.col("physical_offset") != F.col("position") + HEADER_BYTES
    )
    return checks.union(
        [
            bad,
            other,
            finding(
                misplaced,
                "message_misplaced",
                ERROR,
                F.format_string(
                    "the record says physical offset %d, its entry starts at %d (+44 = %d)",
                    F.col("physical_offset"),
                    F.col("position"),
                    F.col("position") + HEADER_BYTES,
                ),
            ),
        ]
    )


def queue_offset_order(messages: DataFrame) -> DataFrame:
    """In each replica's log, the messages of one queue carry queue offsets that rise by one
    from message to message (index order): a repeat is `duplicate_queue_offset`, a skip or a
    fall `queue_offset_gap`."""
    by_queue = Window.partitionBy("group", "replica", "topic", "queue_id").orderBy("index")
    ordered = (
        _messages(messages)
        .withColumn("prev_offset", F.lag("queue_offset").over(by_queue))
        .withColumn("prev_index", F.lag("index").over(by_queue))
    )
    dup = ordered.where(F.col("queue_offset") == F.col("prev_offset"))
    gap = ordered.where(
        F.col("prev_offset").isNotNull()
        & (F.col("queue_offset") != F.col("prev_offset") + 1)
        & (F.col("queue_offset") != F.col("prev_offset"))
    )
    where = F.format_string("%s queue %d", F.col("topic"), F.col("queue_id"))
    return checks.union(
        [
            finding(
                dup,
                "duplicate_queue_offset",
                ERROR,
                F.format_string(
                    "%s: queue offset %d at index %d and again at index %d",
                    where,
                    F.col("queue_offset"),
                    F.col("prev_index"),
                    F.col("index"),
                ),
            ),
            finding(
                gap,
                "queue_offset_gap",
                ERROR,
                F.format_string(
                    "%s: queue offset %d at index %d follows %d at index %d",
                    where,
                    F.col("queue_offset"),
                    F.col("index"),
                    F.col("prev_offset"),
                    F.col("prev_index"),
                ),
            ),
        ]
    )


def _valid_units(units: DataFrame) -> DataFrame:
    return units.where(
        F.col("io_error").isNull() & (F.col("unit_size") > 0) & (F.col("unit_physical_offset") >= 0)
    )


def unit_defects(units: DataFrame) -> DataFrame:
    """Unreadable ConsumeQueue files (exit 2); units that are not zeros and not a unit either
    (size <= 0 or a negative physical offset); queue offsets with no unit between two units
    (`cq_gap`: the queue must be contiguous)."""
    unreadable = finding(
        units.where(F.col("io_error").isNotNull()), "unreadable", UNREADABLE, F.col("io_error")
    )
    invalid = units.where(
        F.col("io_error").isNull()
        & ((F.col("unit_size") <= 0) | (F.col("unit_physical_offset") < 0))
    )
    by_queue = Window.partitionBy("group", "replica", "topic", "queue_id").orderBy("queue_offset")
    gaps = (
        _valid_units(units)
        .withColumn("prev_offset", F.lag("queue_offset").over(by_queue))
        .where(
            F.col("prev_offset").isNotNull() & (F.col("queue_offset") > F.col("prev_offset") + 1)
        )
    )
    return checks.union(
        [
            unreadable,
            finding(
                invalid,
                "cq_unit_invalid",
                ERROR,
                F.format_string(
                    "unit at queue offset %d is neither zeros nor a unit: physical offset %d, "
                    "size %d",
                    F.col("queue_offset"),
                    F.col("unit_physical_offset"),
                    F.col("unit_size"),
                ),
            ),
            finding(
                gaps,
                "cq_gap",
                ERROR,
                F.format_string(
                    "%s queue %d: no unit at queue offsets %d..%d, between two units",
                    F.col("topic"),
                    F.col("queue_id"),
                    F.col("prev_offset") + 1,
                    F.col("queue_offset") - 1,
                ),
            ),
        ]
    )


def _unit_facts(units: DataFrame, stores: DataFrame, queue_lengths: DataFrame) -> DataFrame:
    """Valid units with their replica's log start and whether the checkpoint covers them."""
    lengths = queue_lengths.select("group", "replica", "topic", "queue_id", "length")
    return (
        _valid_units(units)
        .join(
            F.broadcast(stores.select("group", "replica", "start_position")), ["group", "replica"]
        )
        .join(F.broadcast(lengths), ["group", "replica", "topic", "queue_id"], "left")
        .withColumn("checkpointed", F.col("queue_offset") < F.coalesce(F.col("length"), F.lit(0)))
        .where(F.col("unit_physical_offset") >= F.col("start_position"))
    )


def units_against_log(
    units: DataFrame, messages: DataFrame, stores: DataFrame, queue_lengths: DataFrame
) -> DataFrame:
    """Every unit points at a stored message of its replica's log: at its physical offset,
    with its size, its queue and queue offset, and the tag hash it must have (the due time in
    the schedule topics). A unit past the end of the log that the checkpoint does not cover
    is a note (a crash lost the log's unsynced tail; the broker rebuilds); any other unit
    pointing at no message is an error."""
    msgs = _messages(messages).select(
        "group",
        "replica",
        F.col("physical_offset").alias("unit_physical_offset"),
        F.col("index"),
        F.col("topic").alias("m_topic"),
        F.col("queue_id").alias("m_queue_id"),
        F.col("queue_offset").alias("m_queue_offset"),
        "store_size",
        "tag_hash",
    )
    log_end = (
        _messages(messages).groupBy("group", "replica").agg(F.max("physical_offset").alias("last"))
    )
    joined = (
        _unit_facts(units, stores, queue_lengths)
        .join(msgs, ["group", "replica", "unit_physical_offset"], "left")
        .join(F.broadcast(log_end), ["group", "replica"], "left")
    )
    nowhere = joined.where(F.col("index").isNull())
    past_log = (F.col("unit_physical_offset") > F.coalesce(F.col("last"), F.lit(-1))) & ~F.col(
        "checkpointed"
    )
    point = F.format_string(
        "%s queue %d, queue offset %d: unit points at physical offset %d (size %d)",
        F.col("topic"),
        F.col("queue_id"),
        F.col("queue_offset"),
        F.col("unit_physical_offset"),
        F.col("unit_size"),
    )
    differences = F.concat_ws(
        "; ",
        F.when(
            F.col("unit_size") != F.col("store_size"),
            F.format_string(
                "size %d, the record is %d bytes", F.col("unit_size"), F.col("store_size")
            ),
        ),
        F.when(
            (F.col("m_topic") != F.col("topic")) | (F.col("m_queue_id") != F.col("queue_id")),
            F.format_string("the record is in %s queue %d", F.col("m_topic"), F.col("m_queue_id")),
        ),
        F.when(
            F.col("m_queue_offset") != F.col("queue_offset"),
            F.format_string("the record's queue offset is %d", F.col("m_queue_offset")),
        ),
        F.when(
            F.col("unit_tag_hash") != F.col("tag_hash"),
            F.format_string(
                "tag hash %d, the record's is %d", F.col("unit_tag_hash"), F.col("tag_hash")
            ),
        ),
    )
    mismatched = joined.where(F.col("index").isNotNull()).withColumn("why", differences)
    return checks.union(
        [
            finding(
                nowhere.where(~past_log),
                "cq_unit_dangling",
                ERROR,
                F.concat(point, F.lit(", where the log holds no message")),
                file=F.col("file"),
                position=F.col("file_position"),
            ),
            finding(
                nowhere.where(past_log),
                "cq_unit_past_log",
                NOTE,
                F.concat(point, F.lit(", past the log's end and past the checkpoint")),
                file=F.col("file"),
                position=F.col("file_position"),
            ),
            finding(
                mismatched.where(F.col("why") != ""),
                "cq_unit_mismatch",
                ERROR,
                F.concat(point, F.lit(": "), F.col("why")),
                file=F.col("file"),
                position=F.col("file_position"),
            ),
        ]
    )


def messages_in_queues(
    units: DataFrame, messages: DataFrame, stores: DataFrame, queue_lengths: DataFrame
) -> DataFrame:
    """Every message at or below the replica's checkpointed applied index is in exactly one
    ConsumeQueue slot; no message (checkpointed or not) is in two. `file` names the queue file
    where its unit should be."""
    slots = (
        _unit_facts(units, stores, queue_lengths)
        .groupBy("group", "replica", F.col("unit_physical_offset").alias("physical_offset"))
        .agg(F.count("*").alias("slots"), F.collect_list("queue_offset").alias("at"))
    )
    cq_bytes = stores.select("group", "replica", "applied_index", "cq_file_bytes")
    placed = (
        _messages(messages)
        .join(slots, ["group", "replica", "physical_offset"], "left")
        .join(F.broadcast(cq_bytes), ["group", "replica"])
    )
    byte = F.col("queue_offset") * 20
    size = F.greatest(F.col("cq_file_bytes"), F.lit(20))
    file = F.format_string(
        "consumequeue/%s/%d/%020d", F.col("topic"), F.col("queue_id"), byte - byte % size
    )
    where = F.format_string(
        "message at physical offset %d (%s queue %d, queue offset %d)",
        F.col("physical_offset"),
        F.col("topic"),
        F.col("queue_id"),
        F.col("queue_offset"),
    )
    missing = placed.where(F.col("slots").isNull() & (F.col("index") <= F.col("applied_index")))
    twice = placed.where(F.col("slots") > 1)
    return checks.union(
        [
            finding(
                missing,
                "message_not_in_cq",
                ERROR,
                F.format_string(
                    "%s, applied (the checkpoint counts index %d), is in no ConsumeQueue slot",
                    where,
                    F.col("applied_index"),
                ),
                file=file,
                position=byte % size,
            ),
            finding(
                twice,
                "message_in_cq_twice",
                ERROR,
                F.format_string(
                    "%s is in %d ConsumeQueue slots: queue offsets %s",
                    where,
                    F.col("slots"),
                    F.array_join(F.array_sort("at").cast("array<string>"), ", "),
                ),
                file=file,
                position=byte % size,
            ),
        ]
    )


def _minority(rows: DataFrame, key: list[str], version: list[str]) -> DataFrame:
    """Rows whose `version` columns are not those most rows of their `key` hold: the replicas
    that disagree with the others. When two versions tie for most holders (two replicas
    holding it, say), no one is the majority and every holder is returned. `major_*` and
    `holders`: the version compared against (the smallest of a tie) and how many hold it."""
    counted = rows.groupBy(*key, *version).agg(F.count("*").alias("holders"))
    rank = Window.partitionBy(*key).orderBy(F.desc("holders"), *version)
    by_key = Window.partitionBy(*key)
    best = (
        counted.withColumn("r", F.row_number().over(rank))
        .withColumn("top", F.max("holders").over(by_key))
        .withColumn("tied", F.sum(F.when(F.col("holders") == F.col("top"), 1)).over(by_key))
        .where(F.col("r") == 1)
    )
    majority = best.select(
        *key, *[F.col(v).alias(f"major_{v}") for v in version], "holders", "tied"
    )
    differs = F.col("tied") > 1
    for v in version:
        differs = differs | ~F.col(v).eqNullSafe(F.col(f"major_{v}"))
    return rows.join(majority, key).where(differs)


def divergent_units(units: DataFrame) -> DataFrame:
    """ConsumeQueues the same on every replica: a unit is 20 bytes, all of them its physical
    offset, size and tag hash, so replicas holding unit k of a queue must hold the same three
    values. A replica that holds fewer units (it applied less) is judged by the other rules."""
    odd = _minority(
        _valid_units(units),
        ["group", "topic", "queue_id", "queue_offset"],
        ["unit_physical_offset", "unit_size", "unit_tag_hash"],
    )
    return finding(
        odd,
        "cq_divergent",
        ERROR,
        F.format_string(
            "%s queue %d, queue offset %d: this replica's unit (%d, %d, %d) differs from the "
            "(%d, %d, %d) of %d other replicas",
            F.col("topic"),
            F.col("queue_id"),
            F.col("queue_offset"),
            F.col("unit_physical_offset"),
            F.col("unit_size"),
            F.col("unit_tag_hash"),
            F.col("major_unit_physical_offset"),
            F.col("major_unit_size"),
            F.col("major_unit_tag_hash"),
            F.col("holders"),
        ),
        position=F.col("file_position"),
    )


def _items(index: DataFrame) -> DataFrame:
    return index.where(F.col("what") == "item")


def index_structure(index: DataFrame, headers: DataFrame) -> DataFrame:
    """An IndexFile's hash chains: every slot names a used item whose key hashes to it, every
    item's previous item is an earlier one of the same slot, and every item is named exactly
    once (by its slot or by the next item of its chain), so a query walking a key's chain
    from its slot reaches every item of that key."""
    unreadable = finding(
        index.where(F.col("what") == "error"), "unreadable", UNREADABLE, F.col("detail")
    )
    items = _items(index).select(
        "group",
        "replica",
        "file",
        F.col("number").alias("target"),
        F.col("slot").alias("target_slot"),
    )
    counts = headers.select("group", "replica", "file", "index_count")
    key = ["group", "replica", "file", "target"]
    slot_rows = (
        index.where(F.col("what") == "slot")
        .join(F.broadcast(counts), ["group", "replica", "file"])
        .withColumn("target", F.col("head"))
        .join(items, key, "left")
        .withColumnRenamed("target_slot", "head_slot")
    )
    bad_slot = slot_rows.where(
        (F.col("head") < 1)
        | (F.col("head") >= F.col("index_count"))
        | F.col("head_slot").isNull()
        | (F.col("head_slot") != F.col("number"))
    )
    item_rows = (
        _items(index)
        .withColumn("target", F.col("prev_index"))
        .join(items, key, "left")
        .withColumnRenamed("target_slot", "prev_slot")
    )
    bad_prev = item_rows.where(
        (F.col("prev_index") < 0)
        | (F.col("prev_index") >= F.col("number"))
        | (
            (F.col("prev_index") > 0)
            & (F.col("prev_slot").isNull() | (F.col("prev_slot") != F.col("slot")))
        )
    )
    refs = (
        index.where(F.col("what") == "slot")
        .select("group", "replica", "file", F.col("head").alias("target"))
        .unionByName(
            _items(index)
            .where(F.col("prev_index") > 0)
            .select("group", "replica", "file", F.col("prev_index").alias("target"))
        )
        .groupBy("group", "replica", "file", "target")
        .agg(F.count("*").alias("refs"))
    )
    reach = _items(index).join(
        refs.withColumnRenamed("target", "number"), ["group", "replica", "file", "number"], "left"
    )
    unreachable = reach.where(F.coalesce(F.col("refs"), F.lit(0)) != 1)
    return checks.union(
        [
            unreadable,
            finding(
                bad_slot,
                "index_slot_dangling",
                ERROR,
                F.format_string(
                    "slot %d names item %d: %s",
                    F.col("number"),
                    F.col("head"),
                    F.when(
                        (F.col("head") < 1) | (F.col("head") >= F.col("index_count")),
                        F.format_string("the file's items are 1..%d", F.col("index_count") - 1),
                    ).otherwise(F.format_string("its key hashes to slot %d", F.col("head_slot"))),
                ),
                position=F.col("file_position"),
            ),
            finding(
                bad_prev,
                "index_chain_broken",
                ERROR,
                F.format_string(
                    "item %d (slot %d) links to item %d, which is not an earlier item of its slot",
                    F.col("number"),
                    F.col("slot"),
                    F.col("prev_index"),
                ),
                position=F.col("file_position"),
            ),
            finding(
                unreachable,
                "index_item_unreachable",
                ERROR,
                F.format_string(
                    "item %d (slot %d) is named %d times by slots and chains, not once: a query "
                    "walking its key's chain %s",
                    F.col("number"),
                    F.col("slot"),
                    F.coalesce(F.col("refs"), F.lit(0)),
                    F.when(
                        F.coalesce(F.col("refs"), F.lit(0)) == 0, F.lit("never finds it")
                    ).otherwise(F.lit("meets it twice")),
                ),
                position=F.col("file_position"),
            ),
        ]
    )


def index_against_log(index: DataFrame, messages: DataFrame, stores: DataFrame) -> DataFrame:
    """Every item names a message of its replica's log that is indexed under its key hash;
    every message at or below the checkpoint's applied index and index_end is found by each of
    its keys (topic#UNIQ_KEY and topic#k for each KEYS entry) in an item of its replica."""
    keyed = (
        _messages(messages)
        .join(
            F.broadcast(
                stores.where("index_read").select("group", "replica", "applied_index", "index_end")
            ),
            ["group", "replica"],
        )
        .select(
            "group",
            "replica",
            "index",
            "position",
            "file",
            "physical_offset",
            "applied_index",
            "index_end",
            "topic",
            "uniq_key",
            F.explode("key_hashes").alias("key_hash"),
        )
        .distinct()
    )
    items = _items(index).select(
        "group",
        "replica",
        F.col("file").alias("item_file"),
        "number",
        F.col("file_position").alias("item_position"),
        F.col("phy_offset").alias("physical_offset"),
        "key_hash",
    )
    starts = stores.select("group", "replica", "start_position")
    dangling = (
        items.join(F.broadcast(starts), ["group", "replica"])
        .where(F.col("physical_offset") >= F.col("start_position"))
        .join(
            keyed.select("group", "replica", "physical_offset", "key_hash"),
            ["group", "replica", "physical_offset", "key_hash"],
            "left_anti",
        )
    )
    missing = keyed.where(
        (F.col("index") <= F.col("applied_index"))
        & (F.col("physical_offset") <= F.col("index_end"))
    ).join(
        items.select("group", "replica", "physical_offset", "key_hash"),
        ["group", "replica", "physical_offset", "key_hash"],
        "left_anti",
    )
    return checks.union(
        [
            finding(
                dangling,
                "index_item_dangling",
                ERROR,
                F.format_string(
                    "item %d: key hash %d at physical offset %d, where the log holds no message "
                    "with a key of that hash",
                    F.col("number"),
                    F.col("key_hash"),
                    F.col("physical_offset"),
                ),
                file=F.col("item_file"),
                position=F.col("item_position"),
            ),
            finding(
                missing,
                "index_key_missing",
                ERROR,
                F.format_string(
                    "message at physical offset %d (%s, UNIQ_KEY %s): no IndexFile item has its "
                    "key hash %d (indexed through physical offset %d, per the checkpoint)",
                    F.col("physical_offset"),
                    F.col("topic"),
                    F.coalesce("uniq_key", F.lit("-")),
                    F.col("key_hash"),
                    F.col("index_end"),
                ),
            ),
        ]
    )


def divergent_index_files(index: DataFrame) -> DataFrame:
    """IndexFiles the same on every replica: per file, the SHA-256 of its first items (as many
    as the replica holding fewest has), and of the whole file among replicas that hold exactly
    that many (their slots must then be equal too)."""
    digests = index.where(F.col("what") == "digest")
    items = _minority(digests, ["group", "file"], ["items_digest"])
    whole = _minority(
        digests.where(F.col("file_digest").isNotNull()), ["group", "file"], ["file_digest"]
    )
    return checks.union(
        [
            finding(
                items,
                "index_divergent",
                ERROR,
                F.format_string(
                    "items 1..%d differ from those of %d other replicas",
                    F.col("items_hashed"),
                    F.col("holders"),
                ),
            ),
            finding(
                whole.join(
                    items.select("group", "replica", "file"),
                    ["group", "replica", "file"],
                    "left_anti",
                ),
                "index_divergent",
                ERROR,
                F.format_string(
                    "header or slots differ from those of %d other replicas holding as many items",
                    F.col("holders"),
                ),
            ),
        ]
    )


def duplicate_message_ids(messages: DataFrame) -> DataFrame:
    """offsetMsgIds unique over every group: two log positions (or two groups) with the same
    store host and physical offset would answer a query by id with the wrong message."""
    ids = (
        _messages(messages)
        .select("group", "index", "offset_msg_id", "replica", "file", "position")
        .distinct()
    )
    per_id = ids.groupBy("offset_msg_id").agg(
        F.countDistinct("group", "index").alias("n"), F.min(F.struct("group", "index")).alias("a")
    )
    dups = ids.join(per_id.where(F.col("n") > 1), "offset_msg_id")
    return finding(
        dups,
        "duplicate_offset_msg_id",
        ERROR,
        F.format_string(
            "offsetMsgId %s is held by %d messages (first: %s index %d)",
            F.col("offset_msg_id"),
            F.col("n"),
            F.col("a.group"),
            F.col("a.index"),
        ),
    )


def consumer_offsets(offsets: DataFrame, queue_lengths: DataFrame) -> DataFrame:
    """Replicated consumer offsets within their queue's range: 0 <= offset <= the queue's
    length, both as the same checkpoint recorded them (offsets and lengths are taken at once).
    `offsets`: group, replica, consumer_group, topic, queue_id, offset."""
    joined = offsets.join(
        queue_lengths, ["group", "replica", "topic", "queue_id"], "left"
    ).withColumn("length", F.coalesce(F.col("length"), F.lit(0)))
    bad = joined.where((F.col("offset") < 0) | (F.col("offset") > F.col("length")))
    return finding(
        bad,
        "consumer_offset_out_of_range",
        ERROR,
        F.format_string(
            "consumer group %s on %s queue %d: committed offset %d, the queue holds 0..%d",
            F.col("consumer_group"),
            F.col("topic"),
            F.col("queue_id"),
            F.col("offset"),
            F.col("length"),
        ),
        file=F.lit("broker-state"),
    )


def all_broker_findings(
    messages: DataFrame,
    units: DataFrame,
    index: DataFrame,
    stores: DataFrame,
    queue_lengths: DataFrame,
    headers: DataFrame,
    offsets: DataFrame,
) -> list[DataFrame]:
    """Every broker rule's findings, a DataFrame per rule (broker_job collects them one by
    one: as one union query they took twice as long to plan and run)."""
    return [
        message_defects(messages),
        queue_offset_order(messages),
        unit_defects(units),
        units_against_log(units, messages, stores, queue_lengths),
        messages_in_queues(units, messages, stores, queue_lengths),
        divergent_units(units),
        index_structure(index, headers),
        index_against_log(index, messages, stores),
        divergent_index_files(index),
        duplicate_message_ids(messages),
        consumer_offsets(offsets, queue_lengths),
    ]


def _stored(messages: DataFrame, commits: DataFrame) -> DataFrame:
    """One row per committed message of each group (replicas agree on the committed log, or
    the log's checks say where they do not): `commits` holds each group's highest index any
    replica's checkpoints (the log's or the broker's) call committed or applied."""
    return (
        _messages(messages)
        .join(F.broadcast(commits), "group")
        .where(F.col("index") <= F.col("group_commit"))
        .select("group", "index", "topic", "queue_id", "queue_offset", "body_digest")
        .distinct()
    )


def history_findings(
    acked: DataFrame, consumed: DataFrame, messages: DataFrame, commits: DataFrame
) -> DataFrame:
    """With a broker chaos history: every acknowledged send is in its group's committed log
    (`lost_message` when not), at the queue and queue offset its SEND_OK named
    (`ack_misplaced` when no record of it is there: a delayed message's SEND_OK names the
    queue offset of its schedule record, in SCHEDULE_TOPIC_XXXX, beside the queue id asked
    for, and its delivery is a second record, in the topic); records in its topic beyond the first are counted (`duplicate_message`, a note: a
    retried send may be stored twice); every consumed message was stored at the queue offset
    the consumer got it from (`consumed_not_stored`)."""
    stored = _stored(messages, commits).withColumnRenamed("body_digest", "digest")
    here = F.col("s_topic") == F.col("topic")
    copies = (
        acked.join(
            stored.select(
                "group",
                "digest",
                "index",
                F.col("topic").alias("s_topic"),
                F.col("queue_id").alias("s_queue_id"),
                F.col("queue_offset").alias("s_queue_offset"),
            ),
            ["group", "digest"],
            "left",
        )
        .groupBy(*acked.columns)
        .agg(
            F.count("index").alias("records"),
            F.count(F.when(here, F.col("index"))).alias("copies"),
            F.min("index").alias("index"),
            F.max(
                (F.col("s_queue_offset") == F.col("queue_offset"))
                & (
                    (F.col("s_queue_id") == F.col("queue_id"))
                    | F.col("s_topic").isin(*SCHEDULE_TOPICS)
                )
            ).alias("in_place"),
            F.array_join(
                F.array_sort(
                    F.collect_list(
                        F.format_string(
                            "index %d (%s queue %d, offset %d)",
                            "index",
                            "s_topic",
                            "s_queue_id",
                            "s_queue_offset",
                        )
                    )
                ),
                "; ",
            ).alias("where"),
        )
    )
    said = F.format_string(
        "acknowledged send of %s (process %s, time_ns %d) to %s: SEND_OK said queue %d, queue "
        "offset %d",
        F.col("value"),
        F.col("process"),
        F.col("time_ns"),
        F.col("topic"),
        F.col("queue_id"),
        F.col("queue_offset"),
    )
    not_stored = consumed.distinct().join(
        stored.select("group", "topic", "queue_id", "queue_offset", "digest"),
        ["group", "topic", "queue_id", "queue_offset", "digest"],
        "left_anti",
    )
    return checks.union(
        [
            finding(
                copies.where(F.col("records") == 0),
                "lost_message",
                ERROR,
                F.concat(said, F.lit("; no committed message of the group holds it")),
            ),
            finding(
                copies.where((F.col("records") > 0) & ~F.col("in_place")),
                "ack_misplaced",
                ERROR,
                F.concat(said, F.lit("; the log holds it at "), F.col("where")),
            ),
            finding(
                copies.where(F.col("copies") > 1),
                "duplicate_message",
                NOTE,
                F.concat(
                    said, F.format_string("; stored %d times: ", F.col("copies")), F.col("where")
                ),
            ),
            finding(
                not_stored,
                "consumed_not_stored",
                ERROR,
                F.format_string(
                    "consumer group %s got %s from %s queue %d, queue offset %d; the committed "
                    "log holds no such message there",
                    F.col("consumer_group"),
                    F.col("value"),
                    F.col("topic"),
                    F.col("queue_id"),
                    F.col("queue_offset"),
                ),
            ),
        ]
    )
