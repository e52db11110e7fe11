"""The offset coalescer (broker/offsets.py) answers reads with what it was told, also in the
moment between an offset entry's commit and this replica's apply of it: a consumer taking a
queue over reads the offset its previous owner committed, never the one before; and a read
that could not settle says so in its answer."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import trio
import trio.testing

from broker.consumer_manage import handle_query_consumer_offset
from broker.metadata import Metadata
from broker.offsets import OffsetCoalescer
from broker.writes import WriteFailed, Written
from remoting.codes import RequestCode, ResponseCode
from remoting.command import RemotingCommand
from remoting.headers import (
    OFFSET_UNSETTLED_AT_ONCE_FIELD,
    OFFSET_UNSETTLED_FIELD,
    QueryConsumerOffsetRequestHeader,
)

KEY = ("g", "T", 0)


class AppliedLater:
    """A replica's state whose apply runs behind the log's commit, as it may."""

    def __init__(self) -> None:
        self.metadata = Metadata()
        self.applied_index = 0
        self._applied = trio.Event()

    async def wait_applied(self, index: int) -> None:
        while self.applied_index < index:
            await self._applied.wait()

    def apply(self, index: int, offsets: dict[tuple[str, str, int], int]) -> None:
        self.metadata.offsets.update(offsets)
        self.applied_index = index
        self._applied.set()
        self._applied = trio.Event()


class CommitAtOnce:
    """A write path whose appends commit at once, as entry 1, 2, ..."""

    def __init__(self) -> None:
        self.index = 0

    async def append(self, bodies: Any, timeout_s: float) -> Written:
        self.index += 1
        return Written(self.index, True)


async def test_a_committed_offset_is_read_back_before_and_after_its_apply() -> None:
    state = AppliedLater()
    state.metadata.offsets[KEY] = 3  # an older commit, applied
    coalescer = OffsetCoalescer(state, CommitAtOnce())  # type: ignore[arg-type]
    coalescer.commit(*KEY, 7)
    assert coalescer.query(*KEY) == 7
    async with trio.open_nursery() as nursery:
        nursery.start_soon(coalescer.write_pending)
        await trio.testing.wait_all_tasks_blocked()
        assert coalescer.entries_written == 1  # committed, not yet applied here
        assert coalescer.query(*KEY) == 7
        state.apply(1, {KEY: 7})
    assert coalescer.query(*KEY) == 7


# --- a read settles first (found by the second 30-minute broker soak: the whole group was
# restarted 0.6 s after a consumer's commit had gone into the log; the first replica up answered
# the consumer that took the queue from its applied state, one commit older, before it had
# learnt that the newer entry in its log was committed)


class BlockedUntilReleased(CommitAtOnce):
    """A write path whose appends wait for the test to release them."""

    def __init__(self) -> None:
        super().__init__()
        self.release = trio.Event()

    async def append(self, bodies: Any, timeout_s: float) -> Written:
        await self.release.wait()
        self.release = trio.Event()
        return await super().append(bodies, timeout_s)


class NoLeader:
    def __init__(self) -> None:
        self.attempts = 0

    async def append(self, bodies: Any, timeout_s: float) -> Written:
        self.attempts += 1
        raise WriteFailed("no leader elected within the timeout")


async def test_a_read_waits_until_an_entry_written_after_it_is_applied() -> None:
    state = AppliedLater()
    state.apply(4, {KEY: 7695})
    writes = CommitAtOnce()
    writes.index = 5  # entry 5 (offsets: 7697) is committed in the log, not yet applied here
    coalescer = OffsetCoalescer(state, writes)  # type: ignore[arg-type]
    assert coalescer.query(*KEY) == 7695  # what the replica would have answered at once
    settled: list[bool] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(coalescer.run)

        async def read() -> None:
            settled.append(await coalescer.settle())

        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        assert writes.index == 6, "a read's round is written at once, empty as it is"
        state.apply(5, {KEY: 7697})
        await trio.testing.wait_all_tasks_blocked()
        assert settled == []
        state.apply(6, {})
        await trio.testing.wait_all_tasks_blocked()
        assert settled == [True]
        assert coalescer.query(*KEY) == 7697
        nursery.cancel_scope.cancel()


async def test_a_round_begun_before_the_read_does_not_settle_it() -> None:
    state = AppliedLater()
    writes = BlockedUntilReleased()
    coalescer = OffsetCoalescer(state, writes)  # type: ignore[arg-type]
    coalescer.commit(*KEY, 9)
    settled: list[str] = []

    async def read(name: str) -> None:
        assert await coalescer.settle()
        settled.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(coalescer.run)
        nursery.start_soon(read, "first")
        await trio.testing.wait_all_tasks_blocked()  # round 1 (the commit) is being appended
        nursery.start_soon(read, "second")
        await trio.testing.wait_all_tasks_blocked()
        writes.release.set()
        await trio.testing.wait_all_tasks_blocked()
        state.apply(1, {KEY: 9})
        await trio.testing.wait_all_tasks_blocked()
        assert settled == ["first"], "round 1 began before the second read: not its round"
        writes.release.set()  # round 2, the second read's
        await trio.testing.wait_all_tasks_blocked()
        state.apply(2, {})
        await trio.testing.wait_all_tasks_blocked()
        assert settled == ["first", "second"]
        assert writes.index == 2
        nursery.cancel_scope.cancel()


async def test_without_a_leader_a_read_gives_up_and_its_round_is_retried(
    autojump_clock: trio.testing.MockClock,
) -> None:
    state = AppliedLater()
    writes = NoLeader()
    coalescer = OffsetCoalescer(state, writes)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(coalescer.run)
        started = trio.current_time()
        assert await coalescer.settle(timeout_s=2.0) is False
        assert trio.current_time() - started == 2.0
        assert writes.attempts >= 5, "the round is tried again while the read waits"
        attempts = writes.attempts
        await trio.sleep(5)
        assert writes.attempts == attempts, "no reader waits, nothing pending: no more rounds"
        nursery.cancel_scope.cancel()


# --- a commit written late must not replace a newer one (found by the 30-minute broker soak:
# a pull consumer committed through a follower while the client was cut from the leader, then
# newer offsets through the leader; the follower's older commit reached the log after them and
# the consumer, restarted, began 200 messages back)


def offsets_entry(rows: list[tuple[tuple[str, str, int], int, int]]) -> dict[str, Any]:
    return Metadata.offsets_op(rows)


def test_an_older_commit_applied_after_a_newer_one_is_skipped() -> None:
    metadata = Metadata()
    metadata.apply(offsets_entry([(KEY, 3514, 2_000)]))  # written first, received later
    metadata.apply(offsets_entry([(KEY, 3314, 1_000), (("g", "T", 1), 9, 1_000)]))
    assert metadata.offsets[KEY] == 3514
    assert metadata.offsets[("g", "T", 1)] == 9  # the other rows of the late entry apply
    metadata.apply(offsets_entry([(KEY, 100, 3_000)]))  # a newer commit, even a rewind, wins
    assert metadata.offsets[KEY] == 100


def test_offset_entries_of_older_brokers_without_times_still_set_offsets() -> None:
    metadata = Metadata()
    metadata.apply(offsets_entry([(KEY, 50, 5_000)]))
    metadata.apply({"op": "offsets", "offsets": [[*KEY, 7]]})
    assert metadata.offsets[KEY] == 7
    metadata.apply(offsets_entry([(KEY, 8, 1)]))  # the old entry left no time to compare with
    assert metadata.offsets[KEY] == 8


def test_offset_times_survive_a_checkpoint() -> None:
    metadata = Metadata()
    metadata.apply(offsets_entry([(KEY, 3514, 2_000)]))
    restored = Metadata()
    restored.restore(metadata.state())
    restored.apply(offsets_entry([(KEY, 3314, 1_000)]))
    assert restored.offsets[KEY] == 3514
    restored.apply({"op": "delete_group", "group": "g"})
    assert KEY not in restored.offsets and KEY not in restored.offset_times


async def test_a_replica_answers_the_newest_commit_it_knows_not_its_own_older_one() -> None:
    """This replica holds a commit it could not write yet (cut off); the log has since applied
    a newer one taken by another replica: a read answers the newer."""
    state = AppliedLater()
    coalescer = OffsetCoalescer(state, CommitAtOnce())  # type: ignore[arg-type]
    coalescer.commit(*KEY, 3314)
    state.metadata.apply(offsets_entry([(KEY, 3514, int(1e15))]))  # received "later"
    assert coalescer.query(*KEY) == 3514
    state.metadata.apply(offsets_entry([(KEY, 3000, 1)]))  # stale: skipped, 3514 stays
    assert coalescer.query(*KEY) == 3514


# --- an unsettled read says so (found by broker chaos seed 1616: a replica cut off from its
# group answered a restarted pull consumer an offset ~430 messages old, and nothing told the
# client to ask the group's other replicas)


class StubOffsets:
    def __init__(self, settled: bool, offset: int | None) -> None:
        self.settled, self.offset = settled, offset
        self.settles = 0

    async def settle(self) -> bool:
        self.settles += 1
        return self.settled

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        return self.offset


class StubState:
    def __init__(self, lo: int) -> None:
        self.lo = lo

    def queue_range(self, topic: str, queue_id: int) -> tuple[int, int]:
        return self.lo, self.lo + 10


async def query_answer(
    settled: bool,
    offset: int | None,
    lo: int = 0,
    *,
    at_once: bool | str = False,  # True: the field as our client sends it; a str: that value
    leader: str | None = "n1",
    offsets: StubOffsets | None = None,
) -> RemotingCommand:
    offsets = offsets or StubOffsets(settled, offset)
    node = SimpleNamespace(leader=leader)
    broker = SimpleNamespace(offsets=offsets, state=StubState(lo), node=node)
    fields = QueryConsumerOffsetRequestHeader(consumer_group="g", topic="T", queue_id=0).encode()
    if at_once:
        fields[OFFSET_UNSETTLED_AT_ONCE_FIELD] = "true" if at_once is True else str(at_once)
    request = RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET, fields)
    return await handle_query_consumer_offset(broker, request, None)  # type: ignore[arg-type]


async def test_a_settled_offset_answer_is_plain_rocketmq() -> None:
    answer = await query_answer(True, 7)
    assert answer.code == ResponseCode.SUCCESS
    assert dict(answer.ext_fields) == {"offset": "7"}


async def test_an_unsettled_offset_answer_is_marked_whatever_it_says() -> None:
    for offset, lo, code, expected in (
        (7, 0, ResponseCode.SUCCESS, "7"),  # what this replica has
        (None, 0, ResponseCode.SUCCESS, "0"),  # no commit known, the queue starts at 0
        (None, 5, ResponseCode.QUERY_NOT_FOUND, None),  # no commit known
    ):
        answer = await query_answer(False, offset, lo)
        assert answer.code == code
        assert answer.ext_fields.get("offset") == expected
        assert answer.ext_fields[OFFSET_UNSETTLED_FIELD] == "true"


async def test_asked_at_once_a_replica_without_a_leader_answers_unsettled_without_waiting() -> None:
    offsets = StubOffsets(True, 7)
    answer = await query_answer(True, 7, at_once=True, leader=None, offsets=offsets)
    assert offsets.settles == 0
    assert answer.ext_fields["offset"] == "7"
    assert answer.ext_fields[OFFSET_UNSETTLED_FIELD] == "true"


async def test_a_replica_with_a_leader_or_asked_plainly_settles_first() -> None:
    for at_once, leader in ((True, "n1"), (False, None), (False, "n1")):
        offsets = StubOffsets(True, 7)
        answer = await query_answer(True, 7, at_once=at_once, leader=leader, offsets=offsets)
        assert offsets.settles == 1
        assert dict(answer.ext_fields) == {"offset": "7"}


async def test_an_at_once_field_other_than_true_is_a_plain_read() -> None:
    for value in ("false", "TRUE", "1", " "):
        offsets = StubOffsets(True, 7)
        answer = await query_answer(True, 7, at_once=value, leader=None, offsets=offsets)
        assert offsets.settles == 1, value
        assert dict(answer.ext_fields) == {"offset": "7"}
