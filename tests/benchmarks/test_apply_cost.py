"""bench.apply_cost's workload: messages placed and offset as a leader would, so every
replica's dispatcher accepts them (it asserts each record's physical offset) and the queues
and index end where the log does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import apply_cost
from broker.state import BrokerState
from dledger.log.store import LogStore, StoreConfig


def test_the_workload_appends_and_applies_as_a_replica_would(tmp_path: Path) -> None:
    segment_bytes = 1 << 20  # small: some entries must skip to the next segment
    batches = apply_cost.messages(1_000, segment_bytes)
    assert sum(len(b) for b in batches) == 1_000
    store = LogStore.open(
        tmp_path, StoreConfig(segment_bytes=segment_bytes), group="g", self_id="n"
    )
    state = BrokerState(tmp_path, store, None)
    for batch in batches:
        assert batch.first_index == store.last_index + 1
        store.append(batch)
        state.apply(batch)
    assert state.applied_index == 1_000
    queues = {q: state.queue_range("BenchTopic", q) for q in range(apply_cost.QUEUES)}
    assert queues == dict.fromkeys(range(apply_cost.QUEUES), (0, 1_000 // apply_cost.QUEUES))
    assert store.positions(1_000, 1_000)[0] >= segment_bytes  # into the second segment
    state.close()
    store.close()


def test_the_timed_mode_writes_its_figure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(apply_cost, "MANY", 300)
    out = tmp_path / "apply_cost.json"
    assert apply_cost.main(["--timed", "--out", str(out)]) == 0
    document = json.loads(out.read_text())
    assert document["what"] == "apply_cost" and document["us_per_message"] > 0
