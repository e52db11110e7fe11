"""The Spark audit's speed and memory, next to a single-process pure-Python reference check
and a cat-like sequential read of the same stores.

    python -m bench.audit --quick    # 2 groups x 3 replicas x 20,000 entries, a few minutes
    python -m bench.audit            # 2 x 3 x 1,000,000 entries of 1 KiB (~6.3 GB of stores)
    python -m bench.audit --pairs 4  # then 4 more audit/reference pairs: medians, pairs won

Stores are written once by the project's log writer (dledger.log.store.LogStore) into a cache
directory (--cache; reused by later runs, removed with --clean), with 1 GiB segments for the
main comparison and, for the memory comparison, group g1 again with small segments. Measures:

  audit      dledger-audit's job on local[2]: wall time (session start included) and entries/s,
             with the JVM class archive dledger-audit-prepare makes (made first if missing, not
             timed), and again without it (audit_without_jvm_archive)
  reference  bench/audit.py's own pure-Python check of the same stores, one process: walk every
             segment, check both CRCs, order, positions, and compare replicas per index
  cat        read every data and index file once with 1 MiB sequential reads
  memory     peak RSS of the executor (the local[2] JVM) and of the largest Python worker,
             auditing g1 with large and with small segments: flat means bounded tasks
  history    the same audit with --history: a synthetic chaos history (an invoke and an ok
             line per entry, the value its body) acknowledging every entry, and its ratio to
             the audit without (audit_with_history_to_without); with --history-rounds N,
             N such pairs back to back and the median of their ratios
  digest     the reader's worker CPU per entry with and without the SHA-256 of each body
             that agreement compares (one task of 2^18 entries, process time), and the
             candidate digests per 1 KiB and per 40-byte body (docs/decisions.md)

Writes bench/results/audit.json (audit_quick.json with --quick); prints the same JSON last.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
from isal.isal_zlib import crc32  # the CRC the Spark reader uses too (equal to zlib.crc32)

from dledger.log.config import StoreConfig
from dledger.log.store import LogStore
from dledger.raft.entries import data_batch
from spark import history, job, jvm_archive, layout, parse, read, session
from spark.progress import Progress

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
BODY_BYTES = 1 * KiB
BATCH_ENTRIES = 1024  # entries per LogStore.append while generating
READ_BYTES = 1 * MiB  # the cat-like read's block size
SAMPLE_S = 0.2  # RSS sampling period
GROUPS, REPLICAS = ("g1", "g2"), ("n0", "n1", "n2")
HEADER = struct.Struct(">IIqqqHHII")
ENTRY_MAGIC, BLANK_MAGIC = 0x444C4531, 0x424C4E4B


def generate(root: Path, entries: int, segment_bytes: int, groups: tuple[str, ...]) -> float:
    """Write every replica with LogStore unless the cache has it; returns seconds spent."""
    began = time.perf_counter()
    config = StoreConfig(segment_bytes=segment_bytes, preallocate=False)
    for group in groups:
        for replica in REPLICAS:
            store_dir = root / group / replica
            if (store_dir / ".complete").exists():
                continue
            shutil.rmtree(store_dir, ignore_errors=True)
            with LogStore.open(store_dir, config, group=group, self_id=replica) as store:
                for first in range(1, entries + 1, BATCH_ENTRIES):
                    n = min(BATCH_ENTRIES, entries + 1 - first)
                    bodies = [
                        (b"%s-%010d-" % (group.encode(), i)).ljust(BODY_BYTES, b"x")
                        for i in range(first, first + n)
                    ]
                    store.append(data_batch(first, 1 + first * 4 // entries, bodies))
                store.flush()
                store.write_checkpoint(entries, entries)
            (store_dir / ".complete").touch()
    return time.perf_counter() - began


class PeakRss:
    """Samples the RSS of this process's descendants: the JVM and its Python workers."""

    def __init__(self) -> None:
        self.jvm = self.python_worker = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.wait(SAMPLE_S):
            for _pid, cmd, rss in _descendants(me):
                if "java" in cmd:
                    self.jvm = max(self.jvm, rss)
                elif "pyspark" in cmd:  # the daemon and the workers it forks, not the driver
                    self.python_worker = max(self.python_worker, rss)


