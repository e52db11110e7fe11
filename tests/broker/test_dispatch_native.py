"""The C half of the dispatcher (broker/dispatch_native.c) against the Python one, which
defines what it must do: for arbitrary batches the ConsumeQueue and IndexFile files come out
as the same bytes either way, every record the C half takes reads as the Python reader reads it,
an IndexFile filled by `put_items` equals one filled by `put`, the leader's `shape` gives the
same records, offsets and placements, a send handler's `pack_batch` the same records as
its Python loop (or leaves the batch to it), and the leader's `send_ok_frames` the frames of
its Python pass."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from isal.isal_zlib import crc32

from broker import send
from broker.consume_queue import UNIT
from broker.delays import SCHEDULE_TOPIC, SOURCE
from broker.entries import encode_meta
from broker.index_file import NATIVE_ITEM, IndexFile, index_keys
from broker.metadata import Metadata, TopicConfig
from broker.native import native
from broker.state import NATIVE_SPECIAL_TOPICS, NATIVE_STOP_KEYS, BrokerState, Geometry, Placed
from broker.transactions import HALF_OFFSET, HALF_TOPIC
from dledger import limits
from dledger.log.segment import entry_position
from dledger.log.store import LogStore, StoreConfig
from dledger.raft.entries import EntryBatch, EntryKind
from dledger.raft.events import Role, RoleState
from remoting import properties as props
from remoting import stored_message
from remoting.codes import RequestCode, SerializeType
from remoting.command import RemotingCommand
from remoting.errors import MessageFormatError
from remoting.tag_hash import index_key_hash, tags_code
from tests.broker.test_state_replicated import derived_files

# not skipped without it: ./dev.sh installs a compiler and the headers, so a missing
# extension is a broken build here, not a choice
assert native is not None, (
    "broker._dispatch_native is not built: run ./dev.sh test (pip install -e .)"
)

HEADER = limits.ENTRY_HEADER_BYTES
SEGMENT_BYTES = 1 << 22
GEOMETRY = Geometry(cq_units_per_file=8, index_slots=16, index_items=12)

TOPICS = ["T", "Topic-b", "%RETRY%g", SCHEDULE_TOPIC, HALF_TOPIC]
KEY_NAMES = [props.TAGS, props.KEYS, props.UNIQ_KEY, "X", SOURCE, HALF_OFFSET]
text = st.text(alphabet="ab7 é#", max_size=6)
pairs = st.lists(st.tuples(st.sampled_from(KEY_NAMES), text), max_size=5)
STORE_TIMES = st.one_of(
    st.integers(1_700_000_000_000, 1_700_000_100_000),
    st.sampled_from([-5_000, 0, 1, (1 << 62), 1_699_000_000_000]),
)
messages = st.lists(
    st.tuples(
        st.sampled_from(TOPICS),
        st.integers(0, 3),
        pairs,
        st.sampled_from([0, 4, 8, 12]),  # transaction types, 12 a rollback
        STORE_TIMES,
        st.booleans(),  # a NOOP entry before it
    ),
    min_size=1,
    max_size=40,
)


def properties_bytes(found: list[tuple[str, str]]) -> bytes:
    """Pairs as a client may send them: duplicates and empty values included."""
    return b"".join(b"%s\x01%s\x02" % (k.encode(), v.encode()) for k, v in found)


def record(
    topic: str, queue_id: int, found: list[tuple[str, str]], sys_flag: int, ms: int
) -> bytes:
    return stored_message.pack(
        queue_id=queue_id,
        flag=0,
        queue_offset=0,
        physical_offset=0,
        sys_flag=sys_flag,
        born_timestamp_ms=1,
        born_host=("127.0.0.1", 1),
        store_timestamp_ms=ms,
        store_host=("127.0.0.1", 10911),
        reconsume_times=0,
        prepared_transaction_offset=0,
        body=b"body",
        topic=topic,
        properties_data=properties_bytes(found),
    )


def batches(specs: list[tuple], sizes: list[int], bases: list[int]) -> list[EntryBatch]:
    """The specs as entries placed as a leader places them: physical offsets by position,
    queue offsets consecutive per queue from that queue's base."""
    payloads: list[bytes] = []
    kinds: list[int] = []
    position = 0
    next_offsets: dict[tuple[str, int], int] = {}
    for topic, queue_id, found, sys_flag, ms, noop in specs:
        if noop:
            position = entry_position(position, HEADER, SEGMENT_BYTES) + HEADER
            payloads.append(b"")
            kinds.append(EntryKind.NOOP)
        body = bytearray(record(topic, queue_id, found, sys_flag, ms))
        position = entry_position(position, HEADER + len(body), SEGMENT_BYTES)
        key = (topic, queue_id)
        offset = next_offsets.get(key, bases[queue_id])
        next_offsets[key] = offset + 1
        stored_message.patch_offsets(body, 0, offset, position + HEADER)
        position += HEADER + len(body)
        payloads.append(bytes(body))
        kinds.append(EntryKind.DATA)
    result, first, at = [], 1, 0
    for size in sizes:
        if at >= len(payloads):
            break
        chunk = slice(at, at + size)
        count = len(payloads[chunk])
        result.append(EntryBatch(first, [1] * count, kinds[chunk], payloads[chunk]))
        first, at = first + count, at + count
    if at < len(payloads):
        result.append(EntryBatch(first, [1] * (len(payloads) - at), kinds[at:], payloads[at:]))
    return result


