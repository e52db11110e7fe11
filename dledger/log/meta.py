"""The store's own state files: `meta` (identity, geometry, where the log starts) and
`checkpoint` (commit, applied and durable index), as attrs classes over state_file.py.

Keys follow docs/formats.md#state-files-meta-hardstate-checkpoint; readers ignore unknown keys
so keys can be added without a version bump, and reject a known key of the wrong type.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import attrs

from dledger.log.config import StoreConfig
from dledger.log.errors import CorruptStateFile, StoreMismatch
from dledger.log.layout import StorePaths, list_numbered
from dledger.log.state_file import (
    CHECKPOINT_MAGIC,
    META_MAGIC,
    read_state_file,
    write_state_file,
)
from dledger.raft.entries import EntryId, LogStart


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _field(body: dict[str, Any], key: str, kind: type, path: Path) -> Any:
    value = body.get(key)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise CorruptStateFile(str(path), f"key {key!r} is {value!r}, expected {kind.__name__}")
    return value


@attrs.frozen
class Meta:
    """Who the store belongs to, its geometry, and where the retained log starts."""

    group: str
    self_id: str
    segment_bytes: int
    index_records_per_file: int
    start: LogStart
    created_ms: int

    def to_body(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "self_id": self.self_id,
            "segment_bytes": self.segment_bytes,
            "index_records_per_file": self.index_records_per_file,
            "start_index": self.start.prev.index + 1,
            "start_prev_term": self.start.prev.term,
            "start_position": self.start.position,
            "created_ms": self.created_ms,
        }

    @classmethod
    def from_body(cls, body: dict[str, Any], path: Path) -> Meta:
        start_index = _field(body, "start_index", int, path)
        prev_term = _field(body, "start_prev_term", int, path)
        position = _field(body, "start_position", int, path)
        if start_index < 1 or prev_term < 0 or position < 0:
            raise CorruptStateFile(
                str(path), f"start {start_index}/{prev_term} at position {position} is impossible"
            )
        return cls(
            group=_field(body, "group", str, path),
            self_id=_field(body, "self_id", str, path),
            segment_bytes=_field(body, "segment_bytes", int, path),
            index_records_per_file=_field(body, "index_records_per_file", int, path),
            start=LogStart(EntryId(start_index - 1, prev_term), position),
            created_ms=_field(body, "created_ms", int, path),
        )


def read_meta(path: Path) -> Meta | None:
    body = read_state_file(path, META_MAGIC)
    return None if body is None else Meta.from_body(body, path)


def write_meta(path: Path, meta: Meta) -> None:
    write_state_file(path, META_MAGIC, meta.to_body())


@attrs.frozen
class Checkpoint:
    """What the owner had committed and applied, and what the log had made durable, when it
    was written. It may lag the log; it never runs ahead of what was durable then."""

    commit_index: int = 0
    applied_index: int = 0
    durable_index: int = 0
    written_ms: int = 0

    def to_body(self) -> dict[str, Any]:
        return attrs.asdict(self)

    @classmethod
    def from_body(cls, body: dict[str, Any], path: Path) -> Checkpoint:
        values = {f.name: _field(body, f.name, int, path) for f in attrs.fields(cls)}
        return cls(**values)


def read_checkpoint(path: Path) -> Checkpoint | None:
    body = read_state_file(path, CHECKPOINT_MAGIC)
    return None if body is None else Checkpoint.from_body(body, path)


def write_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    write_state_file(path, CHECKPOINT_MAGIC, checkpoint.to_body())


def open_meta(paths: StorePaths, config: StoreConfig, *, group: str, self_id: str) -> Meta:
    """The store's meta: created for a new store; for an existing one, checked against who
    opens it and how (StoreMismatch), since a store holds one replica of one group."""
    meta = read_meta(paths.meta)
    if meta is None:
        if list_numbered(paths.data) or list_numbered(paths.index):
            raise CorruptStateFile(str(paths.meta), "missing, but the store holds data files")
        meta = Meta(
            group=group,
            self_id=self_id,
            segment_bytes=config.segment_bytes,
            index_records_per_file=config.index_records_per_file,
            start=LogStart(EntryId(0, 0), 0),
            created_ms=now_ms(),
        )
        write_meta(paths.meta, meta)
        return meta
    for field, stored, given in (
        ("group", meta.group, group),
        ("self_id", meta.self_id, self_id),
        ("segment_bytes", meta.segment_bytes, config.segment_bytes),
        ("index_records_per_file", meta.index_records_per_file, config.index_records_per_file),
    ):
        if stored != given:
            raise StoreMismatch(field, stored, given)
    return meta
