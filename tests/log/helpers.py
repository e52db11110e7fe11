"""What the log store tests share: small geometries, deterministic bodies, opening helpers."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from dledger.log.flusher import Flusher
from dledger.log.store import FlushPolicy, LogStore, StoreConfig
from dledger.raft.entries import EntryBatch, EntryKind

GROUP, SELF_ID = "g", "n0"
# rollover all the time, and the page cache let go of two segments behind the write position
TINY = StoreConfig(segment_bytes=4096, index_records_per_file=8, cache_tail_bytes=8192)
SMALL = StoreConfig(segment_bytes=64 * 1024, index_records_per_file=64)
ASYNC_SMALL = StoreConfig(
    segment_bytes=64 * 1024, index_records_per_file=64, flush=FlushPolicy.ASYNC_FLUSH
)


def open_store(path: Path, config: StoreConfig = TINY, **kwargs: object) -> LogStore:
    return LogStore.open(path, config, group=GROUP, self_id=SELF_ID, **kwargs)  # type: ignore[arg-type]


def append_one(store: LogStore, flusher: Flusher, size: int | None = None) -> int:
    """One entry (term 1) after the last, and the flusher told, as the node does; its index."""
    index = store.append(batch_of(store.last_index + 1, 1, 1, size))
    flusher.notify()
    return index


def body(index: int, term: int, size: int | None = None) -> bytes:
    """A deterministic body for (index, term): the crash test's writer and checker agree on
    it without talking. Its length comes from the digest unless given."""
    digest = hashlib.blake2b(f"{index}/{term}".encode(), digest_size=32).digest()
    length = size if size is not None else digest[0] * 4 + digest[1] % 7  # 0..1026 bytes
    return (digest * (length // len(digest) + 1))[:length]


def batch_of(first: int, term: int, count: int, size: int | None = None) -> EntryBatch:
    payloads = [body(first + k, term, size) for k in range(count)]
    return EntryBatch(first, [term] * count, [EntryKind.DATA.value] * count, payloads)


def batch_from(first: int, entries: Sequence[tuple[int, bytes]]) -> EntryBatch:
    """A batch of (term, body) pairs."""
    return EntryBatch(
        first,
        [t for t, _ in entries],
        [EntryKind.DATA.value] * len(entries),
        [b for _, b in entries],
    )


def segment_files(path: Path) -> list[Path]:
    return sorted((path / "dledger" / "data").iterdir())


def index_files(path: Path) -> list[Path]:
    return sorted((path / "dledger" / "index").iterdir())


def flip(path: Path, offset: int, mask: int = 0xFF) -> None:
    """XOR one byte of a file in place."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ mask]))
