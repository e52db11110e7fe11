"""The checkers of a broker run: pure functions of the history (read once, chaos/broker_scan.py)
and the final read of every replica (chaos/broker_final.py).

Must hold (any violation makes the verdict "fail"):
- acked_lost: a send acknowledged SEND_OK whose value is in no queue of its group's log;
- acked_misplaced: it is there, but not at the queue and queue offset acknowledged;
- acked_unconsumed: a consumer group never consumed an acknowledged value of its topic;
- consumed_not_stored: a consumer got a value the log does not hold at that queue offset;
- order: a value of a sharding key consumed for the first time by the orderly group after a
  later value of the same key (per-key order after dedupe);
- queues: a replica's queue with a hole (an offset in [min, max) not held in its place), or
  holding a different message than the reference replica at an offset, or (converged) ending
  at a different offset;
- rewinds_beyond_bound: a consumer member that took a queue and started below an offset the
  broker had acknowledged as committed, and kept (no fault of the group) for COMMIT_DURABLE_S,
  before the take: a committed offset lost;
- failed_in_log: a value whose every send failed (surely not stored) is in the log;
- unexpected_in_log: a value in the log no producer sent;
- crashes: a process (broker replica or name server) that exited unbidden.
Counted: duplicates in the log (re-sends after unknown outcomes), redeliveries per consumer
group (and per failover), unknown outcomes that landed, unavailability per group (the longest
stretch without a SEND_OK on it) and failover per fault (injection to the first SEND_OK on the
fault's group of a send invoked after the injection). Without a complete final read the checks
against the log are not run and the verdict is "unknown", never "pass".
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from chaos import availability
from chaos.broker_final import BrokerFinal, split_key
from chaos.broker_scan import (
    SAMPLES_MAX,
    Ack,
    Observation,
    OrderViolation,
    Phantom,
    QueueId,
    Rewind,
    Scan,
    scan,
)
from chaos.history import Op
from chaos.workloads.messages import CONSUMER_TOPICS, TAKE_POLL_S

NS_PER_S = 1_000_000_000
# broker/offsets.py OFFSET_COALESCE_MS (0.2 s: a commit is in the log by then on a healthy
# group) plus a margin for the write itself: a commit observed this long before a take, with no
# fault of the group meanwhile, must be where the taker starts, or later.
COMMIT_DURABLE_S = 0.5


@attrs.frozen
class Lost:
    value: str
    group: str
    topic: str
    queue_id: int
    offset: int
    acked_ns: int


@attrs.frozen
class Misplaced:
    value: str
    group: str
    topic: str
    queue_id: int
    offset: int
    found: tuple[tuple[str, str, int, int], ...]  # (group, topic, queue id, offset)


@attrs.frozen
class Unconsumed:
    consumer_group: str
    value: str
    group: str
    queue_id: int
    offset: int


@attrs.frozen
class QueueProblem:
    group: str
    host: str
    queue: str  # "topic/queue id"
    kind: str  # "holes", "mismatches", "max offset differs"
    detail: str


@attrs.frozen
class RewindFinding:
    rewind: Rewind
    take_ns: int | None  # the member's take of the queue before the rewind
    committed_before: int | None  # the highest offset durably committed before the take
    cause: str  # the latest fault or consumer restart before it
    beyond_bound: bool


@attrs.frozen
class Failover:
    number: int
    kind: str
    group: str | None  # None: the name servers
    leader_affected: bool
    ms: float | None  # None: no SEND_OK before the next fault (or the end)


@attrs.frozen
class GroupFacts:
    """What one broker group went through and kept."""

    acked: int
    lost: int
    misplaced: int
    unconsumed: dict[str, int]  # by consumer group
    redelivered: dict[str, int]  # by consumer group
    queue_problems: int
    duplicates_in_log: int
    longest_no_ok_ms: float | None
    longest_no_ok_at_s: float | None
    faults: dict[str, int]
    failover_ms: dict[str, Any]  # summarize() over the faults on this group that hit its leader


@attrs.frozen
class Evaluation:
    verdict: str
    reasons: tuple[str, ...]
    final_read: bool
    converged: bool
    acked: int
    sends: dict[str, int]  # invoke, ok, fail, info
    lost: tuple[Lost, ...]
    misplaced: tuple[Misplaced, ...]
    unconsumed: dict[str, tuple[Unconsumed, ...]]  # by consumer group (samples)
    unconsumed_count: dict[str, int]
    phantoms: tuple[Phantom, ...]
    phantom_count: int
    order: tuple[OrderViolation, ...]
    keys_checked: int
    queue_problems: tuple[QueueProblem, ...]
    rewinds: tuple[RewindFinding, ...]
    redelivered: dict[str, int]  # by consumer group
    consumed: dict[str, int]  # distinct values, by consumer group
    duplicates_in_log: dict[str, int]  # value -> extra copies
    unknown_in_log: int
    failed_in_log: tuple[str, ...]
    unexpected_in_log: tuple[str, ...]
    failovers: tuple[Failover, ...]
    windows: tuple[availability.FaultWindow, ...]
    groups: dict[str, GroupFacts]
    crashes: tuple[dict[str, Any], ...]
    history_problems: tuple[str, ...]
    notes: tuple[str, ...]  # what stood in the way (not a check)


# --- the log against what producers were told --------------------------------------------------


def stored_index(final: BrokerFinal) -> dict[QueueId, dict[int, str]]:
    """(group, topic, queue id) -> queue offset -> value, from each group's reference."""
    index: dict[QueueId, dict[int, str]] = {}
    for name, group in final.groups.items():
        for key, listing in group.queues.items():
            topic, queue_id = split_key(key)
            index[(name, topic, queue_id)] = {s.offset: s.value for s in listing.slots}
    return index


