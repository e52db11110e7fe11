"""The log store's speed, next to what the same machine does with plain os.write and fsync.

    python -m bench.log_store --quick     # about half a minute
    python -m bench.log_store             # full run: 1 GiB stores, a few minutes

Measures, for 1 KiB entries:

  raw        os.write of the bytes the store writes for a batch (headers and bodies, one call
             per batch) to a new file, then one fdatasync; per batch size
  async      LogStore.append under ASYNC_FLUSH with the default settings (a flush every
             500 ms or every 4 MiB dirty), batches of 1, 64 and 1024 entries; a flush
             ticket runs in a worker thread whenever flush_due says so, as the Flusher does;
             timed to the end of a final flush, so every byte is on disk when the clock stops
  sync       LogStore.append then flush() for every batch (SYNC_FLUSH, one caller)
  group      SYNC_FLUSH with 64 concurrent trio appenders of one entry each, sharing fsyncs
             through the Flusher, against sync with batches of 1 (one fsync per entry); the
             process CPU time per entry (both threads) is recorded too
  lone       the same with one appender: each entry waits for its own fsync through the
             Flusher, so next to sync with batches of 1 it shows the cost of the worker-thread
             round trip that keeps the fsync off the event loop
  wakes      64 trio tasks that only park and are woken together (the scheduler's share of
             a group round); with the one-entry append time and the flush of 64 entries it
             gives the summary's group_ceiling: the group figure if a round cost only those
  read       LogStore.get of a random index from the 1024-batch store: p50/p99 latency
  recovery   reopening that store: after close (checkpoint), after a crash with no
             checkpoint (every entry verified), and with its index files deleted (rebuilt)

MB is 10**6 bytes. Stores live in a temporary directory (--dir to choose the disk) removed
at exit. Prints a table; writes bench/results/log_store.json (log_store_quick.json with
--quick, or --out PATH); the last line printed is the same JSON.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from dledger import limits
from dledger.log.entry import encode_run
from dledger.log.flusher import Flusher
from dledger.log.store import FlushPolicy, LogStore, StoreConfig
from dledger.raft.entries import EntryBatch, EntryKind

MB = 1_000_000
ENTRY_BODY_BYTES = 1024
BATCHES = (1, 64, 1024)
APPENDERS = 64
BODIES_DISTINCT = 1024  # bodies are drawn from this many random 1 KiB strings
RESULTS = Path(__file__).resolve().parent / "results"
TARGET_ASYNC_RATIO = 0.5  # ASYNC batched appends >= 50% of raw write bandwidth (issue 3)
TARGET_GROUP_RATIO = 20.0  # SYNC group commit >= 20x one fsync per entry (issue 3)


class Plan:
    """How much each measurement does: stop at whichever bound comes first."""

    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.store_bytes = (128 if quick else 1024) * limits.MiB  # written per async run
        self.async_s_max = 10.0 if quick else 60.0
        self.sync_s = 1.0 if quick else 3.0
        self.group_s = 1.0 if quick else 3.0
        self.reads = 20_000 if quick else 100_000
        self.segment_bytes = (128 if quick else 1024) * limits.MiB


def payloads(rng: random.Random) -> list[bytes]:
    """BODIES_DISTINCT random bodies, listed twice so any run of them is one slice."""
    return [rng.randbytes(ENTRY_BODY_BYTES) for _ in range(BODIES_DISTINCT)] * 2


def batch(first: int, count: int, bodies: list[bytes]) -> EntryBatch:
    """Entries first.. with bodies from `bodies` (which holds them twice over)."""
    assert count <= BODIES_DISTINCT
    start = first % BODIES_DISTINCT
    chosen = bodies[start : start + count]
    return EntryBatch(first, [1] * count, [EntryKind.DATA.value] * count, chosen)


def entry_bytes() -> int:
    return limits.ENTRY_HEADER_BYTES + ENTRY_BODY_BYTES


def mb_s(nbytes: int, seconds: float) -> float:
    return round(nbytes / seconds / MB, 1)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


# --- raw os.write ---------------------------------------------------------------------------


def raw_write(work: Path, plan: Plan, batch_entries: int, bodies: list[bytes]) -> dict[str, Any]:
    """os.write of exactly what the store writes for one batch, batch after batch."""
    count = batch_entries
    sizes = [entry_bytes()] * count
    positions = [k * entry_bytes() for k in range(count)]
    chunk = encode_run(
        1, [1] * count, [0] * count, batch(1, count, bodies).payloads, positions, sizes
    )
    total = plan.store_bytes - plan.store_bytes % len(chunk)
    path = work / f"raw-{batch_entries}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        began = time.perf_counter()
        written = 0
        while written < total:
            written += os.write(fd, chunk)
        wrote = time.perf_counter()
        os.fdatasync(fd)
        synced = time.perf_counter()
    finally:
        os.close(fd)
        path.unlink()
    return {
        "batch": batch_entries,
        "bytes": written,
        "write_s": round(wrote - began, 3),
        "total_s": round(synced - began, 3),
        "page_cache_mb_s": mb_s(written, wrote - began),
        "mb_s": mb_s(written, synced - began),
    }


# --- appends --------------------------------------------------------------------------------


def open_store(path: Path, plan: Plan, policy: FlushPolicy) -> LogStore:
    config = StoreConfig(segment_bytes=plan.segment_bytes, flush=policy)
    return LogStore.open(path, config, group="bench", self_id="n0")


def append_async(path: Path, plan: Plan, batch_entries: int, bodies: list[bytes]) -> dict[str, Any]:
    """Appends with flush tickets run in a worker thread whenever flush_due, as the Flusher
    would; segments prepared ahead in the same worker. Timed to the end of a last flush."""
    store = open_store(path, plan, FlushPolicy.ASYNC_FLUSH)
    store.prepare_next_segment()
    entries = plan.store_bytes // entry_bytes() // batch_entries * batch_entries
    pending: concurrent.futures.Future[None] | None = None
    preparing: concurrent.futures.Future[None] | None = None
    ticket = None
    flushes = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        began = time.perf_counter()
        deadline = began + plan.async_s_max
        index = 1
        while index <= entries and time.perf_counter() < deadline:
            store.append(batch(index, batch_entries, bodies))
            index += batch_entries
            if pending is not None and pending.done():
                pending.result()
                store.complete_flush(ticket)  # type: ignore[arg-type]
                pending = None
                flushes += 1
            if pending is None and store.flush_due(int(time.monotonic() * 1000)):
                ticket = store.begin_flush()
                if ticket is not None:
                    pending = pool.submit(ticket.run)
            if store.segment_prepare_due and (preparing is None or preparing.done()):
                preparing = pool.submit(store.prepare_next_segment)
        appended = time.perf_counter()
        if pending is not None:
            pending.result()
            store.complete_flush(ticket)  # type: ignore[arg-type]
        store.flush()
        flushed = time.perf_counter()
    written = (index - 1) * entry_bytes()
    store.close()
    return {
        "batch": batch_entries,
        "entries": index - 1,
        "bytes": written,
        "append_s": round(appended - began, 3),
        "total_s": round(flushed - began, 3),
        "page_cache_mb_s": mb_s(written, appended - began),
        "mb_s": mb_s(written, flushed - began),
        "entries_s": round((index - 1) / (flushed - began)),
        "flushes": flushes,
    }


def append_sync(path: Path, plan: Plan, batch_entries: int, bodies: list[bytes]) -> dict[str, Any]:
    """One caller: append a batch, flush it, repeat (one fsync per batch)."""
    store = open_store(path, plan, FlushPolicy.SYNC_FLUSH)
    store.prepare_next_segment()
    index = 1
    flush_us = []
    began = time.perf_counter()
    while time.perf_counter() - began < plan.sync_s:
        store.append(batch(index, batch_entries, bodies))
        index += batch_entries
        flushing = time.perf_counter_ns()
        store.flush()
        flush_us.append((time.perf_counter_ns() - flushing) / 1000)
    elapsed = time.perf_counter() - began
    store.close()
    written = (index - 1) * entry_bytes()
    return {
        "batch": batch_entries,
        "entries": index - 1,
        "bytes": written,
        "total_s": round(elapsed, 3),
        "mb_s": mb_s(written, elapsed),
        "entries_s": round((index - 1) / elapsed),
        "flushes": store.flushes,
        "flush_p50_us": round(percentile(flush_us, 0.50), 1),  # two fdatasyncs: data, index
        "flush_p99_us": round(percentile(flush_us, 0.99), 1),
    }


async def _group(
    store: LogStore, plan: Plan, bodies: list[bytes], appenders: int
) -> dict[str, Any]:
    flusher = Flusher(store)
    done = 0
    stop = trio.current_time() + plan.group_s

    async def appender() -> None:
        nonlocal done
        while trio.current_time() < stop:
            index = store.append(batch(store.last_index + 1, 1, bodies))
            flusher.notify()
            await flusher.wait_durable(index)
            done += 1

    began, cpu_began = time.perf_counter(), time.process_time()
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        async with trio.open_nursery() as tasks:
            for _ in range(appenders):
                tasks.start_soon(appender)
        nursery.cancel_scope.cancel()
    elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu_began
    return {
        "appenders": appenders,
        "entries": done,
        "total_s": round(elapsed, 3),
        "entries_s": round(done / elapsed),
        "flushes": store.flushes,
        "entries_per_flush": round(done / max(store.flushes, 1), 1),
        "cpu_us_per_entry": round(cpu / max(done, 1) * 1e6, 1),
    }


async def _wakes(seconds: float) -> dict[str, Any]:
    """APPENDERS tasks that only park and are woken together, rescheduled directly as the
    Flusher does: the scheduler's share of a group commit round, with nothing else in it."""
    parked: list[trio.lowlevel.Task] = []
    everyone_parked = trio.Event()
    alive, woken = APPENDERS, 0
    stop = trio.current_time() + seconds

    async def waiter() -> None:
        nonlocal alive, woken
        while trio.current_time() < stop:
            parked.append(trio.lowlevel.current_task())
            if len(parked) == alive:
                everyone_parked.set()
            await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)
            woken += 1
        alive -= 1
        if len(parked) == alive:  # the rest are parked (or none is left): release them
            everyone_parked.set()

    async def releaser() -> None:
        nonlocal everyone_parked
        while alive:
            await everyone_parked.wait()
            everyone_parked = trio.Event()
            for task in parked:
                trio.lowlevel.reschedule(task)
            parked.clear()

    began = time.perf_counter()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(releaser)
        for _ in range(APPENDERS):
            nursery.start_soon(waiter)
    elapsed = time.perf_counter() - began
    return {"tasks": APPENDERS, "wakes": woken, "us_per_wake": round(elapsed / woken * 1e6, 2)}


