"""The stored-message record (docs/formats.md#stored-message): the example bytes of the protocol
notes, round trips, fast readers, patching, and corruption that must raise CorruptMessage."""

from __future__ import annotations

import contextlib
import socket
import struct
import zlib
from collections.abc import Callable

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remoting import limits, properties, stored_message
from remoting.errors import CorruptMessage, MessageTooLarge, PropertiesTooLong, TopicTooLong
from remoting.stored_message import MAGIC_V1, MAGIC_V2, StoredMessage

# rocketmq-remoting.md section 6: the first 112 bytes of the 203-byte "key-0" record, as seen.
EXAMPLE_HEAD = bytes.fromhex(
    """
    00 00 00 cb da a3 20 a7 06 0b b6 a6 00 00 00 00
    00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
    00 00 00 00 00 00 00 00 00 00 01 a2 04 e1 bb 2a
    7f 00 00 01 00 00 e4 c4 00 00 01 a2 04 e1 bb 2b
    7f 00 00 01 00 00 83 43 00 00 00 00 00 00 00 00
    00 00 00 00 00 00 00 06 62 6f 64 79 2d 30 0a 50
    72 6f 62 65 54 6f 70 69 63 00 60 4b 45 59 53 01
    """
)
# The notes show only "KEYS\1..." of the 96 property bytes. These are what the C++ client sends
# (keys sorted) and the CLUSTER the broker appends, with a guessed key, tag and UNIQ_KEY of the right
# lengths; only the first 5 bytes are checked against the notes.
EXAMPLE_PROPERTIES = {
    "KEYS": "key-0",
    "TAGS": "TagA",
    "UNIQ_KEY": "7F000001" + "0" * 24,
    "WAIT": "true",
    "CLUSTER": "DefaultCluster",
}


def example() -> StoredMessage:
    return StoredMessage(
        queue_id=0,
        flag=0,
        queue_offset=0,
        physical_offset=0,
        sys_flag=0,
        born_timestamp_ms=0x1A204E1BB2A,
        born_host=("127.0.0.1", 58564),
        store_timestamp_ms=0x1A204E1BB2B,
        store_host=("127.0.0.1", 33603),
        reconsume_times=0,
        prepared_transaction_offset=0,
        body=b"body-0",
        topic="ProbeTopic",
        properties=EXAMPLE_PROPERTIES,
    )


def test_example_bytes_from_the_protocol_notes() -> None:
    data = stored_message.encode(example())
    assert len(EXAMPLE_HEAD) == 112
    assert len(data) == 203 == 91 + 6 + 10 + 96
    assert data[:112] == EXAMPLE_HEAD
    assert stored_message.decode(data) == example()


def test_layout_matches_the_spec() -> None:
    """Offsets as the table draws them, read with plain struct calls."""
    m = example()
    data = stored_message.encode(m)
    assert struct.unpack_from(">iIIiiqqiq", data) == (
        203,
        MAGIC_V1,
        zlib.crc32(b"body-0") & 0x7FFFFFFF,
        0,
        0,
        0,
        0,
        0,
        m.born_timestamp_ms,
    )
    assert struct.unpack_from(">q", data, 56)[0] == m.store_timestamp_ms
    assert struct.unpack_from(">i", data, 84)[0] == 6
    assert data[94] == 10 and data[95:105] == b"ProbeTopic"
    assert struct.unpack_from(">h", data, 105)[0] == 96
    assert data[107:] == properties.encode(EXAMPLE_PROPERTIES)


hosts_v4 = st.tuples(st.ip_addresses(v=4).map(str), st.integers(0, 65535))
hosts_v6 = st.tuples(  # in inet_ntop's spelling, which decode returns
    st.ip_addresses(v=6).map(lambda ip: socket.inet_ntop(socket.AF_INET6, ip.packed)),
    st.integers(0, 65535),
)
int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
prop_text = st.text(
    st.characters(blacklist_characters="\x01\x02", codec="utf-8"), min_size=1, max_size=20
)


@st.composite
def messages(draw: st.DrawFn) -> StoredMessage:
    host_bits = draw(st.sampled_from([0, 0x10, 0x20, 0x30]))
    sys_flag = draw(int32) & ~0x30 | host_bits
    return StoredMessage(
        queue_id=draw(int32),
        flag=draw(int32),
        queue_offset=draw(int64),
        physical_offset=draw(int64),
        sys_flag=sys_flag,
        born_timestamp_ms=draw(int64),
        born_host=draw(hosts_v6 if host_bits & 0x10 else hosts_v4),
        store_timestamp_ms=draw(int64),
        store_host=draw(hosts_v6 if host_bits & 0x20 else hosts_v4),
        reconsume_times=draw(int32),
        prepared_transaction_offset=draw(int64),
        body=draw(st.binary(max_size=300)),
        topic=draw(st.text(max_size=40).filter(lambda t: len(t.encode()) <= 127)),
        properties=draw(st.dictionaries(prop_text, prop_text, max_size=6)),
    )


