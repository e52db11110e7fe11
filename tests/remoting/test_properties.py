"""The properties string (docs/formats.md#properties): round trips, RocketMQ's leniency on
decode, and the named errors for what encode cannot carry."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from remoting import limits, properties
from remoting.errors import BadProperty, PropertiesTooLong

text = st.text(
    st.characters(blacklist_characters="\x01\x02", codec="utf-8"), min_size=1, max_size=30
)


@given(st.dictionaries(text, text, max_size=10))
def test_round_trip(pairs: dict[str, str]) -> None:
    data = properties.encode(pairs)
    assert properties.decode(data) == pairs
    for key, value in pairs.items():
        assert properties.find(data, key.encode()) == value.encode()


def test_layout() -> None:
    data = properties.encode({properties.KEYS: "k1 k2", properties.TAGS: "TagA"})
    assert data == b"KEYS\x01k1 k2\x02TAGS\x01TagA\x02"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"", {}),
        (b"A\x01b", {"A": "b"}),  # the last pair may lack its \x02
        (b"A\x01\x02B\x01c\x02", {"B": "c"}),  # an empty value: skipped, as Java
        (b"\x01x\x02B\x01c\x02", {"B": "c"}),  # an empty key: skipped
        (b"junk\x02B\x01c\x02", {"B": "c"}),  # no \x01: skipped
        (b"A\x01v\x01w\x02", {"A": "v\x01w"}),  # the first \x01 splits
        (b"A\x011\x02A\x012\x02", {"A": "2"}),  # the last duplicate wins
    ],
)
def test_decode_is_as_lenient_as_rocketmq(raw: bytes, expected: dict[str, str]) -> None:
    assert properties.decode(raw) == expected
    for key, value in expected.items():
        assert properties.find(raw, key.encode()) == value.encode()


def test_find_matches_whole_keys_only() -> None:
    raw = b"XTAGS\x01no\x02A\x01TAGS\x01no\x02TAGS\x01yes\x02"
    assert properties.find(raw, b"TAGS") == b"yes"
    assert properties.find(raw, b"KEYS") is None
    assert properties.find(b"TAGS\x01\x02", b"TAGS") is None


@given(st.binary(max_size=40).map(lambda b: bytes(b"AB\x01\x02"[x % 4] for x in b)))
def test_table_answers_what_find_answers(raw: bytes) -> None:
    found = properties.table(raw)
    for key in (b"A", b"B", b"AB", b"BA", b"AA", b""):
        assert (found.get(key) or None) == properties.find(raw, key), key


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("", "v", "empty key"),
        ("k", "", "empty value"),
        ("k\x01", "v", "key contains a separator"),
        ("k", "v\x02w", "value contains a separator"),
        ("k", "v\ud800", "lone surrogate"),
        ("\udc00", "v", "lone surrogate"),
    ],
)
def test_bad_pairs_are_named(key: str, value: str, reason: str) -> None:
    with pytest.raises(BadProperty) as caught:
        properties.encode({key: value})
    assert caught.value.key == key
    assert all(word in caught.value.reason for word in reason.split()[-2:])


@given(st.dictionaries(st.text("ab\x01\x02", max_size=4), st.text("ab\x01\x02", max_size=4)))
def test_encode_refuses_exactly_the_pairs_check_refuses(pairs: dict[str, str]) -> None:
    # encode checks all pairs at once on its text; check, pair by pair, names the bad one
    bad = []
    for key, value in pairs.items():
        try:
            properties.check(key, value)
        except BadProperty as err:
            bad.append(err.key)
    if bad:
        with pytest.raises(BadProperty) as caught:
            properties.encode(pairs)
        assert caught.value.key == bad[0]
    else:
        assert properties.decode(properties.encode(pairs)) == pairs


def test_too_long_is_named() -> None:
    fits = {"K": "v" * (limits.PROPERTIES_BYTES_MAX - 3)}  # K \x01 ... \x02
    assert len(properties.encode(fits)) == limits.PROPERTIES_BYTES_MAX
    with pytest.raises(PropertiesTooLong) as caught:
        properties.encode({"K": "é" * (limits.PROPERTIES_BYTES_MAX // 2)})  # 2 bytes each
    assert caught.value.size == limits.PROPERTIES_BYTES_MAX // 2 * 2 + 3
    assert caught.value.limit == 32767
