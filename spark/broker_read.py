"""Read broker stores into DataFrames, in bounded tasks (executor side).

- `messages`: one row per DATA entry of each replica's log that is a stored message (or
  claims to be one and does not parse, or is neither message nor metadata), with what the
  ConsumeQueue and IndexFile must say about it. Tasks are the log reader's slot ranges
  (spark/read.py plan); a task reads CHUNK_RECORDS_MAX index records at once and the data
  they point at in windows of at most parse.WINDOW_BYTES_MAX plus one entry.
- `queue_units`: one row per ConsumeQueue unit that is not all zeros, a task per file read in
  chunks of CQ_CHUNK_UNITS.
- `index_rows`: per IndexFile, one row per used item and per non-zero slot, read in chunks,
  and one digest row (SHA-256 of its first `items` items, and of header, slots and items
  when the file holds exactly that many) for replica agreement.

Memory per task is bounded by the chunk and window sizes, whatever the store's size. The
readers do not judge: spark/broker_checks.py does.
"""

from __future__ import annotations

import functools
import hashlib
import posixpath
from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

import attrs
import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
from isal import isal_zlib
from pyspark.sql import DataFrame, SparkSession

from spark import broker_formats as bf
from spark import broker_layout, formats, frames, layout, parse, read

CQ_CHUNK_UNITS = 1 << 16  # ConsumeQueue units read at once: 1.25 MiB
INDEX_CHUNK_SLOTS = 1 << 18  # IndexFile slots read at once: 1 MiB
INDEX_CHUNK_ITEMS = 1 << 16  # IndexFile items read at once: 1.25 MiB

MESSAGE_SCHEMA = pa.schema(
    [
        ("group", pa.string()),
        ("replica", pa.string()),
        ("index", pa.int64()),
        ("file", pa.string()),  # the data segment, e.g. "dledger/data/000...0"
        ("position", pa.int64()),  # the entry's position
        ("body_kind", pa.string()),  # message, other (neither message nor metadata), bad
        ("detail", pa.string()),  # why a message does not parse; null when it does
        ("topic", pa.string()),
        ("queue_id", pa.int64()),
        ("queue_offset", pa.int64()),
        ("physical_offset", pa.int64()),  # the record's field (must be position + 44)
        ("store_size", pa.int64()),
        ("sys_flag", pa.int64()),
        ("store_ts", pa.int64()),
        ("tag_hash", pa.int64()),  # what its ConsumeQueue unit must hold
        ("key_hashes", pa.list_(pa.int64())),  # the IndexFile key hashes it must be found by
        ("offset_msg_id", pa.string()),
        ("uniq_key", pa.string()),
        ("body_digest", pa.binary()),  # SHA-256 of the (decompressed) body
    ]
)

UNIT_SCHEMA = pa.schema(
    [
        ("group", pa.string()),
        ("replica", pa.string()),
        ("topic", pa.string()),
        ("queue_id", pa.int64()),
        ("file", pa.string()),  # consumequeue/<topic>/<queue_id>/<20 digits>
        ("file_position", pa.int64()),  # the unit's byte in that file
        ("queue_offset", pa.int64()),
        ("unit_physical_offset", pa.int64()),
        ("unit_size", pa.int64()),
        ("unit_tag_hash", pa.int64()),
        ("io_error", pa.string()),
    ]
)

INDEX_SCHEMA = pa.schema(
    [
        ("group", pa.string()),
        ("replica", pa.string()),
        ("file", pa.string()),  # index/<20 digits>
        ("what", pa.string()),  # item, slot, digest, error
        ("number", pa.int64()),  # the item's or the slot's number
        ("file_position", pa.int64()),  # its byte in the file
        ("key_hash", pa.int64()),
        ("slot", pa.int64()),  # an item's slot: key_hash % slot_count
        ("phy_offset", pa.int64()),
        ("time_diff", pa.int64()),
        ("prev_index", pa.int64()),
        ("head", pa.int64()),  # a slot's newest item
        ("items_digest", pa.binary()),  # digest row: SHA-256 of items 1..items_hashed
        ("items_hashed", pa.int64()),
        ("file_digest", pa.binary()),  # digest row: of header, slots and items, or null
        ("detail", pa.string()),
    ]
)