def apply_all(root: Path, entries: list[EntryBatch], *, use_native: bool) -> dict[str, bytes]:
    store = LogStore.open(root, StoreConfig(segment_bytes=SEGMENT_BYTES), group="g", self_id="n")
    state = BrokerState(root, store, GEOMETRY)
    if not use_native:
        state._native = None
    try:
        for batch in entries:
            store.append(batch)
            state.apply(batch)
        state.index.write_header()
    finally:
        state.close()
        store.close()
    return derived_files(root)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    specs=messages,
    sizes=st.lists(st.integers(1, 12), max_size=8),
    bases=st.lists(st.integers(0, 9), min_size=4, max_size=4),
)
def test_both_dispatchers_write_the_same_files(
    tmp_path_factory: pytest.TempPathFactory, specs: list[tuple], sizes: list[int], bases: list[int]
) -> None:
    entries = batches(specs, sizes, bases)
    root = tmp_path_factory.mktemp("native")
    with_c = apply_all(root / "c", entries, use_native=True)
    in_python = apply_all(root / "py", entries, use_native=False)
    assert with_c.keys() == in_python.keys()
    for name in with_c:
        assert with_c[name] == in_python[name], name


def test_a_batch_of_usual_messages_is_taken_whole_by_the_c_half(tmp_path: Path) -> None:
    specs = [
        (
            "T",
            n % 3,
            [(props.UNIQ_KEY, f"u{n}"), (props.TAGS, "a"), (props.KEYS, "k1 k2")],
            0,
            n,
            False,
        )
        for n in range(20)
    ]
    (batch,) = batches(specs, [20], [0, 0, 0, 0])
    store = LogStore.open(
        tmp_path, StoreConfig(segment_bytes=SEGMENT_BYTES), group="g", self_id="n"
    )
    try:
        store.append(batch)
        positions = store.positions(1, 20)
    finally:
        store.close()
    assert native is not None
    stop, runs, items = native.scan(
        list(batch.payloads), positions, list(batch.kinds), 0, 0, HEADER,
        NATIVE_SPECIAL_TOPICS, NATIVE_STOP_KEYS, 100,
    )  # fmt: skip
    assert stop == 20
    assert [(t, q, o, len(u) // UNIT.size) for t, q, o, u in runs] == [
        ("T", 0, 0, 7),
        ("T", 1, 0, 7),
        ("T", 2, 0, 6),
    ]
    assert len(items) // NATIVE_ITEM.size == 60  # UNIQ_KEY and two KEYS each


def python_view(body: bytes, position: int) -> tuple[bytes, list[tuple[int, int, int, int]]] | None:
    """What the Python dispatcher makes of a record: its unit and its items (as scan packs
    them), or None when it would not take it as a plain message."""
    try:
        read = stored_message.read_dispatch(body)
    except Exception:
        return None
    found = props.table(read.properties)
    tags = found.get(b"TAGS")
    unit = UNIT.pack(
        read.physical_offset, read.size, tags_code(tags.decode(errors="replace")) if tags else 0
    )
    keys, uniq = found.get(b"KEYS"), found.get(b"UNIQ_KEY")
    names = index_keys(
        read.topic,
        keys.decode(errors="replace") if keys else None,
        uniq.decode(errors="replace") if uniq else None,
    )
    if read.sys_flag & 0xC == 0xC:
        names = []
    hashes = [index_key_hash(name) for name in names]
    items = [
        (h, len(hashes) if i == 0 else 0, read.physical_offset, read.store_timestamp_ms)
        for i, h in enumerate(hashes)
    ]
    return unit, items


@settings(max_examples=300, deadline=None)
@given(
    topic=st.sampled_from(["T", "Topic-b"]),
    found=pairs,
    cuts=st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=3),
)
def test_every_record_the_c_half_takes_reads_the_same_in_python(
    topic: str, found: list[tuple[str, str]], cuts: list[tuple[int, int]]
) -> None:
    body = bytearray(record(topic, 1, found, 0, 1_700_000_000_000))
    stored_message.patch_offsets(body, 0, 5, 1000 + HEADER)
    for at, value in cuts:  # damage: any byte may change, the size and magic included
        if at < len(body):
            body[at] = value
    assert native is not None
    stop, runs, items = native.scan(
        [bytes(body)], [1000], [0], 0, 0, HEADER, NATIVE_SPECIAL_TOPICS, NATIVE_STOP_KEYS, 100
    )
    if stop == 0:
        return  # left to the Python dispatcher
    view = python_view(bytes(body), 1000)
    assert view is not None
    unit, expected = view
    ((_, _, offset, units),) = runs
    assert units == unit
    assert offset == stored_message.read_dispatch(bytes(body)).queue_offset
    assert list(NATIVE_ITEM.iter_unpack(items)) == expected


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    messages=st.lists(
        st.tuples(
            st.lists(st.integers(0, (1 << 31) - 1), min_size=1, max_size=4),
            st.integers(1, 1 << 40),
            STORE_TIMES,
        ),
        max_size=30,
    )
)
def test_put_items_fills_a_file_as_put_does(
    tmp_path_factory: pytest.TempPathFactory,
    messages: list[tuple[list[int], int, int]],
) -> None:
    root = tmp_path_factory.mktemp("index")
    one = IndexFile.create(root / "one", 7, 40)
    many = IndexFile.create(root / "many", 7, 40)
    items = b""
    for hashes, physical_offset, ms in messages:
        if one.room < len(hashes):
            break  # put_items stops there too (IndexStore rolls a new file)
        if physical_offset > one.end_phy_offset:  # as IndexStore._put: a replay is skipped
            for h in hashes:
                one.put(h, physical_offset, ms)
        for i, h in enumerate(hashes):  # put_items gets the replays too, and skips them
            items += NATIVE_ITEM.pack(h, len(hashes) if i == 0 else 0, physical_offset, ms)
    assert many.put_items(items, 0) == len(items) // NATIVE_ITEM.size
    one.write_header()
    many.write_header()
    assert (root / "one").read_bytes() == (root / "many").read_bytes()
    one.close()
    many.close()


