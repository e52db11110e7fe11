"""A seeded network between simulated nodes: delay, loss, duplication, reordering, partitions.

Partitions are computed as data first (the set of cut links) and applied after, as Jepsen's
nemesis does; a cut link drops messages both when they are sent and when they would arrive.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence

import attrs

from dledger.raft.entries import NodeId
from dledger.raft.messages import Message


@attrs.frozen
class NetworkFaults:
    drop: float = 0.0  # probability a message is lost
    duplicate: float = 0.0  # probability it is delivered twice
    delay_ticks_max: int = 0  # uniform delay in [0, max] ticks
    long_delay: float = 0.0  # probability of a delay up to 10x the max (old messages arrive late)


CLEAN = NetworkFaults()
FAULTY = NetworkFaults(drop=0.05, duplicate=0.03, delay_ticks_max=2, long_delay=0.02)


@attrs.define
class Packet:
    deliver_at: int
    src: NodeId
    dst: NodeId
    message: Message


Cut = frozenset[tuple[NodeId, NodeId]]


def cut_between(side_a: Iterable[NodeId], side_b: Iterable[NodeId]) -> Cut:
    a, b = list(side_a), list(side_b)
    return frozenset({(x, y) for x in a for y in b} | {(y, x) for x in a for y in b})


def random_halves(nodes: Sequence[NodeId], rng: random.Random) -> Cut:
    shuffled = list(nodes)
    rng.shuffle(shuffled)
    k = rng.randint(1, len(shuffled) // 2)
    return cut_between(shuffled[:k], shuffled[k:])


def isolate(node: NodeId, nodes: Sequence[NodeId]) -> Cut:
    return cut_between([node], [n for n in nodes if n != node])


def bridge(nodes: Sequence[NodeId], rng: random.Random) -> Cut:
    """Two sides that cannot talk, and one node that talks to both."""
    shuffled = list(nodes)
    rng.shuffle(shuffled)
    rest = shuffled[1:]  # shuffled[0] is the bridge: no cut touches it
    half = len(rest) // 2
    return cut_between(rest[:half], rest[half:]) if half else frozenset()


def one_way(src: NodeId, dst: NodeId) -> Cut:
    return frozenset({(src, dst)})


class Network:
    def __init__(self, rng: random.Random, faults: NetworkFaults) -> None:
        self.rng = rng
        self.faults = faults
        self.cut: Cut = frozenset()
        self.in_flight: list[Packet] = []
        self.sent = self.dropped = 0

    def send(self, src: NodeId, dst: NodeId, message: Message, now: int) -> None:
        self.sent += 1
        f, rng = self.faults, self.rng
        if (src, dst) in self.cut or (f.drop and rng.random() < f.drop):
            self.dropped += 1
            return
        copies = 2 if f.duplicate and rng.random() < f.duplicate else 1
        for _ in range(copies):
            delay = rng.randint(0, f.delay_ticks_max) if f.delay_ticks_max else 0
            if f.long_delay and rng.random() < f.long_delay:
                delay = rng.randint(0, 10 * max(1, f.delay_ticks_max))
            self.in_flight.append(Packet(now + delay, src, dst, message))

    def ready(self, now: int) -> list[int]:
        return [i for i, p in enumerate(self.in_flight) if p.deliver_at <= now]

    def take(self, position: int) -> Packet | None:
        """Remove the packet; None when a cut link eats it on arrival."""
        packets = self.in_flight
        packets[position], packets[-1] = packets[-1], packets[position]
        packet = packets.pop()
        if (packet.src, packet.dst) in self.cut:
            self.dropped += 1
            return None
        return packet

    def drop_around(self, node: NodeId, chance: float) -> None:
        """A node crashed: each message to or from it is lost with this chance."""
        rng = self.rng
        self.in_flight = [
            p for p in self.in_flight if (p.src != node and p.dst != node) or rng.random() >= chance
        ]