def group_commit(
    path: Path, plan: Plan, bodies: list[bytes], appenders: int = APPENDERS
) -> dict[str, Any]:
    store = open_store(path, plan, FlushPolicy.SYNC_FLUSH)
    store.prepare_next_segment()  # as for the other runs: the first segment is ready
    try:
        return trio.run(_group, store, plan, bodies, appenders)
    finally:
        store.close()


# --- reads and recovery ---------------------------------------------------------------------


def random_reads(store: LogStore, plan: Plan) -> dict[str, Any]:
    rng = random.Random(7)
    first, last = store.first_index, store.last_index
    latencies = []
    for _ in range(plan.reads):
        index = rng.randint(first, last)
        began = time.perf_counter_ns()
        store.get(index)
        latencies.append((time.perf_counter_ns() - began) / 1000)
    return {
        "reads": plan.reads,
        "entries": last - first + 1,
        "p50_us": round(percentile(latencies, 0.50), 1),
        "p99_us": round(percentile(latencies, 0.99), 1),
        "mean_us": round(statistics.fmean(latencies), 1),
    }


def timed_open(path: Path, plan: Plan) -> dict[str, Any]:
    began = time.perf_counter()
    store = open_store(path, plan, FlushPolicy.ASYNC_FLUSH)
    seconds = time.perf_counter() - began
    report = store.recovery
    result = {
        "seconds": round(seconds, 3),
        "entries_checked": report.entries_checked,
        "index_records_rebuilt": report.index_records_rebuilt,
        "last_index": store.last_index,
    }
    store.close()
    return result


