"""Every broker checker on hand-made histories and final reads: each must catch what it exists
for, and pass what is fine. A checker that cannot fail is not a checker."""

from __future__ import annotations

from chaos import broker_checks
from chaos.broker_final import NO_FINAL_READ, QueueListing, Slot, holes, summarize
from chaos.workloads.messages import (
    CONCURRENT_GROUP,
    ORDERED_TOPIC,
    ORDERLY_GROUP,
    PULL_GROUP,
)
from tests.chaos.broker_histories import BrokerHistory, final_of, key, listing

CLEAN_QUEUES = {key(0): ["p0-0", "p0-1"], key(0, ORDERED_TOPIC): ["k1-0", "k1-1"]}


def sent() -> BrokerHistory:
    return (
        BrokerHistory()
        .send("p0", "p0-0", offset=0)
        .send("p0", "p0-1", offset=1)
        .send("o0", "k1-0", offset=0, topic=ORDERED_TOPIC, key="k1")
        .send("o0", "k1-1", offset=1, topic=ORDERED_TOPIC, key="k1")
    )


def consumed(h: BrokerHistory, *, pull: bool = True) -> BrokerHistory:
    h.take("concurrent/0", CONCURRENT_GROUP).consume(
        "concurrent/0", CONCURRENT_GROUP, [(0, "p0-0"), (1, "p0-1")]
    )
    if pull:
        h.take("pull/0", PULL_GROUP).consume("pull/0", PULL_GROUP, [(0, "p0-0"), (1, "p0-1")])
    h.take("orderly/0", ORDERLY_GROUP, topic=ORDERED_TOPIC).consume(
        "orderly/0", ORDERLY_GROUP, [(0, "k1-0"), (1, "k1-1")], topic=ORDERED_TOPIC
    )
    return h


def clean() -> BrokerHistory:
    return consumed(sent())


def judge(h: BrokerHistory, queues: object = None, **final: object) -> broker_checks.Evaluation:
    groups = {"broker-a": queues if queues is not None else CLEAN_QUEUES}
    return broker_checks.evaluate(h.ops, final_of(groups, **final))  # type: ignore[arg-type]


def test_a_clean_run_passes_every_check() -> None:
    e = judge(clean())
    assert e.verdict == "pass", e.reasons
    assert e.acked == 4 and e.sends == {"invoke": 4, "ok": 4, "fail": 0, "info": 0}
    assert (e.lost, e.misplaced, e.order, e.queue_problems, e.phantoms) == ((), (), (), (), ())
    assert e.unconsumed_count == {CONCURRENT_GROUP: 0, ORDERLY_GROUP: 0, PULL_GROUP: 0}
    assert e.consumed == {CONCURRENT_GROUP: 2, ORDERLY_GROUP: 2, PULL_GROUP: 2}
    assert e.keys_checked == 1 and e.rewinds == () and e.duplicates_in_log == {}


def test_an_acknowledged_message_missing_from_the_log_is_lost() -> None:
    e = judge(clean(), {key(0): ["p0-0"], key(0, ORDERED_TOPIC): ["k1-0", "k1-1"]})
    assert e.verdict == "fail"
    assert [(x.value, x.group, x.offset) for x in e.lost] == [("p0-1", "broker-a", 1)]
    assert "1 acknowledged messages lost" in e.reasons


def test_a_message_in_another_groups_log_is_still_lost_from_its_own() -> None:
    groups = {"broker-a": {key(0): ["p0-0"], key(0, ORDERED_TOPIC): ["k1-0", "k1-1"]}}
    groups["broker-b"] = {key(0): ["p0-1"]}
    e = broker_checks.evaluate(clean().ops, final_of(groups))
    assert [x.value for x in e.lost] == ["p0-1"]


def test_an_acknowledged_message_at_another_offset_is_misplaced() -> None:
    queues = {key(0): ["p0-1", "p0-0"], key(0, ORDERED_TOPIC): ["k1-0", "k1-1"]}
    e = judge(sent(), queues)
    assert e.verdict == "fail"
    assert {(m.value, m.offset, m.found) for m in e.misplaced} == {
        ("p0-0", 0, (("broker-a", "ChaosTopic", 0, 1),)),
        ("p0-1", 1, (("broker-a", "ChaosTopic", 0, 0),)),
    }


def test_an_acknowledged_message_a_consumer_group_never_got_is_unconsumed() -> None:
    e = judge(consumed(sent(), pull=False))
    assert e.verdict == "fail"
    assert e.unconsumed_count == {CONCURRENT_GROUP: 0, ORDERLY_GROUP: 0, PULL_GROUP: 2}
    assert {u.value for u in e.unconsumed[PULL_GROUP]} == {"p0-0", "p0-1"}
    assert "acknowledged messages never consumed: chaos_pull 2" in e.reasons


