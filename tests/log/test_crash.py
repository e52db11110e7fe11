"""kill -9 at random moments: a writer process appends, truncates and flushes under
SYNC_FLUSH; after every kill (and, every other time, the loss of a random part of what was
not yet fsynced, as a power loss would add) the store must open with every entry the writer
saw durable, byte for byte, and serve nothing invalid."""

from __future__ import annotations

import os
import queue
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from dledger.log.index_file import RECORD, index_file_first
from dledger.log.layout import file_name
from dledger.log.meta import read_checkpoint
from dledger.log.store import LogStore
from tests.log.crash_writer import CONFIG
from tests.log.helpers import body, open_store

REPO = Path(__file__).resolve().parents[2]
LINE_WAIT_S = 30.0  # a writer that prints nothing for this long is stuck: fail
KILLS = 50
KILLS_SLOW = 400


@attrs.define
class Model:
    """What the writer said: the term it wrote at each index, and what became durable."""

    terms: dict[int, int] = attrs.Factory(dict)
    durable: int = 0

    def apply(self, line: str) -> None:
        word, *args = line.split()
        numbers = [int(a) for a in args]
        if word == "append":
            first, last, term = numbers
            for index in range(first, last + 1):
                self.terms[index] = term
        elif word == "truncate":  # said before it happens: it may not have, so keep terms
            self.durable = min(self.durable, numbers[0])
        elif word == "durable":
            self.durable = numbers[0]
        else:
            assert word == "open", line


def lines(proc: subprocess.Popen[str]) -> Iterator[str | None]:
    """The writer's lines as they come; None when LINE_WAIT_S passes without one."""
    inbox: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            inbox.put(line)
        inbox.put(None)

    threading.Thread(target=pump, daemon=True).start()
    while True:
        try:
            item = inbox.get(timeout=LINE_WAIT_S)
        except queue.Empty:
            yield None
            return
        if item is None:
            return
        yield item


def verify(store: LogStore, model: Model) -> None:
    """Every durable entry is there as written; every entry served is a valid one."""
    assert store.last_index >= model.durable, (store.last_index, model.durable, store.recovery)
    previous = store.start.prev.term
    index = store.first_index
    while index <= store.last_index:
        batch = store.read(index, store.last_index, 1 << 20)
        for k, payload in enumerate(batch.payloads):
            term = batch.terms[k]
            assert term >= previous
            assert payload == body(index + k, term), index + k
            if index + k <= model.durable:
                assert term == model.terms[index + k], (index + k, term)
            previous = term
        index += len(batch)
    report = store.recovery
    assert report.cut_bytes >= 0 and report.cut_entries >= 0 and report.seconds < 30


def lose_unsynced_tail(store_dir: Path, durable: int, rng: random.Random) -> None:
    """What a power loss may add to a kill: the bytes after entry `durable` (fsynced) are
    lost from a random point on, the first of them torn (garbage), later segments gone."""
    if durable == 0:
        return
    per_file = CONFIG.index_records_per_file
    first = index_file_first(durable, per_file)
    record = (store_dir / "dledger" / "index" / file_name(first)).read_bytes()
    position, index, _, size, _, _ = RECORD.unpack_from(record, (durable - first) * RECORD.size)
    assert index == durable
    cut = position + size + rng.randint(0, 3000)
    seg = CONFIG.segment_bytes
    base = cut - cut % seg
    for path in (store_dir / "dledger" / "data").iterdir():
        if int(path.name) > base:
            path.unlink()
    segment = store_dir / "dledger" / "data" / file_name(base)
    if segment.exists() and cut > base:
        with open(segment, "r+b") as f:
            f.seek(cut - base)
            torn = rng.randbytes(rng.randint(0, 64))
            f.write((torn + bytes(seg))[: seg - (cut - base)])


def kill_cycles(tmp_path: Path, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    store_dir = tmp_path / "store"
    model = Model()
    for cycle in range(kills):
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.log.crash_writer",
                str(store_dir),
                str(seed * 1000 + cycle),
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
            env=os.environ | {"PYTHONPATH": str(REPO)},
        )
        flushes_before_kill = rng.choice([0, 1, 2, 5, 10, 30])
        stream = lines(proc)
        try:
            flushes = 0
            for line in stream:
                assert line is not None, f"writer silent for {LINE_WAIT_S} s (cycle {cycle})"
                model.apply(line)
                flushes += line.startswith("durable")
                if flushes >= flushes_before_kill and line.startswith(("open", "durable")):
                    break
            time.sleep(rng.uniform(0, 0.004))  # land the kill anywhere in the next operation
        finally:
            proc.kill()
            proc.wait()
        for line in stream:  # what it said before dying, still in the pipe
            if line is not None:
                model.apply(line)
        if rng.random() < 0.5:
            # A truncation said but not done leaves the checkpoint above model.durable, and
            # what the checkpoint vouches for was fsynced: only what follows it may be lost.
            checkpoint = read_checkpoint(store_dir / "dledger" / "checkpoint")
            synced = max(model.durable, checkpoint.durable_index if checkpoint else 0)
            lose_unsynced_tail(store_dir, synced, rng)
        with open_store(store_dir, CONFIG) as store:
            verify(store, model)
            assert store.durable_index == store.last_index  # recovery synced what it kept
            model.durable = store.last_index


def test_kill_9_keeps_every_durable_entry(tmp_path: Path) -> None:
    kill_cycles(tmp_path, KILLS, seed=1)


@pytest.mark.slow
def test_kill_9_soak(tmp_path: Path) -> None:
    kill_cycles(tmp_path, KILLS_SLOW, seed=2)
