"""A SEND answer names where the message landed, also when the replica that took it forwarded it.

Found by the broker chaos run (pause-leader): a leader paused mid-proposal kept, per log index,
the queue offsets it had assigned to messages it proposed; a new leader put other messages at
those indexes; after the resume the old leader, now a follower, forwarded a send, the new
leader stored it at one of those indexes, and the answer carried the old guess (queue offset
567 for a message stored at 419), because the follower looked the index up before applying it.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from broker import state as state_module
from broker.context import Broker
from broker.state import Placed
from dledger.client import ClientError, RequestFailed
from dledger.wire import Status
from remoting import stored_message
from remoting.client import open_connection
from remoting.codes import ResponseCode
from remoting.headers import RAFT_FORWARDED_FIELD
from tests.broker.group import broker_group, send_request
from tests.remoting.test_stored_message import example

TOPIC = "PlacementTopic"
STALE_OFFSET = 99_999
INDEXES_PLANTED = 64  # more than the entries the two sends and any background write take


async def test_a_forwarded_send_answers_where_it_landed_not_an_old_leaders_guess(
    tmp_path: Path,
) -> None:
    async with broker_group(tmp_path) as group:
        follower = group.follower()
        async with open_connection("127.0.0.1", follower.config.listen.port) as conn:
            first = await conn.request(send_request(TOPIC, b"m0"), timeout_s=10)
            assert first.code == ResponseCode.SUCCESS, first.remark
            queue_id = int(first.ext_fields["queueId"])
            await group.wait_applied_everywhere()
            # what this replica would hold had it proposed other messages at the coming
            # indexes as leader of an earlier term (its guesses, never committed)
            nxt = follower.node.last_index + 1
            for index in range(nxt, nxt + INDEXES_PLANTED):
                follower.state.remember_shaped([(index, Placed(queue_id, STALE_OFFSET, 0))])
            second = await conn.request(send_request(TOPIC, b"m1", queue_id=queue_id), timeout_s=10)
    assert second.code == ResponseCode.SUCCESS, second.remark
    assert int(first.ext_fields["queueOffset"]) == 0
    assert int(second.ext_fields["queueOffset"]) == 1


async def test_a_forwarded_send_says_so_and_the_leaders_does_not(tmp_path: Path) -> None:
    """raftForwarded ("true") on the answer of a replica that forwarded the write to its
    leader, so a client knows its route names an old master; absent from the leader's answer
    (and from a plain RocketMQ broker's)."""
    async with broker_group(tmp_path) as group:
        answers = {}
        for role, broker in (("leader", group.leader()), ("follower", group.follower())):
            async with open_connection("127.0.0.1", broker.config.listen.port) as conn:
                answers[role] = await conn.request(send_request(TOPIC, b"m"), timeout_s=10)
    assert all(a.code == ResponseCode.SUCCESS for a in answers.values()), answers
    assert answers["follower"].ext_fields[RAFT_FORWARDED_FIELD] == "true"
    assert RAFT_FORWARDED_FIELD not in answers["leader"].ext_fields


# --- a forwarded send's place is read from this replica once it knows the entry committed
# (found by the failover benchmark: a follower forwarded a send, the leader committed it and
# died; the follower, not yet told of the commit, asked the new leader, which had not committed
# the index in its term yet and answered INDEX_OUT_OF_RANGE; the send handler failed with a
# traceback and the client got an error for a stored message)


class BehindItsLeader:
    """A follower's node and state: entry 3145 in its log, committed by the leader, not yet
    known committed here."""

    def __init__(self, record: bytes) -> None:
        self.commit_index = 3144
        self.last_index = 3145
        self.applied_index = 3144
        self._record = record
        self._applied = trio.Event()

    def entry(self, index: int) -> SimpleNamespace:
        assert index == 3145 and index <= self.commit_index, "read before it is known committed"
        return SimpleNamespace(body=self._record)

    def placed_range(self, first: int, last: int, *, shaped_here: bool) -> list[Placed | None]:
        return [None] * (last - first + 1)  # not applied: nothing remembered

    async def wait_applied(self, index: int) -> None:
        while self.applied_index < index:
            await self._applied.wait()

    def learn_commit(self) -> None:
        self.commit_index = self.applied_index = 3145
        self._applied.set()


class NewLeaderNotCommittedYet:
    def __init__(self) -> None:
        self.gets = 0

    async def get(self, index: int) -> Any:
        self.gets += 1
        raise RequestFailed(
            Status.INDEX_OUT_OF_RANGE, f"index {index} is not committed here (up to 3144)"
        )


def a_follower(record: bytes, client: Any) -> tuple[Broker, BehindItsLeader]:
    replica = BehindItsLeader(record)
    broker = Broker(
        config=None,  # type: ignore[arg-type]
        node=replica,  # type: ignore[arg-type]
        state=replica,  # type: ignore[arg-type]
        writes=None,  # type: ignore[arg-type]
        client=client,
        clients=None,  # type: ignore[arg-type]
        offsets=None,  # type: ignore[arg-type]
        disk=None,  # type: ignore[arg-type]
    )
    return broker, replica


def stored(queue_id: int, queue_offset: int, physical_offset: int) -> bytes:
    message = attrs.evolve(
        example(), queue_id=queue_id, queue_offset=queue_offset, physical_offset=physical_offset
    )
    return stored_message.encode(message)


async def test_a_forwarded_send_reads_its_place_once_this_replica_knows_it_committed() -> None:
    client = NewLeaderNotCommittedYet()
    broker, replica = a_follower(stored(2, 419, 81_920), client)
    found: list[list[Placed]] = []

    async def place() -> None:
        found.append(await broker.placements(3145, 3145, shaped_here=False))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(place)
        await trio.testing.wait_all_tasks_blocked()
        assert found == [] and client.gets == 0
        replica.learn_commit()  # the leader's next heartbeat
    assert found == [[Placed(2, 419, 81_920)]]
    assert client.gets == 0


async def test_a_place_this_replica_cannot_tell_within_the_wait_is_asked_of_the_leader(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client = NewLeaderNotCommittedYet()
    broker, _replica = a_follower(stored(2, 419, 81_920), client)
    with pytest.raises(ClientError, match="INDEX_OUT_OF_RANGE"):
        await broker.placements(3145, 3145, shaped_here=False)
    assert client.gets == 1


def test_recent_placements_keep_the_newest_and_forget_the_oldest() -> None:
    # bounded without a step per put: two generations, the older dropped whole (an OrderedDict
    # evicted one item a message; a plain dict used as a FIFO scanned its freed slots)
    table = state_module.RecentPlacements(8)
    for index in range(1, 11):
        table.update([(index, Placed(0, index, index * 100))])
        assert min(index, 4) <= len(table) <= 8
        assert table.get(index) == Placed(0, index, index * 100)  # the newest always held
    assert [table.get(k) is not None for k in range(1, 11)] == [False] * 4 + [True] * 6
    table.update([(9, Placed(1, 9, 900))])  # a re-put replaces
    assert table.get(9) == Placed(1, 9, 900)
    table.update([(k, Placed(2, k, k * 100)) for k in range(11, 17)])  # a run past half the bound
    assert all(table.get(k) == Placed(2, k, k * 100) for k in range(11, 17))
    assert len(table) <= 8 + 6
    # a range reads as get() of each index, across both generations and past what is held
    assert table.get_range(1, 18) == [table.get(k) for k in range(1, 19)]
    assert table.get_range(11, 16) == [Placed(2, k, k * 100) for k in range(11, 17)]


async def test_the_leader_reads_no_record_its_send_handlers_packed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shape takes the fields a send handler packed each record from (identical to reading
    it), and the leader's dispatcher takes what shape knew for the very records it applies:
    no record a send handler made is read back on the leader. (That is the Python
    dispatcher's way; the C half reads each record again, which costs less than keeping the
    fields: tests/broker/test_dispatch_native.py.)"""
    packed_known = 0
    proposed: list[bytes] = []
    read_again: list[bytes] = []
    async with broker_group(tmp_path) as group:
        state = group.leader().state
        shape, read = state.shape, stored_message.read_dispatch

        def spying_shape(first: int, positions: Any, payloads: list[bytes]) -> list[bytes]:
            nonlocal packed_known
            for payload in payloads:
                known = state._packed.get(id(payload))
                if known is not None:
                    assert known[0] is payload and known[1] == tuple(read(payload))
                    packed_known += 1
            shaped = shape(first, positions, payloads)
            for k, record in enumerate(shaped):
                held = state._shaped_reads.get(first + k)
                if held is not None:
                    assert held[0] is record
                    assert held[1] == tuple(read(record))
                    proposed.append(record)
            return shaped

        def spying_read(buf: Any, at: int = 0) -> stored_message.DispatchFields:
            if any(buf is p for p in proposed) or id(buf) in state._packed:
                read_again.append(buf)
            return read(buf, at)

        monkeypatch.setattr(state, "_native", None)
        monkeypatch.setattr(state, "shape", spying_shape)
        monkeypatch.setattr(stored_message, "read_dispatch", spying_read)
        async with open_connection("127.0.0.1", group.leader().config.listen.port) as conn:
            for n in range(5):
                answer = await conn.request(send_request(TOPIC, b"m%d" % n), timeout_s=10)
                assert answer.code == ResponseCode.SUCCESS, answer.remark
        await group.wait_applied_everywhere()
        assert state._shaped_reads == {} and state._packed == {}
    assert len(proposed) >= 5 and packed_known == 5 and read_again == []
