"""The latency and fault tracker: which broker groups a producer avoids for a while
(RocketMQ's MQFaultStrategy with LatencyFaultTolerance).

Broker groups: every answer records its latency against the broker group (broker name) that gave it; a slow
answer makes the producer avoid the group for a time that grows with the latency
(limits.LATENCY_STEPS_S -> limits.AVOID_STEPS_S), a failure (no answer, a refusal) for
limits.FAILURE_AVOID_S, and a quick answer ends the avoidance at once. The slowest recent
answer of each group (`slow_answer_s`, decaying) lets a send give a slow group's requests more
time than a quiet group's. The queue picker
(client/selectors.py) skips avoided groups while another is left, and otherwise takes the
group whose avoidance ends first.

Replica addresses: a request that failed at an address (no connection, no answer, a refusal)
puts that address after the group's others for limits.ADDRESS_AVOID_S (`replica_order`), so a
client cut off from one replica (the leader, say) goes straight to another, which forwards the
write, instead of waiting out the cut replica on every send. An address that gave no answer at
all is avoided twice as long, so when every replica failed (the leader cut off from its peers
times out while the others have no leader yet) the next try begins with those that answered.

Time comes from the clock given (trio's by default), so tests drive it by hand.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence

import trio

from client import limits


def avoid_for_s(latency_s: float) -> float:
    """How long an answer that took `latency_s` makes the producer avoid its group."""
    step = bisect.bisect_right(limits.LATENCY_STEPS_S, latency_s)  # steps it reached
    return limits.AVOID_STEPS_S[step - 1] if step else 0.0


class FaultTracker:
    def __init__(self, clock: Callable[[], float] = trio.current_time) -> None:
        self._clock = clock
        self._avoid_until: dict[str, float] = {}  # broker name -> clock time
        self._address_avoid_until: dict[str, float] = {}  # replica address -> clock time
        self._slowest: dict[str, tuple[float, float]] = {}  # broker name -> (latency_s, when)

    def answered(self, broker_name: str, latency_s: float) -> None:
        """An answer (a stored message) came back from the group after `latency_s`."""
        now = self._clock()
        if latency_s >= self.slow_answer_s(broker_name):
            self._slowest[broker_name] = (latency_s, now)
        avoid = avoid_for_s(latency_s)
        if avoid > 0:
            self._avoid_until[broker_name] = self._clock() + avoid
        else:
            self._avoid_until.pop(broker_name, None)

    def slow_answer_s(self, broker_name: str) -> float:
        """The group's slowest recent answer: the slowest seen, halved every
        limits.LATENCY_HALF_LIFE_S since (0 when none)."""
        seen = self._slowest.get(broker_name)
        if seen is None:
            return 0.0
        latency_s, at = seen
        return float(latency_s * 0.5 ** ((self._clock() - at) / limits.LATENCY_HALF_LIFE_S))

    def failed(self, broker_name: str) -> None:
        """The group refused, was unreachable, or did not answer in time."""
        self._avoid_until[broker_name] = self._clock() + limits.FAILURE_AVOID_S

    def available(self, broker_name: str) -> bool:
        until = self._avoid_until.get(broker_name)
        if until is None:
            return True
        if self._clock() >= until:
            del self._avoid_until[broker_name]
            return True
        return False

    def least_avoided(self, broker_names: Iterable[str]) -> str | None:
        """Of these groups, the one whose avoidance ends first (ties: the first given)."""
        best: str | None = None
        best_until = 0.0
        for name in broker_names:
            until = self._avoid_until.get(name, 0.0)
            if best is None or until < best_until:
                best, best_until = name, until
        return best

    def avoided(self) -> dict[str, float]:
        """Groups avoided now, with the seconds left (for logs and tests)."""
        now = self._clock()
        return {n: u - now for n, u in self._avoid_until.items() if u > now}

    # --- replica addresses ---------------------------------------------------------------

    def address_failed(self, address: str, *, answered: bool = True) -> None:
        """A request to `address` got a refusal (`answered`), or no connection or no answer
        (avoided longer: limits.ADDRESS_SILENT_AVOID_S)."""
        avoid_s = limits.ADDRESS_AVOID_S if answered else limits.ADDRESS_SILENT_AVOID_S
        self._address_avoid_until[address] = self._clock() + avoid_s

    def address_answered(self, address: str) -> None:
        """`address` stored a message: it is tried in its route order again."""
        self._address_avoid_until.pop(address, None)

    def replica_order(self, addresses: Sequence[str]) -> list[str]:
        """`addresses` (master first) with the avoided ones moved last, those whose avoidance
        ends first before the others; the rest keep their order."""
        now = self._clock()
        avoided = {
            a: until for a in addresses if (until := self._address_avoid_until.get(a, 0.0)) > now
        }
        if not avoided:
            return list(addresses)
        for a in [a for a, u in self._address_avoid_until.items() if u <= now]:
            del self._address_avoid_until[a]
        return [a for a in addresses if a not in avoided] + sorted(avoided, key=avoided.__getitem__)