@given(messages(), st.sampled_from([MAGIC_V1, MAGIC_V2]), st.binary(max_size=9))
def test_round_trip(m: StoredMessage, magic: int, before: bytes) -> None:
    data = before + stored_message.encode(m, magic=magic) + b"\xff" * 3
    at = len(before)
    assert stored_message.decode(data, at) == m
    size = len(data) - at - 3
    assert stored_message.read_size(data, at) == size
    assert stored_message.read_queue_id(data, at) == m.queue_id
    assert stored_message.read_store_timestamp(data, at) == m.store_timestamp_ms
    assert stored_message.read_topic(data, at) == m.topic
    assert stored_message.read_properties(data, at) == m.properties
    assert stored_message.read_tags(data, at) == m.properties.get("TAGS")
    fields = stored_message.read_dispatch(data, at)
    assert fields == (
        size,
        m.queue_id,
        m.queue_offset,
        m.physical_offset,
        m.sys_flag,
        m.store_timestamp_ms,
        m.topic,
        properties.encode(m.properties),
    )


@given(messages(), int64, int64)
def test_patch_offsets(m: StoredMessage, queue_offset: int, physical_offset: int) -> None:
    buf = bytearray(b"xx" + stored_message.encode(m))
    stored_message.patch_offsets(buf, 2, queue_offset, physical_offset)
    expected = attrs.evolve(m, queue_offset=queue_offset, physical_offset=physical_offset)
    assert stored_message.decode(buf, 2) == expected
    assert stored_message.read_dispatch(memoryview(buf), 2)[2:4] == (queue_offset, physical_offset)


@given(
    messages(),
    st.lists(st.tuples(st.integers(-(2**31), 2**31 - 1), st.binary(max_size=64)), max_size=5),
    st.sampled_from([MAGIC_V1, MAGIC_V2]),
)
def test_one_packer_packs_a_batch_as_pack_packs_each(
    m: StoredMessage, others: list[tuple[int, bytes]], magic: int
) -> None:
    """A send request's Packer (the fields its messages share, encoded once) gives each record
    that pack gives, and a message it refuses does not spoil the next one."""
    shared = attrs.asdict(m, recurse=False)
    for field in ("flag", "body", "properties", "queue_offset", "physical_offset"):
        del shared[field]
    del shared["prepared_transaction_offset"]
    packer = stored_message.Packer(**shared, magic=magic)
    raw = properties.encode(m.properties)
    batch = [(m.flag, m.body, raw), *((flag, body, raw) for flag, body in others)]
    with pytest.raises(PropertiesTooLong):
        packer.pack(0, b"", b"x" * 32768)
    for flag, body, raw_properties in batch:
        record = packer.pack(flag, body, raw_properties)
        assert record == stored_message.pack(
            **shared,
            flag=flag,
            queue_offset=0,
            physical_offset=0,
            prepared_transaction_offset=0,
            body=body,
            properties_data=raw_properties,
            magic=magic,
        )
        decoded = stored_message.decode(record)
        assert (decoded.flag, decoded.body, decoded.topic) == (flag, body, m.topic)


def test_v2_topic_longer_than_v1_allows() -> None:
    m = attrs.evolve(example(), topic="t" * 300)
    with pytest.raises(TopicTooLong) as caught:
        stored_message.encode(m)
    assert (caught.value.size, caught.value.limit) == (300, 127)
    data = stored_message.encode(m, magic=MAGIC_V2)
    assert struct.unpack_from(">h", data, 88 + 6)[0] == 300
    assert stored_message.decode(data) == m


def test_raw_properties_are_stored_unchanged() -> None:
    """pack keeps a client's properties string byte for byte, even ones decode would drop."""
    raw = b"B\x01x\x02A\x01\x02"
    fields = attrs.asdict(example(), recurse=False)
    del fields["properties"]
    data = stored_message.pack(**fields, properties_data=raw)
    assert stored_message.read_dispatch(data).properties == raw
    assert stored_message.decode(data).properties == {"B": "x"}
    with pytest.raises(PropertiesTooLong):
        stored_message.pack(**fields, properties_data=b"x" * 32768)


def test_too_large_for_one_log_entry() -> None:
    fields = attrs.asdict(example(), recurse=False)
    del fields["properties"], fields["body"]
    fits = limits.STORED_MESSAGE_BYTES_MAX - stored_message.encoded_size(0, 10, 0)
    assert len(stored_message.pack(**fields, body=bytes(fits), properties_data=b"")) == 4 << 20
    with pytest.raises(MessageTooLarge) as caught:
        stored_message.pack(**fields, body=bytes(fits + 1), properties_data=b"")
    assert (caught.value.size, caught.value.limit) == (limits.STORED_MESSAGE_BYTES_MAX + 1, 4 << 20)


def reason_of(data: bytes | bytearray, at: int = 0) -> str:
    with pytest.raises(CorruptMessage) as caught:
        stored_message.decode(data, at)
    assert caught.value.at == at
    return caught.value.reason


