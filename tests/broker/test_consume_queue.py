"""ConsumeQueue (docs/formats.md#consumequeue): layout, contiguity, recovery of a torn or zeroed
tail, truncation, retention, byte-identical files from two writers, and a list model."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from broker.consume_queue import ConsumeQueue, ConsumeQueueSet, Unit
from broker.errors import BadQueueName, CorruptConsumeQueue, QueueOffsetOutOfRange

UPF = 4  # units per file: a roll every 4 appends


def unit(k: int) -> Unit:
    return Unit(physical_offset=1000 * k, size=100 + k, tag_hash=-k)


def fill(queue: ConsumeQueue, first: int, count: int) -> None:
    for k in range(first, first + count):
        queue.append(k, *unit(k))


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_layout_and_names(tmp_path: Path) -> None:
    q = ConsumeQueue.open(tmp_path, UPF)
    fill(q, 0, 6)
    q.flush()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["00000000000000000000", "00000000000000000080"]  # 4 units * 20 bytes
    first = (tmp_path / names[0]).read_bytes()
    assert len(first) == UPF * 20
    assert struct.unpack_from(">qiq", first, 20) == (1000, 101, -1)
    assert (tmp_path / names[1]).read_bytes()[40:] == bytes(40)
    assert (q.min_queue_offset, q.max_queue_offset) == (0, 6)
    assert q.read(0, 100) == [unit(k) for k in range(6)]
    assert q.read(3, 2) == [unit(3), unit(4)]  # across the file boundary
    assert q.get(5) == unit(5)
    q.close()


def test_contiguity_is_asserted(tmp_path: Path) -> None:
    q = ConsumeQueue.open(tmp_path, UPF)
    fill(q, 0, 2)
    with pytest.raises(AssertionError, match="expected 2"):
        q.append(3, *unit(3))
    with pytest.raises(AssertionError, match="expected 2"):
        q.append(1, *unit(1))
    q.close()


def test_a_new_queue_may_start_mid_file(tmp_path: Path) -> None:
    """A queue rebuilt from a log whose head was deleted starts where its first message is."""
    q = ConsumeQueue.open(tmp_path, UPF)
    fill(q, 6, 3)
    assert (q.min_queue_offset, q.max_queue_offset) == (6, 9)
    q.close()
    q = ConsumeQueue.open(tmp_path, UPF)
    assert (q.min_queue_offset, q.max_queue_offset) == (6, 9)
    with pytest.raises(QueueOffsetOutOfRange) as caught:
        q.get(5)
    assert (caught.value.min_queue_offset, caught.value.max_queue_offset) == (6, 9)
    with pytest.raises(QueueOffsetOutOfRange):
        q.get(9)
    q.close()


def test_a_queue_started_mid_file_reopens_across_files(tmp_path: Path) -> None:
    q = ConsumeQueue.open(tmp_path, UPF)
    fill(q, 6, 7)  # units 6..12: files [4,8) (zeros at 4, 5), [8,12), [12,16)
    q.close()
    q = ConsumeQueue.open(tmp_path, UPF)
    assert (q.min_queue_offset, q.max_queue_offset) == (6, 13)
    assert q.read(6, 100) == [unit(k) for k in range(6, 13)]
    q.close()


@pytest.mark.parametrize("count", [1, 3, 4, 5, 8, 9])
def test_reopen_finds_the_end(tmp_path: Path, count: int) -> None:
    q = ConsumeQueue.open(tmp_path, UPF)
    fill(q, 0, count)
    q.close()
    q = ConsumeQueue.open(tmp_path, UPF)
    assert (q.min_queue_offset, q.max_queue_offset) == (0, count)
    fill(q, count, 2)
    assert q.read(0, 100) == [unit(k) for k in range(count + 2)]
    q.close()


@pytest.mark.parametrize("torn_bytes", [1, 8, 12, 19])
def test_torn_unit_is_cut(tmp_path: Path, torn_bytes: int) -> None:
    """A unit written only partly (the rest zeros) is not a unit: recovery zeroes it."""
    q = ConsumeQueue.open(tmp_path, UPF)
    fill(q, 0, 2)
    q.close()
    path = tmp_path / "00000000000000000000"
    data = bytearray(path.read_bytes())
    data[40 : 40 + torn_bytes] = struct.pack(">qiq", 2000, 102, -2)[:torn_bytes]
    data[40] |= 0x01  # non-zero even when only the first byte landed
    path.write_bytes(data)
    q = ConsumeQueue.open(tmp_path, UPF)
    # Once the size has landed the unit counts, torn tag hash and all: units carry no CRC (as
    # RocketMQ's). The dispatcher re-derives units after its last checkpoint from the log.
    assert q.max_queue_offset == (3 if torn_bytes >= 12 else 2)
    q.close()
    if torn_bytes < 12:
        assert path.read_bytes()[40:] == bytes(40)


def test_zero_tail_and_empty_trailing_files(tmp_path: Path) -> None:
    q = ConsumeQueue.open(tmp_path, UPF)
    fill(q, 0, 4)
    q.close()
    for name in ("00000000000000000080", "00000000000000000160"):  # created, never written
        (tmp_path / name).write_bytes(bytes(80))
    q = ConsumeQueue.open(tmp_path, UPF)
    assert q.max_queue_offset == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00000000000000000000"]
    fill(q, 4, 1)
    q.close()


def test_garbage_after_an_invalid_unit_is_cut(tmp_path: Path) -> None:
    """Units after the first invalid one are dropped, even if they look valid (as RocketMQ)."""
    q = ConsumeQueue.open(tmp_path, UPF)
    fill(q, 0, 8)
    q.close()
    path = tmp_path / "00000000000000000080"
    data = bytearray(path.read_bytes())
    data[20:40] = bytes(20)  # unit 5 lost, unit 6 and 7 present
    path.write_bytes(data)
    q = ConsumeQueue.open(tmp_path, UPF)
    assert q.max_queue_offset == 5
    q.close()
    assert path.read_bytes()[20:] == bytes(60)


@pytest.mark.parametrize(
    ("name", "size", "reason"),
    [
        ("00000000000000000070", 80, "not a multiple of 80"),
        ("00000000000000000080", 79, "size is not 80 bytes"),
        ("00000000000000000160", 80, "a file is missing"),
    ],
)
def test_bad_files_are_named(tmp_path: Path, name: str, size: int, reason: str) -> None:
    q = ConsumeQueue.open(tmp_path, UPF)
    fill(q, 0, 2)
    q.close()
    (tmp_path / name).write_bytes(bytes(size))
    with pytest.raises(CorruptConsumeQueue) as caught:
        ConsumeQueue.open(tmp_path, UPF)
    assert reason in caught.value.reason and caught.value.path.endswith(name)


@pytest.mark.parametrize("keep", [-1, 0, 2, 3, 4, 6, 9, 10])
def test_truncate_after(tmp_path: Path, keep: int) -> None:
    q = ConsumeQueue.open(tmp_path / "q", UPF)
    fill(q, 0, 10)
    q.truncate_after(keep)
    assert q.max_queue_offset == min(keep + 1, 10)
    fill(q, q.max_queue_offset, 3)
    q.close()
    # the files are exactly those of a queue that never held the dropped units
    other = ConsumeQueue.open(tmp_path / "other", UPF)
    fill(other, 0, min(keep + 1, 10) + 3)
    other.close()
    assert files(tmp_path / "q") == files(tmp_path / "other")


def test_truncate_from_position(tmp_path: Path) -> None:
    q = ConsumeQueue.open(tmp_path, UPF)
    fill(q, 0, 10)
    q.truncate_from_position(5500)  # units 6.. are at 6000 and later
    assert q.max_queue_offset == 6
    q.truncate_from_position(5000)
    assert q.max_queue_offset == 5
    q.truncate_from_position(0)
    assert (q.min_queue_offset, q.max_queue_offset) == (0, 0)
    assert list(tmp_path.iterdir()) == []
    fill(q, 0, 1)
    q.close()


def test_delete_before(tmp_path: Path) -> None:
    q = ConsumeQueue.open(tmp_path, UPF)
    fill(q, 0, 10)
    assert q.delete_before(3) == 0
    assert q.delete_before(9) == 2  # files [0,4) and [4,8); [8,12) is the last
    assert q.min_queue_offset == 8
    assert q.delete_before(100) == 0  # never the last file
    with pytest.raises(QueueOffsetOutOfRange):
        q.get(7)
    q.close()
    q = ConsumeQueue.open(tmp_path, UPF)
    assert (q.min_queue_offset, q.max_queue_offset) == (8, 10)
    assert q.read(8, 5) == [unit(8), unit(9)]
    q.close()


def test_delete_before_position_moves_the_start_and_deletes_whole_files(tmp_path: Path) -> None:
    q = ConsumeQueue.open(tmp_path, UPF)
    fill(q, 0, 10)  # physical offsets 0, 1000, ... 9000; files at 0, 4, 8
    assert q.delete_before_position(5500) == 1  # units 0..5 point below: file 0 goes
    assert (q.min_queue_offset, q.max_queue_offset) == (6, 10)
    with pytest.raises(QueueOffsetOutOfRange):
        q.get(5)  # its file is kept, but the message it points at is gone
    assert q.get(6) == unit(6)
    fill(q, 10, 1)  # still contiguous
    with pytest.raises(AssertionError, match="expected 11"):
        q.append(13, *unit(13))
    q.close()
    q = ConsumeQueue.open(tmp_path, UPF)  # a restart finds the file's first unit again ...
    assert q.min_queue_offset == 4
    q.delete_before_position(5500)  # ... and the broker moves it on at open
    assert (q.min_queue_offset, q.max_queue_offset) == (6, 11)
    q.close()


def test_a_queue_emptied_by_the_log_head_takes_a_later_offset(tmp_path: Path) -> None:
    """A follower whose log restarted past messages it never held (DLedger's reset) sees the
    next message of a queue at a higher queue offset than its ConsumeQueue's end."""
    q = ConsumeQueue.open(tmp_path, UPF)
    fill(q, 0, 6)
    assert q.delete_before_position(99_000) == 1  # every unit points below; the last file stays
    assert (q.min_queue_offset, q.max_queue_offset) == (6, 6)
    q.append(41, 100_000, 150, 7)
    assert (q.min_queue_offset, q.max_queue_offset) == (41, 42)
    assert q.get(41) == Unit(100_000, 150, 7)
    with pytest.raises(QueueOffsetOutOfRange):
        q.get(6)
    with pytest.raises(AssertionError, match="expected 42"):
        q.append(43, 101_000, 150, 7)  # contiguous again from there
    q.close()
    q = ConsumeQueue.open(tmp_path, UPF)
    assert (q.min_queue_offset, q.max_queue_offset) == (41, 42)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{40 * 20:020d}"]
    q.close()


def test_a_queue_emptied_never_goes_back(tmp_path: Path) -> None:
    q = ConsumeQueue.open(tmp_path, UPF)
    fill(q, 0, 3)
    q.delete_before_position(10_000)
    with pytest.raises(AssertionError, match="expected 3"):
        q.append(2, *unit(2))
    q.close()


def test_two_writers_write_identical_files(tmp_path: Path) -> None:
    """Two replicas applying the same messages, one restarting midway, one flushing often."""
    a, b = ConsumeQueue.open(tmp_path / "a", UPF), ConsumeQueue.open(tmp_path / "b", UPF)
    for k in range(11):
        a.append(k, *unit(k))
        b.append(k, *unit(k))
        if k % 3 == 0:
            b.flush()
        if k == 5:
            a.close()
            a = ConsumeQueue.open(tmp_path / "a", UPF)
    a.close()
    b.close()
    assert files(tmp_path / "a") == files(tmp_path / "b")
    assert len(files(tmp_path / "a")) == 3


def test_queue_set(tmp_path: Path) -> None:
    with ConsumeQueueSet.open(tmp_path, UPF) as queues:
        fill(queues.queue("TopicA", 0), 0, 5)
        fill(queues.queue("TopicA", 3), 0, 2)
        fill(queues.queue("%RETRY%group", 1), 0, 1)
        with pytest.raises(BadQueueName):
            queues.queue("../evil", 0)
        with pytest.raises(BadQueueName):
            queues.queue("TopicA", -1)
        assert queues.find("TopicB", 0) is None
    assert (tmp_path / "consumequeue" / "TopicA" / "3" / "00000000000000000000").exists()
    with ConsumeQueueSet.open(tmp_path, UPF) as queues:
        found = {(t, i): q.max_queue_offset for t, i, q in queues}
        assert found == {("%RETRY%group", 1): 1, ("TopicA", 0): 5, ("TopicA", 3): 2}
        queues.truncate_from_position(1000)  # drops unit 1.. of every queue
        assert [q.max_queue_offset for _, _, q in queues] == [1, 1, 1]


class QueueMatchesList(RuleBasedStateMachine):
    """The queue against a plain list of units, through appends, truncations, retention and
    reopens, with 3-unit files so that every operation meets a file boundary."""

    def __init__(self) -> None:
        super().__init__()
        self.dirs: list[Path] = []

    @initialize(tmp=st.builds(lambda: None))
    def start(self, tmp: None) -> None:
        import tempfile

        self.dir = Path(tempfile.mkdtemp(prefix="cq-model-"))
        self.queue = ConsumeQueue.open(self.dir, 3)
        self.model: list[Unit | None] = []  # None: below min (deleted by retention)
        self.next_position = 0

    @rule(count=st.integers(1, 5))
    def append(self, count: int) -> None:
        for _ in range(count):
            u = Unit(self.next_position, 50, len(self.model) * 7 - 3)
            self.queue.append(len(self.model), *u)
            self.model.append(u)
            self.next_position += 50

    @rule(keep=st.integers(-1, 30))
    def truncate(self, keep: int) -> None:
        self.queue.truncate_after(min(keep, len(self.model) - 1))
        del self.model[max(keep + 1, 0) :]
        if not any(self.model):
            self.model = [None] * len(self.model)

    @rule(below=st.integers(0, 30))
    def retention(self, below: int) -> None:
        self.queue.delete_before(below)
        for k in range(min(self.queue.min_queue_offset, len(self.model))):
            self.model[k] = None

    @rule()
    def reopen(self) -> None:
        self.queue.close()
        self.queue = ConsumeQueue.open(self.dir, 3)

    @invariant()
    def same_units(self) -> None:
        held = [u for u in self.model if u is not None]
        assert self.queue.max_queue_offset - self.queue.min_queue_offset == len(held)
        if held:
            assert self.queue.read(self.queue.min_queue_offset, 100) == held

    def teardown(self) -> None:
        import shutil

        self.queue.close()
        shutil.rmtree(self.dir, ignore_errors=True)


TestQueueMatchesList = QueueMatchesList.TestCase
TestQueueMatchesList.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)


