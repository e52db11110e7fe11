"""The screening pass (spark/screen.py): plain chunks are exactly the healthy ones, and the job
finds the same findings with it as without it, on every fault the checks know and on random
byte flips."""

from __future__ import annotations

import random
import struct
from pathlib import Path
from typing import Any

import attrs
import pytest
from pyspark.sql import SparkSession

from spark import history, job, layout, parse, screen
from spark.progress import Progress
from tests.spark import stores
from tests.spark.stores import payload, write_group, write_replica

N = 60  # entries per replica: segments of 4 KiB hold ~20, index files 16
BITS = 3  # chunks of 8 indexes: several per segment and per index file


def bodies(group: str, n: int = N) -> list[bytes]:
    return [payload(group, i) for i in range(1, n + 1)]


def prefix(root: Path, group: str, replica: str, n: int, commit_index: int) -> Path:
    """A replica holding the first n of the group's N entries (with the same terms)."""
    return write_replica(
        root, group, replica, bodies(group), commit_index=commit_index, truncate_after=n
    )


def plain_chunks(root: Path, group: str) -> dict[int, bool]:
    """chunk lo -> plain, screened in this process (no JVM)."""
    members = [r for r in layout.discover([str(root)]) if r.group == group]
    files = [parse.Files(r) for r in members]
    commit = screen.group_commit(members)
    out = {}
    for task in screen.plan(members, BITS):
        for lo, hi, bucket_end in screen.chunk_ranges(task.lo, task.hi, BITS):
            rows = screen.screen_chunk(members, files, lo, hi, bucket_end, commit)
            assert len({r["plain"] for r in rows}) == 1
            out[lo] = bool(rows[0]["plain"])
    return out


def chunk_of(index: int) -> int:
    return max(1, index >> BITS << BITS)


def test_a_healthy_group_is_plain_everywhere(tmp_path: Path) -> None:
    write_group(tmp_path, "g", N)
    chunks = plain_chunks(tmp_path, "g")
    assert chunks and all(chunks.values())


def test_a_lagging_replica_keeps_chunks_plain_while_a_quorum_holds(tmp_path: Path) -> None:
    for r in ("n0", "n1"):
        write_replica(tmp_path, "g", r, bodies("g"), commit_index=N)
    prefix(tmp_path, "g", "n2", 45, 45)
    assert all(plain_chunks(tmp_path, "g").values())


@pytest.mark.parametrize(
    "fault",
    [
        "corrupt_body",
        "record_term",
        "record_position",
        "divergent",
        "forged",
        "uncommitted_tail",
        "lonely",
    ],
)
def test_a_fault_makes_its_chunk_not_plain(tmp_path: Path, fault: str) -> None:
    at = 30
    if fault in ("divergent", "lonely"):
        other = bodies("g")
        other[at - 1] = bytes(reversed(other[at - 1]))
        for r in ("n0", "n1"):
            n = N if fault == "divergent" else at - 1
            prefix(tmp_path, "g", r, n, n)
        if fault == "lonely":  # n2 alone holds, and committed, at..N
            write_replica(tmp_path, "g", "n2", bodies("g"), commit_index=N)
        else:
            write_replica(tmp_path, "g", "n2", other, commit_index=N)
    elif fault == "uncommitted_tail":
        for r in stores.REPLICAS:
            write_replica(tmp_path, "g", r, bodies("g"), commit_index=at - 1)
    elif fault == "record_position":  # n1's record for `at` points at the entry after it
        write_group(tmp_path, "g", N)
        path, off, _ = stores.index_record(tmp_path / "g" / "n1", at)
        _, _, (other_position, *_) = stores.index_record(tmp_path / "g" / "n1", at + 1)
        with open(path, "r+b") as f:
            f.seek(off)
            f.write(struct.pack(">q", other_position))
    else:
        made = write_group(tmp_path, "g", N)
        if fault == "corrupt_body":
            stores.corrupt_body(made["n1"], at)
        elif fault == "forged":  # another body with the same CRC-32: only a digest tells
            stores.forge_body(made["n2"], at, b"FORGED BY HAND")
        else:
            stores.set_record_term(made["n0"], at, 7)
    chunks = plain_chunks(tmp_path, "g")
    assert chunks[chunk_of(at)] is False
    assert chunks[chunk_of(1)] is True  # the chunks before the fault are untouched


