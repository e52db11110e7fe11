"""Which half messages are unresolved, and how often each was checked: RocketMQ's op queue
(RMQ_SYS_TRANS_OP_HALF_TOPIC) and its re-put half messages, kept in the log instead.

Every half the log holds has a queue offset in RMQ_SYS_TRANS_HALF_TOPIC queue 0. A half is
pending from its apply until the first entry resolving it is applied:

- a committed message naming it in TRAN_HALF_OFFSET (broker/state.py turns its apply into a
  "txn_end" operation with `how` "commit");
- a "txn_end" metadata entry: `how` "rollback" (END_TRANSACTION), "discard" (unresolved after
  transactionCheckMax checks) or "gone" (its record was deleted by retention first).

Later resolutions of the same half change nothing. A "txn_check" entry, written by the leader
before it sends CHECK_TRANSACTION_STATE, counts one check of each half it names and records
when, so a new leader goes on with the counts and the spacing where the old one stopped. Like
every metadata operation, each of these changes nothing when applied a second time.

It changes only as the log is applied, on every replica alike, and is part of the metadata
(snapshots and the checkpoint carry it as `transactions`). Only unresolved halves are held, so
its size is the number of transactions in flight; sends of new halves are refused while
PENDING_MAX are (broker/send.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

# Halves pending at once; more are refused (SYSTEM_BUSY). Each is one row of a metadata
# snapshot entry (about 25 bytes of msgpack), so their rows stay near 1 MiB of one log entry.
PENDING_MAX = 50_000
TXN_OPS = frozenset({"txn_half", "txn_end", "txn_check"})
TXN_END = "txn_end"
TXN_END_BYTES = TXN_END.encode()  # the shaper looks for it in metadata entries
HOW_COMMIT, HOW_ROLLBACK, HOW_DISCARD, HOW_GONE = "commit", "rollback", "discard", "gone"


@attrs.define
class HalfState:
    """One pending half."""

    store_ms: int  # its store time: the first check is due transactionTimeOut after it
    checks: int = 0  # CHECK_TRANSACTION_STATE requests the leaders recorded for it
    last_check_ms: int = 0  # when the last one was recorded (the proposing leader's clock)
    # CHECK_IMMUNITY_TIME_IN_SECONDS, in ms: the first check is due this long after store_ms
    # instead of transactionTimeOut (None: the half did not ask)
    immunity_ms: int | None = None


class TransactionProgress:
    def __init__(self) -> None:
        self.pending: dict[int, HalfState] = {}
        self.end = 0  # halves below this queue offset have been applied

    def resolved(self, offset: int) -> bool:
        """Whether the half at `offset` has been applied and resolved since."""
        return offset < self.end and offset not in self.pending

    def apply(self, op: Mapping[str, Any]) -> None:
        """A "txn_half", "txn_end" or "txn_check" operation (docs/formats.md#metadata-entry)."""
        kind = op["op"]
        if kind == "txn_half":
            offset = int(op["offset"])
            if offset >= self.end:  # applied again (a rebuild replaying): already known
                immunity = op.get("immunity_ms")
                self.pending[offset] = HalfState(
                    int(op["store_ms"]), immunity_ms=None if immunity is None else int(immunity)
                )
                self.end = offset + 1
        elif kind == TXN_END:
            self.pending.pop(int(op["offset"]), None)
        elif kind == "txn_check":
            at_ms = int(op["at_ms"])
            for offset, number in op["halves"]:
                half = self.pending.get(int(offset))
                if half is not None and int(number) > half.checks:  # applied again: as it was
                    half.checks = int(number)
                    half.last_check_ms = at_ms

    @staticmethod
    def half_op(offset: int, store_ms: int, immunity_ms: int | None = None) -> dict[str, Any]:
        """What applying a half message does (never written as an entry of its own)."""
        op: dict[str, Any] = {"op": "txn_half", "offset": offset, "store_ms": store_ms}
        if immunity_ms is not None:
            op["immunity_ms"] = immunity_ms
        return op

    @staticmethod
    def end_op(offset: int, how: str) -> dict[str, Any]:
        return {"op": TXN_END, "offset": offset, "how": how}

    @staticmethod
    def check_op(numbers: Mapping[int, int], at_ms: int) -> dict[str, Any]:
        """Check number `numbers[offset]` of each half, at `at_ms`."""
        return {"op": "txn_check", "halves": [[o, n] for o, n in numbers.items()], "at_ms": at_ms}

    def state(self) -> dict[str, Any]:
        return {
            "end": self.end,
            "pending": [
                [offset, h.store_ms, h.checks, h.last_check_ms]
                + ([] if h.immunity_ms is None else [h.immunity_ms])
                for offset, h in sorted(self.pending.items())
            ],
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        self.end = int(state.get("end", 0))
        self.pending = {}
        for row in state.get("pending", ()):  # a fifth column: the half's immunity, if any
            offset, store_ms, checks, last_ms = row[:4]
            immunity = int(row[4]) if len(row) > 4 else None
            self.pending[int(offset)] = HalfState(
                int(store_ms), int(checks), int(last_ms), immunity
            )

    def runtime_info(self, now_ms: int) -> dict[str, str]:
        """GET_BROKER_RUNTIME_INFO's lines on transactions (ours; RocketMQ shows none):
        `transactionHalfPending`, the half messages with no commit or rollback yet, and
        `transactionHalfOldestAgeMs`, how long ago the oldest of them was stored (0: none)."""
        oldest = min((h.store_ms for h in self.pending.values()), default=None)
        age = 0 if oldest is None else max(0, now_ms - oldest)
        return {
            "transactionHalfPending": str(len(self.pending)),
            "transactionHalfOldestAgeMs": str(age),
        }
