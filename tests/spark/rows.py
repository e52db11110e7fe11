"""Literal entry rows for the checks, as spark/read.py would produce them for a healthy log."""

from __future__ import annotations

import hashlib
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from spark import formats, read
from spark.checks import REPLICA_COLUMNS

SEGMENT_BYTES = 4096
RECORDS_PER_FILE = 64


def healthy_log(
    group: str, replica: str, terms: list[int], size: int = 1000, crcs: list[int] | None = None
) -> list[dict[str, Any]]:
    """Rows for entries 1..len(terms), packed into SEGMENT_BYTES segments with blank records."""
    rows: list[dict[str, Any]] = []
    position = 0
    for k, term in enumerate(terms):
        index = k + 1
        left = SEGMENT_BYTES - position % SEGMENT_BYTES
        if size > left or 0 < left - size < formats.BLANK_BYTES_MIN:
            if rows:
                rows[-1]["after_magic"], rows[-1]["after_size"] = formats.BLANK_MAGIC, left
            position += left
        first_slot = formats.index_file_first(index, RECORDS_PER_FILE)
        segment = position - position % SEGMENT_BYTES
        row = {
            "group": group,
            "replica": replica,
            "index": index,
            "index_file": "index/" + formats.file_name(first_slot),
            "rec_position": position,
            "rec_index": index,
            "rec_term": term,
            "rec_size": size,
            "rec_kind": 0,
            "file": "data/" + formats.file_name(segment),
            "file_bytes": SEGMENT_BYTES,
            "position": position,
            "defect": None,
            "io_error": None,
            "magic": formats.ENTRY_MAGIC,
            "size": size,
            "h_index": index,
            "term": term,
            "h_position": position,
            "kind": 0,
            "body_crc": (crcs or [0x1234] * len(terms))[k],
            "body_digest": digest_of((crcs or [0x1234] * len(terms))[k]),
            "header_ok": True,
            "body_ok": True,
            "after_magic": formats.END_MAGIC,
            "after_size": 0,
            "prev_end": None,
            "prev_term": None,
            "prev_after_magic": None,
            "prev_after_size": None,
        }
        if rows:
            before = rows[-1]
            if before["after_magic"] == formats.END_MAGIC:
                before["after_magic"], before["after_size"] = formats.ENTRY_MAGIC, size
            if (before["position"] + before["size"]) % SEGMENT_BYTES == 0:
                before["after_magic"], before["after_size"] = None, None
            row["prev_end"] = before["position"] + before["size"]
            row["prev_term"] = before["term"]
            row["prev_after_magic"] = before["after_magic"]
            row["prev_after_size"] = before["after_size"]
        rows.append(row)
        position += size
    return rows


def digest_of(body_crc: int) -> bytes:
    """A stand-in body digest: rows with equal CRCs here have equal bodies."""
    return hashlib.sha256(b"body %d" % body_crc).digest()


def entries_frame(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    return spark.createDataFrame(rows, from_arrow_schema(read.ENTRY_SCHEMA))


def replicas_frame(
    spark: SparkSession,
    commits: dict[tuple[str, str], int],
    start_index: int = 1,
    starts: dict[tuple[str, str], int] | None = None,
) -> DataFrame:
    """One row per replica; group size, quorum and commit from the replicas given; every
    replica starts at `start_index` unless `starts` says otherwise."""
    rows = []
    for (group, replica), commit in sorted(commits.items()):
        size = sum(1 for g, _ in commits if g == group)
        group_commit = max(c for (g, _), c in commits.items() if g == group)
        rows.append(
            (
                group,
                replica,
                SEGMENT_BYTES,
                (starts or {}).get((group, replica), start_index),
                0,
                0,
                commit,
                size,
                size // 2 + 1,
                group_commit,
            )
        )
    schema = (
        "group string, replica string, segment_bytes long, start_index long, "
        "start_prev_term long, start_position long, commit_index long, group_size long, "
        "quorum long, group_commit long"
    )
    assert len(schema.split(",")) == len(REPLICA_COLUMNS)
    return spark.createDataFrame(rows, schema)
