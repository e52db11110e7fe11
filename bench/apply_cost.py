"""What one message costs every replica to append and apply, counted in CPU instructions.

    python -m bench.apply_cost            # callgrind, about two minutes
    python -m bench.apply_cost --timed    # wall-clock instead (no valgrind needed; noisy)

Every replica appends each message to its log and applies it (ConsumeQueue unit, IndexFile
items for UNIQ_KEY and KEYS, the dispatcher's bookkeeping). Timed runs on this project's host
move by a third between runs of the same code, so a change worth 5 % is measured here in
instructions instead: the script makes messages as our client sends them (1 KiB body,
UNIQ_KEY, WAIT, CLUSTER; 8 queues), placed and offset as a leader would, appends them to a
fresh LogStore in batches of 64 and applies each batch to a fresh BrokerState. Run under
`valgrind --tool=callgrind` once with FEW and once with MANY messages, and twice more only
making the messages: the difference of the first two totals, less that of the other two,
divided by MANY - FEW is one message's append and apply with start-up, set-up and the making
cancelled. `--timed` times the same loop (best of 3) instead.

Writes bench/results/apply_cost.json (or --out PATH); the last line printed is that JSON.
(Sessions 9 and 10 counted the entries of a real bench run's log the same way: 118,800 per entry
before session 9's changes, 97,100 after, 83,000 after session 10's; docs/decisions.md. This
workload's figure differs from those: its messages go to 8 queues in turn. It was 68,827 before
session 14 moved the dispatcher's loop to C, 16,649 after.)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from broker.state import BrokerState
from dledger import limits
from dledger.log.segment import entry_position
from dledger.log.store import LogStore, StoreConfig
from dledger.raft.entries import EntryBatch, EntryKind
from remoting import properties as props
from remoting import stored_message
from remoting.message_id import UniqIdGenerator

RESULTS = Path(__file__).resolve().parent / "results"
FEW, MANY = 1_000, 5_000
BATCH = 64
QUEUES = 8
BODY = bytes(range(256)) * 4  # 1 KiB
SEGMENT_BYTES = 256 << 20


def messages(count: int, segment_bytes: int) -> list[EntryBatch]:
    """`count` records in batches of BATCH, with the queue and physical offsets a leader
    writes (queues in turn; positions as the store will assign them from an empty log)."""
    ids = UniqIdGenerator(ip="127.0.0.1", pid=4242, salt=7, clock_ms=lambda: 1_790_000_000_000)
    cluster = props.encode({props.CLUSTER: "DefaultCluster"})
    batches, payloads = [], []
    position, next_offsets = 0, [0] * QUEUES
    for n in range(count):
        queue_id = n % QUEUES
        properties = props.encode({props.UNIQ_KEY: ids.next_id(), props.WAIT: "true"}) + cluster
        record = bytearray(
            stored_message.pack(
                queue_id=queue_id,
                flag=0,
                queue_offset=0,
                physical_offset=0,
                sys_flag=0,
                born_timestamp_ms=1_790_000_000_000 + n,
                born_host=("127.0.0.1", 50000),
                store_timestamp_ms=1_790_000_000_000 + n,
                store_host=("127.0.0.1", 10911),
                reconsume_times=0,
                prepared_transaction_offset=0,
                body=BODY,
                topic="BenchTopic",
                properties_data=properties,
            )
        )
        size = limits.ENTRY_HEADER_BYTES + len(record)
        position = entry_position(position, size, segment_bytes)
        physical = position + limits.ENTRY_HEADER_BYTES
        stored_message.patch_offsets(record, 0, next_offsets[queue_id], physical)
        next_offsets[queue_id] += 1
        position += size
        payloads.append(bytes(record))
        if len(payloads) == BATCH or n == count - 1:
            first = n - len(payloads) + 2
            kinds = [EntryKind.DATA] * len(payloads)
            batches.append(EntryBatch(first, [1] * len(payloads), kinds, payloads))
            payloads = []
    return batches


def append_and_apply(root: Path, batches: list[EntryBatch]) -> float:
    """Seconds spent appending and applying `batches` to a fresh store and state."""
    store = LogStore.open(
        root, StoreConfig(segment_bytes=SEGMENT_BYTES), group="bench", self_id="n1"
    )
    state = BrokerState(root, store, None)
    started = time.perf_counter()
    for batch in batches:
        store.append(batch)
        state.apply(batch)
    elapsed = time.perf_counter() - started
    state.close()
    store.close()
    return elapsed


def _one_run(count: int, *, make_only: bool) -> None:
    """The measured program: what callgrind counts (`make_only`: making the messages, the part
    subtracted)."""
    batches = messages(count, SEGMENT_BYTES)
    if make_only:
        return
    root = Path(tempfile.mkdtemp(prefix="bench-apply-cost-"))
    try:
        append_and_apply(root, batches)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _instructions(count: int, *, make_only: bool = False) -> int:
    out = Path(tempfile.mkdtemp(prefix="bench-apply-cost-cg-"))
    run = ["--one-run", str(count)] + (["--make-only"] if make_only else [])
    try:
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out / 'cg.out'}",
             sys.executable, "-m", "bench.apply_cost", *run],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    finally:
        shutil.rmtree(out, ignore_errors=True)
    found = re.search(r"Collected : ([\d,]+)", done.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timed", action="store_true", help="wall-clock, not instructions")
    parser.add_argument("--out", type=Path, help="where the JSON goes")
    parser.add_argument("--one-run", type=int, metavar="N", help=argparse.SUPPRESS)
    parser.add_argument("--make-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one_run is not None:
        _one_run(args.one_run, make_only=args.make_only)
        return 0
    document: dict[str, object] = {
        "what": "apply_cost",
        "messages": [FEW, MANY],
        "batch": BATCH,
        "body_bytes": len(BODY),
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
    }
    if args.timed:
        batches = messages(MANY, SEGMENT_BYTES)
        best = float("inf")
        for _ in range(3):
            root = Path(tempfile.mkdtemp(prefix="bench-apply-cost-"))
            try:
                best = min(best, append_and_apply(root, batches))
            finally:
                shutil.rmtree(root, ignore_errors=True)
        document["us_per_message"] = round(best / MANY * 1e6, 2)
        print(f"append + apply: {document['us_per_message']} us per message (best of 3)")
    else:
        if shutil.which("valgrind") is None:
            print("valgrind is not installed (apt-get install valgrind), or use --timed")
            return 2
        few, many = _instructions(FEW), _instructions(MANY)
        made_few, made_many = (
            _instructions(FEW, make_only=True),
            _instructions(MANY, make_only=True),
        )
        per_message = ((many - few) - (made_many - made_few)) // (MANY - FEW)
        document["instructions_per_message"] = per_message
        document["instructions_total"] = [few, many]
        document["instructions_making_the_messages"] = [made_few, made_many]
        print(f"append + apply: {document['instructions_per_message']:,} instructions per message")
    out = args.out or RESULTS / ("apply_cost_timed.json" if args.timed else "apply_cost.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(document)
    out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")  # the same dict layouts in both counted runs
    raise SystemExit(main())
