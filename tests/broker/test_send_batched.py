"""Sends read from one connection in one go share one append (broker/send.py handle_sends), and
each still gets the answer it would have got alone: a refused one its refusal, the others
SEND_OK with queue offsets contiguous in the order they were written, a new topic created once,
and every replica holding the same records."""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from broker import handlers, send
from broker.admin import runtime_info
from broker.context import Broker
from broker.state import Placed
from broker.writes import Written
from dledger.client import ClientError
from dledger.limits import PROPOSAL_ENTRIES_MAX
from remoting.codes import RequestCode, ResponseCode, SerializeType
from remoting.command import RemotingCommand
from remoting.connection import Connection
from remoting.frame import FrameDecoder, encode
from remoting.message_id import offset_msg_ids_text
from tests.broker.group import broker_group, pull_request, send_request

TOPIC = "BatchedTopic"
NEW_TOPIC = "BatchedNewTopic"
SENDS = 6

BatchHandler = Callable[
    [Broker, list[RemotingCommand], Connection], Awaitable[list[RemotingCommand]]
]


async def read_answers(stream: trio.SocketStream, count: int) -> dict[int, RemotingCommand]:
    decoder = FrameDecoder()
    out: dict[int, RemotingCommand] = {}
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
        before = runtime_info(leader)
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
        after = runtime_info(leader)
    assert sum(sizes) == len(requests) and max(sizes) > 1, sizes  # some did share a batch
    bad = answers.pop(4)
    assert bad.code == ResponseCode.SYSTEM_ERROR and "queueId[99] is illegal" in bad.remark
    assert all(a.code == ResponseCode.SUCCESS for a in answers.values()), answers
    offsets = [int(answers[o].ext_fields["queueOffset"]) for o in sorted(answers)]
    # none skipped or repeated (their order is the next test's: a read may split them)
    assert sorted(offsets[:SENDS]) == list(range(SENDS))
    assert sorted(offsets[SENDS:]) == [0, 1]
    assert NEW_TOPIC in topics
    assert len(set(pulled.values())) == 1  # every replica holds the same records
    # GET_BROKER_RUNTIME_INFO counts it: requests, the appends they shared (one per batch, the
    # refused one's included), the raft proposals and the entries they carried
    grew = {k: int(after[k]) - int(before[k]) for k in before if k.startswith(("send", "raftPro"))}
    assert grew["sendRequests"] == len(requests)
    assert grew["sendAppends"] == len(sizes) < len(requests)
    assert 1 <= grew["raftProposals"] <= grew["sendAppends"]
    # the stored messages and both topics' creations (once per append that makes one)
    assert SENDS + 2 + 2 <= grew["raftProposedEntries"] <= SENDS + 2 + 2 * len(sizes)


def batch_body(count: int, tag: bytes) -> bytes:
    """A SEND_BATCH body of `count` tiny messages (broker/send.py parse_batch's layout)."""
    out = []
    for n in range(count):
        body = tag + b"-%d" % n
        total = 20 + len(body) + 2
        out.append(struct.pack(">iiiii", total, 0, 0, 0, len(body)) + body + struct.pack(">h", 0))
    return b"".join(out)


def batch_request(topic: str, body: bytes) -> RemotingCommand:
    request = send_request(topic, queue_id=2)
    fields = dict(request.ext_fields)
    fields["batch"] = "true"  # the C++ client's batch flag on SEND_MESSAGE
    return RemotingCommand.request(request.code, fields, body)


async def test_sends_past_one_append_s_entry_bound_go_in_several_appends_through_a_follower(
    tmp_path: Path,
) -> None:
    """Nine batches of 1,024 messages read together are more entries than one append may carry
    (a leader refuses a forwarded append past PROPOSAL_ENTRIES_MAX, 8,192): the follower that
    took them appends them in runs and every batch is stored."""
    count = send.BATCH_MESSAGES_MAX
    requests = [batch_request(TOPIC, batch_body(count, b"b%d" % k)) for k in range(9)]
    assert len(requests) * count > PROPOSAL_ENTRIES_MAX
    async with broker_group(tmp_path) as group:
        follower = group.follower()
        # handed over as a connection would after one read: how many one read brings is the
        # kernel's business
        peer = cast(Connection, SimpleNamespace(peer="127.0.0.1:40000"))
        with trio.fail_after(30):
            answers = dict(enumerate(await send.handle_sends(follower, requests, peer)))
    assert all(a.code == ResponseCode.SUCCESS for a in answers.values()), [
        a.remark for a in answers.values()
    ]
    offsets = sorted(int(a.ext_fields["queueOffset"]) for a in answers.values())
    assert offsets == [k * count for k in range(len(requests))]


