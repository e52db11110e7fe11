"""The audit's first pass: which chunks of a group's log are plainly healthy, so that the checks
need not see their entries one by one.

A chunk is 2^chunk_bits consecutive indexes of one group, aligned (chunk k holds indexes
[k << bits, (k + 1) << bits)), read on every replica of the group side by side in one task. It
is *plain* when it has the textbook shape of a healthy replicated log, a condition chosen to be
simple and strict rather than complete:

  - every replica holds either nothing of the chunk, or every slot from its first retained
    index (or the chunk's start) to the chunk's end, and also the slot after the chunk (so no
    replica's last entry, whose trailing bytes a check reads, lies in a plain chunk);
  - every entry held is sound where its index record points (magic, both CRCs, size, kind, its
    own index and position in the header), its record agrees with the header, it starts where
    the entry before it ends (no blank record, no segment change inside or at the start of the
    chunk), its term is not below the term before, and it is at or below its replica's own
    commit index;
  - every replica holding an index holds the same term, size and body (SHA-256) there, and a quorum
    of the group holds or has retained away every index of the chunk.

On a plain chunk no check can find anything (each rule of spark/checks.py and
spark/agreement.py is false on every row of it), so the job reads in detail only the other
chunks, and takes from this pass what the checks need of the plain ones: per replica the rows,
index range and bytes (for replica_spans), and per bucket the count of committed entries (for
agreement.bucket_summary; chunks are whole buckets, so a bucket is either all plain or all read
in detail). A healthy store is thus checked with no per-entry row ever reaching the JVM; a
broken one is checked exactly as before, in the chunks where it is broken. tests/spark/
test_screen.py holds the job's findings with and without this pass equal on every fault.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence

import attrs
import numpy as np
import pyarrow as pa
from pyspark import Broadcast
from pyspark.sql import DataFrame, SparkSession

from spark import formats, frames, layout, parse, read
from spark.history import AckedDigests

CHUNK_BITS_DEFAULT = 12  # 4096 indexes: agreement.BUCKET_BITS, and ~4 MiB of 1 KiB entries
TASK_CHUNKS_MAX = 32  # chunks per screening task (of all replicas of a group)

TASK_SCHEMA = pa.schema([("group", pa.string()), ("lo", pa.int64()), ("hi", pa.int64())])
CHUNK_SCHEMA = pa.schema(
    [
        ("group", pa.string()),
        ("replica", pa.string()),
        ("lo", pa.int64()),  # the chunk: indexes [lo, hi)
        ("hi", pa.int64()),
        ("plain", pa.bool_()),  # the same on every replica's row of a chunk
        ("error", pa.string()),  # null, or the OS error that stopped the screening of it
        ("rows", pa.int64()),  # written slots of this replica in the chunk
        ("first_index", pa.int64()),  # the lowest and highest of them; null when none
        ("last_index", pa.int64()),
        ("bytes", pa.int64()),  # sum of the entry sizes read there (0 where no header)
    ]
)


@attrs.frozen
class ScreenTask:
    group: str
    lo: int  # chunk-aligned, except a group's first task, which starts at its first index
    hi: int


def plan(replicas: Sequence[layout.Replica], chunk_bits: int) -> list[ScreenTask]:
    """Per group, its index slots from the lowest first retained index to the highest end of
    index files, cut at chunk boundaries into tasks of at most TASK_CHUNKS_MAX chunks."""
    width = 1 << chunk_bits
    step = width * TASK_CHUNKS_MAX
    tasks = []
    for group in sorted({r.group for r in replicas}):
        members = [r for r in replicas if r.group == group]
        lo = min(r.start_index for r in members)
        hi = max(read.slot_end(r) for r in members)
        at = lo
        while at < hi:
            end = min(hi, (at // step + 1) * step)
            tasks.append(ScreenTask(group, at, end))
            at = end
    return tasks


@attrs.frozen
class Held:
    """One replica's part of a chunk, as far as the group-wide conditions need it."""

    shape_ok: bool  # the per-replica conditions hold
    rows: int
    first_index: int | None
    last_index: int | None
    bytes: int
    term: np.ndarray  # of the rows, by slot from first_index
    size: np.ndarray
    digest: np.ndarray  # n x parse.DIGEST_BYTES: SHA-256 of each body

    @classmethod
    def nothing(cls, shape_ok: bool) -> Held:
        """A replica holding nothing of the chunk (or, not shape_ok, not known to)."""
        none = np.zeros(0, np.int64)
        digests = np.zeros((0, parse.DIGEST_BYTES), np.uint8)
        return cls(shape_ok, 0, None, None, 0, none, none, digests)


