"""What the broker replicas held at the end of a broker run: every queue of the workload's
topics read back from every replica through RocketMQ's own requests (GET_MIN_OFFSET,
GET_MAX_OFFSET, then PULL_MESSAGE from the first offset to the last, at that replica's
address), after the last fault healed, the consumers drained and the groups converged.

Saved as `final.json` beside the history, so that `dledger-chaos check` judges a saved run as
the run did. To keep it small on a long soak only one listing per group is kept (the
reference: the leader's, or the replica that applied most), and every other replica is kept
as a summary of how its queues differ from it:

    {"complete": true, "converged": true, "problems": [], "crashes": [],
     "groups": {"broker-a": {
        "reference": "broker-a-n1",
        "queues": {"ChaosTopic/0": {"min": 0, "max": 3,
                                    "slots": [[0, "p0-1", "C0A8...", 4096], ...]}, ...},
        "replicas": {"broker-a-n0": {"role": "follower", "term": 3, "commit_index": 90,
                       "applied_index": 90, "error": null,
                       "queues": {"ChaosTopic/0": {"min": 0, "max": 3, "count": 3,
                                  "holes": [], "hole_count": 0,
                                  "mismatches": [], "mismatch_count": 0}}}, ...}}}}

A slot is [queue offset as stored in the record, body text (the workload's value), UNIQ_KEY,
commit log position]. A hole is a queue offset in [min, max) the replica did not return in
its place; a mismatch is an offset both hold with a different message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from client.message import MessageExt, decode_records
from dledger.config import Address
from remoting.client import open_connection
from remoting.codes import RequestCode, ResponseCode
from remoting.command import RemotingCommand
from remoting.errors import RemotingError
from remoting.headers import (
    OffsetResponseHeader,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    QueueRequestHeader,
)

FINAL_FILE = "final.json"
READER_GROUP = "chaos_final_reader"  # pulls without a commit flag: it never writes
PULL_MESSAGES = 32  # the broker's PULL_MESSAGES_MAX
REQUEST_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 600.0  # one replica's queues, all of them (a long soak holds ~1M messages)
SAMPLES_MAX = 20  # holes and mismatches listed per queue; counts are complete


@attrs.frozen
class Slot:
    offset: int  # the queue offset stored in the record
    value: str  # the body: the workload's unique value
    msg_id: str  # UNIQ_KEY
    position: int  # commit log position (physical offset)


@attrs.frozen
class QueueListing:
    """One queue as one replica holds it."""

    min_offset: int
    max_offset: int  # one past the last
    slots: tuple[Slot, ...]


@attrs.frozen
class QueueSummary:
    """One queue of one replica against the reference listing."""

    min_offset: int
    max_offset: int
    count: int
    holes: tuple[int, ...] = ()  # first SAMPLES_MAX
    hole_count: int = 0
    mismatches: tuple[tuple[int, str, str], ...] = ()  # (offset, this value, reference value)
    mismatch_count: int = 0


@attrs.frozen
class ReplicaRead:
    host: str
    role: str = "unknown"
    term: int = 0
    commit_index: int = 0
    applied_index: int = 0
    error: str | None = None  # why it could not be read; then queues is empty
    queues: dict[str, QueueSummary] = attrs.field(factory=dict)

    @property
    def read(self) -> bool:
        return self.error is None


@attrs.frozen
class GroupRead:
    group: str
    reference: str | None  # the host whose listing is kept
    queues: dict[str, QueueListing]  # "topic/queue id" -> the reference's listing
    replicas: dict[str, ReplicaRead]


@attrs.frozen
class BrokerFinal:
    groups: dict[str, GroupRead]
    complete: bool  # every replica of every group was read
    converged: bool = False  # the replicas of each group had applied the same index
    problems: tuple[str, ...] = ()
    crashes: tuple[dict[str, Any], ...] = ()


NO_FINAL_READ = BrokerFinal(groups={}, complete=False, problems=("no final read",))


def queue_key(topic: str, queue_id: int) -> str:
    return f"{topic}/{queue_id}"


def split_key(key: str) -> tuple[str, int]:
    topic, _, queue_id = key.rpartition("/")
    return topic, int(queue_id)


# --- comparing replicas (pure) -----------------------------------------------------------------


def holes(listing: QueueListing) -> list[int]:
    """Offsets in [min, max) not held in their place: missing, out of order or repeated."""
    found = []
    expected = listing.min_offset
    for slot in listing.slots:
        while expected < slot.offset and expected < listing.max_offset:
            found.append(expected)
            expected += 1
        if slot.offset == expected:
            expected += 1
        elif slot.offset < expected:
            found.append(slot.offset)  # repeated or out of order: this slot is not in its place
    found.extend(range(expected, listing.max_offset))
    return found


def summarize(listing: QueueListing, reference: QueueListing | None) -> QueueSummary:
    missing = holes(listing)
    differ: list[tuple[int, str, str]] = []
    if reference is not None:
        theirs = {s.offset: s for s in reference.slots}
        for slot in listing.slots:
            other = theirs.get(slot.offset)
            if other is not None and (other.value, other.msg_id, other.position) != (
                slot.value,
                slot.msg_id,
                slot.position,
            ):
                differ.append((slot.offset, slot.value, other.value))
    return QueueSummary(
        min_offset=listing.min_offset,
        max_offset=listing.max_offset,
        count=len(listing.slots),
        holes=tuple(missing[:SAMPLES_MAX]),
        hole_count=len(missing),
        mismatches=tuple(differ[:SAMPLES_MAX]),
        mismatch_count=len(differ),
    )


def compare_group(
    group: str,
    listings: Mapping[str, Mapping[str, QueueListing]],
    states: Mapping[str, ReplicaRead],
) -> GroupRead:
    """Keep one replica's listings (the leader's, else the one that applied most) and
    summarize every replica against it. `states` holds each replica's role and indexes, or
    its error; `listings` the queues of those that were read."""
    readable = [h for h in states if states[h].read and h in listings]

    def rank(host: str) -> tuple[bool, int, str]:
        s = states[host]
        return (s.role.lower() == "leader", s.applied_index, host)

    reference = max(readable, key=rank) if readable else None
    kept = dict(listings[reference]) if reference is not None else {}
    replicas = {}
    for host, state in states.items():
        if host not in readable:
            replicas[host] = state
            continue
        summaries = {
            key: summarize(listing, kept.get(key)) for key, listing in listings[host].items()
        }
        replicas[host] = attrs.evolve(state, queues=summaries)
    return GroupRead(group, reference, kept, replicas)


# --- reading one replica -----------------------------------------------------------------------


class ReadFailed(Exception):
    pass


async def _call(conn: Any, code: int, fields: dict[str, str]) -> RemotingCommand:
    return await conn.request(RemotingCommand.request(code, fields), timeout_s=REQUEST_TIMEOUT_S)


async def _offset(conn: Any, code: int, topic: str, queue_id: int) -> int:
    fields = QueueRequestHeader(topic=topic, queue_id=queue_id).encode()
    response = await _call(conn, code, fields)
    if response.code != ResponseCode.SUCCESS:
        raise ReadFailed(f"{RequestCode(code).name} of {topic}/{queue_id}: {response.remark}")
    return OffsetResponseHeader.decode(response.ext_fields).offset


async def read_queue(conn: Any, group: str, topic: str, queue_id: int) -> QueueListing:
    low = await _offset(conn, RequestCode.GET_MIN_OFFSET, topic, queue_id)
    high = await _offset(conn, RequestCode.GET_MAX_OFFSET, topic, queue_id)
    slots: list[Slot] = []
    offset = low
    while offset < high:
        header = PullMessageRequestHeader(
            consumer_group=READER_GROUP,
            topic=topic,
            queue_id=queue_id,
            queue_offset=offset,
            max_msg_nums=PULL_MESSAGES,
            sys_flag=4,  # the subscription below; no commit, no suspend
            commit_offset=0,
            suspend_timeout_millis=0,
            subscription="*",
            sub_version=0,
            expression_type="TAG",
        )
        response = await _call(conn, RequestCode.PULL_MESSAGE, header.encode())
        answer = PullMessageResponseHeader.decode(response.ext_fields)
        if response.code != ResponseCode.SUCCESS:
            raise ReadFailed(
                f"pull of {topic}/{queue_id} at {offset} of [{low}, {high}): code "
                f"{response.code} {response.remark} (next {answer.next_begin_offset})"
            )
        messages: list[MessageExt] = decode_records(response.body, group)
        if not messages:
            raise ReadFailed(f"pull of {topic}/{queue_id} at {offset}: found, but no records")
        slots.extend(
            Slot(m.queue_offset, m.body.decode(errors="replace"), m.msg_id, m.commit_log_offset)
            for m in messages
        )
        if answer.next_begin_offset <= offset:
            raise ReadFailed(f"pull of {topic}/{queue_id} at {offset} did not move forward")
        offset = answer.next_begin_offset
    return QueueListing(low, high, tuple(slots))


async def read_replica(
    address: Address, group: str, queues: Sequence[tuple[str, int]]
) -> dict[str, QueueListing]:
    """Every queue of `queues` as the replica at `address` holds it; ReadFailed naming what
    could not be read."""
    found: dict[str, QueueListing] = {}
    problems: list[str] = []
    try:
        with trio.fail_after(READ_TIMEOUT_S):
            async with open_connection(address.host, address.port) as conn:
                for topic, qid in queues:
                    found[queue_key(topic, qid)] = await read_queue(conn, group, topic, qid)
    except* (ReadFailed, OSError, RemotingError, trio.TooSlowError, trio.BrokenResourceError) as eg:
        # from inside the connection's block they come in an ExceptionGroup
        problems = [str(e) if isinstance(e, ReadFailed) else repr(e) for e in eg.exceptions]
    if problems:
        raise ReadFailed(f"{address}: {'; '.join(problems)}")
    return found


# --- final.json --------------------------------------------------------------------------------


def _summary_json(s: QueueSummary) -> dict[str, Any]:
    return {
        "min": s.min_offset,
        "max": s.max_offset,
        "count": s.count,
        "holes": list(s.holes),
        "hole_count": s.hole_count,
        "mismatches": [list(m) for m in s.mismatches],
        "mismatch_count": s.mismatch_count,
    }


def to_json(state: BrokerFinal) -> dict[str, Any]:
    return {
        "complete": state.complete,
        "converged": state.converged,
        "problems": list(state.problems),
        "crashes": list(state.crashes),
        "groups": {
            name: {
                "reference": g.reference,
                "queues": {
                    key: {
                        "min": q.min_offset,
                        "max": q.max_offset,
                        "slots": [[s.offset, s.value, s.msg_id, s.position] for s in q.slots],
                    }
                    for key, q in sorted(g.queues.items())
                },
                "replicas": {
                    host: {
                        "role": r.role,
                        "term": r.term,
                        "commit_index": r.commit_index,
                        "applied_index": r.applied_index,
                        "error": r.error,
                        "queues": {k: _summary_json(s) for k, s in sorted(r.queues.items())},
                    }
                    for host, r in sorted(g.replicas.items())
                },
            }
            for name, g in sorted(state.groups.items())
        },
    }


def from_json(data: dict[str, Any]) -> BrokerFinal:
    groups = {}
    for name, g in data["groups"].items():
        queues = {
            key: QueueListing(
                int(q["min"]),
                int(q["max"]),
                tuple(Slot(int(o), str(v), str(i), int(p)) for o, v, i, p in q["slots"]),
            )
            for key, q in g["queues"].items()
        }
        replicas = {
            host: ReplicaRead(
                host=host,
                role=str(r["role"]),
                term=int(r["term"]),
                commit_index=int(r["commit_index"]),
                applied_index=int(r["applied_index"]),
                error=r["error"],
                queues={
                    k: QueueSummary(
                        min_offset=int(s["min"]),
                        max_offset=int(s["max"]),
                        count=int(s["count"]),
                        holes=tuple(int(h) for h in s["holes"]),
                        hole_count=int(s["hole_count"]),
                        mismatches=tuple((int(o), str(a), str(b)) for o, a, b in s["mismatches"]),
                        mismatch_count=int(s["mismatch_count"]),
                    )
                    for k, s in r["queues"].items()
                },
            )
            for host, r in g["replicas"].items()
        }
        groups[name] = GroupRead(name, g["reference"], queues, replicas)
    return BrokerFinal(
        groups=groups,
        complete=bool(data["complete"]),
        converged=bool(data.get("converged", False)),
        problems=tuple(data.get("problems", ())),
        crashes=tuple(data.get("crashes", ())),
    )


def save(path: Path, state: BrokerFinal) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(to_json(state), separators=(",", ":")))
    tmp.replace(path)


def load(path: Path) -> BrokerFinal:
    if not path.exists():
        return NO_FINAL_READ
    return from_json(json.loads(path.read_text()))
