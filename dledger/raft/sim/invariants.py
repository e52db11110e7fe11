"""The Raft safety properties (Figure 3 of the paper), checked while the simulator runs.

Each check restates one property. They are kept incrementally: a new leader, a new entry, an
advanced commit index or an applied entry is checked when it happens, and the durability of
committed entries after every step, so a violation is reported at the step that caused it.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from dledger.raft.entries import EntryBatch, EntryId, NodeId
from dledger.raft.membership import Membership


@attrs.define
class Violation(AssertionError):
    prop: str  # the property that failed, e.g. "election safety"
    detail: str

    def __str__(self) -> str:
        return f"{self.prop}: {self.detail}"


class Checker:
    def __init__(self, membership: Membership) -> None:
        self.leaders_by_term: dict[int, set[NodeId]] = {}
        # log matching, by induction: an (index, term) names one payload and one previous term
        self.entries_seen: dict[tuple[int, int], tuple[bytes, int]] = {}
        self.committed_terms: list[int] = []  # committed_terms[i - 1]: term of committed entry i
        # commit_terms[i - 1]: the term whose leader committed entry i first (leader
        # completeness binds only leaders of later terms)
        self.commit_terms: list[int] = []
        # the configuration whose quorum committed the newest committed entry: a leader counts
        # the newest configuration in its log, committed or not (single-server changes)
        self.commit_membership = membership
        self.applied: list[tuple[int, bytes]] = []  # the one applied sequence all nodes share
        self.elections = 0

    # Election safety: at most one leader can be elected in a given term.
    def on_leader(self, node: NodeId, term: int) -> None:
        leaders = self.leaders_by_term.setdefault(term, set())
        leaders.add(node)
        self.elections += 1
        if len(leaders) > 1:
            raise Violation("election safety", f"term {term} had leaders {sorted(leaders)}")

    # Log matching: if two logs contain an entry with the same index and term, the logs are
    # identical in all entries up through that index.
    def on_persist(self, node: NodeId, batch: EntryBatch, prev_term: int) -> None:
        """`batch` was appended after an entry of `prev_term`."""
        seen = self.entries_seen
        for offset, term in enumerate(batch.terms):
            key = (batch.first_index + offset, term)
            value = (batch.payloads[offset], prev_term)
            known = seen.setdefault(key, value)
            if known != value:
                raise Violation(
                    "log matching",
                    f"{node} holds i{key[0]}/t{term} with payload {value[0]!r} after t{prev_term}"
                    f", another node holds {known[0]!r} after t{known[1]}",
                )
            prev_term = term

    # Commit indexes never go back, and what is committed is the same on every node.
    def on_commit(
        self,
        node: NodeId,
        before: int,
        after: int,
        first: int,
        terms: list[int],
        kinds: list[int],
        payloads: list[bytes],
        membership: Membership,
        current_term: int,
    ) -> None:
        """The node's commit index moved from `before` to `after`; `terms`, `kinds` and
        `payloads` are its entries first..after (first > before when a log reset skipped
        entries, which other nodes must have committed already); `membership` is the node's
        newest configuration and `current_term` its term, which counted the quorum and name
        the commit's term when this commit is the first."""
        if after < before:
            raise Violation("commit monotonic", f"{node} commit index went {before} -> {after}")
        known = self.committed_terms
        if first - 1 > len(known):
            raise Violation(
                "committed entries agree",
                f"{node} committed through {after} skipping entries before {first} "
                f"that no node committed (known through {len(known)})",
            )
        for offset, term in enumerate(terms):
            index = first + offset
            if index <= len(known):
                if known[index - 1] != term:
                    raise Violation(
                        "committed entries agree",
                        f"{node} committed i{index}/t{term}, earlier commit had "
                        f"t{known[index - 1]}",
                    )
            else:
                known.append(term)
                self.commit_terms.append(current_term)
                self.commit_membership = membership

    @property
    def committed_top(self) -> EntryId | None:
        k = self.committed_terms
        return EntryId(len(k), k[-1]) if k else None

    def committed_before(self, term: int) -> EntryId | None:
        """The newest entry committed in a term before `term`: what a leader of `term` must
        hold. A leader elected late in an older term (its vote replies were delayed) owes
        nothing to entries a later term has committed meanwhile."""
        commit_terms = self.commit_terms
        for index in range(len(commit_terms), 0, -1):
            if commit_terms[index - 1] < term:
                return EntryId(index, self.committed_terms[index - 1])
        return None

    # Leader completeness: a leader's log holds every entry committed in earlier terms.
    def on_leader_log(self, node: NodeId, term: int, has: bool, top: EntryId) -> None:
        if not has:
            raise Violation(
                "leader completeness",
                f"{node} leads term {term} without committed entry {top}",
            )

    # State machine safety: applied sequences are prefixes of each other.
    def on_apply(self, node: NodeId, index: int, term: int, payload: bytes) -> None:
        applied = self.applied
        if index <= len(applied):
            if applied[index - 1] != (term, payload):
                raise Violation(
                    "state machine safety",
                    f"{node} applied i{index}/t{term} {payload!r}, another node applied "
                    f"t{applied[index - 1][0]} {applied[index - 1][1]!r}",
                )
        else:
            assert index == len(applied) + 1, (node, index, len(applied))
            applied.append((term, payload))

    # No entry once committed is ever lost: a majority still holds it on disk.
    def on_step(self, holders: Iterable[NodeId]) -> None:
        top = self.committed_top
        if top is None:
            return
        voters = self.commit_membership.voters
        held = [n for n in holders if n in voters]
        if len(held) < self.commit_membership.quorum:
            raise Violation(
                "committed entries durable",
                f"committed {top} is on the disk of only {sorted(held)} of {sorted(voters)}",
            )
