"""A pull of messages that left the log's page cache (behind its cache tail) reads them in a
worker thread first, then answers them intact; a pull at the tail reads nothing in."""

from __future__ import annotations

from pathlib import Path

import trio

from broker.admin import runtime_info
from remoting import stored_message
from remoting.client import open_connection
from remoting.codes import RequestCode, ResponseCode
from remoting.command import RemotingCommand
from remoting.message_id import parse_offset_msg_id
from tests.broker.group import broker_group, pull_request, send_request
from tests.broker.test_limits import create_topic

TOPIC = "ColdPulls"
BODY_BYTES = 4000
MESSAGES = 600  # ~2.5 MiB of log over 1 MiB segments, far more than the tail
TAIL_BYTES = 64 * 1024
RELEASE_DEADLINE_S = 10.0  # ASYNC_FLUSH flushes at least every 500 ms
POLL_S = 0.01


def body(k: int) -> bytes:
    return (b"%06d-" % k) * (BODY_BYTES // 7)


def records(buf: bytes) -> list[stored_message.StoredMessage]:
    found, at = [], 0
    while at < len(buf):
        found.append(stored_message.decode(buf, at))
        at += stored_message.read_size(buf, at)
    return found


async def test_a_pull_behind_the_tail_is_read_in_off_the_loop(tmp_path: Path) -> None:
    async with broker_group(tmp_path, cache_tail_bytes=TAIL_BYTES) as group:
        leader = group.leader()
        async with open_connection("127.0.0.1", leader.config.listen.port) as conn:
            await create_topic(conn, TOPIC, 1)
            for k in range(MESSAGES):
                sent = await conn.request(send_request(TOPIC, body(k)), timeout_s=10)
                assert sent.code == ResponseCode.SUCCESS, sent.remark
            store = leader.state.store
            first = leader.state.units(TOPIC, 0, 0, 1)[0].physical_offset
            with trio.fail_after(RELEASE_DEADLINE_S):  # the next background flush lets go
                while not store.left_cache(first):
                    await trio.sleep(POLL_S)
            assert leader.cold_read_bytes == 0

            pulled = await conn.request(pull_request(TOPIC, 0, 0))
            assert pulled.code == ResponseCode.SUCCESS, pulled.remark
            got = records(pulled.body)
            assert [m.body for m in got] == [body(k) for k in range(32)]
            assert [m.queue_offset for m in got] == list(range(32))
            cold = leader.cold_read_bytes
            assert cold >= 32 * BODY_BYTES
            assert runtime_info(leader)["pullColdReadBytes"] == str(cold)

            # the newest messages are in the tail: nothing to read in
            pulled = await conn.request(pull_request(TOPIC, 0, MESSAGES - 5))
            assert [m.body for m in records(pulled.body)] == [
                body(k) for k in range(MESSAGES - 5, MESSAGES)
            ]
            assert leader.cold_read_bytes == cold


async def test_pulls_at_the_end_and_out_of_range_answer_as_before(tmp_path: Path) -> None:
    """The cold check must not read units the queue does not hold (it once raised
    QueueOffsetOutOfRange out of every pull at the queue's end)."""
    async with broker_group(tmp_path, cache_tail_bytes=TAIL_BYTES) as group:
        leader = group.leader()
        async with open_connection("127.0.0.1", leader.config.listen.port) as conn:
            await create_topic(conn, TOPIC, 1)
            for k in range(3):
                sent = await conn.request(send_request(TOPIC, body(k)), timeout_s=10)
                assert sent.code == ResponseCode.SUCCESS, sent.remark
            answers = {
                offset: (await conn.request(pull_request(TOPIC, 0, offset))).code
                for offset in (0, 2, 3, 7)
            }
            assert answers == {
                0: ResponseCode.SUCCESS,
                2: ResponseCode.SUCCESS,
                3: ResponseCode.PULL_NOT_FOUND,
                7: ResponseCode.PULL_OFFSET_MOVED,
            }


async def test_messages_looked_up_behind_the_tail_are_read_in_off_the_loop(
    tmp_path: Path,
) -> None:
    """VIEW_MESSAGE_BY_ID and QUERY_MESSAGE of messages that left the page cache read them in
    first (BrokerState.read_in_records), then answer them intact."""
    async with broker_group(tmp_path, cache_tail_bytes=TAIL_BYTES) as group:
        leader = group.leader()
        async with open_connection("127.0.0.1", leader.config.listen.port) as conn:
            await create_topic(conn, TOPIC, 1)
            offsets = []
            for k in range(MESSAGES):
                properties = {"KEYS": f"key-{k % 300}", "TAGS": "TagA"}
                request = send_request(TOPIC, body(k), properties=properties)
                sent = await conn.request(request, timeout_s=10)
                assert sent.code == ResponseCode.SUCCESS, sent.remark
                offsets.append(parse_offset_msg_id(sent.ext_fields["msgId"])[1])
            store = leader.state.store
            with trio.fail_after(RELEASE_DEADLINE_S):
                while not store.left_cache(offsets[300]):
                    await trio.sleep(POLL_S)
            assert leader.state.lookup_cold_read_bytes == 0

            view = await conn.request(
                RemotingCommand.request(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(offsets[7])})
            )
            assert view.code == ResponseCode.SUCCESS, view.remark
            assert stored_message.decode(view.body).body == body(7)
            viewed = leader.state.lookup_cold_read_bytes
            assert viewed >= BODY_BYTES

            fields = {"topic": TOPIC, "key": "key-5", "maxNum": "32", "beginTimestamp": "0"}
            query = await conn.request(
                RemotingCommand.request(
                    RequestCode.QUERY_MESSAGE, {**fields, "endTimestamp": str(2**62)}
                )
            )
            assert query.code == ResponseCode.SUCCESS, query.remark
            assert sorted(m.body for m in records(query.body)) == [body(5), body(305)]
            assert leader.state.lookup_cold_read_bytes > viewed  # message 5 was cold
            assert runtime_info(leader)["lookupColdReadBytes"] == str(
                leader.state.lookup_cold_read_bytes
            )

            # a message in the tail reads nothing in
            before = leader.state.lookup_cold_read_bytes
            view = await conn.request(
                RemotingCommand.request(
                    RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(offsets[-1])}
                )
            )
            assert stored_message.decode(view.body).body == body(MESSAGES - 1)
            assert leader.state.lookup_cold_read_bytes == before