def test_native_items_are_the_size_the_c_half_writes() -> None:
    assert native is not None
    assert native.ITEM_BYTES == NATIVE_ITEM.size == struct.calcsize("=IIqq")
    assert UNIT.size == native.UNIT_BYTES


SHAPE_PAIRS = st.lists(
    st.tuples(
        st.sampled_from([props.TAGS, props.UNIQ_KEY, "X", SOURCE, HALF_OFFSET]),
        st.sampled_from(["", "a", "7", f"{SCHEDULE_TOPIC}:0:3", "x SCHEDULE_SOURCE y"]),
    ),
    max_size=3,
)
proposals = st.lists(
    st.one_of(
        st.tuples(
            st.just("message"),
            st.sampled_from(["T", "Topic-b", "bad topic"]),
            st.integers(0, 2),
            SHAPE_PAIRS,
        ),
        st.tuples(st.just("meta"), st.just(""), st.just(0), st.just([])),
    ),
    min_size=1,
    max_size=30,
)


def leader_state(root: Path, *, use_native: bool) -> tuple[LogStore, BrokerState]:
    store = LogStore.open(root, StoreConfig(segment_bytes=SEGMENT_BYTES), group="g", self_id="n")
    state = BrokerState(root, store, GEOMETRY)
    if not use_native:
        state._native = None
    state.on_role_change(RoleState(Role.LEADER, 1, None))
    return store, state


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    specs=proposals, known=st.dictionaries(st.sampled_from(["T", "Topic-b"]), st.integers(0, 50))
)
def test_both_shapers_give_the_same_records_and_offsets(
    tmp_path_factory: pytest.TempPathFactory, specs: list[tuple], known: dict[str, int]
) -> None:
    payloads = [
        encode_meta(Metadata.topic_op(TopicConfig("T", 4, 4, 6)))
        if kind == "meta"
        else record(topic, queue_id, found, 0, 1_700_000_000_000)
        for kind, topic, queue_id, found in specs
    ]
    positions, position = [], 0
    for payload in payloads:
        position = entry_position(position, HEADER + len(payload), SEGMENT_BYTES)
        positions.append(position)
        position += HEADER + len(payload)
    root = tmp_path_factory.mktemp("shape")
    results = []
    for use_native in (True, False):
        store, state = leader_state(root / str(use_native), use_native=use_native)
        try:
            state.shape(1, [], [])  # ready: the next offsets as a leader has them
            state._next_offsets.update({(topic, 1): offset for topic, offset in known.items()})
            shaped = state.shape(1, positions, list(payloads))
            results.append(
                (
                    shaped,
                    dict(state._next_offsets),
                    list(state._last_shape),
                    [state._shaped.get(i) for i in range(1, len(payloads) + 1)],
                )
            )
        finally:
            state.close()
            store.close()
    assert results[0] == results[1]


