"""Which queues of a topic each member of a consumer group takes: the allocation strategies.

Every member runs the same function on the same inputs (the topic's readable queues and the
group's client ids, both sorted) and takes its own share, so no coordinator is needed; while
members' views differ (a join seen by one and not yet by another), a queue may briefly have
two owners or none, which the next rebalance mends (orderly consumers also hold a broker lock).

- `allocate_averagely`: RocketMQ's AllocateMessageQueueAveragely, the default: contiguous runs
  of queues, the first `queues % members` members taking one more.
- `ConsistentHash`: RocketMQ's AllocateMessageQueueConsistentHash: each member on a ring of
  MD5 points (10 virtual nodes each); a queue goes to the first point at or after its own hash.
  A member joining or leaving moves only the queues it takes or gave up. The hashes are Java's
  (the first 4 bytes of MD5 of `clientId-n` and of MessageQueue.toString()), so Python and Java
  members of one group agree.

Each strategy is a function (group, this member's id, all queues, all ids) -> this member's
queues; `plan` turns an allocation into queues to start and to stop.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Collection, Sequence

import attrs

from client.message import MessageQueue

Allocator = Callable[[str, str, Sequence[MessageQueue], Sequence[str]], list[MessageQueue]]

VIRTUAL_NODES_DEFAULT = 10  # AllocateMessageQueueConsistentHash's virtualNodeCnt


def _check(current_id: str, queues: Sequence[MessageQueue], ids: Sequence[str]) -> bool:
    if not current_id:
        raise ValueError("the current client id is empty")
    return bool(queues) and current_id in ids


def allocate_averagely(
    group: str, current_id: str, queues: Sequence[MessageQueue], ids: Sequence[str]
) -> list[MessageQueue]:
    """This member's run of `queues` (sorted), by its index in `ids` (sorted); nothing when it
    is not among `ids` or there are more members than queues and it comes late."""
    if not _check(current_id, queues, ids):
        return []
    index = list(ids).index(current_id)
    count, members = len(queues), len(ids)
    extra = count % members
    if count <= members:
        size = 1
    elif extra and index < extra:
        size = count // members + 1
    else:
        size = count // members
    start = index * size if extra and index < extra else index * size + extra
    return [queues[(start + i) % count] for i in range(max(0, min(size, count - start)))]


def java_md5_hash(key: str) -> int:
    """The first 4 bytes of MD5 of the UTF-8 key, as an unsigned number (Java's MD5Hash)."""
    digest = hashlib.md5(key.encode(), usedforsecurity=False).digest()
    return int.from_bytes(digest[:4], "big")


def java_queue_text(queue: MessageQueue) -> str:
    """MessageQueue.toString(), the key a queue is hashed by."""
    return f"MessageQueue [topic={queue.topic}, brokerName={queue.broker_name}, queueId={queue.queue_id}]"


@attrs.frozen
class ConsistentHash:
    """An allocator: `ConsistentHash()` or `ConsistentHash(virtual_nodes=20)`."""

    virtual_nodes: int = VIRTUAL_NODES_DEFAULT

    def __attrs_post_init__(self) -> None:
        if self.virtual_nodes < 1:
            raise ValueError(f"virtual_nodes must be at least 1, not {self.virtual_nodes}")

    def ring(self, ids: Sequence[str]) -> tuple[list[int], list[str]]:
        """Sorted points and the member at each; a later member wins a shared point, as a
        TreeMap.put over the members in order does."""
        points: dict[int, str] = {}
        for member in ids:
            for n in range(self.virtual_nodes):
                points[java_md5_hash(f"{member}-{n}")] = member
        keys = sorted(points)
        return keys, [points[k] for k in keys]

    def owner(self, queue: MessageQueue, ring: tuple[list[int], list[str]]) -> str:
        keys, members = ring
        at = bisect.bisect_left(keys, java_md5_hash(java_queue_text(queue)))
        return members[at % len(keys)]

    def __call__(
        self, group: str, current_id: str, queues: Sequence[MessageQueue], ids: Sequence[str]
    ) -> list[MessageQueue]:
        if not _check(current_id, queues, ids):
            return []
        ring = self.ring(ids)
        return [q for q in queues if self.owner(q, ring) == current_id]


def allocator(strategy: str | Allocator) -> Allocator:
    """ "averagely" (the default), "consistent_hash", or any function of the Allocator shape."""
    if callable(strategy):
        return strategy
    if strategy == "averagely":
        return allocate_averagely
    if strategy in ("consistent_hash", "consistent-hash"):
        return ConsistentHash()
    raise ValueError(f"unknown allocation strategy {strategy!r}: use averagely or consistent_hash")


@attrs.frozen
class Plan:
    start: frozenset[MessageQueue]
    stop: frozenset[MessageQueue]


def plan(owned: Collection[MessageQueue], wanted: Collection[MessageQueue]) -> Plan:
    """Queues to start pulling and queues to stop, going from `owned` to `wanted`."""
    owned_set, wanted_set = frozenset(owned), frozenset(wanted)
    return Plan(start=wanted_set - owned_set, stop=owned_set - wanted_set)
