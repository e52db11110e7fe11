"""IndexFile (docs/formats.md#indexfile): layout, queries by key and time across a roll-over,
deterministic names, rebuild and truncate-then-replay equal to incremental puts, retention,
and files that do not hold together."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.errors import CorruptIndexFile
from broker.index_file import IndexFile, IndexStore, file_bytes, index_keys, rebuild
from remoting import stored_message
from remoting.stored_message import StoredMessage
from remoting.tag_hash import index_key_hash

SLOTS, ITEMS = 8, 6  # 5 items per file (item 0 is never used)
T0 = 1_764_000_000_000  # a store timestamp, ms


def record(
    k: int,
    keys: str | None = None,
    uniq: str | None = None,
    ts: int | None = None,
    sys_flag: int = 0,
) -> bytes:
    """The stored message number k, at physical offset 1000 * k, stored 1 s after k - 1."""
    properties = {}
    if keys is not None:
        properties["KEYS"] = keys
    if uniq is not None:
        properties["UNIQ_KEY"] = uniq
    return stored_message.encode(
        StoredMessage(
            queue_id=0,
            flag=0,
            queue_offset=k,
            physical_offset=1000 * k,
            sys_flag=sys_flag,
            born_timestamp_ms=0,
            born_host=("10.0.0.1", 1),
            store_timestamp_ms=T0 + 1000 * k if ts is None else ts,
            store_host=("10.0.0.2", 10911),
            reconsume_times=0,
            prepared_transaction_offset=0,
            body=b"b",
            topic="T",
            properties=properties,
        )
    )


def workload() -> list[bytes]:
    """Thirty messages: a key per message, a key shared by every third, some without keys,
    some with two keys, so files roll mid-stream with messages that do not fit."""
    out = []
    for k in range(30):
        keys = f"k{k}" + (" every3" if k % 3 == 0 else "")
        out.append(record(k, keys=keys if k % 7 else None, uniq=f"U{k:04d}" if k % 2 else None))
    return out


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def index_all(store: IndexStore, records: list[bytes]) -> None:
    for data in records:
        store.index_record(data)


def test_keys_as_rocketmq_builds_them() -> None:
    assert index_keys("T", " a  b ", "U1") == ["T#U1", "T#a", "T#b"]
    assert index_keys("T", None, None) == []


def test_layout(tmp_path: Path) -> None:
    with IndexStore.open(tmp_path, SLOTS, ITEMS) as store:
        store.index_message("T", "a", None, 4096, T0)
        store.index_message("T", "a b", None, 8192, T0 + 2500)
    (name,) = (tmp_path / "index").iterdir()
    assert name.name == "00000000000000004096"
    data = name.read_bytes()
    assert len(data) == file_bytes(SLOTS, ITEMS) == 40 + 8 * 4 + 6 * 20
    assert struct.unpack_from(">qqqqii", data) == (T0, T0 + 2500, 4096, 8192, 2, 4)
    ha, hb = index_key_hash("T#a"), index_key_hash("T#b")
    assert struct.unpack_from(">i", data, 40 + 4 * (ha % SLOTS))[0] == 2  # newest item for a
    items = [struct.unpack_from(">iqii", data, 72 + 20 * n) for n in range(4)]
    assert items[0] == (0, 0, 0, 0)  # item 0 is never used
    assert items[1] == (ha, 4096, 0, 0)
    assert items[2] == (ha, 8192, 2, 1)  # 2.5 s later, in whole seconds; links to item 1
    assert items[3] == (hb, 8192, 2, 0)


def test_the_header_is_written_after_a_batch_and_when_a_file_rolls(tmp_path: Path) -> None:
    # not at every put: the dispatcher writes it once per batch of messages
    def header(name: str) -> tuple[int, ...]:
        return struct.unpack_from(">qqqqii", (tmp_path / "index" / name).read_bytes())

    with IndexStore.open(tmp_path, SLOTS, ITEMS) as store:
        store.index_message("T", "a b", None, 4096, T0)
        assert header("00000000000000004096") == (0, 0, 0, 0, 0, 1)
        assert store.query("T", "b", 10) == [4096]  # queries read the items, not the header
        store.write_header()
        assert header("00000000000000004096") == (T0, T0, 4096, 4096, 2, 3)
        store.index_message("T", "c d e f", None, 8192, T0 + 1000)  # rolls: 2 + 4 > 5 items
        assert header("00000000000000004096") == (T0, T0, 4096, 4096, 2, 3)
        assert header("00000000000000008192") == (0, 0, 0, 0, 0, 1)
        store.flush_plan()  # a flush writes the header too
        assert header("00000000000000008192")[3:] == (8192, 4, 5)


def test_query_by_key_and_time_across_a_roll_over(tmp_path: Path) -> None:
    with IndexStore.open(tmp_path, SLOTS, ITEMS) as store:
        index_all(store, workload())
        names = store.file_names
        assert len(names) > 4
        # each file is named by the physical offset of its first message
        assert all(int(n) % 1000 == 0 for n in names) and names == sorted(names)
        every3 = [1000 * k for k in range(27, -1, -3) if k % 7]  # 21 and 0 have no KEYS
        assert store.query("T", "every3", 100) == every3  # newest first, across files
        assert store.query("T", "every3", 4) == every3[:4]
        window = store.query("T", "every3", 100, begin_ms=T0 + 5000, end_ms=T0 + 21_000)
        assert window == [18_000, 15_000, 12_000, 9_000, 6_000]
        assert store.query("T", "k8", 10) == [8000]
        assert store.query("T", "U0009", 10) == [9000]
        assert store.query("T", "k7", 10) == []  # k % 7 == 0: no KEYS
        assert store.query("Other", "k8", 10) == []
        assert store.query("T", "k8", 10, begin_ms=T0 + 9000) == []


def test_same_hash_keys_both_come_back(tmp_path: Path) -> None:
    """ "Aa" and "BB" have one Java hashCode, so do T#Aa and T#BB: RocketMQ returns both, and
    the caller compares the messages' keys."""
    assert index_key_hash("T#Aa") == index_key_hash("T#BB")
    with IndexStore.open(tmp_path, SLOTS, ITEMS) as store:
        store.index_message("T", "Aa", None, 1000, T0)
        store.index_message("T", "BB", None, 2000, T0)
        store.index_message("T", "Cc", None, 3000, T0)
        assert store.query("T", "Aa", 10) == [2000, 1000]