def _descendants(root: int) -> list[tuple[int, str, int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except OSError:
                continue
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            rss = next(
                int(line.split()[1]) * KiB
                for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if line.startswith("VmRSS:")
            )
        except (OSError, StopIteration):
            continue
        out.append((pid, cmd, rss))
    return out


def cpu_ticks() -> list[int]:
    """The machine's CPU time so far, from /proc/stat: user ... steal, in clock ticks."""
    return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]


def steal_percent(before: list[int], after: list[int]) -> float:
    """Share of CPU time the hypervisor took between two cpu_ticks(): figures need it here."""
    spent = [b - a for a, b in zip(before, after, strict=True)]
    return round(100 * spent[7] / max(1, sum(spent)), 1)


def prepare_jvm_archive() -> dict[str, Any]:
    """dledger-audit-prepare, as an installation would have run it (not timed with the audit)."""
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "spark.prepare"], capture_output=True, text=True, check=True
    )
    return {
        "path": str(jvm_archive.archive_path(session.JVM_OPTIONS)),
        "prepare_s": round(time.perf_counter() - began, 1),
        "said": done.stdout.strip(),
    }


def audit_once(stores: list[str], master: str, history_path: str | None) -> None:
    """One audit in this process (`--one`), its outcome as JSON on stdout's last line. With a
    history, read as dledger-audit reads it (in the timed process, while the JVM starts)."""
    replicas = layout.discover(stores)
    reading = history.Reading(history_path) if history_path else None  # while the JVM starts
    spark = session.start(master)
    try:
        acked = None if reading is None else reading.result()
        with Progress(spark.sparkContext) as progress:
            out = Path("/tmp") / f"dledger-audit-bench-out-{os.getpid()}"
            outcome = job.run(spark, replicas, acked, str(out), progress)
            shutil.rmtree(out, ignore_errors=True)
    finally:
        spark.stop()
    print(json.dumps({"counts": outcome.counts, "entries": outcome.entries_checked,
                      "tasks": outcome.tasks}))  # fmt: skip


def run_audit(stores: list[Path], master: str, history_path: Path | None = None) -> dict[str, Any]:
    """An audit in a process of its own, as `dledger-audit` runs: PySpark keeps its JVM for the
    life of the Python process, so a second audit in one process would start warm."""
    ticks = cpu_ticks()
    load = os.getloadavg()[0]
    began = time.perf_counter()
    given = [] if history_path is None else ["--history-file", str(history_path)]
    with PeakRss() as rss:
        done = subprocess.run(
            [sys.executable, "-m", "bench.audit", "--master", master, *given, "--one",
             *map(str, stores)],
            stdout=subprocess.PIPE, text=True, check=True,
        )  # fmt: skip
    wall = time.perf_counter() - began
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert not outcome["counts"], outcome["counts"]  # the generated stores are clean
    return {
        "wall_s": round(wall, 2),
        "entries": outcome["entries"],
        "entries_per_s": round(outcome["entries"] / wall),
        "tasks": outcome["tasks"],
        "peak_rss_jvm_mb": round(rss.jvm / 1e6),
        "peak_rss_python_worker_mb": round(rss.python_worker / 1e6),
        "jvm_archive": jvm_archive.use_options(session.JVM_OPTIONS) != "",
        "steal_percent": steal_percent(ticks, cpu_ticks()),
        "loadavg_1min_before": round(load, 2),
    }


