"""Each audit rule on a handful of literal rows, asserting its exact findings."""

from __future__ import annotations

import hashlib
from typing import Any

import attrs
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark import agreement, checks, formats, history, job, screen
from tests.spark.rows import (
    SEGMENT_BYTES,
    digest_of,
    entries_frame,
    healthy_log,
    replicas_frame,
)

pytestmark = pytest.mark.spark

TERMS = [1, 1, 1, 2, 2, 2, 2, 3, 3, 3]
COMMITS = {("g", "n0"): 10, ("g", "n1"): 10, ("g", "n2"): 10}


def group_rows(**overrides: Any) -> list[dict[str, Any]]:
    return [row for r in ("n0", "n1", "n2") for row in healthy_log("g", r, TERMS, **overrides)]


def row(rows: list[dict[str, Any]], replica: str, index: int) -> dict[str, Any]:
    (found,) = [r for r in rows if r["replica"] == replica and r["index"] == index]
    return found


def assert_findings(found: DataFrame, *expected: tuple[Any, ...]) -> None:
    """Exact rows, every column. (pyspark.testing.assertDataFrameEqual would do, but it imports
    pyspark.pandas, which fails to import under pandas 3.)"""
    assert found.columns == list(checks.FINDING_COLUMNS)
    assert sorted(tuple(r) for r in found.collect()) == sorted(expected)


def test_a_healthy_group_has_no_findings(spark: SparkSession) -> None:
    entries = entries_frame(spark, group_rows())
    found = job.all_findings(entries, replicas_frame(spark, COMMITS), None, None)
    assert found.collect() == []


def test_healthy_rows_cross_segments_with_blank_records() -> None:
    rows = healthy_log("g", "n0", TERMS)  # 1000-byte entries, 4096-byte segments
    assert [r["position"] for r in rows[:5]] == [0, 1000, 2000, 3000, SEGMENT_BYTES]
    assert rows[3]["after_magic"] == formats.BLANK_MAGIC and rows[3]["after_size"] == 96


def test_corrupt_body_is_one_malformed_entry(spark: SparkSession) -> None:
    rows = group_rows()
    row(rows, "n1", 5)["body_ok"] = False
    found = checks.malformed_entries(entries_frame(spark, rows), replicas_frame(spark, COMMITS))
    position = row(rows, "n1", 5)["position"]
    assert_findings(
        found,
        (
            "malformed_entry",
            "error",
            "g",
            "n1",
            5,
            "data/" + formats.file_name(SEGMENT_BYTES),
            position,
            "body crc mismatch",
        ),
    )
    # a corrupt copy is not held, so it is not also a divergence
    both = job.all_findings(entries_frame(spark, rows), replicas_frame(spark, COMMITS), None, None)
    assert [r.kind for r in both.collect()] == ["malformed_entry"]


def test_bad_magic_where_the_data_expects_the_entry_is_malformed(spark: SparkSession) -> None:
    rows = group_rows()
    bad = row(rows, "n2", 3)
    bad.update(magic=0x01020304, header_ok=False, body_ok=None)
    found = checks.malformed_entries(entries_frame(spark, rows), replicas_frame(spark, COMMITS))
    assert [(r.replica, r["index"], r.detail) for r in found.collect()] == [
        ("n2", 3, "magic 0x01020304 is not an entry's")
    ]


def test_index_record_with_another_term_is_an_index_mismatch(spark: SparkSession) -> None:
    rows = group_rows()
    row(rows, "n0", 6)["rec_term"] = 9
    found = checks.index_mismatches(entries_frame(spark, rows), replicas_frame(spark, COMMITS))
    assert_findings(
        found,
        (
            "index_mismatch",
            "error",
            "g",
            "n0",
            6,
            "index/" + formats.file_name(1),
            row(rows, "n0", 6)["position"],
            "record at byte 160: term: record 9, entry 2",
        ),
    )


def test_index_record_pointing_elsewhere_is_an_index_mismatch(spark: SparkSession) -> None:
    rows = group_rows()
    moved = row(rows, "n0", 2)
    moved.update(rec_position=1500, position=1500, magic=0x55555555, header_ok=False, body_ok=None)
    entries, replicas = entries_frame(spark, rows), replicas_frame(spark, COMMITS)
    found = checks.index_mismatches(entries, replicas).collect()
    assert [(r.replica, r["index"], r.detail) for r in found] == [
        ("n0", 2, "record at byte 32: position: record 1500, but the data holds the entry at 1000")
    ]
    assert checks.malformed_entries(entries, replicas).collect() == []