# --- the job with and without screening ----------------------------------------------------------
def write_lagging_and_overclaim(root: Path) -> None:
    """Two groups whose every chunk is plain: n2 lags (fine), and n2's checkpoint claims a
    commit past the end of its log (a checkpoint_outside_log finding)."""
    for r in ("n0", "n1"):
        write_replica(root, "lagging", r, bodies("lagging"), commit_index=N)
    prefix(root, "lagging", "n2", 37, 37)
    for r in ("n0", "n1"):
        write_replica(root, "overclaim", r, bodies("overclaim"), commit_index=N)
    prefix(root, "overclaim", "n2", 40, N)


def write_fault_groups(root: Path, seeds: range) -> None:
    """One group per fault, and one per random byte flip in a healthy group."""
    write_group(root, "clean", N)
    other = bodies("divergent")
    other[29] = bytes(reversed(other[29]))
    for r in ("n0", "n1"):
        write_replica(root, "divergent", r, bodies("divergent"), commit_index=N)
    write_replica(root, "divergent", "n2", other, commit_index=N)
    for r in ("n0", "n1"):
        write_replica(root, "tail", r, bodies("tail"), commit_index=50)
    write_replica(root, "tail", "n2", bodies("tail"), commit_index=50, truncate_after=55)
    stores.corrupt_body(write_group(root, "corrupt", N)["n1"], 20)
    stores.forge_body(write_group(root, "forged", N)["n2"], 20, b"FORGED BY HAND")
    stores.set_record_term(write_group(root, "index", N)["n0"], 25, 7)
    write_replica(root, "lonely", "n0", bodies("lonely"), commit_index=N)
    for r in ("n1", "n2"):
        write_replica(root, "lonely", r, bodies("lonely"), commit_index=59, truncate_after=59)
    write_lagging_and_overclaim(root)
    made = write_group(root, "gap", N)  # an index record zeroed in the middle of n1's log
    path, off, _ = stores.index_record(made["n1"], 33)
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(bytes(stores.INDEX_RECORD_BYTES))
    for seed in seeds:
        rng = random.Random(seed)
        made = write_group(root, f"flip{seed}", N)
        store = made[rng.choice(stores.REPLICAS)] / "dledger"
        files = sorted(
            p for p in (*store.glob("data/*"), *store.glob("index/*")) if p.stat().st_size
        )
        target = rng.choice(files)
        stores.flip_byte(target, rng.randrange(min(target.stat().st_size, 4096)))


def findings(
    spark: SparkSession,
    root: Path,
    out: Path,
    chunk_bits: int | None,
    acked: history.Acked | None = None,
) -> Any:
    replicas = layout.discover([str(root)])
    with Progress(spark.sparkContext, quiet=True) as progress:
        outcome = job.run(spark, replicas, acked, str(out), progress, chunk_bits=chunk_bits)
    examples = sorted(tuple(sorted(e.items())) for e in outcome.examples)
    return outcome, examples


@attrs.frozen
class BothWays:
    """One store set audited with the screen and without it (every entry read in detail)."""

    screened: job.Outcome
    with_screen: list[Any]  # the examples, sorted
    full: job.Outcome
    without: list[Any]


