"""The send handler's fast look at a message's properties (broker/send.py `_plain`): when it says
plain, the four looks it stands for (a half message, a delay or SOURCE, a commit offset to
strip, a CLUSTER the client set) would each have found nothing."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broker import delays
from broker.send import _plain
from broker.transactions import HALF_OFFSET, is_half, strip_half_offset
from remoting import properties as props

KEYS = [
    props.TRAN_MSG,
    props.CLUSTER,
    HALF_OFFSET,
    delays.SOURCE,
    "DELAY",
    "__STARTDELIVERTIME",
    "TIMER_DELAY_SEC",
    "TIMER_DELIVER_MS",
    "UNIQ_KEY",
    "KEYS",
    "TAGS",
    "WAIT",
]
TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"),
    min_size=1,
    max_size=20,
)
VALUES = st.one_of(st.sampled_from(["true", "TRUE", "false", "3", "1000"]), TEXT)


def looks_find_nothing(data: bytes) -> bool:
    return (
        not is_half(data, 0)
        and not delays.needs_look(data)
        and strip_half_offset(data) == data
        and props.find(data, b"CLUSTER") is None
    )


@given(st.dictionaries(st.one_of(st.sampled_from(KEYS), TEXT), VALUES, max_size=6))
def test_plain_properties_hold_nothing_the_four_looks_would_find(values: dict[str, str]) -> None:
    data = props.encode(values)
    if _plain(data):
        assert looks_find_nothing(data)
    else:  # it may only be cautious where one of the markers occurs
        assert any(k.encode() in data for k in KEYS[:7]) or b"TIMER_" in data


@given(st.binary(max_size=200))
def test_plain_holds_for_any_bytes(data: bytes) -> None:
    if _plain(data):
        assert looks_find_nothing(data)


def test_each_special_property_is_not_plain() -> None:
    for values in (
        {props.TRAN_MSG: "true"},
        {props.CLUSTER: "DefaultCluster"},
        {HALF_OFFSET: "12"},
        {"DELAY": "3"},
        {"__STARTDELIVERTIME": "1000"},
        {"TIMER_DELAY_SEC": "5"},
        {delays.SOURCE: "x"},
    ):
        assert not _plain(props.encode(values | {"UNIQ_KEY": "7F0000010001"})), values
    assert _plain(props.encode({"UNIQ_KEY": "7F0000010001", "WAIT": "true", "TAGS": "a"}))
