"""The Raft paper's figures, replayed on our core (Ongaro & Ousterhout, 2014)."""

from __future__ import annotations

import attrs
import pytest

from dledger.raft.entries import EntryKind
from dledger.raft.events import Role
from dledger.raft.messages import AppendEntries, RequestVote, RequestVoteReply
from dledger.raft.sim.invariants import Violation
from tests.raft.broken import CommitsPreviousTerm
from tests.raft.script import SCRIPT_CONFIG, Script

# The paper's protocol has neither pre-vote nor check-quorum; these figures are about it.
PAPER_CONFIG = attrs.evolve(SCRIPT_CONFIG, pre_vote=False, check_quorum=False)

FIGURE_7_LEADER = [1, 1, 1, 4, 4, 5, 5, 6, 6, 6]
FIGURE_7_FOLLOWERS = {
    "a": [1, 1, 1, 4, 4, 5, 5, 6, 6],
    "b": [1, 1, 1, 4],
    "c": [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 6],
    "d": [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 7, 7],
    "e": [1, 1, 1, 4, 4, 4, 4],
    "f": [1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3],
}


@pytest.mark.parametrize("case", sorted(FIGURE_7_FOLLOWERS))
def test_figure_7_follower_converges_to_leader_log(case: str) -> None:
    """Section 5.3, Figure 7: whatever a follower's log looks like, once the term-8 leader
    replicates to it, the follower's log equals the leader's (missing entries added,
    extraneous and conflicting ones removed)."""
    s = Script(7, config=PAPER_CONFIG)
    leader, follower = "n0", "n1"
    s.set_log(leader, FIGURE_7_LEADER, current_term=7)
    s.set_log(follower, FIGURE_7_FOLLOWERS[case], current_term=7)
    for voter in ("n2", "n3", "n4", "n5", "n6"):
        s.set_log(voter, FIGURE_7_LEADER[:4], current_term=7)  # they vote for the leader
    s.campaign(leader)
    s.stabilize()
    assert s.core(leader).role is Role.LEADER and s.core(leader).term == 8
    assert s.terms(follower) == [*FIGURE_7_LEADER, 8]
    assert s.terms(follower) == s.terms(leader)


def test_figure_7_backs_off_a_term_per_round_trip() -> None:
    """Follower (f) diverges over 8 entries of terms 2 and 3; with the conflict hint the
    leader needs one rejection per conflicting term, not one per entry."""
    s = Script(3, config=PAPER_CONFIG)
    s.set_log("n0", FIGURE_7_LEADER, current_term=7)
    s.set_log("n1", FIGURE_7_FOLLOWERS["f"], current_term=7)
    s.set_log("n2", FIGURE_7_LEADER, current_term=7)
    s.campaign("n0")
    rejections = 0
    for _ in range(50):
        for packet in s.pending(src="n1", dst="n0"):
            m = packet.message
            if hasattr(m, "success") and not m.success:
                rejections += 1
        if not s.deliver():
            break
    assert s.terms("n1") == [*FIGURE_7_LEADER, 8]
    assert rejections <= 3, rejections  # probe at 10, term 3 skipped, term 2 skipped


def _win(s: Script, candidate: str, voters: list[str]) -> None:
    """Campaign until `candidate` leads, letting only `voters` hear it."""
    for _ in range(5):
        s.campaign(candidate)
        for _ in range(4):
            for v in voters:
                s.deliver(src=candidate, dst=v, kind=RequestVote)
            s.drop(src=candidate, kind=RequestVote)
            s.deliver(dst=candidate, kind=RequestVoteReply)
        if s.core(candidate).role is Role.LEADER:
            return
    raise AssertionError(f"{candidate} did not win")


def _figure_8(s: Script) -> None:
    """Figure 8 with S1..S5 = n0..n4, batches of one entry so that the term-1 entry and the
    term-3 no-op reach S3 in separate AppendEntries."""
    s.campaign("n0")
    s.stabilize()  # n0 leads term 1; everyone holds its no-op at index 1
    # (a) S1 replicates index 2 (term 1) to S2 only.
    s.propose("n0", b"x")
    s.deliver(src="n0", dst="n1", kind=AppendEntries)
    s.drop(src="n0")
    s.deliver(dst="n0")
    # (b) S1 crashes; S5 wins term 2 with S3 and S4 and appends index 2 (its no-op) alone.
    s.crash("n0")
    _win(s, "n4", ["n2", "n3"])
    assert s.terms("n4") == [1, 2]
    s.drop(src="n4")
    s.crash("n4")
    # (c) S1 restarts, wins term 3 with S2 and S3, and copies index 2 (term 1) to S3.
    s.restart("n0")
    _win(s, "n0", ["n1", "n2"])
    for _ in range(4):  # probes and the one-entry batch carrying index 2
        s.deliver(src="n0", dst="n2", kind=AppendEntries, limit=1)
        s.deliver(src="n0", dst="n1", kind=AppendEntries)
        s.deliver(dst="n0")
        if s.terms("n2")[:2] == [1, 1]:
            break
    s.deliver(dst="n0")
    assert s.terms("n2")[:2] == [1, 1]
    s.drop(src="n0")  # the no-op of term 3 never reaches S3
    # (d) S1 crashes; S5 restarts and wins with S3 and S4: its log ends with term 2 > 1.
    s.crash("n0")
    s.restart("n4")
    _win(s, "n4", ["n2", "n3"])


def test_figure_8_entry_of_earlier_term_is_not_committed_by_counting() -> None:
    """Section 5.4.2: in (c) index 2 is on a majority, but it is of term 1 and the leader is
    in term 3, so it is not committed; S5 may then legitimately replace it."""
    config = attrs.evolve(PAPER_CONFIG, append_batch_entries_max=1)
    s = Script(5, config=config)
    _figure_8(s)
    assert s.core("n4").role is Role.LEADER
    s.stabilize()
    assert s.terms("n2")[1] == 2  # replaced, and nothing committed was lost (checks ran)
    assert s.world.checker.committed_terms[:1] == [1]


def test_figure_8_broken_core_commits_and_loses_the_entry() -> None:
    """The same run with a core that counts replicas for any term: it commits index 2 in
    (c), and in (d) a leader without it is elected, which the checker reports."""
    config = attrs.evolve(PAPER_CONFIG, append_batch_entries_max=1)
    s = Script(5, config=config, core=CommitsPreviousTerm)
    with pytest.raises(Violation) as err:
        _figure_8(s)
    assert err.value.prop in ("leader completeness", "committed entries durable")


def test_new_leader_appends_noop_of_its_term() -> None:
    s = Script(3)
    s.elect("n0")
    log = s.node("n0").log
    assert log.kind_at(log.last_index) == EntryKind.NOOP
    assert log.term_at(log.last_index) == s.core("n0").term
    assert s.core("n0").commit_index == log.last_index  # committed on all after stabilising