def write_history(path: Path, entries: int) -> float:
    """A chaos history acknowledging every entry of the generated stores (an invoke and an ok
    line each, values the bodies generate() wrote), unless the cache has it; returns seconds."""
    began = time.perf_counter()
    if path.exists():
        return 0.0
    partial = path.with_suffix(".partial")
    with open(partial, "w") as f:
        at_ns = 0
        for group in GROUPS:
            for i in range(1, entries + 1):
                value = (f"{group}-{i:010d}-").ljust(BODY_BYTES, "x")
                op = {"process": i % 4, "f": "append", "value": value, "group": group}
                f.write(json.dumps({"type": "invoke", **op, "index": None, "time_ns": at_ns}))
                f.write("\n")
                f.write(json.dumps({"type": "ok", **op, "index": i, "time_ns": at_ns + 1}))
                f.write("\n")
                at_ns += 2
    os.replace(partial, path)
    return time.perf_counter() - began


def run_history(
    cache: Path, root: Path, entries: int, master: str, rounds: int = 1
) -> dict[str, Any]:
    """The audit without and then with a history acknowledging every entry, back to back,
    `rounds` times (each run after a `cat` of the stores); the first pair in full, every
    pair's wall times, and the median of their ratios."""
    history_path = cache / f"history-e{entries}.jsonl"
    result: dict[str, Any] = {"write_s": round(write_history(history_path, entries), 1)}
    result["bytes"] = history_path.stat().st_size
    pairs: list[dict[str, float]] = []
    for _ in range(rounds):
        cat(root)  # the history's writing may have pushed the stores out of the page cache
        without = run_audit([root], master)
        cat(root)
        with_history = run_audit([root], master, history_path)
        if not pairs:
            result["audit_without"], result["audit_with"] = without, with_history
        ratio = round(with_history["wall_s"] / without["wall_s"], 2)
        pairs.append({"without_s": without["wall_s"], "with_s": with_history["wall_s"],
                      "ratio": ratio})  # fmt: skip
    result["audit_with_history_to_without"] = pairs[0]["ratio"]
    result["rounds"] = pairs
    result["median_ratio"] = statistics.median(p["ratio"] for p in pairs)
    return result


def digest_costs(root: Path) -> dict[str, Any]:
    """Worker CPU per entry of the reader (read.chunk_facts, one task's 2^18 entries of one
    replica, process time, best of 3) with the SHA-256 of each body and without it (the
    digest step replaced by zeros: the reader as it was before agreement used digests); and
    the candidates' cost per body, one call each as the reader makes them."""
    replica = next(r for r in layout.discover([str(root / "g1")]) if r.name == "n0")
    n = read.TASK_RECORDS_MAX

    def reader_us() -> float:
        best = float("inf")
        for _ in range(3):
            began = time.process_time()
            with parse.Files(replica) as files:
                for lo in range(1, n + 1, read.CHUNK_RECORDS_MAX):
                    read.chunk_facts(replica, files, lo, lo + read.CHUNK_RECORDS_MAX)
            best = min(best, time.process_time() - began)
        return round(best / n * 1e6, 3)

    with_digest = reader_us()
    zeros = lambda window, starts, ends: np.zeros((len(starts), 32), np.uint8)  # noqa: E731
    with mock.patch.object(parse, "_digests", zeros):
        without_digest = reader_us()
    candidates: dict[str, Any] = {
        "sha256": lambda b: hashlib.sha256(b).digest(),
        "blake2b_256": lambda b: hashlib.blake2b(b, digest_size=32).digest(),
    }
    try:
        import blake3  # type: ignore[import-not-found]  # not a dependency: measured if present

        candidates["blake3"] = lambda b: blake3.blake3(b).digest()
    except ImportError:
        pass
    per_body: dict[str, dict[str, float]] = {}
    for size in (40, BODY_BYTES):
        data = memoryview(os.urandom(size * 20_000))
        bodies = [data[i * size : (i + 1) * size] for i in range(20_000)]
        per_body[f"{size}_bytes_us"] = {}
        for name, fn in [("crc32", crc32), *candidates.items()]:
            best = float("inf")
            for _ in range(5):
                began = time.process_time()
                for body in bodies:
                    fn(body)
                best = min(best, (time.process_time() - began) / len(bodies))
            per_body[f"{size}_bytes_us"][name] = round(best * 1e6, 3)
    return {
        "reader_us_per_entry_with_digest": with_digest,
        "reader_us_per_entry_without_digest": without_digest,
        "per_body": per_body,
        "loadavg_1min": round(os.getloadavg()[0], 2),
    }