def test_a_consumed_message_the_log_does_not_hold_there_is_caught() -> None:
    h = clean().consume("pull/0", PULL_GROUP, [(0, "p0-1")])  # offset 0 holds p0-0
    e = judge(h)
    assert e.verdict == "fail" and e.phantom_count == 1
    assert (e.phantoms[0].offset, e.phantoms[0].value, e.phantoms[0].stored) == (0, "p0-1", "p0-0")


def test_a_later_value_of_a_key_consumed_first_is_an_order_violation() -> None:
    h = sent().take("orderly/0", ORDERLY_GROUP, topic=ORDERED_TOPIC)
    h.consume("orderly/0", ORDERLY_GROUP, [(1, "k1-1"), (0, "k1-0")], topic=ORDERED_TOPIC)
    h.consume("concurrent/0", CONCURRENT_GROUP, [(0, "p0-0"), (1, "p0-1")])
    h.consume("pull/0", PULL_GROUP, [(0, "p0-0"), (1, "p0-1")])
    e = judge(h)
    assert e.verdict == "fail"
    assert [(v.key, v.seq, v.after_seq) for v in e.order] == [("k1", 0, 1)]


def test_order_is_judged_after_dedupe_so_a_redelivery_is_no_violation() -> None:
    h = clean().consume("orderly/1", ORDERLY_GROUP, [(0, "k1-0"), (1, "k1-1")], topic=ORDERED_TOPIC)
    e = judge(h)
    assert e.verdict == "pass", e.reasons
    assert e.order == () and e.redelivered[ORDERLY_GROUP] == 2
    [rewind] = [r.rewind for r in e.rewinds]
    assert (rewind.member, rewind.start_offset, rewind.depth, rewind.count) == (
        "orderly/1",
        0,
        2,
        2,
    )


def test_order_is_per_key() -> None:
    h = sent().send("o0", "k2-0", offset=2, topic=ORDERED_TOPIC, key="k2")
    h.consume(
        "orderly/0", ORDERLY_GROUP, [(0, "k1-0"), (2, "k2-0"), (1, "k1-1")], topic=ORDERED_TOPIC
    )
    h.consume("concurrent/0", CONCURRENT_GROUP, [(0, "p0-0"), (1, "p0-1")])
    h.consume("pull/0", PULL_GROUP, [(0, "p0-0"), (1, "p0-1")])
    e = judge(h, {key(0): ["p0-0", "p0-1"], key(0, ORDERED_TOPIC): ["k1-0", "k1-1", "k2-0"]})
    assert e.verdict == "pass", e.reasons
    assert e.keys_checked == 2


def test_a_hole_in_one_replicas_queue_is_caught() -> None:
    gap = QueueListing(0, 2, (Slot(0, "p0-0", "ID-p0-0", 0),))
    e = judge(clean(), replicas={"broker-a/n1": {key(0): gap}})
    assert e.verdict == "fail"
    [problem] = e.queue_problems
    assert (problem.host, problem.queue, problem.kind) == ("n1", "ChaosTopic/0", "holes")


def test_another_message_on_one_replica_is_caught() -> None:
    other = listing(["p0-0", "zz-9"])
    e = judge(
        clean(),
        replicas={"broker-a/n2": {key(0): other, key(0, ORDERED_TOPIC): listing(["k1-0", "k1-1"])}},
    )
    assert e.verdict == "fail"
    assert [(p.host, p.kind) for p in e.queue_problems] == [("n2", "mismatches")]


def test_replicas_that_end_at_different_offsets_after_converging_are_caught() -> None:
    longer = {
        key(0): listing(["p0-0", "p0-1", "p0-1"]),
        key(0, ORDERED_TOPIC): listing(["k1-0", "k1-1"]),
    }
    e = judge(clean(), replicas={"broker-a/n1": longer})
    assert [(p.host, p.kind) for p in e.queue_problems] == [("*", "max offset differs")]
    unconverged = judge(clean(), replicas={"broker-a/n1": longer}, converged=False)
    assert unconverged.queue_problems == ()  # a follower may lag when they had not converged


def test_holes_and_summaries_of_listings() -> None:
    assert holes(listing(["a", "b", "c"], first=5)) == []
    jumped = QueueListing(0, 4, (Slot(0, "a", "", 0), Slot(2, "c", "", 2)))
    assert holes(jumped) == [1, 3]
    repeated = QueueListing(0, 2, (Slot(0, "a", "", 0), Slot(0, "a", "", 0), Slot(1, "b", "", 1)))
    assert holes(repeated) == [0]
    summary = summarize(listing(["a", "x", "c"]), listing(["a", "b", "c", "d"]))
    assert (summary.count, summary.hole_count, summary.mismatch_count) == (3, 0, 1)
    assert summary.mismatches == ((1, "x", "b"),)


def rewound(take_ms: float, *, fault_during_commit: bool = False) -> BrokerHistory:
    """concurrent/0 consumes offsets 0-1, the broker says 2 is committed at 10 ms, then
    concurrent/1 takes the queue at `take_ms` and starts over at 0."""
    h = clean().at(10)
    if fault_during_commit:
        h.fault("pause-leader", "pause")
    h.committed(CONCURRENT_GROUP, 2)
    if fault_during_commit:
        h.fault("pause-leader", "pause", phase="ok")
    h.at(take_ms).restart("concurrent/0", CONCURRENT_GROUP)
    h.take("concurrent/1", CONCURRENT_GROUP)
    return h.consume("concurrent/1", CONCURRENT_GROUP, [(0, "p0-0"), (1, "p0-1")])


