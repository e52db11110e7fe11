"""What must enter the log at most once, as the leader's shaper sees it (broker/state.py).

Two kinds of entries act on a record earlier in the log and must do so once: the delivery of a
delayed message (it names its schedule record in SCHEDULE_SOURCE) and the resolution of a half
message of a transaction (a commit naming it in TRAN_HALF_OFFSET, or a "txn_end" entry). The
shaper sees every proposal just before it enters the leader's log; `ShapedOnce` remembers what
it let through in the current term that is not applied yet, and with the applied progress
(broker/schedule_progress.py, broker/transaction_progress.py) decides whether a new one is the
first. A second delivery or commit is replaced by a `void` entry; a second "txn_end" goes in
and changes nothing when applied. docs/decisions.md "Delayed messages are delivered exactly
once across a failover" has the argument; transactions follow it.
"""

from __future__ import annotations

from broker.delays import SOURCE_BYTES, Source
from broker.entries import decode_meta
from broker.schedule_progress import DeliveryProgress
from broker.transaction_progress import TXN_END, TransactionProgress
from broker.transactions import half_offset_of
from remoting import properties as props


class ShapedOnce:
    """One leader term's deliveries and resolutions shaped and not yet applied."""

    def __init__(self) -> None:
        self.sources: set[Source] = set()
        self.halves: set[int] = set()
        self._new_sources: list[Source] = []  # noted by the proposal being shaped
        self._new_halves: list[int] = []

    def clear(self) -> None:
        """A new term (or none): nothing of this leader's is in flight."""
        self.sources.clear()
        self.halves.clear()
        self.begin()

    def begin(self) -> None:
        """A proposal starts being shaped."""
        self._new_sources = []
        self._new_halves = []

    def refused(self) -> None:
        """The proposal just shaped did not enter the log: forget what it noted."""
        self.sources.difference_update(self._new_sources)
        self.halves.difference_update(self._new_halves)
        self.begin()

    # --- applied: no longer in flight (the progress has it now) ------------------------------

    def delivered(self, source: Source) -> None:
        self.sources.discard(source)

    def resolved(self, half: int) -> None:
        self.halves.discard(half)

    # --- the shaper's questions ----------------------------------------------------------

    def first_delivery(self, properties: bytes, progress: DeliveryProgress) -> bool:
        """Whether a delivered delayed message names a source no entry of the log before it
        delivered (the applied progress, and what this term shaped since): then it is noted as
        shaped, else it must not enter the log."""
        raw = props.find(properties, SOURCE_BYTES)
        if raw is None:
            return True  # the name occurred in the properties, but not as a key
        source = Source.parse(raw)
        if source is None or source in self.sources or progress.delivered(source):
            return False
        self.sources.add(source)
        self._new_sources.append(source)
        return True

    def first_commit(
        self, properties: bytes, progress: TransactionProgress, halves_shaped: int
    ) -> bool:
        """Whether a committed message names a half that no entry of the log before it
        resolved: then the half is noted as resolved, else the commit must not enter the log.
        `halves_shaped` is the half queue's next offset as the shaper assigns them (halves at
        and past the applied `progress.end` were shaped in this term and are pending)."""
        half = half_offset_of(properties)
        if half is None:
            return True  # the name occurred, but not as the key: an ordinary message
        if half in self.halves:
            return False
        if half < progress.end:
            unresolved = half in progress.pending
        else:
            unresolved = half < halves_shaped  # else it names no half at all
        if unresolved:
            self._note(half)
        return unresolved

    def note_resolution(self, payload: bytes) -> None:
        """A metadata entry that may be a "txn_end" (rollback, discard) enters the log: no
        commit of its half may follow it."""
        op = decode_meta(payload)
        if op is None or op.get("op") != TXN_END or not isinstance(op.get("offset"), int):
            return
        if op["offset"] not in self.halves:
            self._note(op["offset"])

    def _note(self, half: int) -> None:
        self.halves.add(half)
        self._new_halves.append(half)