def test_a_message_never_straddles_two_files(tmp_path: Path) -> None:
    with IndexStore.open(tmp_path, SLOTS, ITEMS) as store:
        store.index_message("T", "a b c", None, 1000, T0)  # 3 of 5 items
        store.index_message("T", "d e c", None, 2000, T0)  # does not fit: a new file
        assert store.file_names == ["00000000000000001000", "00000000000000002000"]
        assert store.query("T", "c", 10) == [2000, 1000]
        # more keys than an empty file holds: the first five
        assert store.index_message("T", "1 2 3 4 5 6 7", None, 3000, T0) == 5
        assert store.query("T", "5", 10) == [3000] and store.query("T", "6", 10) == []


def test_replay_and_rollback_are_skipped(tmp_path: Path) -> None:
    with IndexStore.open(tmp_path, SLOTS, ITEMS) as store:
        assert store.index_record(record(1, keys="a")) == 1
        assert store.index_record(record(1, keys="a")) == 0  # at or before the last indexed
        assert store.index_record(record(2, keys="a", sys_flag=0xC)) == 0  # rolled back
        assert store.index_record(record(3, keys="a", sys_flag=0x8)) == 1  # committed
        assert store.query("T", "a", 10) == [3000, 1000]


def test_rebuild_equals_incremental(tmp_path: Path) -> None:
    """One replica indexes as messages arrive, flushing and restarting now and then; another
    rebuilds from the log at the end. Same bytes, same names."""
    records = workload()
    store = IndexStore.open(tmp_path / "a", SLOTS, ITEMS)
    for k, data in enumerate(records):
        store.index_record(data)
        if k % 4 == 0:
            store.flush()
        if k % 9 == 0:
            store.close()
            store = IndexStore.open(tmp_path / "a", SLOTS, ITEMS)
    store.close()
    (tmp_path / "b" / "index").mkdir(parents=True)
    (tmp_path / "b" / "index" / "00000000000000000000").write_bytes(b"stale")  # replaced
    rebuild(tmp_path / "b", [(data, 0) for data in records], SLOTS, ITEMS).close()
    assert files(tmp_path / "a" / "index") == files(tmp_path / "b" / "index")


@pytest.mark.parametrize("cut_k", [0, 1, 5, 12, 17, 29, 40])
def test_truncate_then_replay_equals_incremental(tmp_path: Path, cut_k: int) -> None:
    """After a crash (or a cut log) the index forgets from a position; re-indexing the log
    from what truncate_from_position returns gives the uninterrupted bytes."""
    records = workload()
    with IndexStore.open(tmp_path / "a", SLOTS, ITEMS) as store:
        index_all(store, records)
    with IndexStore.open(tmp_path / "b", SLOTS, ITEMS) as store:
        index_all(store, records)
        restart = store.truncate_from_position(1000 * cut_k)
        assert restart <= 1000 * cut_k
        assert store.end_phy_offset < restart
        index_all(store, [r for k, r in enumerate(records) if 1000 * k >= restart])
    assert files(tmp_path / "a" / "index") == files(tmp_path / "b" / "index")