def recovery(path: Path, plan: Plan) -> dict[str, Any]:
    store_bytes = sum(p.stat().st_size for p in (path / "dledger" / "data").iterdir())
    clean = timed_open(path, plan)
    store = open_store(path, plan, FlushPolicy.ASYNC_FLUSH)
    (path / "dledger" / "checkpoint").unlink()  # no checkpoint: verify every entry
    store.abandon()
    crash = timed_open(path, plan)
    (path / "dledger" / "checkpoint").unlink()
    for index_file in (path / "dledger" / "index").iterdir():
        index_file.unlink()
    rebuild = timed_open(path, plan)
    walked = crash["entries_checked"] * entry_bytes()
    return {
        "store_bytes": store_bytes,
        "after_close": clean,
        "after_crash_full_walk": crash | {"mb_s": mb_s(walked, crash["seconds"])},
        "index_rebuilt": rebuild,
        "page_cache": "warm: the store was just written; a cold cache adds the disk's read time",
    }


# --- the run --------------------------------------------------------------------------------


def run(work: Path, plan: Plan) -> dict[str, Any]:
    bodies = payloads(random.Random(1))
    results: dict[str, Any] = {"raw": [], "async": [], "sync": []}
    step("raw os.write")
    for n in BATCHES:
        results["raw"].append(raw_write(work, plan, n, bodies))
    for n in BATCHES:
        step(f"async appends, batch {n}")
        path = work / f"async-{n}"
        results["async"].append(append_async(path, plan, n, bodies))
        if n == BATCHES[-1]:
            step("random reads")
            with open_store(path, plan, FlushPolicy.ASYNC_FLUSH) as store:
                results["read"] = random_reads(store, plan)
            step("recovery")
            results["recovery"] = recovery(path, plan)
        shutil.rmtree(path)
    for n in BATCHES:
        step(f"sync appends, batch {n}")
        path = work / f"sync-{n}"
        results["sync"].append(append_sync(path, plan, n, bodies))
        shutil.rmtree(path)
    step("group commit")
    results["group"] = group_commit(work / "group", plan, bodies)
    shutil.rmtree(work / "group")
    step("trio wake-ups")
    results["wakes"] = trio.run(_wakes, plan.group_s / 3)
    step("lone appender")
    results["lone"] = group_commit(work / "lone", plan, bodies, appenders=1)
    shutil.rmtree(work / "lone")
    return results


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Headline ratios. async_to_raw is strict: the best batched append against the best raw
    write (1024-entry chunks); async_to_raw_same_batch compares each batch size with raw
    writes of that batch's bytes."""
    raw_best = max(r["mb_s"] for r in results["raw"])
    async_best = max(r["mb_s"] for r in results["async"] if r["batch"] > 1)
    raw_by_batch = {r["batch"]: r["mb_s"] for r in results["raw"]}
    same_batch = {
        str(r["batch"]): round(r["mb_s"] / raw_by_batch[r["batch"]], 2) for r in results["async"]
    }
    sync_one = next(r for r in results["sync"] if r["batch"] == 1)
    one_per_entry = sync_one["entries_s"]
    group = results["group"]["entries_s"]
    # What the group figure could be if a round cost nothing but its parts measured here:
    # every appender's append (as in the one-entry async run, batch built the same way) and
    # wake-up, then one flush of 64 entries, which nothing overlaps.
    append_us = 1e6 / next(r for r in results["async"] if r["batch"] == 1)["entries_s"]
    flush_64_us = next(r for r in results["sync"] if r["batch"] == APPENDERS)["flush_p50_us"]
    wake_us = results["wakes"]["us_per_wake"]
    ceiling = APPENDERS * 1e6 / (APPENDERS * (append_us + wake_us) + flush_64_us)
    return {
        "raw_write_mb_s": raw_best,
        "async_batched_mb_s": async_best,
        "async_to_raw": round(async_best / raw_best, 2),
        "async_to_raw_same_batch": same_batch,
        "async_target_met": async_best / raw_best >= TARGET_ASYNC_RATIO,
        "sync_one_fsync_per_entry_s": one_per_entry,
        "sync_flush_p50_us": sync_one["flush_p50_us"],
        "sync_group_commit_entries_s": group,
        "group_to_one_fsync": round(group / one_per_entry, 1),
        "group_target_met": group / one_per_entry >= TARGET_GROUP_RATIO,
        "group_cpu_us_per_entry": results["group"]["cpu_us_per_entry"],
        "group_ceiling_entries_s": round(ceiling),
        "group_ceiling_to_one_fsync": round(ceiling / one_per_entry, 1),
        "ceiling_parts_us": {
            "append": round(append_us, 2),
            "wake": wake_us,
            "flush_of_64": flush_64_us,
        },
        "lone_appender_entries_s": results["lone"]["entries_s"],
        "read_p50_us": results["read"]["p50_us"],
        "read_p99_us": results["read"]["p99_us"],
        "recovery_full_walk_s": results["recovery"]["after_crash_full_walk"]["seconds"],
    }