def where_stored(final: BrokerFinal) -> dict[str, list[tuple[str, str, int, int]]]:
    """value -> every (group, topic, queue id, offset) holding it."""
    found: dict[str, list[tuple[str, str, int, int]]] = defaultdict(list)
    for name, group in final.groups.items():
        for key, listing in group.queues.items():
            topic, queue_id = split_key(key)
            for slot in listing.slots:
                found[slot.value].append((name, topic, queue_id, slot.offset))
    return found


def lost_acks(
    acks: Iterable[Ack], where: dict[str, list[tuple[str, str, int, int]]]
) -> tuple[list[Lost], list[Misplaced]]:
    lost, misplaced = [], []
    for a in acks:
        places = where.get(a.value, [])
        in_group = [p for p in places if p[0] == a.group]
        if not in_group:
            lost.append(Lost(a.value, a.group, a.topic, a.queue_id, a.offset, a.done_ns))
        elif (a.group, a.topic, a.queue_id, a.offset) not in places:
            misplaced.append(
                Misplaced(a.value, a.group, a.topic, a.queue_id, a.offset, tuple(places))
            )
    return lost, misplaced


def unconsumed_acks(s: Scan) -> dict[str, list[Unconsumed]]:
    out: dict[str, list[Unconsumed]] = {}
    for cg, topic in CONSUMER_TOPICS.items():
        seen = s.consumed.get(cg)
        first = seen.first_ns if seen is not None else {}
        out[cg] = [
            Unconsumed(cg, a.value, a.group, a.queue_id, a.offset)
            for a in s.acks.values()
            if a.topic == topic and a.value not in first
        ]
    return out


def queue_problems(final: BrokerFinal) -> list[QueueProblem]:
    found = []
    for name, group in sorted(final.groups.items()):
        ends: dict[str, set[int]] = defaultdict(set)
        for host, replica in sorted(group.replicas.items()):
            for key, q in sorted(replica.queues.items()):
                ends[key].add(q.max_offset)
                if q.hole_count:
                    found.append(
                        QueueProblem(
                            name,
                            host,
                            key,
                            "holes",
                            f"{q.hole_count} offsets of [{q.min_offset}, {q.max_offset}) "
                            f"not in place, first {list(q.holes)}",
                        )
                    )
                if q.mismatch_count:
                    found.append(
                        QueueProblem(
                            name,
                            host,
                            key,
                            "mismatches",
                            f"{q.mismatch_count} offsets hold another message than "
                            f"{group.reference}'s, first {list(q.mismatches)}",
                        )
                    )
        if final.converged:
            for key, maxima in sorted(ends.items()):
                if len(maxima) > 1:
                    found.append(
                        QueueProblem(name, "*", key, "max offset differs", f"ends {sorted(maxima)}")
                    )
    return found


def log_outcomes(
    s: Scan, where: dict[str, list[tuple[str, str, int, int]]]
) -> tuple[dict[str, int], int, list[str], list[str]]:
    """(duplicates: value -> extra copies, unknown outcomes in the log, failed values in the
    log, values in the log nobody sent)."""
    duplicates = {v: len(p) - 1 for v, p in where.items() if len(p) > 1}
    unknown = sum(1 for v in where if v in s.unknown and v not in s.acks)
    failed = sorted(v for v in where if v in s.failed and v not in s.acks and v not in s.unknown)
    unexpected = sorted(v for v in where if v not in s.invoked)
    return duplicates, unknown, failed, unexpected


# --- rewinds -----------------------------------------------------------------------------------


