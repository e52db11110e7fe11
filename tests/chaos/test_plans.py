"""Partitions and fault schedules are data: planned, checked and recorded before anything is
applied, so they are tested here without a network."""

from __future__ import annotations

import itertools
import random

import pytest

from chaos import partition as plans
from chaos.net import drop_rules
from chaos.schedule import FAULTS, SCENARIOS, plan

THREE = ["n0", "n1", "n2"]
FIVE = ["n0", "n1", "n2", "n3", "n4"]


def test_isolating_the_leader_cuts_it_off_both_ways_and_nothing_else() -> None:
    p = plans.isolate(THREE, "n1")
    assert p.drops == {("n1", "n0"), ("n0", "n1"), ("n1", "n2"), ("n2", "n1")}
    assert p.reaches("n0", "n2") and p.reaches("n2", "n0")
    assert not plans.in_majority(p, "n1", THREE)
    assert plans.in_majority(p, "n0", THREE)
    assert p.describe()["components"] == [["n1"], ["n0", "n2"]]


@pytest.mark.parametrize("nodes", [THREE, FIVE])
@pytest.mark.parametrize("seed", range(5))
def test_halves_split_into_a_minority_and_a_majority(nodes: list[str], seed: int) -> None:
    p = plans.halves(nodes, random.Random(seed))
    small, large = p.components
    assert len(small) == len(nodes) // 2 and len(large) == len(nodes) - len(small)
    assert set(small) | set(large) == set(nodes) and not set(small) & set(large)
    for a, b in itertools.product(small, large):
        assert not p.reaches(a, b) and not p.reaches(b, a)
    assert all(plans.in_majority(p, n, nodes) for n in large)
    assert not any(plans.in_majority(p, n, nodes) for n in small)


def test_halves_are_a_function_of_the_seed() -> None:
    assert plans.halves(FIVE, random.Random(3)) == plans.halves(FIVE, random.Random(3))


@pytest.mark.parametrize("nodes", [THREE, FIVE])
def test_a_bridge_node_reaches_both_sides_that_cannot_reach_each_other(nodes: list[str]) -> None:
    p = plans.bridge(nodes, random.Random(1), via="n2")
    left, middle, right = p.components
    assert middle == ("n2",)
    assert all(p.reaches("n2", n) and p.reaches(n, "n2") for n in nodes if n != "n2")
    for a, b in itertools.product(left, right):
        assert not p.reaches(a, b) and not p.reaches(b, a)
    # every node still belongs to some majority, through the bridge
    assert all(plans.in_majority(p, n, nodes) for n in nodes)


def test_one_way_drops_only_one_direction() -> None:
    p = plans.one_way(THREE, "n0")
    assert p.drops == {("n0", "n1"), ("n0", "n2")}
    assert p.reaches("n1", "n0") and not p.reaches("n0", "n1")
    assert plans.drops_by_destination(p) == {"n1": ["n0"], "n2": ["n0"]}


def test_rules_are_grouped_by_the_namespace_that_drops() -> None:
    p = plans.isolate(THREE, "n0")
    assert plans.drops_by_destination(p) == {"n0": ["n1", "n2"], "n1": ["n0"], "n2": ["n0"]}


def test_a_client_cut_drops_only_what_the_client_host_sends_the_target() -> None:
    """The replicas still reach each other both ways; the target's chain drops the client
    host's address, nobody else's chain changes."""
    p = plans.cut_client(THREE, "n1")
    assert p.drops == {(plans.CLIENT, "n1")}
    assert all(p.reaches(a, b) for a in THREE for b in THREE)
    assert plans.in_majority(p, "n1", THREE)
    hosts = {"n0": "10.77.0.10", "n1": "10.77.0.11", "n2": "10.77.0.12"}
    assert drop_rules(p, hosts, "10.77.0.1") == {"n1": "-A DLCHAOS -s 10.77.0.1/32 -j DROP\n"}
    isolated = drop_rules(plans.isolate(THREE, "n0"), hosts, "10.77.0.1")
    assert isolated["n0"] == (
        "-A DLCHAOS -s 10.77.0.11/32 -j DROP\n-A DLCHAOS -s 10.77.0.12/32 -j DROP\n"
    )


def test_a_partition_naming_an_unknown_node_is_refused() -> None:
    with pytest.raises(AssertionError, match="n7"):
        plans.isolate(THREE, "n7")


def test_schedules_are_a_function_of_the_seed() -> None:
    a = list(itertools.islice(plan("random", random.Random(1)), 50))
    b = list(itertools.islice(plan("random", random.Random(1)), 50))
    assert a == b
    assert {f.kind for f in a} <= set(FAULTS) and len({f.kind for f in a}) > 5
    assert all(10.0 <= f.interval_s <= 20.0 for f in a)
    for f in a:
        low, high = FAULTS[f.kind].hold_s
        assert low <= f.hold_s <= high


def test_fixed_scenarios_cycle_through_their_faults() -> None:
    kinds = [f.kind for f in itertools.islice(plan("mixed", random.Random(0)), 6)]
    assert kinds == list(SCENARIOS["mixed"]) * 2
    pauses = [f for f in itertools.islice(plan("pause", random.Random(0)), 4)]
    assert all(f.hold_s > 1.0 for f in pauses)  # longer than the longest election timeout


def test_an_unknown_scenario_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown scenario"):
        next(plan("meteor", random.Random(0)))
