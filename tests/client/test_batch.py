"""Batch bodies (client/batch.py): records our broker's decoder reads back exactly, and the
splitter's cuts at 4 MiB and 1024 messages."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.send import parse_batch
from client import batch, limits
from client.errors import InvalidMessage
from client.message import Message
from client.send_request import prepare_batches
from remoting import properties as props
from remoting.message_id import UniqIdGenerator

IDS = UniqIdGenerator(ip="127.0.0.1", pid=1, salt=2, clock_ms=lambda: 1_700_000_000_000)

keys = st.text(
    st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), min_size=1
)
record = st.tuples(
    st.binary(max_size=300),
    st.integers(-(2**31), 2**31 - 1),
    st.dictionaries(keys, keys, max_size=4),
)


@given(st.lists(record, min_size=1, max_size=20))
def test_records_round_trip_through_the_brokers_decoder(
    records: list[tuple[bytes, int, dict[str, str]]],
) -> None:
    """Every body, flag and property the client encodes, the broker decodes unchanged."""
    encoded = [(body, flag, props.encode(p)) for body, flag, p in records]
    decoded = parse_batch(batch.encode(encoded))
    assert [(o.body, o.flag, props.decode(o.properties)) for o in decoded] == records


def test_a_record_has_the_documented_layout() -> None:
    """total size, magic 0, crc 0, flag, body length, body, int16 properties length, properties."""
    data = batch.encode_record(b"body", 7, b"K\x01v\x02")
    assert data == struct.pack(">iiiii", 30, 0, 0, 7, 4) + b"body" + b"\x00\x04" + b"K\x01v\x02"


def test_the_splitter_sizes_topic_body_properties_and_overhead() -> None:
    """Sized as RocketMQ's splitter: topic + body + keys and values + 20."""
    assert batch.message_size("Topic", b"x" * 10, {"KEYS": "ab", "é": "1"}) == 5 + 10 + 6 + 3 + 20


@given(keys, st.binary(max_size=50), st.dictionaries(keys, keys, max_size=6))
def test_the_size_from_encoded_properties_is_the_splitters(
    topic: str, body: bytes, properties: dict[str, str]
) -> None:
    encoded = props.encode(properties)
    assert batch.encoded_message_size(topic, body, encoded, len(properties)) == (
        batch.message_size(topic, body, properties)
    )


def test_the_splitter_cuts_before_a_batch_passes_its_byte_limit() -> None:
    """Three messages of 40 bytes in batches of at most 100 bytes: 2 + 1."""
    assert batch.split([40, 40, 40], bytes_max=100) == [range(0, 2), range(2, 3)]
    assert batch.split([50, 50, 50, 50], bytes_max=100) == [range(0, 2), range(2, 4)]


def test_the_splitter_cuts_at_the_message_count_limit() -> None:
    """No batch holds more than messages_max messages, however small they are."""
    assert batch.split([1] * 5, messages_max=2) == [range(0, 2), range(2, 4), range(4, 5)]


def test_a_message_alone_over_the_limit_is_refused() -> None:
    """A single message larger than a batch may be cannot be sent in one."""
    with pytest.raises(InvalidMessage, match="message 1 is 101 bytes"):
        batch.split([10, 101], bytes_max=100)


def test_four_mib_batches_from_a_list_of_messages() -> None:
    """Ten 1 MiB messages: batches of at most 4 MiB as sized, in order, every UNIQ_KEY once."""
    messages = [Message("Big", bytes([i]) * (1 << 20)) for i in range(10)]
    batches = prepare_batches(messages, IDS)
    assert [len(parse_batch(b.body)) for b in batches] == [3, 3, 3, 1]
    bodies = [o.body for b in batches for o in parse_batch(b.body)]
    assert bodies == [m.body for m in messages]  # never compressed in a batch
    keys = [k for b in batches for k in b.uniq_key.split(",")]
    assert len(set(keys)) == 10
    for b in batches:
        assert b.is_batch and b.sys_flag == 0
        decoded = [props.decode(o.properties)[props.UNIQ_KEY] for o in parse_batch(b.body)]
        assert ",".join(decoded) == b.uniq_key
        sizes = [
            batch.message_size("Big", o.body, props.decode(o.properties))
            for o in parse_batch(b.body)
        ]
        assert sum(sizes) <= limits.BATCH_BYTES_MAX


def test_a_batch_is_of_one_topic_without_delay() -> None:
    """Mixed topics and delay levels are refused before anything is sent."""
    with pytest.raises(InvalidMessage, match="message 1 is for 'B'"):
        prepare_batches([Message("A", b"1"), Message("B", b"2")], IDS)
    with pytest.raises(InvalidMessage, match="delay"):
        prepare_batches([Message("A", b"1", delay_level=3)], IDS)
    with pytest.raises(InvalidMessage, match="no messages"):
        prepare_batches([], IDS)
