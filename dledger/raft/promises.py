"""The caller's half of "persist before you promise": promises held until the log is durable.

The core marks vote grants and append acknowledgements as `send_after_persist` with the index
they vouch for (`Effects.sync_through`). Whoever performs the effects must not send them before
its log is durable that far, must forget them when the log they vouch for is cut away (a
truncation or a reset), and must tell the core how far the log is durable (`Persisted`), so the
leader may count its own copy. The node (dledger/node.py) and the simulator
(dledger/raft/sim/world.py) both keep that contract through this one class, so the seeds the
simulator runs test the code production runs.

Pure: it holds envelopes and answers which may leave; the caller sends them.
"""

from __future__ import annotations

from collections.abc import Sequence

from dledger.raft.entries import EntryId
from dledger.raft.events import Persist, Persisted
from dledger.raft.messages import Envelope


class Promises:
    """Envelopes that vouch for log entries, waiting for the disk to catch up."""

    def __init__(self) -> None:
        self._held: list[tuple[int, Envelope]] = []  # (sync_through, envelope), in order

    def __len__(self) -> int:
        return len(self._held)

    def log_changed(self, persist: Persist) -> None:
        """`persist` cut the log (truncate or reset): a promise about entries past the cut
        vouches for entries this replica no longer holds, so it is never sent."""
        if persist.reset is not None:
            cut: int | None = persist.reset.prev.index
        else:
            cut = persist.truncate_after
        if cut is not None and self._held:
            self._held = [(s, e) for s, e in self._held if s <= cut]

    def hold(
        self, sync_through: int, envelopes: Sequence[Envelope], durable_index: int
    ) -> list[Envelope]:
        """Take the promises of one step; those the log already covers come back to be sent,
        after anything held before them (promises leave in the order they were made)."""
        self._held.extend((sync_through, e) for e in envelopes)
        return self.release(durable_index)

    def release(self, durable_index: int) -> list[Envelope]:
        """The promises the log now covers, in order; the rest stay held."""
        if not self._held:
            return []
        ready: list[Envelope] = []
        keep: list[tuple[int, Envelope]] = []
        for sync_through, envelope in self._held:
            if sync_through <= durable_index:
                ready.append(envelope)
            else:
                keep.append((sync_through, envelope))
        self._held = keep
        return ready

    def durable(self, through: EntryId, log_start: int) -> tuple[list[Envelope], Persisted | None]:
        """The log became durable through `through`: the promises to send now, and the report
        for the core (none when `through` lies at or before the log's start, which the core
        knows already: a reset log holds no entry there)."""
        ready = self.release(through.index)
        return ready, Persisted(through) if through.index > log_start else None

    def clear(self) -> None:
        """A crash: what was held is gone with the process."""
        self._held.clear()