def damaged(record: bytes, damage: list[tuple[int, int]]) -> bytearray:
    """`record` with each (offset, value) written, or cut at offset % length when past the end."""
    data = bytearray(record)
    for offset, value in damage:
        if not data:
            break
        if offset < len(data):
            data[offset] = value
        else:
            del data[offset % len(data) :]
    return data


class TestCorruption:
    @given(messages(), st.lists(st.tuples(st.integers(0, 10**4), st.integers(0, 255)), max_size=4))
    @settings(max_examples=200)
    def test_any_damage_is_a_named_error(
        self, m: StoredMessage, damage: list[tuple[int, int]]
    ) -> None:
        """Whatever the bytes, readers return or raise CorruptMessage: never struct.error,
        IndexError or UnicodeDecodeError."""
        data = damaged(stored_message.encode(m), damage)
        for read in (
            stored_message.decode,
            stored_message.read_dispatch,
            stored_message.read_properties,
            stored_message.read_tags,
            stored_message.read_store_timestamp,
            stored_message.read_queue_id,
        ):
            with contextlib.suppress(CorruptMessage):
                read(data, 0)

    @given(
        messages(),
        st.sampled_from([MAGIC_V1, MAGIC_V2]),
        st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=3),
    )
    @settings(max_examples=300)
    def test_the_fast_dispatch_read_answers_as_the_checked_one(
        self, m: StoredMessage, magic: int, damage: list[tuple[int, int]]
    ) -> None:
        """read_dispatch reads the usual record inline: on any bytes it returns what
        read_dispatch_checked returns, or raises the same error."""
        data = damaged(stored_message.encode(m, magic=magic), damage)

        def outcome(read: Callable[[bytearray], object]) -> object:
            try:
                return read(data)
            except CorruptMessage as err:
                return ("raised", err.at, err.reason)

        assert outcome(stored_message.read_dispatch) == outcome(
            stored_message.read_dispatch_checked
        )

    def test_flipped_body_byte(self) -> None:
        data = bytearray(stored_message.encode(example()))
        data[90] ^= 0x01
        assert reason_of(data) == "body crc mismatch"

    @given(st.integers(0, 202), st.integers(1, 255))
    def test_any_flipped_byte_is_caught_or_harmless(self, offset: int, xor: int) -> None:
        """A changed byte fails a check, or it is a field no check can guard (the body CRC
        covers only the body) and the decode differs in exactly that field."""
        data = bytearray(stored_message.encode(example()))
        data[offset] ^= xor
        try:
            decoded = stored_message.decode(data)
        except CorruptMessage:
            return
        assert decoded != example()
        assert not 84 <= offset < 94  # body length and body are always caught

    @given(st.integers(1, 202))
    def test_cut_tail(self, keep: int) -> None:
        data = stored_message.encode(example())[:keep]
        reason = reason_of(data)
        assert "past the buffer end" in reason or "less than a size" in reason

    def test_bad_magic(self) -> None:
        data = bytearray(stored_message.encode(example()))
        data[4:8] = b"\xda\xa3\x20\xa8"
        assert reason_of(data) == "bad magic 0xdaa320a8"
        assert reason_of(bytes(200)) == "bad magic 0x00000000"

    @pytest.mark.parametrize(
        ("at", "value", "fmt", "expected"),
        [
            (0, 202, ">i", "properties length 96 runs past the record"),
            (0, 50, ">i", "size 50 is below the smallest record"),
            (84, 7, ">i", "runs past the record"),
            (84, 200, ">i", "body length 200 runs past the record"),
            (84, -1, ">i", "body length -1 runs past the record"),
            (105, 95, ">h", "size 203 but the fields end at 202"),
            (105, -5, ">h", "properties length -5 runs past the record"),
        ],
    )
    def test_lying_lengths(self, at: int, value: int, fmt: str, expected: str) -> None:
        data = bytearray(stored_message.encode(example()) + bytes(10))
        struct.pack_into(fmt, data, at, value)
        assert expected in reason_of(data)
        with pytest.raises(CorruptMessage):
            stored_message.read_dispatch(data)

    def test_topic_length_past_the_record(self) -> None:
        data = bytearray(stored_message.encode(example()))
        data[94] = 120
        assert reason_of(data) == "topic length 120 runs past the record"

    def test_not_utf8(self) -> None:
        data = bytearray(stored_message.encode(example()))
        data[95] = 0xFF
        assert reason_of(data) == "topic is not UTF-8"
        data = bytearray(stored_message.encode(example()))
        data[110] = 0xFF
        assert reason_of(data) == "properties are not UTF-8"

    def test_at_names_where_the_record_starts(self) -> None:
        data = bytearray(bytes(7) + stored_message.encode(example()))
        data[-1] ^= 0x01  # still UTF-8: '\x02' -> '\x03'
        stored_message.decode(data, 7)  # properties carry no CRC; decode is lenient
        data[7 + 90] ^= 0x01
        assert reason_of(data, 7) == "body crc mismatch"