def test_delete_before_position(tmp_path: Path) -> None:
    with IndexStore.open(tmp_path, SLOTS, ITEMS) as store:
        index_all(store, workload())
        names = store.file_names
        assert store.delete_before_position(0) == 0
        second_start = int(names[1])
        assert store.delete_before_position(second_start) == 1
        assert store.file_names == names[1:]
        assert store.delete_before_position(10**9) == len(names) - 2  # never the last
        assert store.query("T", "every3", 100) == [27_000]


def test_default_geometry_is_sparse(tmp_path: Path) -> None:
    with IndexStore.open(tmp_path) as store:
        store.index_message("T", "a", "U", 0, T0)
    (path,) = (tmp_path / "index").iterdir()
    assert path.stat().st_size == 420_000_040
    assert path.stat().st_blocks * 512 < 1 << 20


class TestBadFiles:
    def make(self, tmp_path: Path) -> Path:
        with IndexStore.open(tmp_path, SLOTS, ITEMS) as store:
            store.index_message("T", "a b", None, 4096, T0)
        return tmp_path / "index" / "00000000000000004096"

    @pytest.mark.parametrize(
        ("at", "fmt", "value", "reason"),
        [
            (36, ">i", 0, "index count 0 outside 1..6"),
            (36, ">i", 7, "index count 7 outside 1..6"),
            (32, ">i", 3, "hash slot count 3 with 2 items"),
            (16, ">q", 4097, "begin physical offset 4097 is not the file's name"),
            (24, ">q", 10, "end physical offset 10 below the begin"),
        ],
    )
    def test_header_that_does_not_hold_together(
        self, tmp_path: Path, at: int, fmt: str, value: int, reason: str
    ) -> None:
        path = self.make(tmp_path)
        data = bytearray(path.read_bytes())
        struct.pack_into(fmt, data, at, value)
        path.write_bytes(data)
        with pytest.raises(CorruptIndexFile) as caught:
            IndexStore.open(tmp_path, SLOTS, ITEMS)
        assert caught.value.reason == reason and caught.value.path == str(path)

    def test_wrong_size(self, tmp_path: Path) -> None:
        path = self.make(tmp_path)
        with open(path, "ab") as f:
            f.write(b"\0")
        with pytest.raises(CorruptIndexFile, match="size 193, expected 192"):
            IndexStore.open(tmp_path, SLOTS, ITEMS)

    def test_a_file_never_written_is_deleted(self, tmp_path: Path) -> None:
        path = self.make(tmp_path)
        IndexFile.create(tmp_path / "index" / "00000000000000009999", SLOTS, ITEMS).close()
        with IndexStore.open(tmp_path, SLOTS, ITEMS) as store:
            assert store.file_names == [path.name]


messages = st.lists(
    st.tuples(
        st.lists(st.sampled_from(["a", "b", "c", "Aa", "BB", "long-key-x"]), max_size=4),
        st.booleans(),  # a UNIQ_KEY
        st.integers(-3000, 5000),  # store time step, ms: leaders' clocks may go back
        st.sampled_from([0, 0, 0, 0x4, 0x8, 0xC]),  # sys_flag: transaction types
    ),
    max_size=40,
)


