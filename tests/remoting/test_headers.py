"""Header field classes: wire names, numbers or text in, text out, errors naming the field."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from remoting import headers as headers_module
from remoting.errors import HeaderFieldError
from remoting.headers import (
    Header,
    PullMessageRequestHeader,
    RegisterBrokerRequestHeader,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    _parse,
)

CPP_SEND = {
    "producerGroup": "pg",
    "topic": "T",
    "defaultTopic": "TBW102",
    "defaultTopicQueueNums": 4,
    "queueId": 3,
    "sysFlag": 0,
    "bornTimestamp": "1795378235379",
    "flag": 0,
    "properties": "TAGS\x01a\x02",
    "reconsumeTimes": "0",
    "unitMode": "0",
    "batch": "1",
}


class TestSendMessageHeader:
    def test_cpp_long_names_with_numbers(self) -> None:
        """SEND_MESSAGE from C++: long names, some values JSON numbers, batch as "1"."""
        h = SendMessageRequestHeader.decode(CPP_SEND)
        assert (h.topic, h.queue_id, h.default_topic_queue_nums) == ("T", 3, 4)
        assert h.born_timestamp == 1795378235379
        assert h.batch is True and h.unit_mode is False
        assert h.max_reconsume_times is None

    def test_v2_short_names(self) -> None:
        """SEND_MESSAGE_V2's a..m are the same fields."""
        v1 = SendMessageRequestHeader.decode(CPP_SEND)
        v2_ext = v1.encode(short_names=True)
        assert set(v2_ext) == set("abcdefghijkm")
        assert v2_ext["b"] == "T" and v2_ext["m"] == "true"
        assert SendMessageRequestHeader.decode(v2_ext, short_names=True) == v1

    def test_missing_field_named(self) -> None:
        ext = dict(CPP_SEND)
        del ext["queueId"]
        with pytest.raises(HeaderFieldError) as err:
            SendMessageRequestHeader.decode(ext)
        assert (err.value.header, err.value.field, err.value.reason) == (
            "SendMessageRequestHeader",
            "queueId",
            "missing",
        )
        assert "queueId" in str(err.value)

    def test_missing_v2_field_named_by_its_wire_name(self) -> None:
        with pytest.raises(HeaderFieldError, match="field 'e' missing"):
            SendMessageRequestHeader.decode(
                {"a": "g", "b": "t", "c": "d", "d": "4"}, short_names=True
            )

    @pytest.mark.parametrize("value", ["x", "1.5", "", " 3", "0x10", 1.5, [1]])
    def test_invalid_integer_named(self, value: object) -> None:
        with pytest.raises(HeaderFieldError, match="'queueId' not an integer"):
            SendMessageRequestHeader.decode({**CPP_SEND, "queueId": value})

    def test_invalid_boolean_named(self) -> None:
        with pytest.raises(HeaderFieldError, match="'batch' not a boolean"):
            SendMessageRequestHeader.decode({**CPP_SEND, "batch": "yes"})

    def test_out_of_range(self) -> None:
        with pytest.raises(HeaderFieldError, match="64-bit"):
            SendMessageRequestHeader.decode({**CPP_SEND, "bornTimestamp": str(1 << 63)})


class TestEncode:
    def test_values_are_text(self) -> None:
        """Answers carry text only: the C++ client ignores numbers in extFields."""
        ext = SendMessageResponseHeader(msg_id="7F", queue_id=1, queue_offset=42).encode()
        assert ext == {"msgId": "7F", "queueId": "1", "queueOffset": "42"}
        assert all(isinstance(v, str) for v in ext.values())

    @given(
        st.integers(-(1 << 63), (1 << 63) - 1),
        st.integers(0, 1 << 31),
        st.text(max_size=20),
        st.one_of(st.none(), st.integers(0, 1 << 40)),
    )
    def test_round_trip(self, offset: int, queue: int, group: str, term: int | None) -> None:
        pull = PullMessageRequestHeader(
            consumer_group=group,
            topic="T",
            queue_id=queue,
            queue_offset=offset,
            max_msg_nums=32,
            sys_flag=6,
            commit_offset=-1,
            suspend_timeout_millis=15000,
            subscription=None,
            sub_version=0,
        )
        assert PullMessageRequestHeader.decode(pull.encode()) == pull
        reg = RegisterBrokerRequestHeader(
            broker_name="b",
            broker_addr="127.0.0.1:1",
            cluster_name="c",
            ha_server_addr="",
            broker_id=0,
            raft_term=term,
        )
        assert RegisterBrokerRequestHeader.decode(reg.encode()) == reg


def _reference_decode(cls: type[Header], ext: dict[str, object], short_names: bool) -> Header:
    """The plain loop the generated decoders replaced (remoting/headers.py `_compile_decoder`):
    every field in declaration order, text through unchanged, the rest through `_parse`."""
    values: dict[str, object] = {}
    for f in attrs.fields(cls):
        wire = f.metadata["v2"] if short_names and f.metadata["v2"] else f.metadata["wire"]
        raw = ext.get(wire)
        if raw is None:
            if f.default is attrs.NOTHING:
                raise HeaderFieldError(cls.__name__, wire, "missing")
            continue
        values[f.name] = _parse(cls.__name__, wire, f.metadata["kind"], raw)
    return cls(**values)


HEADER_CLASSES = sorted(
    (
        c
        for c in vars(headers_module).values()
        if isinstance(c, type) and issubclass(c, Header) and attrs.has(c)
    ),
    key=lambda c: c.__name__,
)
WIRE_VALUES = st.one_of(
    st.none(),
    st.text(max_size=6),
    st.sampled_from(["0", "7", "-3", "+4", "007", "true", "false", "TRUE", "1", "x", "", "1e3"]),
    st.integers(min_value=-(1 << 70), max_value=1 << 70).map(str),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.booleans(),
    st.floats(allow_nan=True),
    st.lists(st.integers(), max_size=2),
)


@given(data=st.data())
def test_a_generated_decoder_reads_what_the_plain_loop_reads(data: st.DataObject) -> None:
    """For every header class and both name sets: the same header, or the same field named
    with the same reason, whatever mix of text, numbers and junk the extFields hold."""
    cls = data.draw(st.sampled_from(HEADER_CLASSES))
    short_names = data.draw(st.booleans())
    wires = [
        f.metadata["v2"] if short_names and f.metadata["v2"] else f.metadata["wire"]
        for f in attrs.fields(cls)
    ]
    ext = {wire: data.draw(WIRE_VALUES) for wire in wires if data.draw(st.integers(0, 9))}
    ext = {k: v for k, v in ext.items() if v is not None or data.draw(st.booleans())}
    try:
        expected: Header | HeaderFieldError = _reference_decode(cls, ext, short_names)
    except HeaderFieldError as err:
        expected = err
    try:
        got: Header | HeaderFieldError = cls.decode(ext, short_names=short_names)
    except HeaderFieldError as err:
        got = err
    if isinstance(expected, HeaderFieldError):
        assert isinstance(got, HeaderFieldError), (ext, got)
        assert (got.header, got.field, got.reason) == (
            expected.header,
            expected.field,
            expected.reason,
        )
    else:
        assert got == expected, ext