@pytest.fixture(scope="module")
def both_ways(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> BothWays:
    """Every fault the checks know, one group each, twelve random byte flips, a group whose
    every replica holds the same forged body, and a history acknowledging the appends of four
    groups, one append never written and one without an index: audited both ways once, for
    the tests below (a whole audit costs ~20-40 s here, nearly all of it Spark planning and
    running the checks' stages, whatever the store's size)."""
    root = tmp_path_factory.mktemp("both-ways")
    write_fault_groups(root / "stores", range(12))
    for store in write_group(root / "stores", "forged-all", N).values():  # all agree
        stores.forge_body(store, 20, b"FORGED BY HAND")
    write_group(root / "stores", "acked", N)
    acks: list[stores.Ack] = [
        (g, i, payload(g, i).decode(), i % 3, i)
        for g in ("acked", "forged-all", "corrupt", "divergent")
        for i in range(1, N + 1)
    ]
    acks += [("acked", N + 1, "never written", 0, 1), ("acked", None, "no index", 1, 1)]
    acked = history.read_acked(str(stores.write_history(root / "history.jsonl", acks)))
    screened, with_screen = findings(spark, root / "stores", root / "a", BITS, acked)
    full, without = findings(spark, root / "stores", root / "b", None, acked)
    return BothWays(screened, with_screen, full, without)


@pytest.mark.spark
@pytest.mark.slow  # two whole audits (~60 s): the default run has a 20-minute budget
def test_the_job_finds_the_same_with_and_without_screening(both_ways: BothWays) -> None:
    screened, with_screen, full, without = attrs.astuple(both_ways, recurse=False)
    assert with_screen == without
    assert screened.counts == full.counts
    assert sorted(screened.spans, key=str) == sorted(full.spans, key=str)
    assert screened.entries_checked == full.entries_checked
    kinds = {c["kind"] for c in full.counts}
    for kind in ("divergent_entry", "uncommitted_tail", "malformed_entry", "index_mismatch"):
        assert kind in kinds  # the faults are there to be found, in both runs
    for kind in ("under_replicated", "checkpoint_outside_log", "index_gap"):
        assert kind in kinds
    assert not {dict(e)["group"] for e in with_screen} & {"clean", "lagging"}


def write_every_chunk_plain(root: Path) -> None:
    """Groups whose every chunk screens plain, and facts to find: n2 of "overclaim" and
    "ahead" claims commits no replica holds (48..N in "ahead")."""
    write_group(root, "clean", N)
    write_lagging_and_overclaim(root)
    for r in ("n0", "n1"):
        prefix(root, "ahead", r, 47, 47)
    prefix(root, "ahead", "n2", 47, N)
    for group in ("clean", "lagging", "overclaim", "ahead"):
        assert all(plain_chunks(root, group).values())


@pytest.mark.spark
def test_a_store_with_every_chunk_plain_still_gets_the_findings_of_its_facts(
    spark: SparkSession, tmp_path: Path
) -> None:
    """No entry needs detail here, so the job runs only the checks that judge per-replica
    facts (job.all_findings rows=False): they must still find what the facts show."""
    root = tmp_path / "stores"
    write_every_chunk_plain(root)
    screened, with_screen = findings(spark, root, tmp_path / "a", BITS)
    assert screened.tasks == len(screen.plan(layout.discover([str(root)]), BITS))  # no detail
    found = {(dict(e)["kind"], dict(e)["group"], dict(e)["replica"]) for e in with_screen}
    assert ("checkpoint_outside_log", "overclaim", "n2") in found
    assert ("checkpoint_outside_log", "ahead", "n2") in found
    short = [dict(e) for e in with_screen if dict(e)["kind"] == "under_replicated"]
    assert [(e["group"], e["index"], e["last_index"], e["count"]) for e in short] == [
        ("ahead", 48, N, N - 48 + 1)  # one finding for the run of indexes
    ]
    assert not {dict(e)["group"] for e in with_screen} & {"clean", "lagging"}


@pytest.mark.spark
@pytest.mark.slow  # a second whole audit (~12 s): the default run has a 20-minute budget
def test_a_store_with_every_chunk_plain_finds_the_same_unscreened(
    spark: SparkSession, tmp_path: Path
) -> None:
    root = tmp_path / "stores"
    write_every_chunk_plain(root)
    screened, with_screen = findings(spark, root, tmp_path / "a", BITS)
    full, without = findings(spark, root, tmp_path / "b", None)
    assert with_screen == without
    assert screened.counts == full.counts


@pytest.mark.spark
@pytest.mark.slow  # shares the two audits above
def test_the_history_check_finds_the_same_with_and_without_screening(
    both_ways: BothWays,
) -> None:
    """The screen compares acknowledged values' digests in plain chunks; the rest go to the
    Spark check. Both ways must find the same missing appends, named the same way."""
    with_screen = both_ways.with_screen
    assert with_screen == both_ways.without
    missing = {
        (dict(e)["group"], dict(e)["index"])
        for e in with_screen
        if dict(e)["kind"] == "missing_append"
    }
    assert missing == {
        ("forged-all", 20),
        ("acked", N + 1),
    }  # a divergent or corrupt copy is outvoted
    forged = next(
        dict(e)
        for e in with_screen
        if dict(e)["kind"] == "missing_append" and dict(e)["group"] == "forged-all"
    )
    assert (
        forged["replica"] == "n0"
        and "n0, n1, n2 hold another body there: b'FORGED BY HAND" in forged["detail"]
    )
    unchecked = [dict(e) for e in with_screen if dict(e)["kind"] == "unchecked_append"]
    assert [(e["group"], e["count"]) for e in unchecked] == [("acked", 1)]


def test_an_os_error_while_screening_marks_the_chunk_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_group(tmp_path, "g", N)
    members = layout.discover([str(tmp_path)])
    files = [parse.Files(r) for r in members]

    def unreadable(self: parse.Files, lo: int, hi: int) -> Any:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(parse.Files, "index_records", unreadable)
    rows = screen.screen_chunk(members, files, 8, 16, 15, N)
    assert [(r["plain"], r["rows"]) for r in rows] == [(False, 0)] * 3
    assert all("Input/output error" in str(r["error"]) for r in rows)
    chunks = [screen.ChunkRow(**r) for r in rows]  # type: ignore[arg-type]
    assert screen.Screened(chunks, BITS).failed is not None  # the job then reads every entry
