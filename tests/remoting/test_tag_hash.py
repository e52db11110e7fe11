"""Java's String.hashCode as tag hash and index key hash, against values printed by OpenJDK 17
(`"...".hashCode()` and `Math.abs(...)` in a throwaway H.java, run with `java H.java`)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remoting.tag_hash import index_key_hash, index_key_hash_utf8, java_string_hash, tags_code

JAVA = [  # (string, String.hashCode())
    ("", 0),
    ("a", 97),
    ("abc", 96354),
    ("TagA", 2598919),
    ("TagB", 2598920),
    ("hello", 99162322),
    ("Hello World", -862545276),
    ("polygenelubricants", -2147483648),  # Integer.MIN_VALUE: Math.abs keeps it negative
    ("Aa", 2112),
    ("BB", 2112),
    ("été", 227742),
    ("中文标签", 622041809),
    ("\U0001f600", 1772899),  # outside the BMP: two UTF-16 surrogates, as Java counts
    ("TopicTest#KEY-0", 173552480),
    ("PressureTest#C0A8010A00002A9F0000000000000000", -240914146),
    ("a b c", 90630118),
    ("*", 42),
    ("x" * 1000, -1715418112),
]


@pytest.mark.parametrize(("text", "java"), JAVA)
def test_java_string_hash(text: str, java: int) -> None:
    assert java_string_hash(text) == java


@pytest.mark.parametrize(("text", "java"), JAVA)
def test_tags_code_is_the_hash_widened_to_long(text: str, java: int) -> None:
    assert tags_code(text) == java  # negative stays negative: sign-extended to int64
    assert tags_code(None) == 0


@pytest.mark.parametrize(("text", "java"), JAVA)
def test_index_key_hash_is_abs(text: str, java: int) -> None:
    expected = 0 if java == -(2**31) else abs(java)  # IndexFile maps MIN_VALUE to 0
    assert index_key_hash(text) == expected
    assert 0 <= index_key_hash(text) < 2**31


def plain_hash(text: str) -> int:
    """The definition, step by step over UTF-16 code units, in int32 arithmetic."""
    data = text.encode("utf-16-le")
    h = 0
    for k in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[k : k + 2], "little")) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


@settings(max_examples=500)
@given(st.text(max_size=80) | st.text(alphabet="0123456789ABCDEF#%_-Topic", max_size=80))
def test_the_remembered_head_gives_the_plain_hash(text: str) -> None:
    # twice: the second time the head of a long text comes from the table
    assert java_string_hash(text) == plain_hash(text) == java_string_hash(text)


def test_uniq_keys_of_one_producer_share_a_head_and_hash_right() -> None:
    for counter in range(300):
        key = f"BenchTopic#7F0000010A0B18B4AAC2{counter:012X}"
        assert java_string_hash(key) == plain_hash(key)


@settings(max_examples=500)
@given(st.binary(max_size=60) | st.text(max_size=60).map(str.encode))
def test_the_hash_from_utf8_bytes_is_the_hash_of_the_decoded_key(key: bytes) -> None:
    expected = index_key_hash(key.decode(errors="replace"))
    assert index_key_hash_utf8(key) == expected == index_key_hash_utf8(key)  # head remembered


def test_the_hash_from_bytes_maps_min_value_to_zero() -> None:
    assert index_key_hash_utf8(b"polygenelubricants") == 0  # hashCode is Integer.MIN_VALUE
