"""offsetMsgId and UNIQ_KEY (docs/formats.md#message-ids)."""

from __future__ import annotations

import datetime
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from remoting.errors import BadMessageId
from remoting.message_id import (
    UniqIdGenerator,
    month_start_ms,
    offset_msg_id,
    offset_msg_ids,
    offset_msg_ids_text,
    parse_offset_msg_id,
    parse_uniq_id,
    uniq_id_time_ms,
)


def test_offset_msg_id_example_from_the_protocol_notes() -> None:
    """rocketmq-remoting.md section 8: 127.0.0.1:33603, offset 0."""
    assert offset_msg_id(("127.0.0.1", 33603), 0) == "7F00000100008343" + "0" * 16
    assert parse_offset_msg_id("7F000001000083430000000000000000") == (("127.0.0.1", 33603), 0)


canonical_ips = st.ip_addresses().map(  # as inet_ntop writes it: "::ffff:0.0.0.0", not "::ffff:0:0"
    lambda ip: socket.inet_ntop(socket.AF_INET if ip.version == 4 else socket.AF_INET6, ip.packed)
)


@given(canonical_ips, st.integers(0, 65535), st.integers(0, 2**63 - 1))
def test_offset_msg_id_round_trip(ip: str, port: int, position: int) -> None:
    host = (ip, port)
    text = offset_msg_id(host, position)
    assert len(text) == (32 if ":" not in ip else 56) and text == text.upper()
    assert parse_offset_msg_id(text) == (host, position)
    assert parse_offset_msg_id(text.lower()) == (host, position)


@given(canonical_ips, st.integers(0, 65535), st.lists(st.integers(0, 2**63 - 1), max_size=8))
def test_a_batchs_ids_are_each_records_id(ip: str, port: int, positions: list[int]) -> None:
    host = (ip, port)
    assert offset_msg_ids(host, positions) == [offset_msg_id(host, p) for p in positions]
    assert offset_msg_ids_text(host, positions) == ",".join(offset_msg_ids(host, positions))
    assert [parse_offset_msg_id(t) for t in offset_msg_ids(host, positions)] == [
        (host, p) for p in positions
    ]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("7F00000100008343", "16 characters"),
        ("7F0000010000834300000000000000G0", "not hexadecimal"),
        ("7F000001000083438000000000000000", "negative physical offset"),
    ],
)
def test_bad_offset_msg_id_is_named(text: str, reason: str) -> None:
    with pytest.raises(BadMessageId) as caught:
        parse_offset_msg_id(text)
    assert reason in caught.value.reason and caught.value.text == text


def ms(*args: int) -> int:
    return int(datetime.datetime(*args, tzinfo=datetime.UTC).timestamp()) * 1000


class TestUniqId:
    def test_layout_and_fields(self) -> None:
        now = ms(2026, 11, 25, 20, 0, 0) + 123
        gen = UniqIdGenerator(ip="192.168.1.10", pid=0x12345, salt=-2, clock_ms=lambda: now)
        first, second = gen.next_id(), gen.next_id()
        since = now - ms(2026, 11, 1)
        assert first == "C0A8010A" + "2345" + "FFFFFFFE" + f"{since:08X}" + "0000"
        assert second[-4:] == "0001"
        fields = parse_uniq_id(first)
        assert (fields.ip, fields.pid, fields.salt, fields.counter) == (
            "192.168.1.10",
            0x2345,
            -2,
            0,
        )
        assert fields.since_month_start_ms == since
        assert uniq_id_time_ms(first, now_ms=now + 5000) == now

    def test_time_after_day_24_overflows_int32_and_still_parses(self) -> None:
        """Java casts the month's milliseconds to int; past ~24.8 days it is negative in the
        id, and the parser reads the 4 bytes unsigned, so the time still comes back."""
        now = ms(2026, 1, 31, 23, 59, 59)
        gen = UniqIdGenerator(ip="10.0.0.1", pid=1, salt=1, clock_ms=lambda: now)
        text = gen.next_id()
        assert uniq_id_time_ms(text, now_ms=now + 1) == now

    def test_time_from_last_month(self) -> None:
        made = ms(2026, 10, 31, 12, 0, 0)
        text = UniqIdGenerator(ip="10.0.0.1", pid=1, salt=1, clock_ms=lambda: made).next_id()
        assert uniq_id_time_ms(text, now_ms=ms(2026, 11, 2)) == made  # read next month

    def test_month_rolls_over(self) -> None:
        clock = [ms(2026, 2, 28, 23, 59, 59)]
        gen = UniqIdGenerator(ip="10.0.0.1", pid=1, salt=1, clock_ms=lambda: clock[0])
        gen.next_id()
        clock[0] = ms(2026, 3, 1, 0, 0, 1)
        assert parse_uniq_id(gen.next_id()).since_month_start_ms == 1000

    def test_counter_wraps_at_16_bits(self) -> None:
        gen = UniqIdGenerator(ip="10.0.0.1", pid=1, salt=1, clock_ms=lambda: ms(2026, 1, 1))
        gen._counter = 0xFFFF
        assert gen.next_id()[-4:] == "FFFF" and gen.next_id()[-4:] == "0000"

    def test_ipv6_and_this_process(self) -> None:
        gen = UniqIdGenerator.for_this_process("::1")
        text = gen.next_id()
        assert len(text) == 56 and parse_uniq_id(text).ip == "::1"

    def test_month_start_in_another_zone(self) -> None:
        tz = datetime.timezone(datetime.timedelta(hours=8))
        assert month_start_ms(ms(2026, 11, 30, 17, 0, 0), tz) == ms(2026, 11, 30, 16, 0, 0)