def judge_rewinds(s: Scan, windows: Sequence[availability.FaultWindow]) -> list[RewindFinding]:
    """Each rewind with its take, the highest offset durably committed before the take, its
    cause, and whether it started below that offset."""
    by_queue: dict[tuple[str, QueueId], list[Observation]] = defaultdict(list)
    for o in s.observations:
        by_queue[(o.consumer_group, (o.group, o.topic, o.queue_id))].append(o)
    durable_ns = int(COMMIT_DURABLE_S * NS_PER_S)
    poll_ns = int(TAKE_POLL_S * NS_PER_S)
    causes = sorted(
        [
            (w.start_ns, f"fault {w.number} {w.kind} {w.value.get('group') or ''}".strip())
            for w in windows
        ]
        + [(e.time_ns, e.what) for e in s.events]
    )
    cause_times = [t for t, _ in causes]
    found = []
    for r in s.rewinds:
        queue: QueueId = (r.group, r.topic, r.queue_id)
        takes = s.takes.get((r.consumer_group, r.member, queue), [])
        i = bisect.bisect_right(takes, r.first_ns)
        take_ns = takes[i - 1] if i else None
        committed = None
        if take_ns is not None:
            cutoff = take_ns - poll_ns - durable_ns
            for o in by_queue[(r.consumer_group, queue)]:
                if o.time_ns > cutoff:
                    break
                if not _group_faulted(windows, r.group, o.time_ns, o.time_ns + durable_ns):
                    committed = o.offset if committed is None else max(committed, o.offset)
        j = bisect.bisect_right(cause_times, r.first_ns)
        cause = causes[j - 1][1] if j else "none seen"
        beyond = committed is not None and r.start_offset < committed
        found.append(RewindFinding(r, take_ns, committed, cause, beyond))
    return found


def _group_faulted(
    windows: Sequence[availability.FaultWindow], group: str, start_ns: int, end_ns: int
) -> bool:
    for w in windows:
        if w.value.get("group") != group:
            continue
        if w.start_ns <= end_ns and (w.end_ns is None or w.end_ns >= start_ns):
            return True
    return False


# --- availability ------------------------------------------------------------------------------


def failovers(s: Scan, windows: Sequence[availability.FaultWindow]) -> list[Failover]:
    """Per fault: injection to the first SEND_OK (on its group; on any for the name servers)
    of a send invoked once the fault was in force, before the next fault. A send invoked
    earlier may have been answered before the fault took effect (a partition's rules take
    tens of milliseconds), so it says nothing about the failover."""
    acks = sorted(s.acks.values(), key=lambda a: a.done_ns)
    found = []
    for i, w in enumerate(windows):
        until = windows[i + 1].start_ns if i + 1 < len(windows) else None
        group = w.value.get("group")
        first = None
        for a in acks:
            if a.done_ns < w.start_ns or a.invoked_ns < w.applied_ns:
                continue
            if until is not None and a.done_ns >= until:
                break
            if group is None or a.group == group:
                first = a
                break
        ms = None if first is None else (first.done_ns - w.start_ns) / availability.NS_PER_MS
        found.append(Failover(w.number, w.kind, group, w.leader_affected, ms))
    return found


def longest_no_ok(s: Scan, group: str) -> tuple[float, int] | None:
    """(ms, start ns) of the longest stretch without a SEND_OK on `group`, over the time
    sends were made."""
    if s.first_send_ns is None or s.last_send_ns is None:
        return None
    marks = sorted(a.done_ns for a in s.acks.values() if a.group == group)
    marks = [s.first_send_ns, *marks, s.last_send_ns]
    gap, start = max((b - a, a) for a, b in itertools.pairwise(marks))
    return gap / availability.NS_PER_MS, start


# --- everything --------------------------------------------------------------------------------