def test_a_flush_plan_is_taken_on_the_dispatcher_and_run_elsewhere(tmp_path: Path) -> None:
    """The checkpoint flushes in a worker thread while the dispatcher creates queues: the thread
    must only touch the plan (it iterated the set's table and died with "dictionary changed
    size during iteration" when a topic was auto-created meanwhile)."""
    from broker.consume_queue import ConsumeQueueSet, run_flush

    queues = ConsumeQueueSet.open(tmp_path, units_per_file=4)
    queues.queue("A", 0).append(0, 100, 10, 0)
    plan = queues.flush_plan()
    queues.queue("B", 0).append(0, 200, 10, 0)  # a topic created while the plan is written
    run_flush(plan)
    later = queues.flush_plan()
    assert len(later.sync) == 1  # B's file: A's was named by the first plan, unwritten since
    run_flush(later)
    queues.close()


def test_a_flush_syncs_each_written_file_by_a_descriptor_of_its_own(
    tmp_path: Path, synced_inodes: list[int]
) -> None:
    """By fdatasync, which frees the GIL while the disk works: CPython's mmap.flush holds it
    through msync, and the event loop froze while a worker thread flushed (up to 200 ms). The
    rolled files are synced and then unmapped; a file deleted after the plan is passed over."""
    from broker.consume_queue import ConsumeQueueSet, run_flush

    synced = synced_inodes
    queues = ConsumeQueueSet.open(tmp_path, units_per_file=UPF)
    fill(queues.queue("A", 0), 0, UPF + 1)  # a rolled file and a current one
    fill(queues.queue("B", 1), 0, 1)
    plan = queues.flush_plan()
    assert len(plan.close) == 1  # the rolled file's mapping, unmapped after its sync
    run_flush(plan)
    written = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    assert len(written) == 3
    assert sorted(synced) == sorted(p.stat().st_ino for p in written)
    assert plan.close[0].closed
    fill(queues.queue("A", 0), UPF + 1, 1)
    fill(queues.queue("B", 1), 1, 1)
    gone = queues.flush_plan()
    queues.queue("B", 1).truncate_after(-1)  # deletes B's only file after the plan named it
    synced.clear()
    run_flush(gone)
    assert len(synced) == 1  # A's current file; B's is gone and needs nothing
    queues.close()