def reference_check(root: Path) -> dict[str, Any]:
    """The same checks in one Python process, walking the segments in order."""
    ticks = cpu_ticks()
    began = time.perf_counter()
    total = 0
    for group in sorted(os.listdir(root)):
        if not (root / group).is_dir():
            continue
        logs = {}
        for replica in sorted(os.listdir(root / group)):
            logs[replica] = _walk(root / group / replica / "dledger")
            total += len(logs[replica][0])
        first = next(iter(logs.values()))
        for replica, log in logs.items():
            assert log == first, f"{group}/{replica} differs"  # equal terms, sizes, body CRCs
    wall = time.perf_counter() - began
    return {
        "wall_s": round(wall, 2),
        "entries": total,
        "entries_per_s": round(total / wall),
        "steal_percent": steal_percent(ticks, cpu_ticks()),
    }


def run_pairs(root: Path, master: str, n: int, first: dict[str, Any]) -> dict[str, Any]:
    """N more (audit, reference) runs back to back; with the main run's pair, the medians
    and how many pairs the audit won. Only figures of one session compare on this host. Each
    run starts after a `cat` of the store, as the main runs do: the memory runs in between
    read other stores, and this VM's page cache also shrinks on its own, so without it the
    first run of a pair would read from disk what the second then finds cached."""
    runs = [
        {
            "audit_s": first["audit"]["wall_s"],
            "reference_s": first["reference"]["wall_s"],
            "audit_steal_percent": first["audit"]["steal_percent"],
            "reference_steal_percent": first["reference"]["steal_percent"],
        }
    ]
    for _ in range(n):
        cat_before_audit = cat(root)
        audit = run_audit([root], master)
        cat_before_reference = cat(root)
        reference = reference_check(root)
        runs.append(
            {
                "audit_s": audit["wall_s"],
                "reference_s": reference["wall_s"],
                "audit_steal_percent": audit["steal_percent"],
                "reference_steal_percent": reference["steal_percent"],
                "cat_before_audit_s": cat_before_audit["wall_s"],
                "cat_before_reference_s": cat_before_reference["wall_s"],
            }
        )
    audit_median = statistics.median(r["audit_s"] for r in runs)
    reference_median = statistics.median(r["reference_s"] for r in runs)
    return {
        "runs": runs,
        "summary": {
            "pairs": len(runs),
            "audit_faster": sum(r["audit_s"] < r["reference_s"] for r in runs),
            "audit_median_s": audit_median,
            "reference_median_s": reference_median,
            "audit_to_reference": round(audit_median / reference_median, 2),
        },
    }


def _walk(store: Path) -> tuple[array, array, array]:
    terms, sizes, crcs = array("q"), array("q"), array("q")
    expected_index, last_term = 1, 0
    for seg in sorted((store / "data").iterdir()):
        data = seg.read_bytes()  # one segment at a time: up to segment_bytes of memory
        at = 0
        while at + HEADER.size <= len(data):
            magic, size, index, term, pos, _kind, _r, body_crc, header_crc = HEADER.unpack_from(
                data, at
            )
            if magic == BLANK_MAGIC or magic == 0:
                break
            assert magic == ENTRY_MAGIC and crc32(data[at : at + 40]) == header_crc
            assert crc32(memoryview(data)[at + 44 : at + size]) == body_crc
            assert index == expected_index and term >= last_term
            assert pos == int(seg.name) + at
            terms.append(term)
            sizes.append(size)
            crcs.append(body_crc)
            expected_index, last_term = index + 1, term
            at += size
    return terms, sizes, crcs


