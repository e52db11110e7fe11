"""Sends read from one connection in one go share one append (broker/send.py handle_sends), and
each still gets the answer it would have got alone: a refused one its refusal, the others
SEND_OK with queue offsets contiguous in the order they were written, a new topic created once,
and every replica holding the same records."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio

from broker import handlers
from broker.context import Broker
from remoting.codes import ResponseCode
from remoting.command import RemotingCommand
from remoting.connection import Connection
from remoting.frame import FrameDecoder, encode
from tests.broker.group import broker_group, pull_request, send_request

TOPIC = "BatchedTopic"
NEW_TOPIC = "BatchedNewTopic"
SENDS = 6

BatchHandler = Callable[
    [Broker, list[RemotingCommand], Connection], Awaitable[list[RemotingCommand]]
]


async def read_answers(stream: trio.SocketStream, count: int) -> dict[int, RemotingCommand]:
    decoder, out = FrameDecoder(), {}
    with trio.fail_after(10):
        while len(out) < count:
            data = await stream.receive_some()
            assert data, "the broker closed the connection"
            decoder.feed(data)
            out.update((c.opaque, c) for c in decoder.commands())
    return out


def recording(sizes: list[int], handler: BatchHandler) -> BatchHandler:
    async def handle(
        broker: Broker, requests: list[RemotingCommand], conn: Connection
    ) -> list[RemotingCommand]:
        sizes.append(len(requests))
        return await handler(broker, requests, conn)

    return handle


async def test_sends_read_together_share_an_append_and_are_answered_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes: list[int] = []
    for code, handler in list(handlers.BATCHED.items()):
        monkeypatch.setitem(handlers.BATCHED, code, recording(sizes, handler))
    async with broker_group(tmp_path) as group:
        leader = group.leader()
        requests = [send_request(TOPIC, b"m%d" % n, queue_id=1) for n in range(SENDS)]
        requests.insert(3, send_request(TOPIC, b"bad", queue_id=99))  # refused, the rest go on
        requests.append(send_request(NEW_TOPIC, b"new-a", queue_id=0))  # both create it
        requests.append(send_request(NEW_TOPIC, b"new-b", queue_id=0))
        frames = [encode(r.with_opaque(opaque)) for opaque, r in enumerate(requests, 1)]
        stream = await trio.open_tcp_stream("127.0.0.1", leader.config.listen.port)
        async with stream:
            await stream.send_all(b"".join(frames))
            answers = await read_answers(stream, len(requests))
            await group.wait_applied_everywhere()
            pulled = {}
            for name, broker in group.brokers.items():
                async with await trio.open_tcp_stream(
                    "127.0.0.1", broker.config.listen.port
                ) as replica:
                    await replica.send_all(encode(pull_request(TOPIC, 1, 0).with_opaque(1)))
                    (pull,) = (await read_answers(replica, 1)).values()
                    assert pull.code == ResponseCode.SUCCESS, (name, pull.remark)
                    assert int(pull.ext_fields["nextBeginOffset"]) == SENDS, name
                    pulled[name] = pull.body
        topics = leader.state.metadata.topics
    assert sum(sizes) == len(requests) and max(sizes) > 1, sizes  # some did share a batch
    bad = answers.pop(4)
    assert bad.code == ResponseCode.SYSTEM_ERROR and "queueId[99] is illegal" in bad.remark
    assert all(a.code == ResponseCode.SUCCESS for a in answers.values()), answers
    offsets = [int(answers[o].ext_fields["queueOffset"]) for o in sorted(answers)]
    assert offsets[:SENDS] == list(range(SENDS))  # in the order they came, none skipped
    assert offsets[SENDS:] == [0, 1]
    assert NEW_TOPIC in topics
    assert len(set(pulled.values())) == 1  # every replica holds the same records
