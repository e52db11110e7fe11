"""Failover times, the longest stall and percentiles, from hand-made histories."""

from __future__ import annotations

from chaos import availability
from tests.chaos.histories import Builder


def kill(leader: str, affected: bool = True) -> dict[str, object]:
    return {
        "fault": "kill-leader",
        "leader": leader,
        "leader_affected": affected,
        "nodes": [leader],
    }


def test_failover_is_the_first_ok_on_a_new_leader_after_the_fault() -> None:
    b = Builder().at(0).append(0, "0-0", index=2, node="n0")
    b.at(100).fault("kill", kill("n0"))
    b.at(104).append(1, "1-0", index=3, node="n0")  # an answer already on the wire: not it
    b.at(400).append(0, "0-1", index=4, node="n1")  # completes at 401 ms
    b.at(2000).fault("kill", kill("n0"), "ok")
    [f] = availability.failovers(b.ops)
    assert (f.kind, f.leader_affected, f.node) == ("kill-leader", True, "n1")
    assert f.ms == 301.0


def test_the_old_leader_counts_again_once_the_fault_healed() -> None:
    pause = {"fault": "pause-leader", "leader": "n0", "leader_affected": True, "nodes": ["n0"]}
    b = Builder().at(1000).fault("pause", pause)
    b.at(3000).fault("pause", pause, "ok")
    b.at(3100).append(0, "0-0", index=2, node="n0")  # no election happened: n0 leads again
    [f] = availability.failovers(b.ops)
    assert f.ms == 2101.0 and f.node == "n0"


def test_a_fault_that_spares_the_leader_measures_the_stall() -> None:
    b = (
        Builder()
        .at(0)
        .fault("kill", {"fault": "kill-follower", "leader": "n0", "leader_affected": False})
    )
    b.at(5).append(0, "0-0", index=2, node="n0")
    [f] = availability.failovers(b.ops)
    assert f.ms == 6.0 and not f.leader_affected


def test_no_ok_before_the_next_fault_is_reported_as_such() -> None:
    b = Builder().at(0).fault("kill", kill("n0")).at(10).fault("kill", kill("n0"), "ok")
    b.at(20).fault("pause", {"fault": "pause-leader", "leader": "n1", "leader_affected": True})
    b.at(500).append(0, "0-0", index=2, node="n2").at(600).fault("pause", {}, "ok")
    first, second = availability.failovers(b.ops)
    assert first.ms is None and second.ms == 481.0
    summary = availability.failover_summary([first, second])
    assert summary["by_kind"]["kill-leader"] == {
        "p50": None,
        "p99": None,
        "max": None,
        "count": 0,
        "no_ok_before_next_fault": 1,
    }
    assert summary["overall"]["count"] == 1


def test_fault_windows_pair_injection_and_heal_and_skip_recovery_waits() -> None:
    b = Builder().at(0).fault("partition", {"fault": "partition-halves", "nodes": ["n0"]})
    b.at(50).fault("partition", {"fault": "partition-halves"}, "ok")
    b.at(51).fault("recover", {"fault": "partition-halves"})
    b.at(90).fault("recover", {"fault": "partition-halves"}, "ok")
    b.at(100).fault("kill", kill("n1"))  # never healed: the history ends
    w1, w2 = availability.fault_windows(b.ops)
    assert (w1.kind, w1.start_ns, w1.end_ns) == ("partition-halves", 0, 50_000_000)
    assert (w2.number, w2.kind, w2.end_ns, w2.leader) == (2, "kill-leader", None, "n1")


def test_longest_gap_without_an_ok_append() -> None:
    b = Builder().at(0).append(0, "0-0", index=2)  # ok at 1 ms
    b.at(10).fault("kill", kill("n0"))
    b.at(20).append(0, "0-1", "info")  # completes at 21 ms
    b.at(900).append(0, "0-2", index=3)  # ok at 901 ms
    b.at(950).append(0, "0-3", index=4)  # ok at 951 ms
    gap = availability.longest_gap(b.ops)
    assert gap is not None
    assert (gap.start_ns, gap.end_ns, gap.faults) == (1_000_000, 901_000_000, (1,))
    assert gap.ms == 900.0


def test_percentiles_use_the_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert availability.percentile(values, 50) == 50.0
    assert availability.percentile(values, 99) == 99.0
    assert availability.percentile([7.0], 99) == 7.0
    assert availability.summarize([30.0, 10.0, 20.0]) == {
        "p50": 20.0,
        "p99": 30.0,
        "max": 30.0,
        "count": 3,
    }
    assert availability.summarize([])["count"] == 0