def batch_record(flag: int, body: bytes, properties: bytes) -> bytes:
    """One message of a SEND_BATCH_MESSAGE body (MessageDecoder.encodeMessage's layout)."""
    total = 20 + len(body) + 2 + len(properties)
    return (
        struct.pack(">iiiii", total, 0, 0, flag, len(body))
        + body
        + struct.pack(">h", len(properties))
        + properties
    )


MARKED_PAIRS = st.lists(
    st.tuples(
        st.sampled_from(["UNIQ_KEY", "TAGS", "DELAY", "CLUSTER", "X"]),
        st.sampled_from(["a", "TRAN_MSG", "7"]),
    ),
    max_size=3,
)


@settings(max_examples=300, deadline=None)
@given(
    messages=st.lists(
        st.tuples(st.integers(-5, 5), st.binary(max_size=300), MARKED_PAIRS), min_size=0, max_size=6
    ),
    cuts=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=2),
    record_max=st.sampled_from([400, 4 << 20]),
    sys_flag=st.sampled_from([0, 1, 8]),
)
def test_pack_batch_packs_as_the_python_loop_or_leaves_it_to_it(
    messages: list[tuple[int, bytes, list[tuple[str, str]]]],
    cuts: list[tuple[int, int]],
    record_max: int,
    sys_flag: int,
) -> None:
    body = bytearray(b"".join(batch_record(f, b, properties_bytes(p)) for f, b, p in messages))
    for at, value in cuts:
        if at < len(body):
            body[at] = value
    packer = stored_message.Packer(
        queue_id=2,
        sys_flag=sys_flag,
        born_timestamp_ms=1_700_000_000_000,
        born_host=("127.0.0.2", 5000),
        store_timestamp_ms=1_700_000_000_123,
        store_host=("127.0.0.1", 10911),
        reconsume_times=0,
        topic="T",
    )
    template = packer.pack(0, b"", b"")
    cluster = props.encode({props.CLUSTER: "DefaultCluster"})
    assert native is not None
    got = native.pack_batch(
        bytes(body), template[:88], template[88:-2], cluster, send._SPECIAL_MARKERS,
        record_max, 32767, send.BATCH_MESSAGES_MAX, crc32,
    )  # fmt: skip
    try:
        outgoing = send.parse_batch(bytes(body))
    except send.SendRefused:
        assert got is None
        return
    expected = []
    for message in outgoing:
        if not send._plain(message.properties):
            assert got is None
            return
        try:
            packed = packer.pack(message.flag, message.body, message.properties + cluster)
        except MessageFormatError:
            assert got is None
            return
        if len(packed) > record_max:
            assert got is None
            return
        expected.append(packed)
    assert got == (expected, outgoing[0].properties)


