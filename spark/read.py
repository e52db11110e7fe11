"""Read every replica's index and data files into one DataFrame of entries, in bounded tasks.

Planning (driver). The index files are fixed-size arrays of 32-byte records, one slot per
index, so the driver cuts each replica's index into ranges of at most TASK_RECORDS_MAX slots
without reading any data: a task is (group, replica, first slot, end slot). No task is a
whole segment; a segment of any size is covered by as many tasks as its entries need.

Reading (executor). A task walks its range in chunks of CHUNK_RECORDS_MAX slots. For a chunk
it reads the index records (one read), then the data bytes the records point at, in windows
of at most WINDOW_BYTES_MAX plus one entry, and parses all headers of a window at once with
numpy (fancy indexing builds an n x 44 byte matrix, viewed as the header dtype; the header CRC
runs as a table-driven CRC over the 40 columns). Body CRCs are zlib.crc32 per entry. Memory
per task is therefore bounded by the chunk and window sizes, whatever the segment size.

The reader does not judge: it reports what the index record says (rec_*), what the data holds
where the record points (magic .. body_crc, header_ok, body_ok), the 8 bytes that follow the
entry (after_*: the next entry's magic and size, a blank record, or 0 = end of data), and the
same facts for the slot before (prev_*), so that checks of order and positions need no
shuffle. The slot before a chunk is read again for that purpose. spark/checks.py judges.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence

import attrs
import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from spark import formats, frames, history, layout, parse

TASK_RECORDS_MAX = 1 << 18  # slots per Spark task: ~256 MiB of 1 KiB entries, 8 MiB of index
CHUNK_RECORDS_MAX = 1 << 14  # slots parsed at once in a task: bounds the arrays of one batch
assert CHUNK_RECORDS_MAX <= TASK_RECORDS_MAX

TASK_SCHEMA = pa.schema(
    [("group", pa.string()), ("replica", pa.string()), ("lo", pa.int64()), ("hi", pa.int64())]
)

ENTRY_SCHEMA = pa.schema(
    [
        ("group", pa.string()),
        ("replica", pa.string()),
        ("index", pa.int64()),  # the slot: the index this record and entry should have
        ("index_file", pa.string()),  # e.g. "index/00000000000000000001"
        ("rec_position", pa.int64()),
        ("rec_index", pa.int64()),
        ("rec_term", pa.int64()),
        ("rec_size", pa.int64()),
        ("rec_kind", pa.int32()),
        ("file", pa.string()),  # the segment rec_position falls in, e.g. "data/000...0"
        ("file_bytes", pa.int64()),  # that file's length (0: missing); a cut one is shorter
        ("position", pa.int64()),  # where the header was read: rec_position
        ("defect", pa.string()),  # null, or why no header could be read there
        ("io_error", pa.string()),  # null, or the OS error reading the file (input unreadable)
        ("magic", pa.int64()),
        ("size", pa.int64()),
        ("h_index", pa.int64()),
        ("term", pa.int64()),
        ("h_position", pa.int64()),
        ("kind", pa.int32()),
        ("body_crc", pa.int64()),
        ("body_digest", pa.binary()),  # SHA-256 of the body, computed here; null: no header
        ("header_ok", pa.bool_()),  # magic, header CRC and size bounds hold
        ("body_ok", pa.bool_()),  # body CRC holds; null when the header is not ok
        ("after_magic", pa.int64()),  # the 4+4 bytes after the entry; null at a segment's end
        ("after_size", pa.int64()),
        ("prev_end", pa.int64()),  # slot index-1, if written and its header ok: its end
        ("prev_term", pa.int64()),
        ("prev_after_magic", pa.int64()),
        ("prev_after_size", pa.int64()),
    ]
)


@attrs.frozen
class ReadTask:
    group: str
    replica: str
    lo: int  # first slot (index) of the task
    hi: int  # one past the last slot


def slot_end(replica: layout.Replica) -> int:
    """One past the last index slot of the replica's index files (its written slots lie below)."""
    if not replica.index_files:
        return replica.start_index
    last = replica.index_files[-1]
    slots = min(last.bytes // formats.INDEX_RECORD_BYTES, replica.index_records_per_file)
    return last.first + slots


def plan(
    replicas: Sequence[layout.Replica],
    ranges: Mapping[tuple[str, str], Sequence[tuple[int, int]]] | None = None,
) -> list[ReadTask]:
    """Cut every replica's index slots, from its first retained index to the end of its last
    index file, into ranges of at most TASK_RECORDS_MAX (a range may span index files).
    With `ranges` ((group, replica) -> sorted, disjoint [lo, hi) slot ranges), only those
    slots are read: a replica not named there is not read at all."""
    tasks = []
    for replica in replicas:
        lo_all, hi_all = replica.start_index, slot_end(replica)
        wanted = [(lo_all, hi_all)] if ranges is None else ranges.get(replica.key, ())
        for lo, hi in wanted:
            lo, hi = max(lo, lo_all), min(hi, hi_all)
            for first in range(lo, hi, TASK_RECORDS_MAX):
                end = min(hi, first + TASK_RECORDS_MAX)
                tasks.append(ReadTask(replica.group, replica.name, first, end))
    return tasks


def read_tasks(
    replicas: dict[tuple[str, str], layout.Replica], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: for each task row, the entry rows of its slot range."""
    for batch in batches:
        for task in batch.to_pylist():
            replica = replicas[(task["group"], task["replica"])]
            with parse.Files(replica) as files:
                for lo in range(task["lo"], task["hi"], CHUNK_RECORDS_MAX):
                    hi = min(task["hi"], lo + CHUNK_RECORDS_MAX)
                    yield read_chunk(replica, files, lo, hi)


@attrs.frozen
class ChunkFacts:
    """What one replica's index and data say about the written slots of [lo, hi), and the
    slot before lo: numpy arrays, one element per written slot, sorted by slot."""

    lo: int
    slots: np.ndarray  # int64: the written slots (index record size != 0)
    records: np.ndarray  # formats.INDEX_RECORD: their index records
    data: parse.Entries  # what the data holds where each record points
    has_prev: np.ndarray  # bool: slot-1 is the row before and sound where its record says


def chunk_facts(replica: layout.Replica, files: parse.Files, lo: int, hi: int) -> ChunkFacts:
    """Read the index records and entries of the written slots in [lo, hi), and of the slot
    before lo (so that the first row, too, has the facts of the slot before it)."""
    first = max(lo - 1, replica.start_index)  # the slot before lo, for prev_*
    records = files.index_records(first, hi)
    slots = np.arange(first, hi, dtype=np.int64)
    written = records["size"] != 0
    slots, records = slots[written], records[written]
    data = parse.read_entries(replica, files, records["position"], records["size"])
    # prev_* are facts about entry index-1 only where it was found where its record says
    has_prev = np.zeros(len(slots), dtype=bool)
    has_prev[1:] = (
        (slots[1:] - slots[:-1] == 1)
        & data.header_ok[:-1]
        & (data.index[:-1] == slots[:-1])
        & (data.position[:-1] == records["position"][:-1])
    )
    return ChunkFacts(lo, slots, records, data, has_prev)


def read_chunk(replica: layout.Replica, files: parse.Files, lo: int, hi: int) -> pa.RecordBatch:
    """Entry rows for the written slots in [lo, hi), with the facts of each slot before."""
    return entry_batch(replica, chunk_facts(replica, files, lo, hi))


def entry_batch(replica: layout.Replica, facts: ChunkFacts) -> pa.RecordBatch:
    """ENTRY_SCHEMA rows of a chunk's facts, without the slot before the chunk."""
    slots, records, data, has_prev = facts.slots, facts.records, facts.data, facts.has_prev

    def shifted(values: np.ndarray, missing: np.ndarray | None = None) -> pa.Array:
        """values of the slot before each row; null where that slot is not the row before."""
        out = np.zeros(len(values), dtype=np.int64)
        out[1:] = values[:-1]
        mask = ~has_prev
        if missing is not None:
            mask[1:] |= missing[:-1]
        return pa.array(out, mask=mask)

    after_missing = data.after_magic < 0
    n_per_file = replica.index_records_per_file
    index_firsts, index_file_of = np.unique((slots - 1) // n_per_file, return_inverse=True)
    index_names = ["index/" + formats.file_name(int(k) * n_per_file + 1) for k in index_firsts]
    n = len(slots)
    columns = {
        "group": _repeated(replica.group, n),
        "replica": _repeated(replica.name, n),
        "index": pa.array(slots),
        "index_file": _strings(index_names, index_file_of),
        "rec_position": pa.array(records["position"].astype(np.int64)),
        "rec_index": pa.array(records["index"].astype(np.int64)),
        "rec_term": pa.array(records["term"].astype(np.int64)),
        "rec_size": pa.array(records["size"].astype(np.int64)),
        "rec_kind": pa.array(records["kind"].astype(np.int32)),
        "file": _strings(data.file_names, data.file_of),
        "file_bytes": pa.array(data.file_bytes),
        "position": pa.array(records["position"].astype(np.int64)),
        "defect": _optional_strings(data.defect),
        "io_error": _optional_strings(data.io_error),
        "magic": pa.array(data.magic, mask=data.no_header),
        "size": pa.array(data.size, mask=data.no_header),
        "h_index": pa.array(data.index, mask=data.no_header),
        "term": pa.array(data.term, mask=data.no_header),
        "h_position": pa.array(data.position, mask=data.no_header),
        "kind": pa.array(data.kind, mask=data.no_header),
        "body_crc": pa.array(data.body_crc, mask=data.no_header),
        "body_digest": digest_array(data.digest, data.no_header),
        "header_ok": pa.array(data.header_ok),
        "body_ok": pa.array(data.body_ok, mask=~data.header_ok),
        "after_magic": pa.array(data.after_magic, mask=after_missing),
        "after_size": pa.array(data.after_size, mask=after_missing),
        "prev_end": shifted(records["position"].astype(np.int64) + data.size),
        "prev_term": shifted(data.term),
        "prev_after_magic": shifted(data.after_magic, after_missing),
        "prev_after_size": shifted(data.after_size, after_missing),
    }
    batch = pa.RecordBatch.from_pydict(columns, schema=ENTRY_SCHEMA)
    # drop the slot before lo (it belongs to the previous chunk): slots are sorted
    return batch.slice(int(np.searchsorted(slots, facts.lo)))


def digest_array(digests: np.ndarray, missing: np.ndarray) -> pa.Array:
    """An n x DIGEST_BYTES matrix as a binary column, null where `missing`, without a
    Python object per row."""
    n, width = digests.shape
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    valid = pa.array(~missing).buffers()[1] if missing.any() else None
    return pa.Array.from_buffers(
        pa.binary(),
        n,
        [valid, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(digests))],
        null_count=int(missing.sum()),
    )


def _strings(names: list[str], of: np.ndarray) -> pa.Array:
    """names[of[i]] for every i, built from the few distinct names."""
    return pa.array(names, pa.string()).take(pa.array(of.astype(np.int32, copy=False)))


def _repeated(name: str, n: int) -> pa.Array:
    return _strings([name], np.zeros(n, dtype=np.int32))


def _optional_strings(values: list[str | None]) -> pa.Array:
    if all(value is None for value in values):
        return pa.nulls(len(values), pa.string())
    return pa.array(values, pa.string())


def entries(
    spark: SparkSession,
    replicas: Sequence[layout.Replica],
    ranges: Mapping[tuple[str, str], Sequence[tuple[int, int]]] | None = None,
) -> DataFrame:
    """One row per written index slot of every replica (ENTRY_SCHEMA), one task per range;
    with `ranges`, of those slot ranges only (see plan)."""
    tasks = [attrs.astuple(task) for task in plan(replicas, ranges)]
    if not tasks:  # known empty when planned: the optimizer prunes what joins with it
        return frames.empty(spark, ENTRY_SCHEMA)
    by_name = {r.key: r for r in replicas}
    body = functools.partial(read_tasks, by_name)
    packs = pack([t[3] - t[2] for t in tasks], spark.sparkContext.defaultParallelism)
    return frames.map_tasks(spark, tasks, TASK_SCHEMA, body, ENTRY_SCHEMA, packs=packs)


def pack(slots: Sequence[int], parallelism: int) -> list[list[int]]:
    """The read tasks (their slot counts, in plan order) packed into Spark tasks: runs of
    consecutive tasks of at most min(TASK_RECORDS_MAX, all slots / parallelism) slots, so
    there are at least `parallelism` packs where there are as many tasks, and none holds more
    than TASK_RECORDS_MAX slots unless one task does. Large tasks keep a Spark task each; the
    small ranges of a store with a few broken chunks on many replicas share a few, and every
    scan of the cached entries (each check's) then runs a few Spark tasks, not one per range
    (docs/decisions.md)."""
    limit = min(TASK_RECORDS_MAX, -(-sum(slots) // max(1, parallelism)))
    packs: list[list[int]] = []
    held = limit  # slots in the last pack: none yet, so the first task starts one
    for k, n in enumerate(slots):
        if held + n > limit:
            packs.append([])
            held = 0
        packs[-1].append(k)
        held += n
    return packs


HEAD_SCHEMA = pa.schema(
    [
        ("group", pa.string()),
        ("index", pa.int64()),
        ("replica", pa.string()),
        ("head", pa.string()),  # the body's first bytes, escaped (history.escaped_head)
    ]
)


def body_heads(
    spark: SparkSession, replicas: Sequence[layout.Replica], wanted: DataFrame
) -> DataFrame:
    """The first bytes of the bodies named by `wanted` (group, replica, index, file, position,
    size), escaped, for findings that show what a log holds (a missing acknowledged append).
    One read per entry: only for the few entries a finding names."""
    by_name = {r.key: r for r in replicas}
    columns = wanted.select("group", "replica", "index", "file", "position", "size")
    return columns.mapInArrow(
        functools.partial(read_heads, by_name), from_arrow_schema(HEAD_SCHEMA)
    )


def read_heads(
    replicas: dict[tuple[str, str], layout.Replica], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """mapInArrow body of body_heads()."""
    for batch in batches:
        rows = []
        for row in batch.to_pylist():
            replica = replicas[(row["group"], row["replica"])]
            body_bytes = row["size"] - formats.ENTRY_HEADER_BYTES
            with parse.Files(replica) as files:
                segment_at = row["position"] - replica.segment_of(row["position"])
                head = files.read(
                    row["file"],
                    segment_at + formats.ENTRY_HEADER_BYTES,
                    min(body_bytes, history.HEAD_BYTES + 1),
                ).tobytes()
            shown = history.escaped_head(head[: history.HEAD_BYTES])
            if body_bytes > history.HEAD_BYTES:
                shown += "..."
            rows.append(
                {"group": row["group"], "index": row["index"], "replica": row["replica"],
                 "head": shown}
            )  # fmt: skip
        yield pa.RecordBatch.from_pylist(rows, schema=HEAD_SCHEMA)