def test_a_rewind_below_a_durable_commit_before_the_take_is_caught() -> None:
    e = judge(rewound(take_ms=1000))
    assert e.verdict == "fail"
    [finding] = e.rewinds
    assert finding.beyond_bound and finding.committed_before == 2
    assert finding.rewind.start_offset == 0 and finding.cause == "restart of concurrent/0"
    assert "1 consumer rewinds below a durably committed offset" in e.reasons


def test_a_rewind_to_a_commit_not_yet_durable_at_the_take_is_within_bound() -> None:
    e = judge(rewound(take_ms=300))  # committed at 10 ms: in the log only from ~510 ms
    assert e.verdict == "pass", e.reasons
    [finding] = e.rewinds
    assert not finding.beyond_bound and finding.committed_before is None
    assert e.redelivered[CONCURRENT_GROUP] == 2


def test_a_commit_seen_while_its_group_was_faulted_is_not_taken_as_durable() -> None:
    e = judge(rewound(take_ms=1000, fault_during_commit=True))
    assert e.verdict == "pass", e.reasons
    assert [f.beyond_bound for f in e.rewinds] == [False]


def test_failover_counts_only_sends_invoked_once_the_fault_was_in_force() -> None:
    h = clean().at(100).fault("partition-leader", "partition")
    h.at(120).send("o0", "k1-2", offset=2, topic=ORDERED_TOPIC, key="k1", took_ms=40)  # before
    h.at(200).send("p1", "p1-0", group="broker-b", took_ms=10)  # another group
    h.at(200).send("o0", "k1-3", offset=3, topic=ORDERED_TOPIC, key="k1", took_ms=700)
    h.at(1000).fault("partition-leader", "partition", phase="ok", applied_ns=150 * 1_000_000)
    queues = {key(0): ["p0-0", "p0-1"], key(0, ORDERED_TOPIC): ["k1-0", "k1-1", "k1-2", "k1-3"]}
    e = broker_checks.evaluate(
        h.ops, final_of({"broker-a": queues, "broker-b": {key(0): ["p1-0"]}})
    )
    [failover] = e.failovers
    assert (failover.group, failover.kind, failover.ms) == ("broker-a", "partition-leader", 800.0)
    assert e.groups["broker-a"].failover_ms["max"] == 800.0
    assert e.groups["broker-b"].faults == {}


def test_the_longest_stretch_without_a_send_ok_is_per_group() -> None:
    h = BrokerHistory().send("p0", "p0-0", group="broker-a")
    h.send("p1", "p1-0", group="broker-b").at(500).send("p1", "p1-1", group="broker-b", offset=1)
    h.at(2000).send("p0", "p0-1", group="broker-a", offset=1)
    s = broker_checks.scan(h.ops)
    a, b = broker_checks.longest_no_ok(s, "broker-a"), broker_checks.longest_no_ok(s, "broker-b")
    assert a is not None and b is not None
    assert round(a[0]) == 2000 and round(b[0]) == 1500  # to the last send ok at 2001 ms


def test_duplicates_in_the_log_are_counted_not_failed() -> None:
    h = clean().send("p0", "p0-2", outcome="info").send("p0", "p0-2", offset=2)
    h.consume("concurrent/0", CONCURRENT_GROUP, [(2, "p0-2")]).consume(
        "pull/0", PULL_GROUP, [(2, "p0-2")]
    )
    e = judge(h, {**CLEAN_QUEUES, key(0): ["p0-0", "p0-1", "p0-2", "p0-2"]})
    assert e.verdict == "pass", e.reasons
    assert e.duplicates_in_log == {"p0-2": 1} and e.groups["broker-a"].duplicates_in_log == 1


def test_a_failed_send_in_the_log_and_a_value_nobody_sent_are_caught() -> None:
    h = clean().send("p0", "p0-2", outcome="fail")
    e = judge(h, {**CLEAN_QUEUES, key(0): ["p0-0", "p0-1", "p0-2", "zz-1"]})
    assert e.verdict == "fail"
    assert e.failed_in_log == ("p0-2",) and e.unexpected_in_log == ("zz-1",)


def test_a_process_crash_fails_the_run() -> None:
    crash = {"node": "broker-a-n1", "returncode": 1, "time_ns": 0, "log_tail": "boom"}
    e = judge(clean(), crashes=[crash])
    assert e.verdict == "fail" and "1 process crashes" in e.reasons


def test_without_a_complete_final_read_the_verdict_is_unknown() -> None:
    e = broker_checks.evaluate(clean().ops, NO_FINAL_READ)
    assert e.verdict == "unknown" and e.reasons == ("no final read",)
    assert e.lost == () and not e.final_read