def test_entry_not_where_the_one_before_ends_is_a_position_break(spark: SparkSession) -> None:
    rows = group_rows()
    for r in rows:
        if r["replica"] == "n1" and r["index"] == 2:
            r.update(position=1004, rec_position=1004, h_position=1004)
    found = checks.position_breaks(entries_frame(spark, rows), replicas_frame(spark, COMMITS))
    assert [(r.replica, r["index"], r.position, r.detail) for r in found.collect()] == [
        ("n1", 2, 1004, "starts at 1004, expected 1000")
    ]


def test_blank_record_of_the_wrong_size_is_a_position_break(spark: SparkSession) -> None:
    rows = group_rows()
    row(rows, "n2", 5)["prev_after_size"] = 90
    found = checks.position_breaks(entries_frame(spark, rows), replicas_frame(spark, COMMITS))
    assert [(r.replica, r["index"], r.detail) for r in found.collect()] == [
        ("n2", 5, "blank record at 4000 has size 90, the segment has 96 left")
    ]


def test_lower_term_after_higher_is_a_term_regression(spark: SparkSession) -> None:
    rows = group_rows()
    row(rows, "n0", 9).update(term=1, rec_term=1)
    row(rows, "n0", 10)["prev_term"] = 1
    found = checks.term_regressions(entries_frame(spark, rows), replicas_frame(spark, COMMITS))
    assert [(r.replica, r["index"], r.detail) for r in found.collect()] == [
        ("n0", 9, "term 1 after term 3")
    ]


def test_missing_slots_are_index_gaps(spark: SparkSession) -> None:
    rows = [r for r in group_rows() if not (r["replica"] == "n2" and r["index"] in (1, 4, 5))]
    found = checks.index_gaps(entries_frame(spark, rows), replicas_frame(spark, COMMITS))
    assert sorted((r.replica, r["index"], r.detail) for r in found.collect()) == [
        ("n2", 1, "indexes 1..1 have no index record (1 missing)"),
        ("n2", 4, "indexes 4..5 have no index record (2 missing)"),
    ]


def test_checkpoint_beyond_the_log(spark: SparkSession) -> None:
    rows = [r for r in group_rows() if not (r["replica"] == "n1" and r["index"] > 8)]
    found = checks.checkpoints_outside_log(
        entries_frame(spark, rows), replicas_frame(spark, COMMITS)
    )
    assert [(r.replica, r["index"], r.detail) for r in found.collect()] == [
        ("n1", 10, "checkpoint commit index 10 is outside the log 1..8")
    ]


def test_entries_past_own_commit_are_an_uncommitted_tail_note(spark: SparkSession) -> None:
    commits = {("g", "n0"): 10, ("g", "n1"): 10, ("g", "n2"): 7}
    entries = entries_frame(spark, group_rows())
    found = job.all_findings(entries, replicas_frame(spark, commits), None, None).collect()
    assert [(r.kind, r.severity, r.replica, r["index"], r.detail) for r in found] == [
        ("uncommitted_tail", "note", "n2", 8, "3 entries 8..10 past this replica's commit index 7")
    ]


