"""Which replicas are broker stores, and what each one's derived files are (driver side).

A broker replica's store root holds the replicated log (`dledger/`) and, derived from it,
`consumequeue/<topic>/<queue_id>/<20 digits>`, `index/<20 digits>` and the `broker-state`
checkpoint (docs/formats.md#broker-store-directory). A replica is a broker store when it has
a `consumequeue/` or `index/` directory or a `broker-state` file. Discovery lists files and
reads the small checkpoint only; executors read the rest (spark/broker_read.py).
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from typing import Any

import attrs
import pyarrow.fs as pafs

from spark import broker_formats as bf
from spark import formats, layout

BROKER_STATE_BYTES_MAX = 64 * formats.MiB  # metadata with many offsets; far above a real one


@attrs.frozen
class QueueFile:
    """One ConsumeQueue file: units from queue offset `first_unit` on."""

    topic: str
    queue_id: int
    name: str  # relative to the store: consumequeue/<topic>/<queue_id>/<20 digits>
    first_unit: int  # the file name (a byte offset in the queue) / 20
    bytes: int


@attrs.frozen
class BrokerStore:
    """One replica's derived files and what its checkpoint says they hold at least."""

    replica: layout.Replica
    queue_files: tuple[QueueFile, ...]
    index_files: tuple[layout.DataFile, ...]  # named by their first message's physical offset
    applied_index: int  # broker-state: the last index the derived files reflect (0: none)
    queue_lengths: dict[tuple[str, int], int]  # broker-state: each queue's next queue offset
    index_end: int  # broker-state: physical offset of the last message indexed, -1 for none
    consumer_offsets: tuple[tuple[str, str, int, int], ...]  # (group, topic, queue, offset)
    has_state: bool

    @property
    def key(self) -> tuple[str, str]:
        return self.replica.key

    def path(self, name: str) -> str:
        """A file of the broker store, e.g. consumequeue/T/0/000..0 -> <store>/consumequeue/..."""
        return posixpath.join(self.replica.uri, name)


def is_broker_store(replica: layout.Replica) -> bool:
    fs, local = layout.filesystem(replica.uri)
    names = (bf.CQ_DIR, bf.INDEX_DIR, bf.BROKER_STATE_FILE)
    infos = fs.get_file_info([posixpath.join(local, n) for n in names])
    return any(info.type != pafs.FileType.NotFound for info in infos)


def discover(replicas: Sequence[layout.Replica]) -> list[BrokerStore]:
    """The broker stores among `replicas`; raises layout.InputUnreadable."""
    return [read_store(r) for r in replicas if is_broker_store(r)]


def read_store(replica: layout.Replica) -> BrokerStore:
    fs, local = layout.filesystem(replica.uri)
    state_path = posixpath.join(replica.uri, bf.BROKER_STATE_FILE)
    state_local = posixpath.join(local, bf.BROKER_STATE_FILE)
    state: dict[str, Any] = {}
    has_state = fs.get_file_info(state_local).type == pafs.FileType.File
    if has_state:
        raw = layout.read_small(fs, state_path, state_local, BROKER_STATE_BYTES_MAX)
        try:
            state = bf.decode_broker_state(raw)
            lengths = {(str(t), int(q)): int(n) for t, q, n in state["queues"]}
            offsets = tuple(
                (str(g), str(t), int(q), int(o))
                for g, t, q, o in (state.get("metadata") or {}).get("offsets", [])
            )
            applied, index_end = int(state["applied_index"]), int(state["index_end"])
        except formats.BadStateFile as err:
            raise layout.InputUnreadable(state_path, str(err)) from err
        except (TypeError, ValueError) as err:
            raise layout.InputUnreadable(state_path, f"unexpected layout: {err}") from err
    else:
        lengths, offsets, applied, index_end = {}, (), 0, -1
    return BrokerStore(
        replica=replica,
        queue_files=_queue_files(fs, local),
        index_files=_index_files(fs, local),
        applied_index=applied,
        queue_lengths=lengths,
        index_end=index_end,
        consumer_offsets=offsets,
        has_state=has_state,
    )


def _listing(fs: pafs.FileSystem, directory: str) -> list[pafs.FileInfo]:
    try:
        return list(fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True)))
    except OSError as err:
        raise layout.InputUnreadable(directory, str(err)) from err


def _numbered(name: str) -> bool:
    return len(name) == formats.FILE_NAME_DIGITS and name.isdigit()


def _queue_files(fs: pafs.FileSystem, local: str) -> tuple[QueueFile, ...]:
    out = []
    for topic_dir in _listing(fs, posixpath.join(local, bf.CQ_DIR)):
        if topic_dir.type != pafs.FileType.Directory:
            continue
        topic = posixpath.basename(topic_dir.path)
        for queue_dir in _listing(fs, topic_dir.path):
            queue = posixpath.basename(queue_dir.path)
            if queue_dir.type != pafs.FileType.Directory or not queue.isdigit():
                continue
            for f in _listing(fs, queue_dir.path):
                base = posixpath.basename(f.path)
                if f.type == pafs.FileType.File and _numbered(base):
                    name = f"{bf.CQ_DIR}/{topic}/{queue}/{base}"
                    first = int(base) // bf.CQ_UNIT_BYTES
                    out.append(QueueFile(topic, int(queue), name, first, int(f.size)))
    return tuple(sorted(out, key=lambda q: (q.topic, q.queue_id, q.first_unit)))


def _index_files(fs: pafs.FileSystem, local: str) -> tuple[layout.DataFile, ...]:
    out = []
    for f in _listing(fs, posixpath.join(local, bf.INDEX_DIR)):
        base = posixpath.basename(f.path)
        if f.type == pafs.FileType.File and _numbered(base):
            out.append(layout.DataFile(int(base), f"{bf.INDEX_DIR}/{base}", int(f.size)))
    return tuple(sorted(out, key=lambda d: d.first))
