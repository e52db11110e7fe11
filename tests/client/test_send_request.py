"""The send request as built for the wire (client/send_request.py): every header field a broker
reads, under SEND_MESSAGE_V2's one-letter names, and the answer read back."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client import validation
from client.errors import InvalidMessage
from client.message import Message, MessageQueue
from client.send_request import (
    _plain_records,
    prepare,
    prepare_batches,
    prepare_record,
    request,
    stored_result,
)
from client.send_result import SendStatus
from client.validation import check_topic
from remoting import properties as props
from remoting.codes import FLAG_ONEWAY, RequestCode, ResponseCode
from remoting.command import RemotingCommand
from remoting.headers import SendMessageRequestHeader
from remoting.message_id import UniqIdGenerator

IDS = UniqIdGenerator(ip="10.0.0.7", pid=77, salt=5, clock_ms=lambda: 1_700_000_000_000)


def test_a_single_message_request_decodes_as_the_broker_reads_it() -> None:
    """The hand-built fields equal what the header class would decode from a Java client."""
    outgoing = prepare(Message("T", b"x" * 5000, tags="A", flag=3), IDS)
    command = request("pg", outgoing, 2)
    assert command.code == RequestCode.SEND_MESSAGE_V2 and not command.is_oneway
    header = SendMessageRequestHeader.decode(command.ext_fields, short_names=True)
    assert (header.producer_group, header.topic, header.queue_id) == ("pg", "T", 2)
    assert (header.default_topic, header.default_topic_queue_nums) == ("TBW102", 4)
    assert (header.sys_flag, header.flag, header.reconsume_times) == (1, 3, 0)
    assert header.unit_mode is False and header.batch is None
    assert header.born_timestamp > 1_600_000_000_000
    sent = props.decode((header.properties or "").encode())
    assert sent == {"TAGS": "A", "UNIQ_KEY": outgoing.uniq_key, "WAIT": "true"}
    assert outgoing.uniq_key.startswith("0A000007004D")  # ip 10.0.0.7, pid 77
    assert zlib.decompress(command.body) == b"x" * 5000


def test_a_batch_request_and_a_oneway_flag() -> None:
    (outgoing,) = prepare_batches([Message("T", b"1"), Message("T", b"2")], IDS)
    command = request("pg", outgoing, 0, oneway=True)
    assert command.code == RequestCode.SEND_BATCH_MESSAGE and command.flag & FLAG_ONEWAY
    header = SendMessageRequestHeader.decode(command.ext_fields, short_names=True)
    assert header.batch is True and header.properties is None and header.sys_flag == 0


def test_a_message_keeps_the_uniq_key_it_carries() -> None:
    """To resend after an unknown outcome under the same id."""
    outgoing = prepare(Message("T", b"x", properties={"UNIQ_KEY": "ABC"}), IDS)
    assert outgoing.uniq_key == "ABC"


def test_the_answer_read_back() -> None:
    """SUCCESS and the not-durable codes are results; other codes are not."""
    outgoing = prepare(Message("T", b"x"), IDS)
    ask = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2)
    fields = {"msgId": "7F0000010000271100000000000003E8", "queueId": "1", "queueOffset": "42"}
    queue = MessageQueue("T", "broker-a", 1)
    result = stored_result(ask.response(ResponseCode.SUCCESS, ext_fields=fields), queue, outgoing)
    assert result is not None and result.status is SendStatus.SEND_OK
    assert (result.msg_id, result.offset_msg_id) == (outgoing.uniq_key, fields["msgId"])
    assert (result.queue, result.queue_offset) == (queue, 42)
    slow = stored_result(
        ask.response(ResponseCode.FLUSH_DISK_TIMEOUT, ext_fields=fields), queue, outgoing
    )
    assert slow is not None and slow.status is SendStatus.FLUSH_DISK_TIMEOUT
    assert stored_result(ask.response(ResponseCode.SYSTEM_BUSY, "busy"), queue, outgoing) is None


def test_a_refused_topic_is_refused_every_time_and_a_good_one_remembered() -> None:
    for _ in range(2):
        with pytest.raises(InvalidMessage, match="topic"):
            check_topic("bad topic")
        with pytest.raises(InvalidMessage, match="topic"):
            check_topic(["not", "a", "str"])  # type: ignore[arg-type]
    check_topic("GoodTopic")
    check_topic("GoodTopic")
    assert "GoodTopic" in validation._TOPICS_SEEN and "bad topic" not in validation._TOPICS_SEEN


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.binary(min_size=1, max_size=300), st.integers(-(2**31), 2**31 - 1)),
        min_size=1,
        max_size=40,
    ),
    st.sampled_from(["10.0.0.7", "fe80::1"]),
    st.integers(0, 2**16 + 5),
)
def test_plain_batches_are_packed_as_each_message_would_be(
    found: list[tuple[bytes, int]], ip: str, counter: int
) -> None:
    """A batch of messages without properties, tags or keys is made in C-level steps over
    the batch; it must give prepare_record's records, the splitter's sizes and next_id's ids
    (across a counter wrap too)."""
    messages = [Message("Topic-x", body, flag=flag) for body, flag in found]
    fast, slow = (
        UniqIdGenerator(ip=ip, pid=77, salt=5, clock_ms=lambda: 1_700_000_000_000) for _ in range(2)
    )
    fast._counter = slow._counter = counter
    records, sizes, keys = _plain_records("Topic-x", messages, fast)
    assert keys == [slow.next_id() for _ in messages]
    assert records == [prepare_record(m, k)[0] for m, k in zip(messages, keys, strict=True)]
    assert sizes == [prepare_record(m, k)[1] for m, k in zip(messages, keys, strict=True)]
    (outgoing,) = prepare_batches(messages, fast)  # and the whole batch, with the next ids
    assert outgoing.uniq_key == ",".join(slow.next_id() for _ in messages)
    assert outgoing.body == b"".join(
        prepare_record(m, k)[0] for m, k in zip(messages, outgoing.uniq_key.split(","), strict=True)
    )


def test_a_batch_with_any_property_tag_or_key_is_made_message_by_message() -> None:
    messages = [Message("T", b"1"), Message("T", b"2", tags="A"), Message("T", b"3")]
    (outgoing,) = prepare_batches(messages, IDS)
    keys = outgoing.uniq_key.split(",")
    assert outgoing.body == b"".join(
        prepare_record(m, k)[0] for m, k in zip(messages, keys, strict=True)
    )
    assert b"TAGS\x01A\x02" in outgoing.body
