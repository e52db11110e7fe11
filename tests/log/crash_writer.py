"""The process the crash tests kill: `python -m tests.log.crash_writer STORE SEED`.

It appends deterministic bodies (tests.log.helpers.body) under SYNC_FLUSH, now and then
truncates, checkpoints or prepares a segment, and tells the test what it does on stdout,
always *before* doing it, and what became durable, always *after*:

    open <last_index>
    append <first> <last> <term>
    truncate <index>
    durable <index>

It runs until killed, or until OPS_MAX operations as a bound should the test die first.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from dledger.log.store import StoreConfig
from tests.log.helpers import batch_of, open_store

CONFIG = StoreConfig(segment_bytes=64 * 1024, index_records_per_file=64)
OPS_MAX = 100_000
BATCH_ENTRIES_MAX = 24
TRUNCATE_BACK_MAX = 30


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(store_dir: Path, seed: int) -> None:
    rng = random.Random(seed)
    store = open_store(store_dir, CONFIG)
    say(f"open {store.last_index}")
    for _ in range(OPS_MAX):
        roll = rng.random()
        if roll < 0.08 and store.last_index > store.first_index:
            index = max(store.first_index - 1, store.last_index - rng.randint(1, TRUNCATE_BACK_MAX))
            say(f"truncate {index}")
            store.truncate_after(index)
        elif roll < 0.12:
            durable = store.durable_index
            store.write_checkpoint(durable, durable)
        elif roll < 0.16 and store.segment_prepare_due:
            store.prepare_next_segment()
        term = max(store.last_term, 1) + (rng.random() < 0.1)
        first, count = store.last_index + 1, rng.randint(1, BATCH_ENTRIES_MAX)
        say(f"append {first} {first + count - 1} {term}")
        store.append(batch_of(first, term, count))
        if rng.random() < 0.5:
            say(f"durable {store.flush()}")
        else:  # the split form the flusher uses
            ticket = store.begin_flush()
            if ticket is not None:
                ticket.run()
                say(f"durable {store.complete_flush(ticket)}")
    store.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
