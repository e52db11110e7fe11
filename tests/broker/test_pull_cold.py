"""A pull of messages that left the log's page cache (behind its cache tail) reads them in a
worker thread first, then answers them intact; a pull at the tail reads nothing in."""

from __future__ import annotations

from pathlib import Path

import trio

from broker.admin import runtime_info
from remoting import stored_message
from remoting.client import open_connection
from remoting.codes import ResponseCode
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
