"""Broker rules on a handful of literal rows (the cases a short real cluster does not make:
duplicates, ties, offsets out of range). Spark: run under `flock /tmp/heavy.lock`."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from spark import broker_checks, broker_history, broker_read, frames
from spark.broker_history import ACKED_SCHEMA, CONSUMED_SCHEMA
from spark.broker_job import OFFSETS_SCHEMA

G = "broker-a"


def message(index: int, value: str, queue_offset: int, topic: str = "T") -> dict[str, Any]:
    return {"group": G, "replica": "n0", "index": index, "file": "dledger/data/0",
            "position": 100 * index, "body_kind": "message", "topic": topic, "queue_id": 0,
            "queue_offset": queue_offset, "physical_offset": 100 * index + 44,
            "body_digest": broker_history.digest(value)}  # fmt: skip


def messages(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    table = pa.Table.from_pylist(rows, schema=broker_read.MESSAGE_SCHEMA)
    return spark.createDataFrame(table)


def acked(value: str, queue_offset: int) -> tuple[Any, ...]:
    return (G, "T", 0, queue_offset, value, broker_history.digest(value), "p0", 1)


def kinds(found: DataFrame) -> list[tuple[str, str, int | None]]:
    return sorted((r["kind"], r["severity"], r["index"]) for r in found.collect())


def test_a_retried_send_stored_twice_is_counted_not_failed(spark: SparkSession) -> None:
    log = messages(spark, [message(1, "a", 0), message(2, "b", 1), message(3, "b", 2)])
    sends = frames.local(spark, [acked("a", 0), acked("b", 1)], ACKED_SCHEMA)
    consumed = frames.local(spark, [], CONSUMED_SCHEMA)
    commits = frames.local(spark, [(G, 3)], "group string, group_commit long")
    found = broker_checks.history_findings(sends, consumed, log, commits)
    assert kinds(found) == [("duplicate_message", "note", 2)]
    (row,) = found.collect()
    assert "stored 2 times" in row["detail"] and "index 3 (T queue 0, offset 2)" in row["detail"]


def test_an_uncommitted_copy_is_not_stored_and_a_wrong_offset_is_misplaced(
    spark: SparkSession,
) -> None:
    log = messages(spark, [message(1, "a", 0), message(2, "b", 1)])
    sends = frames.local(spark, [acked("a", 5), acked("b", 1)], ACKED_SCHEMA)
    consumed = frames.local(
        spark, [(G, "T", 0, 0, "a", broker_history.digest("a"), "cg")], CONSUMED_SCHEMA
    )
    commits = frames.local(spark, [(G, 1)], "group string, group_commit long")  # b is past it
    found = broker_checks.history_findings(sends, consumed, log, commits)
    assert kinds(found) == [("ack_misplaced", "error", 1), ("lost_message", "error", None)]


def test_a_tie_between_two_replicas_names_both(spark: SparkSession) -> None:
    rows = [
        {"group": G, "replica": r, "topic": "T", "queue_id": 0, "file": "consumequeue/T/0/0",
         "file_position": 0, "queue_offset": 0, "unit_physical_offset": phy, "unit_size": 10,
         "unit_tag_hash": 0}
        for r, phy in (("n0", 44), ("n1", 144))
    ]  # fmt: skip
    units = spark.createDataFrame(pa.Table.from_pylist(rows, schema=broker_read.UNIT_SCHEMA))
    found = broker_checks.divergent_units(units)
    assert sorted(r["replica"] for r in found.collect()) == ["n0", "n1"]
    rows.append({**rows[0], "replica": "n2"})  # now n0 and n2 agree: only n1 is named
    units = spark.createDataFrame(pa.Table.from_pylist(rows, schema=broker_read.UNIT_SCHEMA))
    assert [r["replica"] for r in broker_checks.divergent_units(units).collect()] == ["n1"]


def test_consumer_offsets_within_their_queue(spark: SparkSession) -> None:
    offsets = frames.local(
        spark,
        [(G, "n0", "cg", "T", 0, 5), (G, "n0", "cg", "T", 1, 6), (G, "n0", "cg", "U", 0, 0),
         (G, "n0", "cg", "U", 1, 1)],
        OFFSETS_SCHEMA,
    )  # fmt: skip
    lengths = frames.local(
        spark, [(G, "n0", "T", 0, 5), (G, "n0", "T", 1, 5)], broker_checks.QUEUE_LENGTH_SCHEMA
    )
    found = broker_checks.consumer_offsets(offsets, lengths).collect()
    details = sorted(r["detail"] for r in found)
    assert details == [
        "consumer group cg on T queue 1: committed offset 6, the queue holds 0..5",
        "consumer group cg on U queue 1: committed offset 1, the queue holds 0..0",
    ]