def cat(root: Path) -> dict[str, Any]:
    began = time.perf_counter()
    total = 0
    buf = bytearray(READ_BYTES)
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.parent.name in ("data", "index"):
            with open(path, "rb", buffering=0) as f:
                while n := f.readinto(buf):
                    total += n
    wall = time.perf_counter() - began
    return {"wall_s": round(wall, 2), "bytes": total, "mb_per_s": round(total / 1e6 / wall)}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.audit")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--entries", type=int)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/dledger-audit-bench"))
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--clean", action="store_true", help="remove the cache at the end")
    parser.add_argument(
        "--pairs", type=int, default=0, metavar="N",
        help="then N more audit/reference pairs back to back, for a noisy host's spread",
    )  # fmt: skip
    parser.add_argument("--one", nargs="+", metavar="STORE", help=argparse.SUPPRESS)
    parser.add_argument("--history-file", help=argparse.SUPPRESS)
    parser.add_argument(
        "--no-history", action="store_true", help="skip the audit with a history (and writing it)"
    )
    parser.add_argument(
        "--history-rounds", type=int, default=1, metavar="N",
        help="audits without and with the history, back to back, N times (median ratio)",
    )  # fmt: skip
    parser.add_argument(
        "--history-only",
        action="store_true",
        help="only the audits without and with a history, and the digest costs "
        "(bench/results/audit_history.json)",
    )
    args = parser.parse_args()
    if args.one:
        audit_once(args.one, args.master, args.history_file)
        return
    entries = args.entries or (20_000 if args.quick else 1_000_000)
    large, small = (1 * GiB, 64 * MiB) if not args.quick else (1 * GiB, 1 * MiB)
    main_root = args.cache / f"e{entries}-s{large}"
    small_root = args.cache / f"e{entries}-s{small}"
    print(f"generating {len(GROUPS)} x {len(REPLICAS)} x {entries} entries under {args.cache}")
    generated_s = generate(main_root, entries, large, GROUPS)
    generated_s += generate(small_root, entries, small, ("g1",))
    result: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_at_start": os.getloadavg(),
        },
        "stores": {
            "groups": len(GROUPS),
            "replicas": len(REPLICAS),
            "entries": entries,
            "body_bytes": BODY_BYTES,
            "segment_bytes": large,
            "generate_s": round(generated_s, 1),
        },
    }
    result["jvm_archive"] = prepare_jvm_archive()
    print("jvm archive", result["jvm_archive"])
    if args.history_only:
        result["history"] = run_history(
            args.cache, main_root, entries, args.master, args.history_rounds
        )
        print("history", result["history"])
        result["digest"] = digest_costs(main_root)
        print("digest", result["digest"])
        out = Path(__file__).parent / "results" / "audit_history.json"
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result))
        return
    result["cat"] = cat(main_root)
    print("cat", result["cat"])
    result["audit"] = run_audit([main_root], args.master)
    print("audit", result["audit"])
    with (  # the same audit with a driver that loads every class itself
        tempfile.TemporaryDirectory() as no_archive,
        mock.patch.dict(os.environ, {jvm_archive.CACHE_ENV: no_archive}),
    ):
        result["audit_without_jvm_archive"] = run_audit([main_root], args.master)
    print("audit without the JVM class archive", result["audit_without_jvm_archive"])
    if not args.no_history:
        result["history"] = run_history(
            args.cache, main_root, entries, args.master, args.history_rounds
        )
        print("history", result["history"])
    result["digest"] = digest_costs(main_root)
    print("digest", result["digest"])
    result["reference"] = reference_check(main_root)
    print("reference", result["reference"])
    result["memory"] = {
        f"segment_{large // MiB}MiB": run_audit([main_root / "g1"], args.master),
        f"segment_{small // MiB}MiB": run_audit([small_root / "g1"], args.master),
    }
    print("memory", result["memory"])
    if args.pairs > 0:
        result["pairs"] = run_pairs(main_root, args.master, args.pairs, result)
        print("pairs", result["pairs"]["summary"])
    name = "audit_quick.json" if args.quick else "audit.json"
    out = Path(__file__).parent / "results" / name
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    if args.clean:
        shutil.rmtree(args.cache, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