def evaluate(history: Iterable[Op], final: BrokerFinal) -> Evaluation:
    complete = final.complete
    s = scan(history, stored_index(final) if complete else None)
    windows = availability.fault_windows(s.nemesis)
    where = where_stored(final) if complete else {}
    lost: list[Lost] = []
    misplaced: list[Misplaced] = []
    unconsumed = unconsumed_acks(s)
    problems = queue_problems(final)
    duplicates: dict[str, int] = {}
    unknown_in_log = 0
    failed: list[str] = []
    unexpected: list[str] = []
    if complete:
        lost, misplaced = lost_acks(s.acks.values(), where)
        duplicates, unknown_in_log, failed, unexpected = log_outcomes(s, where)
    rewinds = judge_rewinds(s, windows)
    beyond = [r for r in rewinds if r.beyond_bound]
    found_failovers = failovers(s, windows)
    unconsumed_count = {cg: len(u) for cg, u in unconsumed.items()}
    checks = [
        (lost, f"{len(lost)} acknowledged messages lost"),
        (misplaced, f"{len(misplaced)} acknowledged messages not at their acknowledged offset"),
        (
            sum(unconsumed_count.values()),
            "acknowledged messages never consumed: "
            + ", ".join(f"{cg} {n}" for cg, n in unconsumed_count.items() if n),
        ),
        (s.phantom_count, f"{s.phantom_count} consumed messages not stored where consumed"),
        (s.order, f"{len(s.order)} per-key order violations in orderly consumption"),
        (problems, f"{len(problems)} queue problems on replicas (holes, mismatches, ends)"),
        (beyond, f"{len(beyond)} consumer rewinds below a durably committed offset"),
        (failed, f"{len(failed)} failed sends in the log"),
        (unexpected, f"{len(unexpected)} unexpected messages in the log"),
        (s.acked_again, f"{len(s.acked_again)} values acknowledged twice"),
        (final.crashes, f"{len(final.crashes)} process crashes"),
    ]
    reasons = [why for violated, why in checks if violated]
    if reasons:
        verdict = "fail"
    elif not complete or s.problems:
        verdict = "unknown"
        reasons = [*final.problems, *(f"history: {p}" for p in s.problems)] or ["no final read"]
    else:
        verdict = "pass"
    return Evaluation(
        verdict=verdict,
        reasons=tuple(reasons),
        final_read=complete,
        converged=final.converged,
        acked=len(s.acks),
        sends={p: s.send_counts.get(p, 0) for p in ("invoke", "ok", "fail", "info")},
        lost=tuple(lost),
        misplaced=tuple(misplaced),
        unconsumed={cg: tuple(u[:SAMPLES_MAX]) for cg, u in unconsumed.items()},
        unconsumed_count=unconsumed_count,
        phantoms=tuple(s.phantoms),
        phantom_count=s.phantom_count,
        order=tuple(s.order),
        keys_checked=s.keys_checked,
        queue_problems=tuple(problems),
        rewinds=tuple(rewinds),
        redelivered={cg: c.redelivered for cg, c in sorted(s.consumed.items())},
        consumed={cg: len(c.first_ns) for cg, c in sorted(s.consumed.items())},
        duplicates_in_log=duplicates,
        unknown_in_log=unknown_in_log,
        failed_in_log=tuple(failed),
        unexpected_in_log=tuple(unexpected),
        failovers=tuple(found_failovers),
        windows=tuple(windows),
        groups=group_facts(
            s,
            final,
            lost,
            misplaced,
            unconsumed,
            problems,
            duplicates,
            where,
            windows,
            found_failovers,
        ),
        crashes=tuple(final.crashes),
        history_problems=tuple(s.problems[:SAMPLES_MAX]),
        notes=tuple(final.problems),
    )


def group_facts(
    s: Scan,
    final: BrokerFinal,
    lost: Sequence[Lost],
    misplaced: Sequence[Misplaced],
    unconsumed: dict[str, list[Unconsumed]],
    problems: Sequence[QueueProblem],
    duplicates: dict[str, int],
    where: dict[str, list[tuple[str, str, int, int]]],
    windows: Sequence[availability.FaultWindow],
    found_failovers: Sequence[Failover],
) -> dict[str, GroupFacts]:
    names = sorted(set(final.groups) | {a.group for a in s.acks.values()})
    out = {}
    for g in names:
        gap = longest_no_ok(s, g)
        mine = [f for f in found_failovers if f.group == g]
        out[g] = GroupFacts(
            acked=sum(1 for a in s.acks.values() if a.group == g),
            lost=sum(1 for x in lost if x.group == g),
            misplaced=sum(1 for x in misplaced if x.group == g),
            unconsumed={cg: sum(1 for u in us if u.group == g) for cg, us in unconsumed.items()},
            redelivered={
                cg: c.redelivered_by_group.get(g, 0) for cg, c in sorted(s.consumed.items())
            },
            queue_problems=sum(1 for p in problems if p.group == g),
            duplicates_in_log=sum(
                n for v, n in duplicates.items() if any(p[0] == g for p in where.get(v, []))
            ),
            longest_no_ok_ms=None if gap is None else round(gap[0], 1),
            longest_no_ok_at_s=None if gap is None else round(gap[1] / NS_PER_S, 3),
            faults=dict(
                sorted(Counter(w.kind for w in windows if w.value.get("group") == g).items())
            ),
            failover_ms=availability.summarize(
                [f.ms for f in mine if f.leader_affected and f.ms is not None]
            ),
        )
    return out
