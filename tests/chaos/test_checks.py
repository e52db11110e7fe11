"""Every checker on hand-made histories: each must catch what it exists for, and pass what is
fine. A checker that cannot fail is not a checker."""

from __future__ import annotations

import attrs

from chaos import checks
from chaos.final import NO_FINAL_READ, FinalState
from tests.chaos.histories import Builder, agreeing, entries, replica

# the log of a healthy run: a no-op from the election, then the clients' values
CLEAN_LOG = [None, "0-0", "1-0", "0-1", "1-1"]


def clean_history() -> Builder:
    return (
        Builder()
        .append(0, "0-0", index=2)
        .append(1, "1-0", index=3)
        .append(0, "0-1", index=4)
        .append(1, "1-1", index=5)
    )


def test_a_clean_run_passes_every_check() -> None:
    e = checks.evaluate(clean_history().ops, agreeing(CLEAN_LOG))
    assert e.verdict == "pass", e.reasons
    assert (e.acked, e.lost, e.misplaced, e.order) == (4, (), (), ())
    assert e.agreement.agree and e.outcomes == checks.NOTHING_FOUND


def test_a_lost_acknowledged_append_is_caught() -> None:
    history = clean_history().append(0, "0-2", index=6).ops
    e = checks.evaluate(history, agreeing(CLEAN_LOG))  # "0-2" never made it
    assert e.verdict == "fail"
    assert [x.value for x in e.lost] == ["0-2"]
    assert "1 acknowledged appends lost" in e.reasons


def test_an_append_acknowledged_at_the_wrong_index_is_caught() -> None:
    history = Builder().append(0, "0-0", index=3).append(1, "1-0", index=2).ops
    e = checks.evaluate(history, agreeing([None, "0-0", "1-0"]))
    assert e.verdict == "fail"
    assert {(m.value, m.index, m.found_at) for m in e.misplaced} == {
        ("0-0", 3, (2,)),
        ("1-0", 2, (3,)),
    }


def test_an_order_violation_is_caught() -> None:
    # client 0 issued 0-0 then 0-1, but the log holds 0-1 first
    history = Builder().append(0, "0-0", index=3).append(0, "0-1", index=2).ops
    e = checks.evaluate(history, agreeing([None, "0-1", "0-0"]))
    assert e.verdict == "fail"
    assert [(v.process, v.earlier, v.later) for v in e.order] == [(0, "0-0", "0-1")]
    assert e.lost == () and e.misplaced == ()


def test_order_is_per_client() -> None:
    # client 1's append landed between two of client 0's: interleaving is fine
    history = Builder().append(0, "0-0", index=2).append(1, "1-0", index=4).ops
    history += Builder().at(10).append(0, "0-1", index=3).ops
    e = checks.evaluate(history, agreeing([None, "0-0", "0-1", "1-0"]))
    assert e.verdict == "pass", e.reasons


def test_a_divergent_replica_is_caught() -> None:
    good = entries(CLEAN_LOG)
    bad = (*good[:3], attrs.evolve(good[3], term=2, body=b"0-9"), *good[4:])
    final = FinalState(
        {"n0": replica("n0", good), "n1": replica("n1", good), "n2": replica("n2", bad)},
        complete=True,
    )
    e = checks.evaluate(clean_history().ops, final)
    assert e.verdict == "fail"
    assert not e.agreement.agree
    first = e.agreement.divergences[0]
    assert first.index == 4 and "n2" in first.nodes
    assert "replicas disagree on committed entries" in e.reasons


def test_a_shorter_replica_and_uncommitted_tails_are_no_divergence() -> None:
    log = entries(CLEAN_LOG)
    stale_tail = entries(["stale"], term=1, first=5)  # from an old term, past its commit
    final = FinalState(
        {
            "n0": replica("n0", log),
            "n1": replica("n1", log[:3]),  # lagging: commit index 3
            "n2": replica("n2", log[:4], uncommitted=stale_tail),
        },
        complete=True,
    )
    e = checks.evaluate(clean_history().ops, final)
    assert e.verdict == "pass", e.reasons
    assert e.agreement.uncommitted == {"n0": 0, "n1": 0, "n2": 1}
    assert e.agreement.commit_index == {"n0": 5, "n1": 3, "n2": 4}


def test_duplicates_are_counted_not_failed() -> None:
    # 0-0 timed out, was sent again and acknowledged; both copies landed
    history = Builder().append(0, "0-0", "info").append(0, "0-0", index=3).ops
    e = checks.evaluate(history, agreeing([None, "0-0", "0-0"]))
    assert e.verdict == "pass", e.reasons
    assert e.outcomes.duplicates == {"0-0": 1}
    assert e.outcomes.unknown_in_log == ("0-0",)


def test_an_unknown_outcome_that_landed_is_counted() -> None:
    history = Builder().append(0, "0-0", "info").append(0, "0-1", "info").ops
    e = checks.evaluate(history, agreeing([None, "0-1"]))
    assert e.verdict == "pass", e.reasons
    assert e.outcomes.unknown_in_log == ("0-1",)
    assert e.ops == {"invoke": 2, "ok": 0, "fail": 0, "info": 2}


def test_a_failed_append_in_the_log_is_caught() -> None:
    history = Builder().append(0, "0-0", "fail").ops
    e = checks.evaluate(history, agreeing([None, "0-0"]))
    assert e.verdict == "fail"
    assert e.outcomes.failed_in_log == ("0-0",)


def test_an_entry_no_client_wrote_is_caught() -> None:
    e = checks.evaluate(clean_history().ops, agreeing([*CLEAN_LOG, "9-9"]))
    assert e.verdict == "fail"
    assert e.outcomes.unexpected_in_log == ("9-9",)


def test_no_final_read_is_unknown_never_a_pass() -> None:
    e = checks.evaluate(clean_history().ops, NO_FINAL_READ)
    assert e.verdict == "unknown"
    assert e.reasons == ("no final read",)
    assert e.lost == ()  # not judged: nothing to judge against, not "nothing lost"


def test_an_incomplete_final_read_is_unknown_but_divergence_still_fails() -> None:
    log = entries(CLEAN_LOG)
    partial = FinalState(
        {"n0": replica("n0", log), "n1": attrs.evolve(replica("n1", ()), error="not running")},
        complete=False,
        problems=("n1: not running",),
    )
    e = checks.evaluate(clean_history().ops, partial)
    assert (e.verdict, e.reasons) == ("unknown", ("n1: not running",))
    other = (*log[:2], attrs.evolve(log[2], body=b"x"))
    divergent = attrs.evolve(partial, replicas={**partial.replicas, "n2": replica("n2", other)})
    assert checks.evaluate(clean_history().ops, divergent).verdict == "fail"


def test_a_replica_crash_fails_the_run() -> None:
    final = attrs.evolve(agreeing(CLEAN_LOG), crashes=({"node": "n1", "returncode": 1},))
    e = checks.evaluate(clean_history().ops, final)
    assert e.verdict == "fail" and "1 replica crashes" in e.reasons


def test_a_malformed_history_is_unknown() -> None:
    # process 0 invoked twice without a completion between: the recorder is broken
    history = Builder().append(0, "0-1", index=2).ops
    history.insert(0, attrs.evolve(history[0], value="0-0", time_ns=0))
    e = checks.evaluate(history, agreeing([None, "0-1"]))
    assert e.verdict == "unknown"
    assert e.history_problems and "twice" in e.history_problems[0]
