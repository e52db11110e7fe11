"""Network partitions as data: which host may not send to which, decided before anything is
applied, so that planning is tested without a network and a run records exactly what it did.

A partition is a set of directed drops (src, dst): packets from src never reach dst. A full
cut between two nodes is both directions. `chaos.net` turns each drop into one iptables rule in
the destination's namespace. Partitions are between replicas, but for one: `cut_client` drops
what the harness's client host (CLIENT, where the workload runs) sends one replica, while the
replicas (and name servers) still reach each other.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

Drop = tuple[str, str]  # (src, dst): packets from src are dropped on arrival at dst
CLIENT = "client"  # the harness's client host, as a drop's source (chaos.net knows its address)


@attrs.frozen
class Partition:
    kind: str  # "isolate", "halves", "bridge", "one-way"
    components: tuple[tuple[str, ...], ...]  # how the nodes were split, for the record
    drops: frozenset[Drop]

    def describe(self) -> dict[str, Any]:
        return {
            "partition": self.kind,
            "components": [list(c) for c in self.components],
            "drops": sorted([list(d) for d in self.drops]),
        }

    def reaches(self, src: str, dst: str) -> bool:
        return (src, dst) not in self.drops


def cut_between(side_a: Iterable[str], side_b: Iterable[str]) -> frozenset[Drop]:
    """Both directions between every node of a and every node of b."""
    a, b = list(side_a), list(side_b)
    return frozenset({(x, y) for x in a for y in b} | {(y, x) for x in a for y in b})


def isolate(nodes: Sequence[str], target: str) -> Partition:
    """`target` alone on one side (e.g. the leader), everyone else on the other."""
    _check(nodes, [target])
    rest = tuple(n for n in nodes if n != target)
    return Partition("isolate", ((target,), rest), cut_between([target], rest))


def halves(nodes: Sequence[str], rng: random.Random) -> Partition:
    """A random minority against the majority (1 vs 2 of 3, 2 vs 3 of 5)."""
    shuffled = list(nodes)
    rng.shuffle(shuffled)
    minority = tuple(sorted(shuffled[: len(nodes) // 2]))
    majority = tuple(sorted(shuffled[len(nodes) // 2 :]))
    return Partition("halves", (minority, majority), cut_between(minority, majority))


def halves_with(nodes: Sequence[str], minority: Sequence[str]) -> Partition:
    """Halves with a chosen minority (e.g. the leader and one follower of 5)."""
    _check(nodes, minority)
    assert 0 < len(minority) < (len(nodes) + 1) / 2, f"{minority} is not a minority of {nodes}"
    small = tuple(sorted(minority))
    large = tuple(sorted(n for n in nodes if n not in minority))
    return Partition("halves", (small, large), cut_between(small, large))


def bridge(nodes: Sequence[str], rng: random.Random, via: str | None = None) -> Partition:
    """Two halves that cannot reach each other and one node (`via`) that reaches both: with 3
    nodes a - via - b; with 5, {a, b} - via - {c, d}. Every node sees a majority through the
    bridge, so the cluster may elect either side's node, or the bridge."""
    assert len(nodes) >= 3, "a bridge needs at least 3 nodes"
    shuffled = list(nodes)
    rng.shuffle(shuffled)
    middle = via if via is not None else shuffled[0]
    _check(nodes, [middle])
    others = [n for n in shuffled if n != middle]
    left, right = (
        tuple(sorted(others[: len(others) // 2])),
        tuple(sorted(others[len(others) // 2 :])),
    )
    return Partition("bridge", (left, (middle,), right), cut_between(left, right))


def one_way(nodes: Sequence[str], src: str, dsts: Sequence[str] | None = None) -> Partition:
    """Packets from `src` to `dsts` (default: everyone else) dropped; the other direction
    flows. Over TCP the acknowledgements of dst's own connections to src are lost too, so
    dst's data reaches src only until its send window fills."""
    targets = [n for n in (dsts if dsts is not None else nodes) if n != src]
    _check(nodes, [src, *targets])
    return Partition("one-way", ((src,), tuple(targets)), frozenset((src, d) for d in targets))


def cut_client(nodes: Sequence[str], target: str) -> Partition:
    """The clients cut off from `target` (the leader, say) while its peers still reach it:
    what they send it is dropped on arrival, so their connections hear nothing back either.
    The group keeps its leader; only the route the clients hold is wrong."""
    _check(nodes, [target])
    return Partition("client", ((target,), (CLIENT,)), frozenset({(CLIENT, target)}))


def in_majority(partition: Partition, node: str, nodes: Sequence[str]) -> bool:
    """`node` belongs to a majority of `nodes` whose members all reach each other both ways:
    a leader there can go on committing."""
    quorum = len(nodes) // 2 + 1
    others = [n for n in nodes if n != node]
    for group in itertools.combinations(others, quorum - 1):
        members = (node, *group)
        if all(partition.reaches(a, b) for a in members for b in members if a != b):
            return True
    return False


def drops_by_destination(partition: Partition) -> dict[str, list[str]]:
    """dst -> the sources whose packets it drops: one rule set per namespace."""
    by_dst: dict[str, list[str]] = {}
    for src, dst in sorted(partition.drops):
        by_dst.setdefault(dst, []).append(src)
    return by_dst


def _check(nodes: Sequence[str], named: Iterable[str]) -> None:
    unknown = [n for n in named if n not in nodes]
    assert not unknown, f"{unknown} are not among {list(nodes)}"