def test_a_flush_syncs_only_the_queues_written_since_the_last_one(
    tmp_path: Path, synced_inodes: list[int]
) -> None:
    """A broker holds a file open for every queue of every topic; a checkpoint every second
    that synced them all opened and fdatasynced thousands of unchanged files on a broker with
    many topics. Only what was written since the last plan is synced; what was written is
    always synced once."""
    from broker.consume_queue import ConsumeQueueSet, run_flush

    def ino(queue: ConsumeQueue) -> int:
        return next(queue.directory.iterdir()).stat().st_ino

    queues = ConsumeQueueSet.open(tmp_path, units_per_file=UPF)
    for queue_id in range(8):
        fill(queues.queue("T", queue_id), 0, 2)
    run_flush(queues.flush_plan())
    assert len(synced_inodes) == 8
    synced_inodes.clear()
    run_flush(queues.flush_plan())
    assert synced_inodes == []  # nothing written since
    fill(queues.queue("T", 3), 2, 1)
    run_flush(queues.flush_plan())
    assert synced_inodes == [ino(queues.queue("T", 3))]
    synced_inodes.clear()
    queues.queue("T", 5).truncate_after(0)  # zeroing a unit is a write too
    run_flush(queues.flush_plan())
    assert synced_inodes == [ino(queues.queue("T", 5))]
    queues.close()