def _answering_item(
    slot: int, index: int, records: int, halves: int, opaque: int, queue_id: int, binary: bool
) -> tuple[tuple[int, send._Prepared], int]:
    request = RemotingCommand.request(RequestCode.SEND_MESSAGE, {}).with_opaque(opaque)
    if binary:
        request = request._replace(serialization=SerializeType.ROCKETMQ)
    prepared = send._Prepared(request, b"", [], [b"r"] * records, queue_id, halves)
    return (slot, prepared), index


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2),  # records
            st.sampled_from([0, 0, 0, 1]),  # halves
            st.integers(-(2**31), 2**31 - 1),  # opaque
            st.integers(0, 2**31 - 1),  # queue id
            st.booleans(),  # a binary header
            st.integers(0, 2**63 - 1),  # physical offset
            st.integers(0, 2**63 - 1),  # queue offset
        ),
        max_size=12,
    ),
    st.sampled_from([("127.0.0.1", 10911), ("10.1.2.3", 1), ("255.255.255.255", 65535)]),
    st.integers(1, 10**12),
)
def test_send_ok_frames_writes_the_python_pass_s_frames(
    sends: list[tuple[int, int, int, int, bool, int, int]],
    store_host: tuple[str, int],
    first: int,
) -> None:
    answering, placed = [], []
    index = first
    for slot, (records, halves, opaque, queue_id, binary, physical, offset) in enumerate(sends):
        answering.append(_answering_item(slot, index, records, halves, opaque, queue_id, binary))
        for _ in range(max(records, 1)):
            placed.append(Placed(queue_id, offset, physical))
        index += max(records, 1)
    by_c: list[Any] = [None] * len(sends)
    by_python: list[Any] = [None] * len(sends)
    assert native is not None
    rest_c = native.send_ok_frames(
        answering, placed, first, send._send_ok_parts(store_host), SerializeType.JSON, by_c
    )
    rest_python = send._send_oks_python(answering, placed, first, by_python, store_host)
    assert rest_c == rest_python
    assert by_c == by_python


def test_send_ok_frames_refuses_what_it_cannot_read() -> None:
    assert native is not None
    parts = send._send_ok_parts(("127.0.0.1", 10911))
    item = _answering_item(0, 5, 1, 0, 1, 0, False)
    json = SerializeType.JSON
    with pytest.raises(IndexError):  # index 5 with placed starting at 1: outside
        native.send_ok_frames([item], [Placed(0, 0, 0)], 1, parts, json, [None])
    with pytest.raises(IndexError):  # slot 0 in an empty responses
        native.send_ok_frames([item], [Placed(0, 0, 0)], 5, parts, json, [])
    with pytest.raises(TypeError):
        native.send_ok_frames([("x", 1)], [], 1, parts, json, [None])
    with pytest.raises(ValueError):
        native.send_ok_frames([item], [Placed(0, 0, -1)], 5, parts, json, [None])
    with pytest.raises(ValueError):
        native.send_ok_frames([item], [Placed(0, 0, 0)], 5, parts[:4], json, [None])
