"""BrokerState on a group of three nodes on memory streams (tests/node/memnet.py): queue offsets
assigned by the leader as messages enter the log are contiguous per queue, continue exactly
across a leader kill, and every replica derives byte-identical ConsumeQueue and IndexFile
files, which a restart without them rebuilds to the same bytes."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from pathlib import Path

import trio
import trio.testing

from broker.entries import encode_meta
from broker.metadata import Metadata, TopicConfig
from broker.state import BrokerState, Geometry
from dledger.log.store import LogStore
from remoting import stored_message
from tests.node.memnet import MemoryGroup, memory_group

GEOMETRY = Geometry(cq_units_per_file=64, index_slots=64, index_items=256)


def record(topic: str, queue_id: int, n: int) -> bytes:
    return stored_message.pack(
        queue_id=queue_id,
        flag=0,
        queue_offset=0,
        physical_offset=0,
        sys_flag=0,
        born_timestamp_ms=1,
        born_host=("127.0.0.1", 1),
        store_timestamp_ms=1_700_000_000_000 + n,
        store_host=("127.0.0.1", 10911),
        reconsume_times=0,
        prepared_transaction_offset=0,
        body=b"m%d" % n,
        topic=topic,
        properties_data=b"KEYS\x01k%d\x02UNIQ_KEY\x01u%d\x02" % (n, n),
    )


def broker_group(root: Path) -> AbstractAsyncContextManager[MemoryGroup]:
    """Three nodes on memory streams, each with a BrokerState in root/<node>."""

    def factory(n: str, store: LogStore) -> BrokerState:
        return BrokerState(root / n, store, GEOMETRY)

    return memory_group(root, factory=factory)


def states(group: MemoryGroup) -> dict[str, BrokerState]:
    return {n: s for n, s in group.state_machines.items() if isinstance(s, BrokerState)}


def derived_files(root: Path) -> dict[str, bytes]:
    found = {}
    for sub in ("consumequeue", "index"):
        for path in sorted((root / sub).rglob("*")):
            if path.is_file():
                found[str(path.relative_to(root))] = path.read_bytes()
    return found


async def send(group: MemoryGroup, queue_id: int, n: int) -> None:
    await group.append([record("T", queue_id, n)])


async def wait_applied(group: MemoryGroup) -> None:
    with trio.fail_after(30):
        while True:
            nodes = list(group.nodes.values())
            commit = max(node.commit_index for node in nodes)
            if all(states(group)[n].applied_index >= commit for n in group.nodes):
                return
            await trio.sleep(0.01)


async def test_offsets_continue_across_a_leader_kill_and_files_agree(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with broker_group(tmp_path) as group:
        await group.append([encode_meta(Metadata.topic_op(TopicConfig("T", 2, 2)))])
        for n in range(30):
            await send(group, n % 2, n)
        first = await group.wait_for_leader()
        group.kill(first)
        for n in range(30, 60):
            await send(group, n % 2, n)
        await group.start(first)
        await send(group, 0, 60)
        await wait_applied(group)
        for s in states(group).values():
            s.flush()
        roots = {n: tmp_path / n for n in group.nodes}
        files = {n: derived_files(root) for n, root in roots.items()}
        state = states(group)[first]
        offsets = {q: [] for q in (0, 1)}
        for q in (0, 1):
            lo, hi = state.queue_range("T", q)
            for unit in state.units("T", q, lo, hi - lo):
                fields = stored_message.read_dispatch(state.record_at(unit.physical_offset))
                assert fields.physical_offset == unit.physical_offset
                offsets[q].append(fields.queue_offset)
        assert state.index.query("T", "k45", 10) != []
    assert offsets[0] == list(range(31)) and offsets[1] == list(range(30))
    assert files["n0"] == files["n1"] == files["n2"]
    assert any(name.startswith("index") for name in files["n0"])


async def test_a_replica_without_its_derived_files_rebuilds_the_same_bytes(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with broker_group(tmp_path) as group:
        await group.append([encode_meta(Metadata.topic_op(TopicConfig("T", 2, 2)))])
        for n in range(40):
            await send(group, n % 2, n)
        await wait_applied(group)
        leader = await group.wait_for_leader()
        victim = next(n for n in group.nodes if n != leader)
        group.kill(victim)
        await group.wait_stopped(victim)
        for sub in ("consumequeue", "index"):
            for path in sorted((tmp_path / victim / sub).rglob("*"), reverse=True):
                path.unlink() if path.is_file() else path.rmdir()
        await group.start(victim)
        await send(group, 1, 40)
        await wait_applied(group)
        for s in states(group).values():
            s.flush()
        rebuilt = derived_files(tmp_path / victim)
        kept = derived_files(tmp_path / leader)
        assert states(group)[victim].metadata.topics["T"].write_queues == 2
    assert rebuilt == kept and len(rebuilt) >= 3


async def test_a_restart_from_its_checkpoint_indexes_again_what_the_torn_file_held(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The IndexStore drops the file being written at the checkpoint (it may be torn); the
    restart indexes the log again from that file's start, so nothing indexed is lost."""

    async with broker_group(tmp_path) as group:
        await group.append([encode_meta(Metadata.topic_op(TopicConfig("T", 2, 2)))])
        for n in range(20):
            await send(group, n % 2, n)
        await wait_applied(group)
        leader = await group.wait_for_leader()
        victim = next(n for n in group.nodes if n != leader)
        state = states(group)[victim]
        state.write_checkpoint(state.checkpoint_marks())
        for n in range(20, 30):
            await send(group, n % 2, n)
        await wait_applied(group)
        group.kill(victim)
        await group.wait_stopped(victim)
        await group.start(victim)
        await send(group, 0, 30)
        await wait_applied(group)
        for s in states(group).values():
            s.flush()
        assert states(group)[victim].index.query("T", "k3", 10) != []
        restarted, kept = derived_files(tmp_path / victim), derived_files(tmp_path / leader)
    assert restarted == kept


async def test_a_checkpoint_ahead_of_a_log_that_lost_its_tail_rebuilds_instead_of_failing(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Under ASYNC_FLUSH the derived files' checkpoint may record entries the log had not
    synced; a crash that loses that tail (the broker chaos run's disk-tail fault) left a replica
    that could not start ("index N is not in the log"). It rebuilds its derived files from what
    the log holds, fetches the rest from the leader, and ends with the same files."""

    async with broker_group(tmp_path) as group:
        await group.append([encode_meta(Metadata.topic_op(TopicConfig("T", 2, 2)))])
        for n in range(20):
            await send(group, n % 2, n)
        await wait_applied(group)
        leader = await group.wait_for_leader()
        victim = next(n for n in group.nodes if n != leader)
        state = states(group)[victim]
        state.write_checkpoint(state.checkpoint_marks())
        applied = state.applied_index
        group.kill(victim)
        await group.wait_stopped(victim)
        store = LogStore.open(
            tmp_path / victim,
            group.stores[victim].config,
            group="g",
            self_id=victim,
        )
        store.truncate_after(applied - 5)  # the unsynced tail, lost in the crash
        store.close()
        await group.start(victim)
        for n in range(20, 30):
            await send(group, n % 2, n)
        await wait_applied(group)
        for s in states(group).values():
            s.flush()
        restarted, kept = derived_files(tmp_path / victim), derived_files(tmp_path / leader)
    assert restarted == kept
