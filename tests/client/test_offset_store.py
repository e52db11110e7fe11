"""The broadcasting offsets file and the in-memory offset table (client/offset_store.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from client.message import MessageQueue
from client.offset_store import (
    LocalOffsetStore,
    offset_file_path,
    read_offset_file,
    write_offset_file,
)

A0, A1, B0 = (
    MessageQueue("T", "broker-a", 0),
    MessageQueue("T", "broker-a", 1),
    MessageQueue("T", "broker-b", 0),
)


def test_the_file_round_trips_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = offset_file_path(tmp_path, "127.0.0.1@DEFAULT", "g")
    assert path == tmp_path / "127.0.0.1@DEFAULT" / "g" / "offsets.json"
    write_offset_file(path, "g", {A1: 7, A0: 3, B0: 0})
    assert read_offset_file(path) == {A0: 3, A1: 7, B0: 0}
    assert [p.name for p in path.parent.iterdir()] == ["offsets.json"]
    data = json.loads(path.read_text())
    assert data["group"] == "g"
    assert data["offsetTable"][0] == {
        "topic": "T",
        "brokerName": "broker-a",
        "queueId": 0,
        "offset": 3,
    }


def test_a_missing_file_is_empty_and_a_bad_one_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "offsets.json"
    assert read_offset_file(path) == {}
    path.write_text('{"offsetTable": [{"topic": "T"}]}')
    with pytest.raises(ValueError, match="not an offsets file"):
        read_offset_file(path)


def test_names_that_cannot_be_directories_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="group"):
        offset_file_path(tmp_path, "c", "a/b")
    with pytest.raises(ValueError, match="client key"):
        offset_file_path(tmp_path, "..", "g")


async def test_local_store_persists_changes_and_keeps_queues_it_gave_up(tmp_path: Path) -> None:
    path = offset_file_path(tmp_path, "c", "g")
    write_offset_file(path, "g", {B0: 40})
    store = LocalOffsetStore(path, "g")
    assert await store.read_stored(B0) == 40
    assert await store.read_stored(A0) is None
    store.update(A0, 5)
    store.update(A0, 3)  # never back, unless asked
    assert store.read_local(A0) == 5
    await store.persist([A0])
    assert read_offset_file(path) == {A0: 5, B0: 40}
    store.update(A0, 2, increase_only=False)
    store.forget(B0)
    await store.persist([A0])
    assert read_offset_file(path) == {A0: 2, B0: 40}
    reopened = LocalOffsetStore(path, "g")
    assert await reopened.read_stored(A0) == 2