async def test_one_batch_s_messages_take_queue_offsets_in_the_order_the_requests_came(
    tmp_path: Path,
) -> None:
    requests = [send_request(TOPIC, b"o%d" % n, queue_id=3) for n in range(SENDS)]
    async with broker_group(tmp_path) as group:
        peer = cast(Connection, SimpleNamespace(peer="127.0.0.1:40000"))
        with trio.fail_after(30):
            answers = await send.handle_sends(group.leader(), requests, peer)
    assert [a.code for a in answers] == [ResponseCode.SUCCESS] * SENDS
    assert [int(a.ext_fields["queueOffset"]) for a in answers] == list(range(SENDS))


@given(
    opaque=st.integers(0, 2**31 - 1),
    physical_offsets=st.lists(st.integers(0, 2**62), min_size=1, max_size=3),
    queue_id=st.integers(0, 1023),
    queue_offset=st.integers(0, 2**62),
    code=st.sampled_from([RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2]),
)
def test_a_send_ok_from_the_template_is_the_frame_the_connection_would_encode(
    opaque: int, physical_offsets: list[int], queue_id: int, queue_offset: int, code: int
) -> None:
    request = RemotingCommand.request(code, {"topic": "T"}, b"body").with_opaque(opaque)
    msg_id = offset_msg_ids_text(("10.0.0.7", 10911), physical_offsets)
    fields = send._send_ok_fields(msg_id, queue_id, queue_offset, True)
    expected = encode(request.response(ResponseCode.SUCCESS, ext_fields=fields).answering(request))
    assert send._send_ok_frame(opaque, msg_id, queue_id, queue_offset) == expected


_REQUEST_KINDS = st.sampled_from(["usual", "binary header", "batch of two", "half"])


@given(
    requests=st.lists(
        st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 1023), _REQUEST_KINDS),
        min_size=1,
        max_size=8,
    ),
    placed=st.lists(st.tuples(st.integers(0, 2**62), st.integers(0, 2**62)), min_size=16),
    host=st.sampled_from([("10.0.0.7", 10911), ("::1", 10911), ("127.0.0.1", 1)]),
    unknown=st.booleans(),
)
def test_a_run_s_send_oks_are_the_answers_each_request_gets_alone(
    requests: list[tuple[int, int, str]],
    placed: list[tuple[int, int]],
    host: tuple[str, int],
    unknown: bool,
) -> None:
    """`_send_oks` answers a committed run's usual requests in one pass: byte for byte what
    `_answer` gives each alone, and leaves it every other request (a batch, a half, a binary
    header) and all of them when the placements are not known."""
    first_index = 100
    placements = [Placed(0, q, p) for p, q in placed]

    async def lookup(first: int, last: int, *, shaped_here: bool) -> list[Placed]:
        assert shaped_here
        if unknown:
            raise ClientError("no leader")
        return placements[first - first_index : last - first_index + 1]

    broker = cast(Broker, SimpleNamespace(store_host=host, placements=lookup))
    answering: send.Answering = []
    index = first_index
    for slot, (opaque, queue_id, kind) in enumerate(requests):
        serialization = SerializeType.ROCKETMQ if kind == "binary header" else SerializeType.JSON
        request = RemotingCommand.request(
            RequestCode.SEND_MESSAGE, {"topic": "T"}, b"body", serialization=serialization
        ).with_opaque(opaque)
        records = [b"r", b"s"] if kind == "batch of two" else [b"r"]
        properties = b"UNIQ_KEY\x01AB\x02" if kind == "half" else b""
        prepared = send._Prepared(
            request, properties, [], records, queue_id, 1 if kind == "half" else 0
        )
        answering.append(((slot, prepared), index))
        index += len(records)
    responses: list[RemotingCommand | bytes | None] = [None] * len(requests)

    async def main() -> tuple[send.Answering, list[RemotingCommand | bytes]]:
        rest = await send._send_oks(broker, answering, responses)
        written = Written(index - 1, True)
        alone = []
        for (_, prepared), first in answering:
            try:
                alone.append(await send._answer(broker, prepared, written, first, True))
            except send.SendRefused as refused:  # placements unknown: refused alone too
                alone.append(prepared.request.response(refused.code, refused.remark))
        return rest, alone

    rest, alone = trio.run(main)
    usual = [kind == "usual" and not unknown for _, _, kind in requests]
    assert [item for item, u in zip(answering, usual, strict=True) if not u] == rest
    for slot, u in enumerate(usual):
        assert responses[slot] == (alone[slot] if u else None)
        if u:
            assert isinstance(alone[slot], bytes)  # what _answer writes from the template
