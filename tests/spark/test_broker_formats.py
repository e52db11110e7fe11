"""spark/broker_formats.py re-states the broker's byte layouts; these tests hold it against the
writers (remoting/, broker/), which the tests may import and the audit may not. No Spark."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.entries import encode_meta, void_entry
from remoting import message_id, properties, stored_message, tag_hash
from spark import broker_formats as bf

HOSTS = st.sampled_from([("127.0.0.1", 10911), ("::1", 40000), ("10.1.2.3", 1)])
# text a client can send: UTF-8 encodable (no lone surrogates), without the separators
TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\x00\x01\x02"), max_size=12
)


def record(
    *,
    body: bytes = b"hello",
    topic: str = "T",
    props: bytes = b"",
    sys_flag: int = 0,
    born: tuple[str, int] = ("127.0.0.1", 1),
    store: tuple[str, int] = ("127.0.0.1", 10911),
    magic: int = stored_message.MAGIC_V1,
) -> bytes:
    v6 = (0x10 if ":" in born[0] else 0) | (0x20 if ":" in store[0] else 0)
    return stored_message.pack(
        queue_id=3, flag=0, queue_offset=17, physical_offset=4096 + 44, sys_flag=sys_flag | v6,
        born_timestamp_ms=1, born_host=born, store_timestamp_ms=1_700_000_000_123,
        store_host=store, reconsume_times=0, prepared_transaction_offset=0, body=body,
        topic=topic, properties_data=props, magic=magic,
    )  # fmt: skip


@given(
    body=st.binary(max_size=64),
    topic=st.text(alphabet="abcXYZ_%0", min_size=1, max_size=20),
    born=HOSTS,
    store=HOSTS,
    v2=st.booleans(),
)
def test_a_stored_message_reads_as_the_broker_wrote_it(
    body: bytes, topic: str, born: tuple[str, int], store: tuple[str, int], v2: bool
) -> None:
    magic = stored_message.MAGIC_V2 if v2 else stored_message.MAGIC_V1
    data = record(body=body, topic=topic, born=born, store=store, magic=magic,
                  props=properties.encode({"TAGS": "t", "UNIQ_KEY": "U1"}))  # fmt: skip
    m = bf.read_message(data)
    assert (m.queue_id, m.queue_offset, m.physical_offset) == (3, 17, 4140)
    assert (m.topic, m.body, m.store_timestamp_ms) == (topic, body, 1_700_000_000_123)
    assert m.offset_msg_id == message_id.offset_msg_id(store, 4140)
    assert bf.body_kind(data) == bf.BODY_KIND_MESSAGE


@pytest.mark.parametrize("cut", [1, 5, 40])
def test_a_cut_message_is_a_bad_record(cut: int) -> None:
    data = record()
    with pytest.raises(bf.BadRecord):
        bf.read_message(data[:-cut])


def test_a_size_field_that_disagrees_is_a_bad_record() -> None:
    data = bytearray(record())
    data[0:4] = (len(data) + 1).to_bytes(4, "big")
    with pytest.raises(bf.BadRecord, match="store_size"):
        bf.read_message(bytes(data))


def test_metadata_and_other_bodies_are_told_apart() -> None:
    assert bf.body_kind(encode_meta({"op": "offsets", "offsets": []})) == bf.BODY_KIND_META
    assert bf.body_kind(void_entry(64)) == bf.BODY_KIND_META
    assert bf.body_kind(b"plain log value") == bf.BODY_KIND_OTHER
    assert bf.body_kind(b"") == bf.BODY_KIND_OTHER


@given(st.text(max_size=30))
def test_java_hash_is_the_broker_s(text: str) -> None:
    assert bf.java_hash(text) == tag_hash.java_string_hash(text)
    assert bf.index_key_hash(text) == tag_hash.index_key_hash(text)


def test_java_hash_known_values() -> None:
    assert bf.java_hash("") == 0
    assert bf.java_hash("hello") == 99162322  # "hello".hashCode() in Java
    assert bf.java_hash("\U0001f600") == tag_hash.java_string_hash("\U0001f600")  # surrogates


@given(st.lists(st.tuples(TEXT, TEXT), max_size=5), st.sampled_from([b"TAGS", b"KEYS", b""]))
def test_a_property_is_found_as_the_broker_finds_it(
    pairs: list[tuple[str, str]], key: bytes
) -> None:
    raw = "".join(f"{k}\x01{v}\x02" for k, v in pairs).encode()
    for data in (raw, raw[:-1]):  # the last \x02 may be missing
        assert bf.find_property(data, key) == properties.find(data, key)


def test_tag_hash_and_index_keys() -> None:
    props = properties.encode({"TAGS": "tagA", "KEYS": "k1  k2", "UNIQ_KEY": "ID"})
    m = bf.read_message(record(props=props, topic="Orders"))
    assert m.tag_hash() == tag_hash.tags_code("tagA")
    assert m.index_keys() == ["Orders#ID", "Orders#k1", "Orders#k2"]
    rolled_back = bf.read_message(record(props=props, sys_flag=0xC))
    assert rolled_back.index_keys() == []
    plain = bf.read_message(record())
    assert plain.tag_hash() == 0 and plain.index_keys() == []


def test_a_schedule_record_s_tag_hash_is_its_due_time() -> None:
    due = properties.encode({"TIMER_OUT_MS": "1700000001000", "TAGS": "x"})
    m = bf.read_message(record(topic="SCHEDULE_TOPIC_XXXX", props=due))
    assert m.tag_hash() == 1_700_000_001_000
    assert bf.read_message(record(topic="SCHEDULE_TOPIC_XXXX")).tag_hash() == 0


def test_the_body_digest_is_of_the_sent_body() -> None:
    compressed = bf.read_message(record(body=zlib.compress(b"value"), sys_flag=0x1))
    plain = bf.read_message(record(body=b"value"))
    assert compressed.body_digest() == plain.body_digest()