@pytest.fixture(
    params=[
        pytest.param(2, id="buckets-of-4"),
        # one bucket for all ten indexes: the same checks without the clean buckets around the
        # fault; slow only for the default run's 20-minute budget
        pytest.param(agreement.BUCKET_BITS, id="default-buckets", marks=pytest.mark.slow),
    ]
)
def bucket_bits(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """The group checks compare buckets of indexes first: with buckets of 4, the 10 indexes
    of these logs span three buckets, so a fault sits in one bucket among clean ones."""
    monkeypatch.setattr(agreement, "BUCKET_BITS", request.param)
    return int(request.param)


@pytest.mark.usefixtures("bucket_bits")
def test_divergent_committed_entry_names_the_replica(spark: SparkSession) -> None:
    rows = group_rows()
    row(rows, "n2", 7)["body_digest"] = digest_of(0xBAD)  # its stored CRC still agrees
    found = agreement.divergent_entries(entries_frame(spark, rows), replicas_frame(spark, COMMITS))
    assert [(r.replica, r["index"], r.file, r.position, r.detail) for r in found.collect()] == [
        (
            "n2",
            7,
            "data/" + formats.file_name(SEGMENT_BYTES),
            row(rows, "n2", 7)["position"],
            "first divergent committed index: term 2 size 1000 body sha256 "
            f"{digest_of(0xBAD).hex()[:16]}, but n0, n1 hold term 2 size 1000 body sha256 "
            f"{digest_of(0x1234).hex()[:16]} (1 divergent indexes, last 7)",
        )
    ]


@pytest.mark.usefixtures("bucket_bits")
def test_divergence_past_the_group_commit_is_not_checked(spark: SparkSession) -> None:
    rows = group_rows()
    row(rows, "n2", 10)["body_digest"] = digest_of(0xBAD)
    commits = {("g", "n0"): 9, ("g", "n1"): 9, ("g", "n2"): 9}
    found = agreement.divergent_entries(entries_frame(spark, rows), replicas_frame(spark, commits))
    assert found.collect() == []


@pytest.mark.usefixtures("bucket_bits")
def test_committed_entries_held_by_one_replica_are_under_replicated(spark: SparkSession) -> None:
    rows = [r for r in group_rows() if r["replica"] == "n0" or r["index"] <= 8]
    commits = {("g", "n0"): 10, ("g", "n1"): 8, ("g", "n2"): 8}
    found = agreement.under_replicated(entries_frame(spark, rows), replicas_frame(spark, commits))
    assert sorted((r.replica, r["index"], r.detail) for r in found.collect()) == [
        ("n0", i, "committed (group commit 10) but held by 1 of 3 replicas (n0); a quorum is 2")
        for i in (9, 10)
    ]


@pytest.mark.usefixtures("bucket_bits")
def test_committed_index_nobody_holds_is_under_replicated(spark: SparkSession) -> None:
    rows = [r for r in group_rows() if r["index"] <= 9]
    commits = {("g", "n0"): 10, ("g", "n1"): 9, ("g", "n2"): 9}
    found = agreement.under_replicated(entries_frame(spark, rows), replicas_frame(spark, commits))
    assert [(r.replica, r["index"], r.file, r.detail) for r in found.collect()] == [
        (
            None,
            10,
            None,
            "committed (group commit 10) but held by 0 of 3 replicas (none); a quorum is 2",
        )
    ]


@pytest.mark.usefixtures("bucket_bits")
def test_indexes_below_a_replicas_start_count_as_held(spark: SparkSession) -> None:
    """Retention drops only applied entries: a replica starting at 6 holds 1..5 for the
    quorum count; a replica that starts at 1 and lacks them does not."""
    rows = [r for r in group_rows() if r["replica"] == "n0" or r["index"] > 5]
    entries = entries_frame(spark, rows)
    starts = {("g", "n2"): 6}
    found = agreement.under_replicated(entries, replicas_frame(spark, COMMITS, starts=starts))
    assert found.collect() == []  # n0 holds 1..5, n2 retained past them: 2 of 3
    rows = [r for r in group_rows() if r["index"] > 5]
    entries = entries_frame(spark, rows)
    starts = {("g", "n0"): 6, ("g", "n2"): 6}
    found = agreement.under_replicated(entries, replicas_frame(spark, COMMITS, starts=starts))
    assert found.collect() == []  # nobody holds 1..5, but two replicas retained past them
    found = agreement.under_replicated(entries, replicas_frame(spark, COMMITS, starts={}))
    assert sorted((r.replica, r["index"], r.detail) for r in found.collect()) == [
        (None, i, "committed (group commit 10) but held by 0 of 3 replicas (none); a quorum is 2")
        for i in range(1, 6)
    ]


def test_facts_checks_told_there_are_no_rows_find_what_an_empty_frame_finds(
    spark: SparkSession,
) -> None:
    """The screened job hands the facts checks None for entries when no chunk was read in
    detail: that must mean exactly an empty entries frame, with spans and a bucket summary."""
    commits = {("g", "n0"): 10, ("g", "n1"): 10, ("g", "n2"): 12}
    replicas = replicas_frame(spark, commits, starts={("g", "n2"): 3})
    spans = spark.createDataFrame(  # n2 starts at 3 but holds from 5; n1 stops at 8
        [("g", "n0", 10, 1, 10, 10_000), ("g", "n1", 8, 1, 8, 8000), ("g", "n2", 6, 5, 10, 6000)],
        screen.SPANS_SCHEMA,
    )
    summary = spark.createDataFrame(  # buckets of 4: nobody but n0 is counted past index 7
        [("g", 0, r, 3, "d") for r in ("n0", "n1")]
        + [("g", 1, r, 4, "d") for r in ("n0", "n1")]
        + [("g", 2, "n0", 3, "d")],
        screen.SUMMARY_SCHEMA,
    )
    empty = entries_frame(spark, [])
    pairs = [
        (checks.index_gaps(None, replicas, spans), checks.index_gaps(empty, replicas, spans)),
        (
            checks.checkpoints_outside_log(None, replicas, spans),
            checks.checkpoints_outside_log(empty, replicas, spans),
        ),
        (
            agreement.under_replicated(None, replicas, summary, bucket_bits=2),
            agreement.under_replicated(empty, replicas, summary, bucket_bits=2),
        ),
    ]
    kinds = []
    for told, counted in pairs:
        assert told.columns == list(checks.FINDING_COLUMNS)
        rows = sorted(tuple(r) for r in told.collect())
        assert rows == sorted(tuple(r) for r in counted.collect())
        assert rows, "each case finds something"
        kinds += [(r[0], r[3], r[4]) for r in rows]
    assert sorted(kinds) == [
        ("checkpoint_outside_log", "n1", 10),
        ("checkpoint_outside_log", "n2", 12),
        ("index_gap", "n2", 3),
        *(("under_replicated", None, i) for i in (8, 9, 10, 11, 12)),
    ]
    with pytest.raises(ValueError, match="spans"):
        checks.index_gaps(None, replicas)
    with pytest.raises(ValueError, match="summary"):
        agreement.under_replicated(None, replicas)


def test_acknowledged_append_missing_from_the_committed_log(spark: SparkSession) -> None:
    """An append is found by the SHA-256 of its value; a finding names who holds the index,
    where, and shows both the value and what is there."""
    replicas = replicas_frame(spark, COMMITS)
    rows = group_rows()

    def ack(index: int | None, value: str, process: str, time_ns: int) -> tuple[Any, ...]:
        return attrs.astuple(history.acknowledged("g", index, value, process, time_ns))

    row(rows, "n0", 3)["body_digest"] = hashlib.sha256(b"a").digest()
    for r in ("n0", "n1", "n2"):
        row(rows, r, 4)["body_digest"] = hashlib.sha256(b"x").digest()
    acked = spark.createDataFrame(
        [
            ack(3, "a", "0", 10),
            ack(4, "b", "1", 20),
            ack(11, "c", "0", 30),
            ack(None, "d", "2", 40),
        ],
        job.ACKED_SCHEMA,
    )

    def heads(wanted: DataFrame) -> DataFrame:
        return wanted.select("group", "index", "replica", F.lit("b'x'").alias("head"))

    found = agreement.missing_appends(acked, entries_frame(spark, rows), replicas, heads).collect()
    where = row(rows, "n0", 4)
    got = [(r.kind, r.replica, r["index"], r.file, r.position, r.detail) for r in found]
    assert sorted(got, key=str) == sorted(
        [
            (
                "missing_append",
                None,
                11,
                None,
                None,
                "acknowledged append b'c' (1 bytes; process 0, time_ns 30) at index 11: past the "
                "group commit index 10",
            ),
            (
                "missing_append",
                "n0",
                4,
                where["file"],
                where["position"],
                "acknowledged append b'b' (1 bytes; process 1, time_ns 20) at index 4: n0, n1, n2 "
                f"hold another body there: b'x' (956 bytes) in {where['file']} at position "
                f"{where['position']}",
            ),
            (
                "unchecked_append",
                None,
                None,
                None,
                None,
                "acknowledged append from process 2 records no index",
            ),
        ],
        key=str,
    )


def test_bytes_after_the_last_entry_are_an_unindexed_data_note(spark: SparkSession) -> None:
    rows = group_rows()
    row(rows, "n1", 10).update(after_magic=formats.ENTRY_MAGIC, after_size=1000)
    found = checks.unindexed_data(entries_frame(spark, rows)).collect()
    last = row(rows, "n1", 10)
    assert [(r.kind, r.replica, r.position, r.detail) for r in found] == [
        (
            "unindexed_data",
            "n1",
            last["position"] + 1000,
            f"an entry header at {last['position'] + 1000} after the last indexed entry",
        )
    ]


def test_unreadable_file_is_reported_once_per_error(spark: SparkSession) -> None:
    rows = group_rows()
    for index in (4, 5):
        row(rows, "n0", index).update(io_error="/s/n0/dledger/data/x: permission denied")
    found = checks.unreadable_files(entries_frame(spark, rows)).collect()
    assert [(r.kind, r.severity, r.replica, r["index"], r.detail) for r in found] == [
        (
            "unreadable",
            "unreadable",
            "n0",
            4,
            "/s/n0/dledger/data/x: permission denied (2 entries not read)",
        )
    ]
