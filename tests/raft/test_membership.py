"""Membership changes, one server at a time: what apply_change allows and how it refuses."""

from __future__ import annotations

import pytest

from dledger.raft.membership import (
    ChangeKind,
    ChangeRefusal,
    ChangeRefused,
    Membership,
    apply_change,
)

GROUP = Membership(frozenset({"n0", "n1", "n2"}), frozenset({"n3"}))


class TestApplyChange:
    @pytest.mark.parametrize("kind", [ChangeKind.ADD_VOTER, ChangeKind.ADD_LEARNER])
    def test_adding_makes_a_learner(self, kind: ChangeKind) -> None:
        """A new server joins as a learner, whether or not it is to become a voter."""
        assert apply_change(GROUP, kind, "n4") == Membership(GROUP.voters, frozenset({"n3", "n4"}))

    def test_promote_makes_a_learner_a_voter(self) -> None:
        """PROMOTE moves a learner to the voters."""
        assert apply_change(GROUP, ChangeKind.PROMOTE, "n3") == Membership(
            frozenset({"n0", "n1", "n2", "n3"})
        )

    @pytest.mark.parametrize("node", ["n1", "n3"])
    def test_remove_takes_a_voter_or_a_learner_out(self, node: str) -> None:
        """REMOVE works on voters and learners alike."""
        after = apply_change(GROUP, ChangeKind.REMOVE, node)
        assert isinstance(after, Membership)
        assert node not in after.members and len(after.members) == 3

    @pytest.mark.parametrize(
        ("kind", "node", "reason"),
        [
            (ChangeKind.ADD_VOTER, "n1", ChangeRefusal.ALREADY_MEMBER),
            (ChangeKind.ADD_LEARNER, "n3", ChangeRefusal.ALREADY_MEMBER),
            (ChangeKind.PROMOTE, "n1", ChangeRefusal.NOT_LEARNER),
            (ChangeKind.PROMOTE, "n9", ChangeRefusal.NOT_LEARNER),
            (ChangeKind.REMOVE, "n9", ChangeRefusal.NOT_MEMBER),
        ],
    )
    def test_refusals_name_the_reason_and_the_node(
        self, kind: ChangeKind, node: str, reason: ChangeRefusal
    ) -> None:
        """A change that cannot apply is refused with a reason, never half applied."""
        assert apply_change(GROUP, kind, node) == ChangeRefused(reason, node)

    def test_the_only_voter_cannot_be_removed(self) -> None:
        """A group with no voter could never elect a leader again."""
        alone = Membership(frozenset({"n0"}), frozenset({"n1"}))
        assert apply_change(alone, ChangeKind.REMOVE, "n0") == ChangeRefused(
            ChangeRefusal.ONLY_VOTER, "n0"
        )


class TestChangeRefused:
    @pytest.mark.parametrize(
        ("reason", "text"),
        [
            (ChangeRefusal.ALREADY_MEMBER, "n3 is already a member"),
            (ChangeRefusal.NOT_LEARNER, "n3 is not a learner"),
            (ChangeRefusal.NOT_MEMBER, "n3 is not a member"),
            (ChangeRefusal.ONLY_VOTER, "n3 is the only voter"),
        ],
    )
    def test_str_is_the_sentence_a_client_gets(self, reason: ChangeRefusal, text: str) -> None:
        """The core puts str() into Refused.detail; clients have always seen these sentences."""
        assert str(ChangeRefused(reason, "n3")) == text
