"""Client appends on their way through the leader: queued, proposed, then answered.

An answer is certain only once the commit index passes the entry's index: the entry there is
then committed forever, and it is ours exactly when its term is the term we proposed it in
(entries never move to another index). Losing leadership or seeing the entry truncated here
proves nothing (a later leader may still hold and commit it), so such appends keep waiting,
until the commit index decides or their deadline answers OUTCOME_UNKNOWN.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence

import attrs

from dledger.wire import Status

Reply = Callable[[Status, str, dict[str, object]], None]


@attrs.define
class PendingAppend:
    """Received, not yet proposed."""

    bodies: Sequence[bytes]
    reply: Reply
    deadline: float  # trio time


@attrs.define(eq=False)
class Waiter:
    """Proposed as entries (last - n + 1)..last in `term`; answered once."""

    last: int
    term: int
    count: int
    reply: Reply
    deadline: float
    done: bool = False

    def answer(self, status: Status, message: str, **fields: object) -> None:
        if not self.done:
            self.done = True
            self.reply(status, message, fields)


class AppendWaiters:
    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Waiter]] = []
        self._tie = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, waiter: Waiter) -> None:
        heapq.heappush(self._heap, (waiter.last, next(self._tie), waiter))

    def commit(self, commit_index: int, term_at: Callable[[int], int | None]) -> None:
        """Answer every append whose last entry the commit index has passed. `term_at` gives
        the committed entry's term, or None when it is no longer stored."""
        heap = self._heap
        while heap and heap[0][0] <= commit_index:
            waiter = heapq.heappop(heap)[2]
            if waiter.done:
                continue
            term = term_at(waiter.last)
            if term == waiter.term:
                waiter.answer(Status.OK, "committed", index=waiter.last, count=waiter.count)
            elif term is None:
                waiter.answer(Status.OUTCOME_UNKNOWN, "committed range is no longer stored")
            else:
                waiter.answer(
                    Status.NOT_COMMITTED,
                    f"index {waiter.last} was committed with another entry (term {term}); "
                    f"this one (term {waiter.term}) never will be",
                )

    def expire(self, now: float) -> int:
        """Answer appends whose deadline passed; returns how many."""
        expired = 0
        for _, _, waiter in self._heap:
            if not waiter.done and waiter.deadline <= now:
                waiter.answer(Status.OUTCOME_UNKNOWN, "not committed before the deadline")
                expired += 1
        if expired:
            self._heap = [item for item in self._heap if not item[2].done]
            heapq.heapify(self._heap)
        return expired

    def fail_all(self, status: Status, message: str) -> None:
        for _, _, waiter in self._heap:
            waiter.answer(status, message)
        self._heap.clear()