@given(messages, st.lists(st.integers(0, 45), max_size=3), st.integers(0, 45))
@settings(max_examples=60, deadline=None)
def test_any_history_equals_a_rebuild(
    tmp_path_factory: pytest.TempPathFactory,
    spec: list[tuple[list[str], bool, int, int]],
    restarts: list[int],
    cut_k: int,
) -> None:
    """Index a random log with restarts (each truncating from a random earlier position and
    re-indexing from where it says); the files equal a rebuild, and a query by key equals a
    scan of the log, newest first."""
    root = tmp_path_factory.mktemp("index")
    records, ts = [], T0
    for k, (keys, uniq, step, sys_flag) in enumerate(spec):
        ts += step
        records.append(
            record(
                k,
                keys=" ".join(keys) or None,
                uniq=f"U{k}" if uniq else None,
                ts=ts,
                sys_flag=sys_flag,
            )
        )
    store = IndexStore.open(root / "a", SLOTS, ITEMS)
    done = 0
    for stop in [*sorted(restarts), len(records)]:
        index_all(store, records[done:stop])
        store.close()
        store = IndexStore.open(root / "a", SLOTS, ITEMS)
        restart = store.truncate_from_position(1000 * min(cut_k, stop))
        done = -(-restart // 1000)  # the first message at or after `restart`
        index_all(store, records[done:stop])
        done = max(done, stop)
    store.write_header()  # the dispatcher's, after each batch
    rebuilt = rebuild(root / "b", [(r, 0) for r in records], SLOTS, ITEMS)
    assert files(root / "a" / "index") == files(root / "b" / "index")
    same_hash = {"Aa": {"Aa", "BB"}, "BB": {"Aa", "BB"}}  # Java hashCode collides

    def indexed_under(k: int, key: str) -> bool:
        keys, uniq, _, sys_flag = spec[k]
        if sys_flag == 0xC:  # rolled back: not indexed
            return False
        return bool(same_hash.get(key, {key}) & set(keys)) or (uniq and key == f"U{k}")

    for key in ["a", "BB", "U1", "zzz"]:
        expected = [1000 * k for k in reversed(range(len(spec))) if indexed_under(k, key)]
        found = rebuilt.query("T", key, 1000)
        assert sorted(set(found), reverse=True) == expected
        assert found == sorted(found, reverse=True)  # newest first (one key may repeat)
    rebuilt.close()
    store.close()


@pytest.mark.parametrize("checkpoint_k", [3, 10, 16])
def test_torn_last_file_after_a_crash_is_rebuilt(tmp_path: Path, checkpoint_k: int) -> None:
    """A crash after the checkpoint left the last file's items written but its header as it
    was at the checkpoint (or any other mix: the file has no CRC). truncate_from_position
    drops that file whole, and re-indexing gives the bytes of an uninterrupted run."""
    records = workload()
    with IndexStore.open(tmp_path / "a", SLOTS, ITEMS) as store:
        index_all(store, records)
    with IndexStore.open(tmp_path / "b", SLOTS, ITEMS) as store:
        index_all(store, records[:checkpoint_k])
        store.flush()
        last = tmp_path / "b" / "index" / store.file_names[-1]
        header_at_checkpoint = last.read_bytes()[:40]
        index_all(store, records[checkpoint_k : checkpoint_k + 2])
    data = bytearray(last.read_bytes())
    data[:40] = header_at_checkpoint  # the header page never reached the disk
    last.write_bytes(data)
    with IndexStore.open(tmp_path / "b", SLOTS, ITEMS) as store:
        restart = store.truncate_from_position(1000 * checkpoint_k)
        index_all(store, [r for k, r in enumerate(records) if 1000 * k >= restart])
    assert files(tmp_path / "a" / "index") == files(tmp_path / "b" / "index")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["T", "TopicA", "話題"]),
            st.binary(min_size=1, max_size=40) | st.text(min_size=1, max_size=40).map(str.encode),
        ),
        min_size=1,
        max_size=14,
    )
)
def test_a_uniq_key_only_message_indexes_as_the_general_path(
    tmp_path_factory: pytest.TempPathFactory, messages: list[tuple[str, bytes]]
) -> None:
    """index_fields hashes "topic#UNIQ_KEY" from bytes for a message without KEYS; the files
    are those the general path (index_message, with the decoded key) writes."""
    root = tmp_path_factory.mktemp("fast")
    with (
        IndexStore.open(root / "a", SLOTS, ITEMS) as fast,
        IndexStore.open(root / "b", SLOTS, ITEMS) as general,
    ):
        for k, (topic, uniq) in enumerate(messages, start=1):
            at, ts = 1000 * k, T0 + 1000 * k
            assert fast.index_fields(topic, at, ts, 0, {b"UNIQ_KEY": uniq}) == 1
            general.index_message(topic, None, uniq.decode(errors="replace"), at, ts)
            assert fast.index_fields(topic, at, ts, 0, {b"UNIQ_KEY": uniq}) == 0  # a replay
        fast.write_header()
        general.write_header()
        for topic, uniq in messages:
            key = uniq.decode(errors="replace")
            assert fast.query(topic, key, 100) == general.query(topic, key, 100)
    assert files(root / "a" / "index") == files(root / "b" / "index")


def test_a_flush_syncs_the_file_by_a_descriptor_of_its_own(
    tmp_path: Path, synced_inodes: list[int]
) -> None:
    """Not mmap.flush, which holds the GIL through msync (broker/mapped_file.py: sync)."""
    with IndexStore.open(tmp_path, SLOTS, ITEMS) as store:
        store.index_record(record(1, keys="a"))
        store.flush()
        (path,) = (tmp_path / "index").iterdir()
        assert synced_inodes == [path.stat().st_ino]