def table(results: dict[str, Any], summary: dict[str, Any]) -> str:
    rows = ["what                               batch      MB/s   entries/s   (page cache MB/s)"]
    for r in results["raw"]:
        rows.append(
            f"raw os.write + fdatasync            {r['batch']:>5} {r['mb_s']:>9}"
            f"           -   ({r['page_cache_mb_s']})"
        )
    for r in results["async"]:
        ratio = summary["async_to_raw_same_batch"][str(r["batch"])]
        rows.append(
            f"append ASYNC_FLUSH (+ final flush)  {r['batch']:>5} {r['mb_s']:>9}"
            f" {r['entries_s']:>11}   ({r['page_cache_mb_s']}; {ratio} of raw)"
        )
    for r in results["sync"]:
        rows.append(
            f"append + flush each (SYNC_FLUSH)    {r['batch']:>5} {r['mb_s']:>9}"
            f" {r['entries_s']:>11}   (flush p50 {r['flush_p50_us']} us)"
        )
    g = results["group"]
    rows.append(
        f"SYNC_FLUSH, {g['appenders']} trio appenders        1         -"
        f" {g['entries_s']:>11}   ({g['entries_per_flush']} entries per fsync,"
        f" {g['cpu_us_per_entry']} us CPU per entry)"
    )
    rows.append(
        f"  ceiling from its parts: {summary['group_ceiling_entries_s']} entries/s"
        f" ({summary['group_ceiling_to_one_fsync']}x); per entry {summary['ceiling_parts_us']['append']}"
        f" us append + {summary['ceiling_parts_us']['wake']} us wake-up, per round"
        f" {summary['ceiling_parts_us']['flush_of_64']} us flush"
    )
    lone = results["lone"]
    rows.append(
        f"SYNC_FLUSH, 1 trio appender          1         - {lone['entries_s']:>11}"
        f"   (through the Flusher's worker thread)"
    )
    rd, rc = results["read"], results["recovery"]
    rows.append(
        f"random get(index): p50 {rd['p50_us']} us, p99 {rd['p99_us']} us"
        f" over {rd['entries']} entries"
    )
    rows.append(
        f"recovery of {rc['store_bytes'] / 2**30:.2f} GiB: after close "
        f"{rc['after_close']['seconds']} s; after crash, full walk "
        f"{rc['after_crash_full_walk']['seconds']} s "
        f"({rc['after_crash_full_walk']['mb_s']} MB/s); index rebuilt "
        f"{rc['index_rebuilt']['seconds']} s"
    )
    rows.append(
        f"targets: ASYNC batched / raw = {summary['async_to_raw']} (>= "
        f"{TARGET_ASYNC_RATIO}: {summary['async_target_met']}); group commit / one "
        f"fsync per entry = {summary['group_to_one_fsync']}x (>= {TARGET_GROUP_RATIO}: "
        f"{summary['group_target_met']})"
    )
    return "\n".join(rows)


def step(what: str) -> None:
    print(f"... {what}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="128 MiB stores, short timings")
    parser.add_argument("--dir", type=Path, help="where the temporary stores go")
    parser.add_argument("--out", type=Path, help="where the JSON goes")
    args = parser.parse_args(argv)
    plan = Plan(args.quick)
    work = Path(tempfile.mkdtemp(prefix="bench-log-store-", dir=args.dir))
    began = time.perf_counter()
    try:
        results = run(work, plan)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = summarize(results)
    document = {
        "what": "log_store",
        "summary": summary,
        "quick": plan.quick,
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "entry_body_bytes": ENTRY_BODY_BYTES,
        "segment_bytes": plan.segment_bytes,
        "duration_s": round(time.perf_counter() - began, 1),
        "method": __doc__,
        "details": results,
    }
    print(table(results, summary))
    out = args.out or RESULTS / ("log_store_quick.json" if plan.quick else "log_store.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=1) + "\n")
    print(json.dumps(document))
    return 0


if __name__ == "__main__":
    sys.exit(main())
