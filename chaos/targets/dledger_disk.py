"""Disk faults on a killed dledger replica's store: the tail of its last written segment torn
(zeroed from the middle of an entry on) or overwritten with garbage, as a crash mid-write
leaves it (docs/formats.md#recovery).

Only the tail is hit, and only entries past the checkpoint's durable index: recovery treats
damage at or below that index (fsynced, so not a torn write) or damage followed by a valid
entry as corruption and refuses to open, which is the store doing its job, not a fault the
cluster should ride out. When there is no entry past the durable index, garbage is written
just after the last entry instead (a torn write of the next one).

The caller must have killed the replica: this writes its files directly.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import attrs

from dledger.log.entry import BLANK_MAGIC, ENTRY_MAGIC, HEADER, decode_header, header_defect
from dledger.log.layout import StorePaths, file_name, list_numbered
from dledger.log.meta import read_checkpoint, read_meta
from dledger.log.segment import nonzero_end

MODES = ("truncate", "garbage")
GARBAGE_BYTES_MAX = 256  # garbage written past the last entry's end (or past the written end)


@attrs.frozen
class TailEntry:
    offset: int  # within its segment
    index: int
    size: int


@attrs.frozen
class TailDamage:
    mode: str  # "truncate", "garbage", "garbage-after-end" or "none"
    segment: str
    start: int  # first damaged byte, within the segment
    length: int
    entries_hit: int  # entries of the log whose bytes were damaged
    first_index_hit: int | None
    durable_index: int  # the checkpoint's, which bounds what may be hit
    reason: str = ""

    def describe(self) -> dict[str, Any]:
        return attrs.asdict(self)


def walk_segment(data: bytes, start: int = 0) -> tuple[list[TailEntry], int]:
    """Valid entry headers from `start` until a blank record, zeros or anything else; returns
    them and where the walk stopped."""
    entries: list[TailEntry] = []
    offset = start
    while offset + HEADER.size <= len(data):
        header = decode_header(data, offset)
        if header.magic == BLANK_MAGIC or header.magic != ENTRY_MAGIC:
            break
        if header_defect(data, offset, header) is not None:
            break
        if offset + header.size > len(data):
            break
        entries.append(TailEntry(offset, header.index, header.size))
        offset += header.size
    return entries, offset


def last_written_segment(paths: StorePaths, segment_bytes: int) -> tuple[int, int] | None:
    """(base, written end) of the last segment holding any non-zero byte."""
    for base in reversed(list_numbered(paths.data)):
        fd = os.open(paths.segment(base), os.O_RDONLY)
        try:
            end = nonzero_end(fd, 0, segment_bytes)
        finally:
            os.close(fd)
        if end > 0:
            return base, end
    return None


def damage_tail(store_dir: Path, mode: str, rng: random.Random) -> TailDamage:
    assert mode in MODES, mode
    paths = StorePaths(store_dir)
    meta = read_meta(paths.meta)
    if meta is None:
        return TailDamage("none", "", 0, 0, 0, None, 0, "the store has no meta file yet")
    checkpoint = read_checkpoint(paths.checkpoint)
    durable = checkpoint.durable_index if checkpoint is not None else 0
    found = last_written_segment(paths, meta.segment_bytes)
    if found is None:
        return TailDamage("none", "", 0, 0, 0, None, durable, "no written segment")
    base, written_end = found
    path = paths.segment(base)
    with open(path, "r+b") as f:
        data = f.read(written_end)
        start = (
            meta.start.position - base
            if base <= meta.start.position < base + meta.segment_bytes
            else 0
        )
        entries, walked_to = walk_segment(data, start)
        candidates = [e for e in entries if e.index > durable]
        if candidates and mode == "truncate":
            victim = rng.choice(candidates)
            cut = victim.offset + rng.randint(1, victim.size - 1)
            length = written_end - cut
            _write(f, cut, bytes(length))
            hit = [e for e in entries if e.offset + e.size > cut]
            damage = TailDamage(mode, file_name(base), cut, length, len(hit), hit[0].index, durable)
        elif candidates and entries[-1] is candidates[-1] and walked_to == written_end:
            last = entries[-1]
            first = last.offset + rng.randint(0, last.size - 1)
            end = min(
                last.offset + last.size + rng.randint(0, GARBAGE_BYTES_MAX), meta.segment_bytes
            )
            _write(f, first, rng.randbytes(end - first))
            damage = TailDamage(
                "garbage", file_name(base), first, end - first, 1, last.index, durable
            )
        else:
            room = meta.segment_bytes - written_end
            if walked_to != written_end or room < HEADER.size:
                why = "the segment is full" if room < HEADER.size else "its tail is not entries"
                return TailDamage(
                    "none",
                    file_name(base),
                    written_end,
                    0,
                    0,
                    None,
                    durable,
                    f"no entry past durable index {durable} and {why}",
                )
            length = min(room, rng.randint(HEADER.size, GARBAGE_BYTES_MAX))
            _write(f, written_end, rng.randbytes(length))
            damage = TailDamage(
                "garbage-after-end",
                file_name(base),
                written_end,
                length,
                0,
                None,
                durable,
                f"no entry past durable index {durable}",
            )
    return damage


def _write(f: Any, offset: int, data: bytes) -> None:
    f.seek(offset)
    f.write(data)
    f.flush()
    os.fsync(f.fileno())
