"""Stores for the audit tests, written by the project's own log writer (dledger.log).

The audit never imports dledger.log; only these fixtures do, so that what the audit reads was
written by the real writer. Faults are then injected by editing bytes at positions computed
from docs/formats.md, each helper naming the one fault it makes.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

from dledger.log.config import StoreConfig
from dledger.log.store import LogStore
from dledger.raft.entries import data_batch

SEGMENT_BYTES = 4096  # tiny segments, so entries cross segment boundaries constantly
INDEX_RECORDS_PER_FILE = 16  # and index files too
REPLICAS = ("n0", "n1", "n2")
INDEX_RECORD_BYTES = 32
ENTRY_HEADER_BYTES = 44


def payload(group: str, index: int) -> bytes:
    """The body of entry `index` in the test logs: distinct, 100-300 bytes, deterministic."""
    return (f"{group}-{index:06d}-".encode() * 30)[: 100 + (index * 37) % 200]


def write_replica(
    root: Path,
    group: str,
    replica: str,
    bodies: Sequence[bytes],
    *,
    commit_index: int,
    terms: Sequence[int] | None = None,
    truncate_after: int | None = None,
) -> Path:
    """A store at root/group/replica holding `bodies` as entries 1..n, one term per entry
    (default: term 1 for the first half, 2 after), optionally truncated, checkpointed."""
    store_dir = root / group / replica
    config = StoreConfig(segment_bytes=SEGMENT_BYTES, index_records_per_file=INDEX_RECORDS_PER_FILE)
    terms = terms or [1 if i < len(bodies) // 2 else 2 for i in range(len(bodies))]
    with LogStore.open(store_dir, config, group=group, self_id=replica) as store:
        first = 0
        while first < len(bodies):  # batches of equal term, as a leader proposes them
            last = first
            while last + 1 < len(bodies) and terms[last + 1] == terms[first] and last - first < 50:
                last += 1
            store.append(data_batch(first + 1, terms[first], bodies[first : last + 1]))
            first = last + 1
        if truncate_after is not None:
            store.truncate_after(truncate_after)
        store.flush()
        store.write_checkpoint(commit_index, commit_index)
    return store_dir


def write_group(
    root: Path, group: str, entries: int, *, replicas: Sequence[str] = REPLICAS
) -> dict[str, Path]:
    """A healthy group: every replica holds entries 1..n, all committed."""
    bodies = [payload(group, i) for i in range(1, entries + 1)]
    return {r: write_replica(root, group, r, bodies, commit_index=entries) for r in replicas}


# --- reading back what the writer wrote, to aim a fault (docs/formats.md) ---------------------
def index_record(store_dir: Path, index: int) -> tuple[Path, int, tuple[int, int, int, int]]:
    """(index file, byte in it, (position, index, term, size)) of the record for `index`."""
    first = ((index - 1) // INDEX_RECORDS_PER_FILE) * INDEX_RECORDS_PER_FILE + 1
    path = store_dir / "dledger" / "index" / f"{first:020d}"
    at = (index - first) * INDEX_RECORD_BYTES
    with open(path, "rb") as f:
        f.seek(at)
        position, idx, term, size, _kind, _ = struct.unpack(">qqqIHH", f.read(32))
    return path, at, (position, idx, term, size)


def segment_of(store_dir: Path, position: int) -> tuple[Path, int]:
    """(segment file, byte in it) of a log position."""
    first = position - position % SEGMENT_BYTES
    return store_dir / "dledger" / "data" / f"{first:020d}", position - first


def flip_byte(path: Path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))


def corrupt_body(store_dir: Path, index: int) -> tuple[str, int]:
    """Flip one body byte of entry `index`: its body CRC fails. Returns (segment, position)."""
    _, _, (position, _, _, _) = index_record(store_dir, index)
    segment, at = segment_of(store_dir, position)
    flip_byte(segment, at + ENTRY_HEADER_BYTES + 5)
    return f"data/{segment.name}", position


def set_record_term(store_dir: Path, index: int, term: int) -> tuple[str, int]:
    """Rewrite the term of `index`'s index record: the index disagrees with the data."""
    path, at, (position, _, _, _) = index_record(store_dir, index)
    with open(path, "r+b") as f:
        f.seek(at + 16)
        f.write(struct.pack(">q", term))
    return f"index/{path.name}", position


def entry_crc(body: bytes) -> int:
    return zlib.crc32(body)


def remove(path: Path) -> None:
    os.remove(path)


def crc32_patch(original: bytes, edited: bytes, at: int) -> bytes:
    """`edited` with its bytes at..at+4 chosen so that its CRC-32 equals `original`'s (same
    length). CRC-32 is affine over GF(2) for a fixed length: crc(a ^ b) = crc(a) ^ crc(b) ^
    crc(zeros), so the 32 patch bits act on the CRC through a 32 x 32 matrix, inverted here
    by elimination. This is the edit agreement by CRC could not see (issue 34)."""
    assert len(original) == len(edited) and 0 <= at <= len(edited) - 4
    n = len(edited)
    zeros = zlib.crc32(bytes(n))
    base = edited[:at] + bytes(4) + edited[at + 4 :]

    def bit_effect(bit: int) -> int:
        patch = (1 << bit).to_bytes(4, "little")
        return zlib.crc32(bytes(at) + patch + bytes(n - at - 4)) ^ zeros

    basis: dict[int, tuple[int, int]] = {}  # highest bit -> (effect, patch bits giving it)
    for bit in range(32):
        effect, bits = bit_effect(bit), 1 << bit
        while effect:
            top = effect.bit_length() - 1
            if top not in basis:
                basis[top] = (effect, bits)
                break
            effect, bits = effect ^ basis[top][0], bits ^ basis[top][1]
    want, bits = zlib.crc32(original) ^ zlib.crc32(base), 0
    while want:
        effect, used = basis[want.bit_length() - 1]
        want, bits = want ^ effect, bits ^ used
    forged = base[:at] + bits.to_bytes(4, "little") + base[at + 4 :]
    assert zlib.crc32(forged) == zlib.crc32(original) and forged != original
    return forged


def forge_body(store_dir: Path, index: int, text: bytes) -> tuple[str, int]:
    """Rewrite the start of entry `index`'s body with `text` and its last four bytes so that
    its body CRC is unchanged: the header, both CRCs and the index record still hold. Returns
    (segment, position)."""
    _, _, (position, _, _, size) = index_record(store_dir, index)
    segment, at = segment_of(store_dir, position)
    with open(segment, "r+b") as f:
        f.seek(at + ENTRY_HEADER_BYTES)
        body = f.read(size - ENTRY_HEADER_BYTES)
        forged = crc32_patch(body, text + body[len(text) :], len(body) - 4)
        f.seek(at + ENTRY_HEADER_BYTES)
        f.write(forged)
    return f"data/{segment.name}", position


# --- a chaos history (docs/formats.md#chaos-history) -----------------------------------------
Ack = tuple[str, int | None, str, int | str, int]  # group, index, value, process, time_ns


def write_history(path: Path, acks: Iterable[Ack]) -> Path:
    """A history.jsonl as the chaos harness writes it (compact JSON): an invoke and an ok line
    per acknowledged append, the ok one with its index (None: the history records none)."""
    with open(path, "w") as f:
        for group, index, value, process, time_ns in acks:
            op = {"process": process, "f": "append", "value": value, "group": group}
            for kind, at, i in (("invoke", time_ns - 1, None), ("ok", time_ns, index)):
                line = {"type": kind, **op, "index": i, "time_ns": at, "error": None}
                f.write(json.dumps(line, separators=(",", ":")) + "\n")
    return path