class StoreFiles:
    """Open files of one broker store (paths relative to its root); zeros past a file's end."""

    def __init__(self, store: broker_layout.BrokerStore) -> None:
        self.fs, self.root = layout.filesystem(store.replica.uri)
        self._open: dict[str, pafs.NativeFile] = {}

    def __enter__(self) -> StoreFiles:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        for f in self._open.values():
            f.close()
        self._open.clear()

    def read(self, name: str, at: int, length: int, size: int) -> bytes:
        """`length` bytes of `name` (whose listed size is `size`) from `at`; raises OSError."""
        f = self._open.get(name)
        if f is None:
            for old in self._open.values():
                old.close()
            self._open.clear()
            f = self.fs.open_input_file(posixpath.join(self.root, name))
            self._open[name] = f
        have = max(0, min(length, size - at))
        data = bytes(f.read_at(have, at)) if have else b""
        return data + bytes(length - len(data))


# --- messages ------------------------------------------------------------------------------


def messages(spark: SparkSession, stores: Sequence[broker_layout.BrokerStore]) -> DataFrame:
    """MESSAGE_SCHEMA rows of every broker store's log, one task per slot range."""
    replicas = [s.replica for s in stores]
    tasks = [attrs.astuple(t) for t in read.plan(replicas)]
    if not tasks:
        return frames.empty(spark, MESSAGE_SCHEMA)
    body = functools.partial(_message_tasks, {r.key: r for r in replicas})
    return frames.map_tasks(spark, tasks, read.TASK_SCHEMA, body, MESSAGE_SCHEMA)


