"""One pass over a broker run's history (chaos/workloads/messages.py writes it), keeping only
what the checkers need, so that a soak's history of millions of operations is read as a stream
and never held whole: every acknowledged send, every consumer group's first consumption of
each value and its redeliveries, the order per sharding key of the orderly group, commit
observations, queue takes, restarts and the nemesis's records.

Redeliveries are grouped into rewinds: a member of a consumer group consuming, in one queue,
values the group had consumed before, until it consumes a new one. Each rewind keeps where it
started, how far back that was (depth: the highest offset the group had consumed in that
queue, plus one, minus the start) and how many values it redelivered.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from chaos.history import NEMESIS, Op, Phase
from chaos.workloads.messages import ORDERLY_GROUP, key_of

PAIRED = frozenset({"send", "commit"})  # client functions with an invocation and a completion
QueueId = tuple[str, str, int]  # (broker group, topic, queue id)
SAMPLES_MAX = 20  # examples kept of a finding; counts are complete


@attrs.frozen
class Ack:
    value: str
    topic: str
    key: str | None
    group: str
    queue_id: int
    offset: int
    msg_id: str
    node: str | None  # the replica that answered
    process: str
    invoked_ns: int
    done_ns: int


@attrs.define
class Rewind:
    consumer_group: str
    member: str
    group: str
    topic: str
    queue_id: int
    start_offset: int
    depth: int  # offsets back from the furthest the group had consumed in the queue
    count: int  # values redelivered in this run
    first_ns: int


@attrs.frozen
class OrderViolation:
    key: str
    seq: int  # first consumed ...
    after_seq: int  # ... after this later one of the same key had been
    member: str
    time_ns: int


@attrs.frozen
class Observation:
    """A committed offset the broker acknowledged (the pull consumer's commit) or answered
    (the sampler's query), at time_ns."""

    consumer_group: str
    group: str
    topic: str
    queue_id: int
    offset: int
    time_ns: int


@attrs.frozen
class Phantom:
    """A message a consumer got that the group's log does not hold at that queue offset."""

    consumer_group: str
    group: str
    topic: str
    queue_id: int
    offset: int
    value: str
    stored: str | None  # what the log holds there


@attrs.frozen
class Event:
    """Something that makes consumers start over: a member restarted, or failed."""

    time_ns: int
    what: str


@attrs.define
class Consumption:
    """One consumer group's view: the first time each value was consumed, and redeliveries."""

    first_ns: dict[str, int] = attrs.field(factory=dict)
    redelivered: int = 0
    redelivered_by_group: Counter[str] = attrs.field(factory=Counter)
    furthest: dict[QueueId, int] = attrs.field(factory=dict)  # highest offset consumed


@attrs.define
class Scan:
    acks: dict[str, Ack] = attrs.field(factory=dict)
    acked_again: list[str] = attrs.field(factory=list)  # values acknowledged more than once
    invoked: set[str] = attrs.field(factory=set)
    failed: set[str] = attrs.field(factory=set)  # values with a `fail` send
    unknown: set[str] = attrs.field(factory=set)  # values with an `info` send
    send_counts: Counter[str] = attrs.field(factory=Counter)  # by phase
    first_send_ns: int | None = None
    last_send_ns: int | None = None
    consumed: dict[str, Consumption] = attrs.field(factory=dict)  # by consumer group
    phantoms: list[Phantom] = attrs.field(factory=list)  # consumed, not stored there
    phantom_count: int = 0
    rewinds: list[Rewind] = attrs.field(factory=list)
    order: list[OrderViolation] = attrs.field(factory=list)
    keys_checked: int = 0
    observations: list[Observation] = attrs.field(factory=list)
    takes: dict[tuple[str, str, QueueId], list[int]] = attrs.field(factory=dict)
    events: list[Event] = attrs.field(factory=list)
    nemesis: list[Op] = attrs.field(factory=list)
    problems: list[str] = attrs.field(factory=list)  # with the history itself
    end_ns: int = 0
    _open: dict[Any, Op] = attrs.field(factory=dict)  # process -> its invocation in flight
    _runs: dict[tuple[str, str, QueueId], Rewind] = attrs.field(factory=dict)
    _order_max: dict[str, int] = attrs.field(factory=dict)  # key -> highest seq consumed


def scan(history: Iterable[Op], stored: Mapping[QueueId, Mapping[int, str]] | None = None) -> Scan:
    """Read the history once. With `stored` (queue -> offset -> value, from the final read)
    every consumed message is looked up there too."""
    s = Scan()
    for op in history:
        s.end_ns = max(s.end_ns, op.time_ns)
        if op.process == NEMESIS:
            s.nemesis.append(op)
        elif op.f in PAIRED:
            _paired(s, op)
        elif op.f == "consume":
            _consume(s, op, stored)
        elif op.f == "committed":
            _observe(s, op)
        elif op.f == "take":
            v = op.value
            key = (str(v["cg"]), str(op.process), (op.group, str(v["t"]), int(v["q"])))
            s.takes.setdefault(key, []).append(op.time_ns)
        elif op.f in ("restart", "consumer-error"):
            s.events.append(Event(op.time_ns, f"{op.f} of {op.process}"))
    for process, op in s._open.items():
        if op.f == "send":
            s.problems.append(f"process {process}: send of {op.value.get('v')} never completed")
    return s


def _paired(s: Scan, op: Op) -> None:
    if op.phase is Phase.INVOKE:
        if op.process in s._open:
            s.problems.append(f"process {op.process} invoked {op.f} at {op.time_ns} twice")
        s._open[op.process] = op
        if op.f == "send":
            s.send_counts["invoke"] += 1
            s.invoked.add(str(op.value["v"]))
            if s.first_send_ns is None:
                s.first_send_ns = op.time_ns
        return
    started = s._open.pop(op.process, None)
    if started is None or started.f != op.f:
        s.problems.append(
            f"process {op.process}: {op.phase.value} {op.f} at {op.time_ns} uninvoked"
        )
        return
    if op.f == "commit":
        if op.phase is Phase.OK:
            _observe(s, op)
        return
    s.send_counts[op.phase.value] += 1
    s.last_send_ns = op.time_ns
    v = op.value
    value = str(v["v"])
    if op.phase is Phase.FAIL:
        s.failed.add(value)
    elif op.phase is Phase.INFO:
        s.unknown.add(value)
    else:
        ack = Ack(
            value=value,
            topic=str(v["t"]),
            key=v.get("k"),
            group=op.group,
            queue_id=int(v["q"]),
            offset=int(v["o"]),
            msg_id=str(v.get("id", "")),
            node=op.node,
            process=str(op.process),
            invoked_ns=started.time_ns,
            done_ns=op.time_ns,
        )
        if value in s.acks:
            s.acked_again.append(value)
        else:
            s.acks[value] = ack


def _observe(s: Scan, op: Op) -> None:
    v = op.value
    s.observations.append(
        Observation(str(v["cg"]), op.group, str(v["t"]), int(v["q"]), int(v["o"]), op.time_ns)
    )


def _consume(s: Scan, op: Op, stored: Mapping[QueueId, Mapping[int, str]] | None) -> None:
    v = op.value
    cg = str(v["cg"])
    queue: QueueId = (op.group, str(v["t"]), int(v["q"]))
    seen = s.consumed.setdefault(cg, Consumption())
    member = str(op.process)
    run_key = (cg, member, queue)
    for offset, value, _msg_id in v["m"]:
        offset, value = int(offset), str(value)
        if stored is not None:
            there = stored.get(queue, {}).get(offset)
            if there != value:
                s.phantom_count += 1
                if len(s.phantoms) < SAMPLES_MAX:
                    s.phantoms.append(Phantom(cg, *queue, offset, value, there))
        furthest = seen.furthest.get(queue, -1)
        if value in seen.first_ns:
            seen.redelivered += 1
            seen.redelivered_by_group[op.group] += 1
            run = s._runs.get(run_key)
            if run is None:
                run = Rewind(cg, member, *queue, offset, furthest + 1 - offset, 0, op.time_ns)
                s._runs[run_key] = run
                s.rewinds.append(run)
            run.count += 1
        else:
            seen.first_ns[value] = op.time_ns
            s._runs.pop(run_key, None)
            if cg == ORDERLY_GROUP:
                _check_order(s, value, member, op.time_ns)
        seen.furthest[queue] = max(furthest, offset)


def _check_order(s: Scan, value: str, member: str, time_ns: int) -> None:
    """A value consumed for the first time must come after every value of its key consumed
    before it: its seq above theirs."""
    key, seq = key_of(value)
    highest = s._order_max.get(key)
    if highest is None:
        s.keys_checked += 1
    elif seq < highest:
        s.order.append(OrderViolation(key, seq, highest, member, time_ns))
        return
    s._order_max[key] = seq if highest is None else max(highest, seq)