def group_commit(members: Sequence[layout.Replica]) -> int:
    """A group's commit index as the screen sees it: the highest its replicas' checkpoints
    record (a history's acknowledgements raise it: job.py passes the raised ones in)."""
    return max(r.commit_index for r in members)


def chunk_ranges(lo: int, hi: int, chunk_bits: int) -> Iterator[tuple[int, int, int]]:
    """(lo, hi, bucket_end) of the chunks of [lo, hi): cut at multiples of 2^chunk_bits, each
    with the last index of the aligned bucket it lies in."""
    width = 1 << chunk_bits
    while lo < hi:
        bucket_end = (lo // width + 1) * width - 1
        end = min(hi, bucket_end + 1)
        yield lo, end, bucket_end
        lo = end


def judge_replica(
    replica: layout.Replica, facts: read.ChunkFacts, hi: int, next_written: bool
) -> Held:
    """The per-replica conditions of a plain chunk (module docstring) on one replica's facts
    of the chunk [facts.lo, hi); `next_written`: the replica has a record for slot hi."""
    lo = facts.lo
    k = int(np.searchsorted(facts.slots, lo))  # rows before k: the slot before the chunk
    slots = facts.slots[k:]
    rec, data = facts.records, facts.data
    n = len(slots)
    size = data.size[k:]
    held = Held(
        shape_ok=n == 0,
        rows=n,
        first_index=int(slots[0]) if n else None,
        last_index=int(slots[-1]) if n else None,
        bytes=int(size.sum()),
        term=data.term[k:],
        size=size,
        digest=data.digest[k:],
    )
    if n == 0:
        return held
    first = max(lo, replica.start_index)
    position = rec["position"].astype(np.int64)
    sound = (
        data.header_ok[k:].all()
        and data.body_ok[k:].all()
        and (data.index[k:] == slots).all()
        and (rec["index"][k:].astype(np.int64) == slots).all()
        and (data.position[k:] == position[k:]).all()
        and (rec["term"][k:].astype(np.int64) == data.term[k:]).all()
        and (rec["size"][k:].astype(np.int64) == size).all()
        and (rec["kind"][k:].astype(np.int32) == data.kind[k:]).all()
        and np.isin(data.kind[k:], formats.ENTRY_KINDS).all()
    )
    contiguous = int(slots[0]) == first and int(slots[-1]) - first + 1 == n
    # each entry starts where the one before ends, or past a blank record at the next segment;
    # the first one against the slot before the chunk (the row before, and sound) or the log's
    # start; terms never fall
    follows = _follow(replica, data, position, k).all() and bool(
        (np.diff(data.term[k:]) >= 0).all()
    )
    if first == replica.start_index:
        joins = (
            int(position[k]) == replica.start_position
            and int(data.term[k]) >= replica.start_prev_term
        )
    else:
        joins = (
            k == 1
            and bool(facts.has_prev[k])
            and bool(_follow(replica, data, position, 0)[0])
            and int(data.term[k]) >= int(data.term[k - 1])
        )
    # where the replica's log ends in this chunk, only zeros or a blank record follow
    ends = not (int(slots[-1]) == hi - 1 and next_written)
    clean_end = not ends or int(data.after_magic[-1]) in (
        -1,
        formats.END_MAGIC,
        formats.BLANK_MAGIC,
    )
    committed = int(slots[-1]) <= replica.commit_index
    shape_ok = bool(sound and contiguous and follows and joins and clean_end and committed)
    return attrs.evolve(held, shape_ok=shape_ok)


def _follow(
    replica: layout.Replica, data: parse.Entries, position: np.ndarray, k: int
) -> np.ndarray:
    """For each pair (i-1, i) with i >= k + 1: entry i starts where entry i-1 ends (in the same
    segment, or at the next one when i-1 ends a segment), or right after a blank record that
    fills the rest of i-1's segment (checks.position_break_rule's expectations)."""
    seg = replica.segment_bytes
    end = position[k:-1] + data.size[k:-1]
    left = seg - end % seg
    blank = data.after_magic[k:-1] == formats.BLANK_MAGIC
    after = data.after_size[k:-1]
    past_blank = (
        (after == left) & (after >= formats.BLANK_BYTES_MIN) & (position[k + 1 :] == end + left)
    )
    return np.where(blank, past_blank, position[k + 1 :] == end)


def judge_group(
    replicas: Sequence[layout.Replica],
    helds: Sequence[Held],
    lo: int,
    hi: int,
    bucket_end: int,
    group_commit: int,
    acks: tuple[np.ndarray, np.ndarray] | None = None,
) -> bool:
    """The chunk [lo, hi), all of the bucket ending at `bucket_end` that the group's logs
    reach, is plain: every replica's part is (judge_replica), the holders of each index agree
    on it, a quorum of the replicas hold or have retained away every index of it up to the
    group commit (agreement.under_replicated's per-bucket test, which must pass here), and
    every acknowledged append of the chunk (`acks`: indexes, SHA-256 of the values) has its
    value's digest as the digest of the body its holders hold (agreement.missing_appends)."""
    if not all(h.shape_ok for h in helds):
        return False
    acked = acks is not None and len(acks[0]) > 0
    if all(h.first_index is None for h in helds):
        return not acked  # no entry anywhere: nothing for a check to see, in either pass
    width = hi - lo
    seen = np.zeros(width, dtype=bool)  # a holder's values are in `reference`
    reference = np.zeros((2, width), dtype=np.int64)  # term, size per index
    digests = np.zeros((width, parse.DIGEST_BYTES), dtype=np.uint8)  # SHA-256 of the body
    for held in helds:
        if held.first_index is None:
            continue
        at = held.first_index - lo
        span = slice(at, at + held.rows)
        values = np.stack([held.term, held.size])
        new = ~seen[span]
        reference[:, span][:, new] = values[:, new]
        digests[span][new] = held.digest[new]
        if (reference[:, span] != values).any() or (digests[span] != held.digest).any():
            return False
        seen[span] = True
    if acks is not None and acked:
        where = acks[0] - lo
        if not (seen[where].all() and (digests[where] == acks[1]).all()):
            return False
    b_lo, b_hi = lo, min(group_commit, bucket_end)
    if b_hi < b_lo:
        return True  # nothing committed here: no quorum to hold
    full = 0
    for replica, held in zip(replicas, helds, strict=True):
        holds = 0
        if held.first_index is not None and held.last_index is not None:
            holds = max(0, min(held.last_index, b_hi) - max(held.first_index, b_lo) + 1)
        retained = max(0, min(replica.start_index, b_hi + 1) - b_lo)
        full += holds + retained >= b_hi - b_lo + 1
    return full >= len(replicas) // 2 + 1


def screen_tasks(
    replicas: dict[str, list[layout.Replica]],
    chunk_bits: int,
    commits: dict[str, int],
    acked: Broadcast[AckedDigests] | None,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: CHUNK_SCHEMA rows for every chunk of every task row."""
    for batch in batches:
        for task in batch.to_pylist():
            members = replicas[task["group"]]
            commit = commits[task["group"]]
            group_acks = None if acked is None else acked.value.get(task["group"])
            with contextlib.ExitStack() as stack:
                files = [stack.enter_context(parse.Files(r)) for r in members]
                rows = []
                for lo, hi, bucket_end in chunk_ranges(task["lo"], task["hi"], chunk_bits):
                    acks = None
                    if group_acks is not None:
                        a, b = np.searchsorted(group_acks[0], [lo, hi])
                        acks = (group_acks[0][a:b], group_acks[1][a:b])
                    rows.extend(screen_chunk(members, files, lo, hi, bucket_end, commit, acks))
            yield pa.RecordBatch.from_pylist(rows, schema=CHUNK_SCHEMA)


def screen_chunk(
    members: Sequence[layout.Replica],
    files: Sequence[parse.Files],
    lo: int,
    hi: int,
    bucket_end: int,
    group_commit: int,
    acks: tuple[np.ndarray, np.ndarray] | None = None,
) -> list[dict[str, object]]:
    """CHUNK_SCHEMA rows of one chunk [lo, hi) (judge_group): one per replica of the group."""
    try:
        helds = []
        for replica, f in zip(members, files, strict=True):
            end = min(hi, read.slot_end(replica))
            first = max(lo, replica.start_index)
            if first >= end:
                helds.append(Held.nothing(True))
                continue
            facts = read.chunk_facts(replica, f, first, end)
            next_written = bool(f.index_records(hi, hi + 1)["size"][0] != 0)
            helds.append(judge_replica(replica, facts, hi, next_written))
        plain = judge_group(members, helds, lo, hi, bucket_end, group_commit, acks)
        error = None
    except OSError as err:
        helds = [Held.nothing(False) for _ in members]
        plain, error = False, str(err)
    return [
        {
            "group": r.group,
            "replica": r.name,
            "lo": lo,
            "hi": hi,
            "plain": plain,
            "error": error,
            "rows": h.rows,
            "first_index": h.first_index,
            "last_index": h.last_index,
            "bytes": h.bytes,
        }
        for r, h in zip(members, helds, strict=True)
    ]


def group_commits(replicas: Sequence[layout.Replica]) -> dict[str, int]:
    """group -> group_commit of its replicas."""
    groups = {r.group for r in replicas}
    return {g: group_commit([r for r in replicas if r.group == g]) for g in groups}


def chunks(
    spark: SparkSession,
    replicas: Sequence[layout.Replica],
    chunk_bits: int,
    commits: dict[str, int] | None = None,
    acked: Broadcast[AckedDigests] | None = None,
) -> DataFrame:
    """CHUNK_SCHEMA: one row per (chunk, replica) of every group, from one pass over the data.
    `commits` (group -> commit index) default to the checkpoints' (group_commit); a history
    raises them, and its acknowledged digests (`acked`) are then compared chunk by chunk."""
    tasks = [attrs.astuple(task) for task in plan(replicas, chunk_bits)]
    by_group: dict[str, list[layout.Replica]] = {}
    for r in replicas:
        by_group.setdefault(r.group, []).append(r)
    commits = group_commits(replicas) if commits is None else commits
    body = functools.partial(screen_tasks, by_group, chunk_bits, commits, acked)
    return frames.map_tasks(spark, tasks, TASK_SCHEMA, body, CHUNK_SCHEMA)


SPANS_SCHEMA = (  # checks.replica_spans
    "group string, replica string, entries long, first_index long, last_index long, bytes long"
)
SUMMARY_SCHEMA = (  # agreement.bucket_summary
    "group string, bucket long, replica string, n long, digest string"
)


@attrs.frozen
class ChunkRow:
    """A CHUNK_SCHEMA row on the driver."""

    group: str
    replica: str
    lo: int
    hi: int
    plain: bool
    error: str | None
    rows: int
    first_index: int | None
    last_index: int | None
    bytes: int


@attrs.frozen
class Screened:
    """The driver's view of the first pass over every chunk, and what the job takes from it."""

    chunks: list[ChunkRow]
    chunk_bits: int

    @classmethod
    def collect(
        cls,
        spark: SparkSession,
        replicas: Sequence[layout.Replica],
        chunk_bits: int,
        commits: dict[str, int] | None = None,
        acked: Broadcast[AckedDigests] | None = None,
    ) -> Screened:
        rows = chunks(spark, replicas, chunk_bits, commits, acked).collect()
        return cls([ChunkRow(**row.asDict()) for row in rows], chunk_bits)

    @property
    def failed(self) -> str | None:
        """An OS error met while screening: the job then reads everything in detail."""
        return next((c.error for c in self.chunks if c.error is not None), None)

    def spans(self) -> list[tuple[str, str, int, int, int, int]]:
        """SPANS_SCHEMA rows from every chunk: per replica holding any entry, its rows, first
        and last index, and bytes."""
        out: dict[tuple[str, str], list[int]] = {}
        for c in self.chunks:
            if c.first_index is None or c.last_index is None:
                continue
            span = out.setdefault((c.group, c.replica), [0, c.first_index, c.last_index, 0])
            span[0] += c.rows
            span[1] = min(span[1], c.first_index)
            span[2] = max(span[2], c.last_index)
            span[3] += c.bytes
        return [(g, r, n, first, last, b) for (g, r), (n, first, last, b) in sorted(out.items())]

    def detail_ranges(
        self, replicas: Sequence[layout.Replica]
    ) -> dict[tuple[str, str], list[tuple[int, int]]]:
        """(group, replica) -> the slot ranges to read in detail: the chunks that are not
        plain, and every chunk of a group with a replica whose indexes have a gap (the gap
        check walks that replica's rows in order)."""
        starts = {r.key: r.start_index for r in replicas}
        broken = {
            g
            for g, r, n, first, last, _ in self.spans()
            if n != last - first + 1 or first > starts[(g, r)]
        }
        wanted: dict[str, set[tuple[int, int]]] = {}
        for c in self.chunks:
            if not c.plain or c.group in broken:
                wanted.setdefault(c.group, set()).add((c.lo, c.hi))
        merged: dict[str, list[tuple[int, int]]] = {}
        for group, spans in wanted.items():
            out: list[tuple[int, int]] = []
            for lo, hi in sorted(spans):
                if out and out[-1][1] == lo:
                    out[-1] = (out[-1][0], hi)
                else:
                    out.append((lo, hi))
            merged[group] = out
        return {r.key: merged[r.group] for r in replicas if r.group in merged}

    def plain_summary(
        self, replicas: Sequence[layout.Replica], commits: dict[str, int] | None = None
    ) -> list[tuple[str, int, str, int, str]]:
        """SUMMARY_SCHEMA rows, with buckets of 2^chunk_bits indexes, of the plain chunks (a
        chunk is all of its bucket the logs reach): each replica's committed entries there are
        the slots first_index..last_index up to the group commit, and all holders hold the
        same entries, so one digest ("plain") stands for all."""
        commits = group_commits(replicas) if commits is None else commits
        rows = []
        for c in self.chunks:
            if not c.plain or c.first_index is None or c.last_index is None:
                continue
            n = min(c.last_index, commits[c.group]) - c.first_index + 1
            if n > 0:
                rows.append((c.group, c.lo >> self.chunk_bits, c.replica, n, "plain"))
        return rows

    def in_plain_chunks(self, group: str, indexes: np.ndarray) -> np.ndarray:
        """bool per index of `group`: it lies in a chunk the screen found plain (so any
        acknowledged append there matched the committed body's digest)."""
        spans = sorted({(c.lo, c.hi) for c in self.chunks if c.group == group and c.plain})
        if not spans:
            return np.zeros(len(indexes), dtype=bool)
        los = np.array([lo for lo, _ in spans], dtype=np.int64)
        his = np.array([hi for _, hi in spans], dtype=np.int64)
        k = np.searchsorted(los, indexes, side="right") - 1
        return (k >= 0) & (indexes < his[np.maximum(k, 0)])
