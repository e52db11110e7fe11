"""The checkers: pure functions of the history and the final state, nothing else.

Must hold (any violation makes the verdict "fail"):
- acked_lost: an ok append whose value is nowhere in the final committed log;
- acked_misplaced: an ok append whose value is in the log, but not at the index acknowledged;
- order: a client's ok appends sit in the log in the order the client issued them;
- replicas agree: every two replicas hold the same committed entries where both have them;
- failed_in_log: an append reported `fail` (surely not applied) that is in the log anyway;
- unexpected_in_log: a data entry whose value no client ever appended;
- crashes: a replica that exited without the nemesis killing it.
Counted, not errors: duplicates (a value stored twice: a retry after an unknown outcome),
unknown outcomes that landed, uncommitted tails. Without a complete final read there is
nothing to judge the history against: the verdict is "unknown", never "pass".
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import attrs

from chaos.final import FinalState, LogEntry
from chaos.history import Op, Phase, check_well_formed

SAMPLES_MAX = 20  # values listed in a result; counts are always complete


@attrs.frozen
class Lost:
    value: str
    process: int | str
    index: int | None  # acknowledged
    time_ns: int


@attrs.frozen
class Misplaced:
    value: str
    index: int | None  # acknowledged
    found_at: tuple[int, ...]


@attrs.frozen
class OrderViolation:
    process: int | str
    earlier: str  # value issued first ...
    earlier_index: int
    later: str  # ... and this one after it, yet it sits at or before it
    later_index: int


@attrs.frozen
class Divergence:
    index: int
    nodes: tuple[str, str]
    entries: tuple[tuple[int, int, str], tuple[int, int, str]]  # (term, kind, body) of each


@attrs.frozen
class Agreement:
    agree: bool
    divergences: tuple[Divergence, ...]  # the first per pair of replicas that differ
    compared: int  # committed indexes compared, summed over pairs
    commit_index: dict[str, int]
    uncommitted: dict[str, int]  # entries past each replica's commit index


def client_ops(history: Sequence[Op], f: str = "append") -> list[Op]:
    return [op for op in history if op.is_client and op.f == f]


def reference_log(final: FinalState) -> list[LogEntry]:
    """The committed log of the replica that committed most (agreement is checked apart)."""
    read = [r for r in final.replicas.values() if r.read]
    if not read:
        return []
    return list(max(read, key=lambda r: (r.commit_index, r.node)).committed)


def positions(log: Sequence[LogEntry]) -> dict[str, list[int]]:
    """value -> the indexes of the data entries that carry it."""
    found: dict[str, list[int]] = defaultdict(list)
    for entry in log:
        value = entry.value
        if value is not None:
            found[value].append(entry.index)
    return found


def lost_appends(
    history: Sequence[Op], log: Sequence[LogEntry]
) -> tuple[list[Lost], list[Misplaced]]:
    where = positions(log)
    lost, misplaced = [], []
    for op in client_ops(history):
        if op.phase is not Phase.OK:
            continue
        found = where.get(op.value, [])
        if not found:
            lost.append(Lost(op.value, op.process, op.index, op.time_ns))
        elif op.index is not None and op.index not in found:
            misplaced.append(Misplaced(op.value, op.index, tuple(found)))
    return lost, misplaced


def order_violations(history: Sequence[Op], log: Sequence[LogEntry]) -> list[OrderViolation]:
    """Per client, each ok append must sit after the ok appends it issued before."""
    where = positions(log)
    last: dict[int | str, tuple[str, int]] = {}
    violations = []
    for op in client_ops(history):
        if op.phase is not Phase.OK:
            continue
        found = where.get(op.value)
        if not found:
            continue  # lost: counted by lost_appends
        index = op.index if op.index in found else found[0]
        before = last.get(op.process)
        if before is not None and index <= before[1]:
            violations.append(OrderViolation(op.process, before[0], before[1], op.value, index))
        last[op.process] = (op.value, index)
    return violations


def replica_agreement(final: FinalState) -> Agreement:
    read = sorted((r for r in final.replicas.values() if r.read), key=lambda r: r.node)
    divergences = []
    compared = 0
    for a, b in itertools.combinations(read, 2):
        b_at = {e.index: e for e in b.committed}
        for entry in a.committed:
            other = b_at.get(entry.index)
            if other is None:
                continue
            compared += 1
            if (entry.term, entry.kind, entry.body) != (other.term, other.kind, other.body):
                divergences.append(
                    Divergence(entry.index, (a.node, b.node), (_show(entry), _show(other)))
                )
                break
    return Agreement(
        agree=not divergences,
        divergences=tuple(divergences),
        compared=compared,
        commit_index={r.node: r.commit_index for r in read},
        uncommitted={r.node: len(r.uncommitted) for r in read},
    )


def _show(entry: LogEntry) -> tuple[int, int, str]:
    return entry.term, entry.kind, entry.body[:80].decode(errors="backslashreplace")


@attrs.frozen
class Outcomes:
    """What the log says about each value, against what clients were told."""

    duplicates: dict[str, int]  # value -> copies beyond the first
    unknown_in_log: tuple[str, ...]  # values of `info` appends that landed
    failed_in_log: tuple[str, ...]  # values of `fail` appends that landed anyway
    unexpected_in_log: tuple[str, ...]  # values in the log that no client appended


def outcomes(history: Sequence[Op], log: Sequence[LogEntry]) -> Outcomes:
    phases: dict[str, Counter[Phase]] = defaultdict(Counter)
    for op in client_ops(history):
        phases[op.value][op.phase] += 1
    in_log: Counter[str] = Counter()
    unexpected = []
    for entry in log:
        if entry.kind != 0:
            continue
        value = entry.value
        if value is None or value not in phases:
            unexpected.append(value if value is not None else repr(entry.body[:80]))
            continue
        in_log[value] += 1
    unknown, failed = [], []
    for value, copies in in_log.items():
        seen = phases[value]
        beyond_ok = copies - seen[Phase.OK]
        unknown.extend([value] * min(seen[Phase.INFO], max(0, beyond_ok)))
        beyond_info = beyond_ok - seen[Phase.INFO]
        failed.extend([value] * min(seen[Phase.FAIL], max(0, beyond_info)))
    return Outcomes(
        duplicates={v: n - 1 for v, n in in_log.items() if n > 1},
        unknown_in_log=tuple(unknown),
        failed_in_log=tuple(failed),
        unexpected_in_log=tuple(unexpected),
    )


def op_counts(history: Sequence[Op]) -> dict[str, int]:
    ops = client_ops(history)
    counted = Counter(op.phase.value for op in ops)
    return {p.value: counted.get(p.value, 0) for p in Phase}


@attrs.frozen
class Evaluation:
    verdict: str  # "pass", "fail" or "unknown"
    reasons: tuple[str, ...]  # why not "pass"
    final_read: bool  # every replica was read: the checks against the log were run
    acked: int
    lost: tuple[Lost, ...]
    misplaced: tuple[Misplaced, ...]
    order: tuple[OrderViolation, ...]
    agreement: Agreement
    outcomes: Outcomes
    ops: dict[str, int]
    crashes: tuple[dict[str, Any], ...]
    history_problems: tuple[str, ...]


NOTHING_FOUND = Outcomes(duplicates={}, unknown_in_log=(), failed_in_log=(), unexpected_in_log=())


def evaluate(history: Sequence[Op], final: FinalState) -> Evaluation:
    """Every checker, and the verdict. Without a complete final read only what needs no
    complete log is judged (replica agreement among those read, crashes); the rest is not
    run, since a missing replica could make any acknowledged value look lost."""
    agreement = replica_agreement(final)
    lost: list[Lost] = []
    misplaced: list[Misplaced] = []
    order: list[OrderViolation] = []
    found = NOTHING_FOUND
    if final.complete:
        log = reference_log(final)
        lost, misplaced = lost_appends(history, log)
        order = order_violations(history, log)
        found = outcomes(history, log)
    problems = check_well_formed(history)
    checks = [
        (lost, f"{len(lost)} acknowledged appends lost"),
        (misplaced, f"{len(misplaced)} acknowledged appends not at their acknowledged index"),
        (order, f"{len(order)} order violations"),
        (not agreement.agree, "replicas disagree on committed entries"),
        (found.failed_in_log, f"{len(found.failed_in_log)} failed appends in the log"),
        (found.unexpected_in_log, f"{len(found.unexpected_in_log)} unexpected entries in the log"),
        (final.crashes, f"{len(final.crashes)} replica crashes"),
    ]
    reasons = [why for violated, why in checks if violated]
    if reasons:
        verdict = "fail"
    elif not final.complete or problems:
        verdict = "unknown"
        reasons = [*final.problems, *(f"history: {p}" for p in problems)] or ["no final read"]
    else:
        verdict = "pass"
    return Evaluation(
        verdict=verdict,
        reasons=tuple(reasons),
        final_read=final.complete,
        acked=sum(1 for op in client_ops(history) if op.phase is Phase.OK),
        lost=tuple(lost),
        misplaced=tuple(misplaced),
        order=tuple(order),
        agreement=agreement,
        outcomes=found,
        ops=op_counts(history),
        crashes=tuple(final.crashes),
        history_problems=tuple(problems),
    )
