"""The offset coalescer (broker/offsets.py) answers reads with what it was told, also in the
moment between an offset entry's commit and this replica's apply of it: a consumer taking a
queue over reads the offset its previous owner committed, never the one before."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from broker.metadata import Metadata
from broker.offsets import OffsetCoalescer
from broker.writes import Written

KEY = ("g", "T", 0)


class AppliedLater:
    """A replica's state whose apply runs behind the log's commit, as it may."""

    def __init__(self) -> None:
        self.metadata = Metadata()
        self.applied_index = 0
        self._applied = trio.Event()

    async def wait_applied(self, index: int) -> None:
        while self.applied_index < index:
            await self._applied.wait()

    def apply(self, index: int, offsets: dict[tuple[str, str, int], int]) -> None:
        self.metadata.offsets.update(offsets)
        self.applied_index = index
        self._applied.set()
        self._applied = trio.Event()


class CommitAtOnce:
    """A write path whose appends commit at once, as entry 1, 2, ..."""

    def __init__(self) -> None:
        self.index = 0

    async def append(self, bodies: Any, timeout_s: float) -> Written:
        self.index += 1
        return Written(self.index, True)


async def test_a_committed_offset_is_read_back_before_and_after_its_apply() -> None:
    state = AppliedLater()
    state.metadata.offsets[KEY] = 3  # an older commit, applied
    coalescer = OffsetCoalescer(state, CommitAtOnce())  # type: ignore[arg-type]
    coalescer.commit(*KEY, 7)
    assert coalescer.query(*KEY) == 7
    async with trio.open_nursery() as nursery:
        nursery.start_soon(coalescer.write_pending)
        await trio.testing.wait_all_tasks_blocked()
        assert coalescer.entries_written == 1  # committed, not yet applied here
        assert coalescer.query(*KEY) == 7
        state.apply(1, {KEY: 7})
    assert coalescer.query(*KEY) == 7
