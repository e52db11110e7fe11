"""A SEND answer names where the message landed, also when the replica that took it forwarded it.

Found by the broker chaos run (pause-leader): a leader paused mid-proposal kept, per log index,
the queue offsets it had assigned to messages it proposed; a new leader put other messages at
those indexes; after the resume the old leader, now a follower, forwarded a send, the new
leader stored it at one of those indexes, and the answer carried the old guess (queue offset
567 for a message stored at 419), because the follower looked the index up before applying it.
"""

from __future__ import annotations

from pathlib import Path

from broker.state import Placed
from remoting.client import open_connection
from remoting.codes import ResponseCode
from remoting.headers import RAFT_FORWARDED_FIELD
from tests.broker.group import broker_group, send_request

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
                follower.state.remember_shaped(index, Placed(queue_id, STALE_OFFSET, 0))
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