def _message_tasks(
    replicas: dict[tuple[str, str], layout.Replica], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        for task in batch.to_pylist():
            replica = replicas[(task["group"], task["replica"])]
            with parse.Files(replica) as files:
                for lo in range(task["lo"], task["hi"], read.CHUNK_RECORDS_MAX):
                    hi = min(task["hi"], lo + read.CHUNK_RECORDS_MAX)
                    rows = message_rows(replica, files, lo, hi)
                    yield pa.RecordBatch.from_pylist(rows, schema=MESSAGE_SCHEMA)


def message_rows(
    replica: layout.Replica, files: parse.Files, lo: int, hi: int
) -> list[dict[str, Any]]:
    """Rows for the sound DATA entries of slots [lo, hi) whose body is not metadata. An entry
    whose header or CRCs do not hold is left out: the log's own checks report it."""
    records = files.index_records(lo, hi)
    slots = np.arange(lo, hi, dtype=np.int64)
    usable = (
        (records["size"] >= formats.ENTRY_HEADER_BYTES)
        & (records["size"] <= formats.ENTRY_BYTES_MAX)
        & (records["kind"] == 0)
        & (records["position"] >= 0)
    )
    slots, records = slots[usable], records[usable]
    rows: list[dict[str, Any]] = []
    for window_slots, window_records, name, at, data in _windows(replica, files, slots, records):
        for slot, record in zip(window_slots.tolist(), window_records, strict=True):
            offset = int(record["position"]) - at
            size = int(record["size"])
            entry = data[offset : offset + size]
            if len(entry) < size or not _sound(entry, slot, int(record["position"])):
                continue
            row = _message_row(entry[formats.ENTRY_HEADER_BYTES :])
            if row is not None:
                row.update(
                    group=replica.group,
                    replica=replica.name,
                    index=slot,
                    file=f"{layout.STORE_DIR}/{name}",
                    position=int(record["position"]),
                )
                rows.append(row)
    return rows


def _windows(
    replica: layout.Replica, files: parse.Files, slots: np.ndarray, records: np.ndarray
) -> Iterator[tuple[np.ndarray, np.ndarray, str, int, bytes]]:
    """Runs of entries in one segment spanning at most WINDOW_BYTES_MAX plus one entry, each
    with the bytes from its first entry's position to its last entry's end."""
    start = 0
    n = len(slots)
    positions = records["position"].astype(np.int64)
    ends = positions + records["size"].astype(np.int64)
    while start < n:
        segment = replica.segment_of(int(positions[start]))
        stop = start + 1
        while (
            stop < n
            and replica.segment_of(int(positions[stop])) == segment
            and positions[stop] >= positions[stop - 1]
            and ends[stop] - positions[start] <= parse.WINDOW_BYTES_MAX
        ):
            stop += 1
        name = "data/" + formats.file_name(segment)
        lo, hi = int(positions[start]), int(ends[start:stop].max())
        if files.exists(name):
            try:
                data = files.read(name, lo - segment, hi - lo).tobytes()
            except OSError:
                data = b""  # the log's checks report an unreadable segment
            yield slots[start:stop], records[start:stop], name, lo, data
        start = stop


def _sound(entry: bytes, slot: int, position: int) -> bool:
    header = np.frombuffer(entry[: formats.ENTRY_HEADER_BYTES], dtype=formats.ENTRY_HEADER)[0]
    return bool(
        header["magic"] == formats.ENTRY_MAGIC
        and header["size"] == len(entry)
        and header["index"] == slot
        and header["position"] == position
        and header["header_crc"] == isal_zlib.crc32(entry[: formats.ENTRY_HEADER_CRC_BYTES])
        and header["body_crc"] == isal_zlib.crc32(entry[formats.ENTRY_HEADER_BYTES :])
    )


def _message_row(body: bytes) -> dict[str, Any] | None:
    kind = bf.body_kind(body)
    if kind == bf.BODY_KIND_META:
        return None
    row: dict[str, Any] = {"body_kind": kind}
    if kind == bf.BODY_KIND_OTHER:
        return row
    try:
        m = bf.read_message(body)
    except bf.BadRecord as err:
        row.update(body_kind="bad", detail=str(err))
        return row
    uniq = m.prop(b"UNIQ_KEY")
    row.update(
        topic=m.topic,
        queue_id=m.queue_id,
        queue_offset=m.queue_offset,
        physical_offset=m.physical_offset,
        store_size=m.store_size,
        sys_flag=m.sys_flag,
        store_ts=m.store_timestamp_ms,
        tag_hash=m.tag_hash(),
        key_hashes=[bf.index_key_hash(k) for k in m.index_keys()],
        offset_msg_id=m.offset_msg_id,
        uniq_key=None if uniq is None else uniq.decode(errors="replace"),
        body_digest=m.body_digest(),
    )
    return row


# --- ConsumeQueue units ----------------------------------------------------------------------


def queue_units(spark: SparkSession, stores: Sequence[broker_layout.BrokerStore]) -> DataFrame:
    """UNIT_SCHEMA rows of every ConsumeQueue file, one task per file, packed."""
    tasks = [
        (s.replica.group, s.replica.name, k) for s in stores for k in range(len(s.queue_files))
    ]
    if not tasks:
        return frames.empty(spark, UNIT_SCHEMA)
    schema = pa.schema([("group", pa.string()), ("replica", pa.string()), ("k", pa.int64())])
    body = functools.partial(_unit_tasks, {s.key: s for s in stores})
    packs = read.pack(
        [
            s.queue_files[k].bytes // bf.CQ_UNIT_BYTES
            for s in stores
            for k in range(len(s.queue_files))
        ],
        spark.sparkContext.defaultParallelism,
    )
    return frames.map_tasks(spark, tasks, schema, body, UNIT_SCHEMA, packs=packs)


def _unit_tasks(
    stores: dict[tuple[str, str], broker_layout.BrokerStore], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        for task in batch.to_pylist():
            store = stores[(task["group"], task["replica"])]
            with StoreFiles(store) as files:
                yield from unit_batches(store, files, store.queue_files[task["k"]])


def unit_batches(
    store: broker_layout.BrokerStore, files: StoreFiles, qf: broker_layout.QueueFile
) -> Iterator[pa.RecordBatch]:
    """The units of one ConsumeQueue file that are not all zeros, CQ_CHUNK_UNITS at a time."""
    fixed = {
        "group": store.replica.group,
        "replica": store.replica.name,
        "topic": qf.topic,
        "queue_id": qf.queue_id,
        "file": qf.name,
    }
    units_total = qf.bytes // bf.CQ_UNIT_BYTES
    for first in range(0, units_total, CQ_CHUNK_UNITS):
        n = min(CQ_CHUNK_UNITS, units_total - first)
        try:
            raw = files.read(qf.name, first * bf.CQ_UNIT_BYTES, n * bf.CQ_UNIT_BYTES, qf.bytes)
        except OSError as err:
            row = {**fixed, "io_error": f"{store.path(qf.name)}: {err}"}
            yield pa.RecordBatch.from_pylist([row], schema=UNIT_SCHEMA)
            return
        matrix = np.frombuffer(raw, dtype=np.uint8).reshape(n, bf.CQ_UNIT_BYTES)
        present = np.flatnonzero(matrix.any(axis=1))
        units = np.frombuffer(raw, dtype=bf.CQ_UNIT)[present]
        k = len(present)
        columns = {
            **{name: pa.array([value] * k) for name, value in fixed.items()},
            "file_position": pa.array((first + present) * bf.CQ_UNIT_BYTES, pa.int64()),
            "queue_offset": pa.array(qf.first_unit + first + present, pa.int64()),
            "unit_physical_offset": pa.array(units["physical_offset"].astype(np.int64)),
            "unit_size": pa.array(units["size"].astype(np.int64)),
            "unit_tag_hash": pa.array(units["tag_hash"].astype(np.int64)),
            "io_error": pa.nulls(k, pa.string()),
        }
        yield pa.RecordBatch.from_pydict(columns, schema=UNIT_SCHEMA)


# --- IndexFiles ------------------------------------------------------------------------------


@attrs.frozen
class IndexGeometry:
    slots: int = bf.INDEX_SLOTS_DEFAULT
    items: int = bf.INDEX_ITEMS_DEFAULT

    @property
    def file_bytes(self) -> int:
        return bf.index_file_bytes(self.slots, self.items)


INFER_FILE_BYTES_MAX = 16 * formats.MiB  # IndexFiles up to this size are read whole to infer


def infer_geometry(stores: Sequence[broker_layout.BrokerStore]) -> IndexGeometry | None:
    """The slot and item counts of the stores' IndexFiles, which no file records (driver side):
    RocketMQ's defaults when the files have their size, else found from the most common file
    size and a file holding at least two items, read whole: the one slot count for which item
    1 is the header's first message (no previous item) and the last item its last. None when
    no file tells (too large, too few items, or more than one count fits)."""
    sizes: dict[int, int] = {}
    for s in stores:
        for f in s.index_files:
            sizes[f.bytes] = sizes.get(f.bytes, 0) + 1
    if not sizes:
        return IndexGeometry()
    size = max(sizes, key=lambda b: (sizes[b], b))
    if size == IndexGeometry().file_bytes:
        return IndexGeometry()
    if size > INFER_FILE_BYTES_MAX:
        return None
    for s in stores:
        for f in s.index_files:
            if f.bytes != size:
                continue
            with StoreFiles(s) as files:
                try:
                    data = files.read(f.name, 0, size, size)
                except OSError:
                    continue
            found = _geometries_fitting(data)
            if len(found) == 1:
                return found[0]
    return None


def _geometries_fitting(data: bytes) -> list[IndexGeometry]:
    header = bf.IndexHeader.decode(data)
    n = header.index_count
    size = len(data)
    if n < 2:
        return []
    slots = np.arange(1, (size - bf.INDEX_HEADER_BYTES) // 4 + 1, dtype=np.int64)
    rest = size - bf.INDEX_HEADER_BYTES - 4 * slots
    items = rest // bf.INDEX_ITEM_BYTES
    fits = (rest % bf.INDEX_ITEM_BYTES == 0) & (items >= n)
    slots, items = slots[fits], items[fits]
    raw = np.frombuffer(data, dtype=np.uint8)

    def field(at: np.ndarray, width: int) -> np.ndarray:
        cols = raw[at[:, None] + np.arange(width)].astype(np.int64)
        value = np.zeros(len(at), dtype=np.int64)
        for k in range(width):
            value = (value << 8) | cols[:, k]
        return value

    # narrowed one field at a time: the candidates' bytes are gathered only where still fitting
    items_at = bf.INDEX_HEADER_BYTES + 4 * slots
    keep = field(items_at + bf.INDEX_ITEM_BYTES + 16, 4) == 0  # item 1 has no previous item
    slots, items, items_at = slots[keep], items[keep], items_at[keep]
    keep = field(items_at + bf.INDEX_ITEM_BYTES + 4, 8) == header.begin_phy_offset
    slots, items, items_at = slots[keep], items[keep], items_at[keep]
    ok = field(items_at + bf.INDEX_ITEM_BYTES * (n - 1) + 4, 8) == header.end_phy_offset
    return [IndexGeometry(int(a), int(b)) for a, b in zip(slots[ok], items[ok], strict=True)]


def index_rows(
    spark: SparkSession,
    stores: Sequence[broker_layout.BrokerStore],
    geometry: IndexGeometry,
    hashed: Mapping[tuple[str, str, str], int],
) -> DataFrame:
    """INDEX_SCHEMA rows of every IndexFile of the right size, one task per file. `hashed`:
    (group, replica, file) -> how many items its digest row covers (the fewest any replica
    holding that file has), so the digests of replicas at different points compare."""
    tasks = [
        (s.replica.group, s.replica.name, k)
        for s in stores
        for k, f in enumerate(s.index_files)
        if f.bytes == geometry.file_bytes
    ]
    if not tasks:
        return frames.empty(spark, INDEX_SCHEMA)
    schema = pa.schema([("group", pa.string()), ("replica", pa.string()), ("k", pa.int64())])
    body = functools.partial(_index_tasks, {s.key: s for s in stores}, geometry, dict(hashed))
    return frames.map_tasks(spark, tasks, schema, body, INDEX_SCHEMA)


def read_index_header(store: broker_layout.BrokerStore, f: layout.DataFile) -> bf.IndexHeader:
    """The 40-byte header of one IndexFile (driver side); raises OSError."""
    with StoreFiles(store) as files:
        return bf.IndexHeader.decode(files.read(f.name, 0, bf.INDEX_HEADER_BYTES, f.bytes))


def _index_tasks(
    stores: dict[tuple[str, str], broker_layout.BrokerStore],
    geometry: IndexGeometry,
    hashed: dict[tuple[str, str, str], int],
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        for task in batch.to_pylist():
            store = stores[(task["group"], task["replica"])]
            f = store.index_files[task["k"]]
            with StoreFiles(store) as files:
                rows = index_file_rows(
                    store, files, f, geometry, hashed.get((*store.key, f.name), 0)
                )
                for chunk in rows:
                    yield pa.RecordBatch.from_pylist(chunk, schema=INDEX_SCHEMA)


def index_file_rows(
    store: broker_layout.BrokerStore,
    files: StoreFiles,
    f: layout.DataFile,
    geometry: IndexGeometry,
    items_hashed: int,
) -> Iterator[list[dict[str, Any]]]:
    """Lists of rows of one IndexFile: its non-zero slots, its used items (1 .. index_count-1),
    then its digest row."""
    base = {"group": store.replica.group, "replica": store.replica.name, "file": f.name}
    try:
        header_bytes = files.read(f.name, 0, bf.INDEX_HEADER_BYTES, f.bytes)
        header = bf.IndexHeader.decode(header_bytes)
        file_hash = hashlib.sha256(header_bytes)
        for first in range(0, geometry.slots, INDEX_CHUNK_SLOTS):
            n = min(INDEX_CHUNK_SLOTS, geometry.slots - first)
            at = bf.INDEX_HEADER_BYTES + 4 * first
            raw = files.read(f.name, at, 4 * n, f.bytes)
            file_hash.update(raw)
            heads = np.frombuffer(raw, dtype=bf.INDEX_SLOT)
            used = np.flatnonzero(heads)
            yield [
                {
                    **base,
                    "what": "slot",
                    "number": first + int(s),
                    "file_position": at + 4 * int(s),
                    "head": int(heads[s]),
                }
                for s in used
            ]
        items_at = bf.INDEX_HEADER_BYTES + 4 * geometry.slots
        count = min(max(header.index_count, 1), geometry.items)
        items_hash = hashlib.sha256()
        for first in range(1, count, INDEX_CHUNK_ITEMS):
            n = min(INDEX_CHUNK_ITEMS, count - first)
            at = items_at + bf.INDEX_ITEM_BYTES * first
            raw = files.read(f.name, at, bf.INDEX_ITEM_BYTES * n, f.bytes)
            file_hash.update(raw)
            hashed_here = max(0, min(n, items_hashed - first))
            items_hash.update(raw[: bf.INDEX_ITEM_BYTES * hashed_here])
            items = np.frombuffer(raw, dtype=bf.INDEX_ITEM)
            key_hash = items["key_hash"].astype(np.int64)
            yield [
                {
                    **base,
                    "what": "item",
                    "number": first + k,
                    "file_position": at + 20 * k,
                    "key_hash": int(key_hash[k]),
                    "slot": int(key_hash[k] % geometry.slots),
                    "phy_offset": int(items["phy_offset"][k]),
                    "time_diff": int(items["time_diff"][k]),
                    "prev_index": int(items["prev_index"][k]),
                }
                for k in range(n)
            ]
    except OSError as err:
        yield [{**base, "what": "error", "detail": f"{store.path(f.name)}: {err}"}]
        return
    yield [
        {
            **base,
            "what": "digest",
            "items_digest": items_hash.digest(),
            "items_hashed": max(0, min(items_hashed, count) - 1) if items_hashed else 0,
            "file_digest": file_hash.digest() if header.index_count == items_hashed else None,
        }
    ]
