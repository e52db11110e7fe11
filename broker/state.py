"""The broker's state machine: what every replica derives from the committed log.

`BrokerState.apply` is RocketMQ's dispatcher (ReputMessageService) and the only writer of the
derived files: for each message, one ConsumeQueue unit and its IndexFile keys (and what it
does to the replicated progress: a delayed message delivered, a half message of a transaction
pending, or committed); for each metadata entry, the change to topics, groups or offsets
(broker/metadata.py). It runs on every replica in log order, so their files are
byte-identical, and can be rebuilt from the log.

Queue offsets and physical offsets are assigned by the leader, in the record itself, as the
message enters the log (`shape`, the node's ProposalShaper): the physical offset is the entry's
byte position plus the entry header, the queue offset the queue's next one counting every
message the leader already proposed. A new leader assigns nothing until it has applied its own
whole log (the entries of earlier terms it holds), so offsets continue exactly where the
committed log left them: never skipped, never given twice. The dispatcher checks each record's
queue offset against the queue (ConsumeQueue.append asserts contiguity). docs/decisions.md,
"Queue offsets are assigned by the leader at append", says why this and not patching on pull.

A local checkpoint (`broker-state`, written every CHECKPOINT_INTERVAL_S after the derived files
are flushed) holds the applied index, the metadata and each queue's length, so a restart cuts
the derived files back to it and re-applies from there (`applied_index` tells the node); when
the derived files are missing or shorter than the checkpoint says, they are rebuilt from the
first entry the log holds.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import attrs
import trio

from broker.consume_queue import CONSUME_QUEUE_DIR, ConsumeQueueSet, FlushPlan, Unit, run_flush
from broker.delays import SCHEDULE_TOPICS, SOURCE_BYTES, Source, due_of
from broker.entries import EntryType, decode_meta, entry_type, void_entry
from broker.index_file import INDEX_DIR, IndexFile, IndexStore
from broker.metadata import Metadata
from broker.native import native
from broker.schedule_progress import DeliveryProgress
from broker.shaped_once import ShapedOnce
from broker.transaction_progress import HOW_COMMIT, TXN_END, TXN_END_BYTES, TransactionProgress
from broker.transactions import (
    HALF_OFFSET_BYTES,
    HALF_QUEUE_ID,
    HALF_TOPIC,
    half_offset_of,
    immunity_ms_of,
)
from dledger import limits as dledger_limits
from dledger.log.page_cache import read_in
from dledger.log.state_file import read_state_file, write_state_file
from dledger.log.store import LogStore
from dledger.node import ProposalRefused
from dledger.raft.entries import EntryBatch, EntryKind
from dledger.raft.events import Role, RoleState
from dledger.wire import Status
from remoting import properties as props
from remoting import stored_message
from remoting.tag_hash import tags_code

log = logging.getLogger("broker.state")

STATE_FILE = "broker-state"
STATE_MAGIC = b"BKST"
HEADER_BYTES = dledger_limits.ENTRY_HEADER_BYTES  # physical offset = entry position + this
COLD_SPAN_GAP_MAX = 64 * 1024  # cold messages this close are read in as one run
COLD_RECORD_BYTES = 64 * 1024  # read in from a cold message looked up by its offset
REINDEX_READ_BYTES = 16 << 20  # one read of the log while re-indexing after a restart
RECENT_SENDS_MAX = 65536
PENDING_OPS_MAX = 1_000_000  # metadata ops kept while waiting for a snapshot (rebuild only)
TOPIC_OPS = frozenset(
    {"topic", "delete_topic", "snapshot"}
)  # (queue offset, physical offset) of the latest messages, by index

QueueKey = tuple[str, int]
HALF_QUEUE: QueueKey = (HALF_TOPIC, HALF_QUEUE_ID)
# what the C half of the dispatcher leaves to `_dispatch`: messages of these topics, and
# messages with these properties (to `shape`: with these anywhere in their properties)
NATIVE_SPECIAL_TOPICS = tuple(sorted(topic.encode() for topic in (*SCHEDULE_TOPICS, HALF_TOPIC)))
NATIVE_STOP_KEYS = (SOURCE_BYTES, HALF_OFFSET_BYTES)


@attrs.frozen
class Geometry:
    """File sizes of the derived files (RocketMQ's defaults; tests pass small ones)."""

    cq_units_per_file: int = 300_000
    index_slots: int = 5_000_000
    index_items: int = 20_000_000


# stored_message.DispatchFields, or the same fields as a plain tuple (what shape read)
DispatchRead = tuple[int, int, int, int, int, int, str, bytes]


class Placed(NamedTuple):  # a tuple: the leader makes one per message it shapes
    """Where a message landed: what a SEND answer carries."""

    queue_id: int
    queue_offset: int
    physical_offset: int


class BrokerState:
    """The state machine a broker replica hands its dledger Node."""

    reads_bodies = True

    def __init__(self, root: Path, store: LogStore, geometry: Geometry | None = None) -> None:
        self.root = root
        self.store = store
        self.geometry = geometry or Geometry()
        self.metadata = Metadata()
        self.applied_index = store.first_index - 1
        self.lookup_cold_read_bytes = 0  # read in by read_in_records
        self.applied_term = 0  # the term of the last entry applied in this run
        self.queues: ConsumeQueueSet
        self.index: IndexStore
        self._arrivals: dict[QueueKey, trio.Event] = {}
        self._applied = trio.Event()
        # Where recent messages landed, by log index, for SEND answers: what this replica
        # assigned as leader when it proposed them, true only if they commit in that term: a
        # deposed leader's guesses stay here after other entries replaced them at those indexes,
        # so only a send that this replica committed as leader may read them. Any other answer
        # reads the committed record from the log (Broker.placements); the dispatcher keeps no
        # table of its own (one dict put per message on every replica, for the rare forwarded
        # write).
        self._shaped = RecentPlacements(RECENT_SENDS_MAX)
        # what `shape` read of each message it proposed, for the dispatcher to use instead of
        # reading the record again, by log index: (the record proposed, its fields). Only for
        # the very record object the applier then gets (the log hands back what was appended);
        # emptied as applied, and dropped on a role change or a refused proposal.
        self._shaped_reads: dict[int, tuple[bytes, DispatchRead]] = {}
        # the C half of the dispatcher (broker/native.py), None for the Python one alone
        self._native = native
        # records this leader's send handlers packed (broker/send.py), by id, with the fields
        # they were packed from: what shape would read of each (`note_packed`)
        self._packed: dict[int, tuple[bytes, DispatchRead]] = {}
        # the leader's assignment of queue offsets (`shape`): valid while `_ready_term` is the
        # term it leads in; None while not leading or not yet caught up with its own log
        self._role = RoleState(Role.FOLLOWER, 0, None)
        self._ready_term: int | None = None
        self._next_offsets: dict[QueueKey, int] = {}
        self._last_shape: list[QueueKey] = []
        # deliveries of delayed messages and resolutions of half messages the leader shaped in
        # `_ready_term` and has not applied yet: with the applied progress, what must never
        # enter the log again (broker/shaped_once.py)
        self._once = ShapedOnce()
        self._schedule_arrival = trio.Event()
        self.shaper = self
        # Metadata is complete when this replica applied the log from its first entry or
        # restored a checkpoint; else (rebuilt from a log retention cut) it waits for a snapshot
        self.metadata_complete = True
        self._ops_since_start: list[tuple[int, dict[str, Any]]] = []
        self.last_snapshot_at_ms = 0  # the newest snapshot entry applied (leader's clock)
        # called after an apply that created, changed or deleted a topic (re-registration)
        self.topic_listeners: list[Callable[[], None]] = []
        self._open()

    # --- opening and checkpoints -------------------------------------------------------------

    def _open(self) -> None:
        saved = read_state_file(self.root / STATE_FILE, STATE_MAGIC)
        geometry = self.geometry
        self.queues = ConsumeQueueSet.open(self.root, geometry.cq_units_per_file)
        self.index = IndexStore.open(self.root, geometry.index_slots, geometry.index_items)
        if saved is not None:
            self.metadata.restore(saved["metadata"])
        # Under ASYNC_FLUSH the checkpoint may count entries the log had not synced, which a
        # crash can take with it: derived files ahead of the log are rebuilt from it, and the
        # leader sends the lost entries again.
        ahead = saved is not None and int(saved["applied_index"]) > self.store.last_index
        if saved is not None and not ahead and self._derived_files_hold(saved):
            self.applied_index = max(int(saved["applied_index"]), self.store.first_index - 1)
            lengths = {(t, int(q)): int(n) for t, q, n in saved["queues"]}
            for topic, queue_id, queue in self.queues:
                queue.truncate_after(lengths.get((topic, queue_id), 0) - 1)
            reindex_from = self.index.truncate_from_position(int(saved["index_end"]) + 1)
            self._reindex(reindex_from, self.applied_index)
            log.info("broker state restored at index %d", self.applied_index)
        else:
            if saved is None:
                why = "no checkpoint"
            elif ahead:
                why = (
                    f"the checkpoint counts index {saved['applied_index']}, past the log's "
                    f"last {self.store.last_index}"
                )
            else:
                why = "derived files behind the checkpoint"
            log.warning("rebuilding ConsumeQueues and IndexFiles from the log (%s)", why)
            self.queues.close()
            self.index.close()
            shutil.rmtree(self.root / CONSUME_QUEUE_DIR, ignore_errors=True)
            shutil.rmtree(self.root / INDEX_DIR, ignore_errors=True)
            self.queues = ConsumeQueueSet.open(self.root, geometry.cq_units_per_file)
            self.index = IndexStore.open(self.root, geometry.index_slots, geometry.index_items)
            self.applied_index = self.store.first_index - 1
            # with no checkpoint and a log that does not start at 1, what came before is only
            # known from the next snapshot entry
            self.metadata_complete = saved is not None or self.store.first_index <= 1
        # derived files may outlive the log's head (a crash between the two deletions)
        self.log_trimmed(self.store.start.position)

    def log_trimmed(self, first_position: int) -> None:
        """The log below byte `first_position` is gone (the node's retention, or a follower's
        log restarted past entries it never held): derived files follow it. Each queue then
        starts at its first message at or after it; files holding only older messages go."""
        queue_files = self.queues.delete_before_position(first_position)
        index_files = self.index.delete_before_position(first_position)
        if queue_files or index_files:
            log.info(
                "log now starts at byte %d: deleted %d ConsumeQueue and %d IndexFile files",
                first_position,
                queue_files,
                index_files,
            )

    def _reindex(self, physical_offset: int, through_index: int) -> None:
        """Index again the messages from `physical_offset` up to entry `through_index` (the
        IndexStore dropped the file being written at the checkpoint: it may be torn)."""
        store = self.store
        if through_index < store.first_index:
            return
        index = store.first_index_at_or_after(physical_offset - HEADER_BYTES)
        while index <= through_index:
            batch = store.read(index, through_index, REINDEX_READ_BYTES)
            for kind, body in zip(batch.kinds, batch.payloads, strict=True):
                if kind == EntryKind.DATA and entry_type(body) is EntryType.MESSAGE:
                    self.index.index_record(body)
            index += len(batch.payloads)
        self.index.write_header()

    def _derived_files_hold(self, saved: dict[str, Any]) -> bool:
        for topic, queue_id, length in saved["queues"]:
            queue = self.queues.find(topic, int(queue_id))
            if length and (queue is None or queue.max_queue_offset < int(length)):
                return False
        return int(saved["index_end"]) <= self.index.end_phy_offset

    def checkpoint_marks(self) -> dict[str, Any]:
        """What a checkpoint records, taken now (on the event loop, between applies)."""
        return {
            "applied_index": self.applied_index,
            "metadata": self.metadata.state(),
            "queues": [[t, q, queue.max_queue_offset] for t, q, queue in self.queues],
            "index_end": self.index.end_phy_offset,
        }

    def flush(self) -> None:
        """Blocking: the derived files to disk."""
        self.write_flush(self.flush_plan())

    def flush_plan(self) -> tuple[FlushPlan, list[IndexFile]]:
        """What a flush writes, taken on the event loop (the dispatcher's thread)."""
        return self.queues.flush_plan(), self.index.flush_plan()

    @staticmethod
    def write_flush(plan: tuple[FlushPlan, list[IndexFile]]) -> None:
        """Blocking, any thread: carry out a flush_plan while the dispatcher goes on."""
        queues, index_files = plan
        run_flush(queues)
        for f in index_files:
            f.flush()

    def write_checkpoint(
        self, marks: dict[str, Any], plan: tuple[FlushPlan, list[IndexFile]] | None = None
    ) -> None:
        """Blocking: flush (the plan taken with `marks`, or now), then record `marks` (taken
        before the flush, so the files hold at least what they say)."""
        self.write_flush(plan if plan is not None else self.flush_plan())
        write_state_file(self.root / STATE_FILE, STATE_MAGIC, marks)

    async def run_checkpoints(self, interval_s: float) -> None:
        written = None
        try:
            while True:
                await trio.sleep(interval_s)
                if written == self.applied_index:
                    continue
                # marks and plan on the loop: the worker thread touches no shared table
                marks, plan = self.checkpoint_marks(), self.flush_plan()
                await trio.to_thread.run_sync(self.write_checkpoint, marks, plan)
                written = marks["applied_index"]
        finally:
            with trio.CancelScope(shield=True):
                self.write_checkpoint(self.checkpoint_marks())

    def close(self) -> None:
        self.queues.close()
        self.index.close()

    # --- the dispatcher (StateMachine.apply) --------------------------------------------------

    def apply(self, batch: EntryBatch) -> None:
        first = batch.first_index
        skip = self.applied_index - first + 1  # entries this state already holds
        positions: list[int] | None = None
        topics_changed = False
        # locals, not attribute lookups, in the loop every message of every replica passes
        kinds, payloads, dispatch = batch.kinds, batch.payloads, self._dispatch
        data, message = EntryKind.DATA, EntryType.MESSAGE
        plain = self._dispatch_plain if self._native is not None else None
        count = len(payloads)
        k = max(skip, 0)
        while k < count:
            if plain is not None:  # the usual messages from k on, in C; then the one it left
                if positions is None and kinds[k] == data and entry_type(payloads[k]) is message:
                    positions = self.store.positions(first, first + count - 1)
                k = plain(k, positions, kinds, payloads)
                if k >= count:
                    break
            if kinds[k] != data:
                k += 1
                continue
            body = payloads[k]
            kind = entry_type(body)
            if kind is message:
                if positions is None:
                    positions = self.store.positions(first, first + count - 1)
                dispatch(first + k, positions[k] + HEADER_BYTES, body)
            elif kind is EntryType.META:
                op = decode_meta(body)
                if op is None:
                    log.error("index %d: a metadata entry that does not decode; skipped", first + k)
                else:
                    self._apply_meta(first + k, op)
                    if op.get("op") in TOPIC_OPS:
                        topics_changed = True
            else:
                log.error("index %d: an entry that is neither message nor metadata", first + k)
            k += 1
        self.index.write_header()  # once per batch, not per message (IndexStore.write_header)
        self.applied_index = max(self.applied_index, first + len(batch.payloads) - 1)
        if batch.terms:
            self.applied_term = batch.terms[-1]
        self._applied.set()
        self._applied = trio.Event()
        if topics_changed:
            for listener in self.topic_listeners:
                listener()

    def _apply_meta(self, index: int, op: dict[str, Any]) -> None:
        """A metadata operation. A snapshot (the leader's whole metadata as of an earlier
        index, re-proposed well within each retention period) matters only to a replica that
        rebuilt from a log whose older entries were deleted: it takes the snapshot, then the
        operations it saw after the snapshot's index again, and is complete from then on. A
        complete replica already holds at least that state and skips it (restoring it would
        undo the operations between the snapshot's index and its entry)."""
        if op.get("op") == "snapshot":
            self.last_snapshot_at_ms = int(op.get("at_ms", 0))
            if self.metadata_complete:
                return
            as_of = int(op["as_of"])
            self.metadata.restore(op["state"])
            for seen_index, seen in self._ops_since_start:
                if seen_index > as_of:
                    self.metadata.apply(seen)
            self._ops_since_start = []
            self.metadata_complete = True
            log.info("metadata taken from the snapshot at index %d (as of %d)", index, as_of)
            return
        if op.get("op") == TXN_END:
            self._once.resolved(int(op["offset"]))
        self.metadata.apply(op)
        if not self.metadata_complete and len(self._ops_since_start) < PENDING_OPS_MAX:
            self._ops_since_start.append((index, op))

    def _dispatch_plain(
        self,
        start: int,
        positions: list[int] | None,
        kinds: Sequence[int],
        payloads: Sequence[bytes],
    ) -> int:
        """What `_dispatch` does for each usual message of a batch from `start` on (a plain
        topic, no delivery or transaction property, ASCII tags and keys), done by the C half
        (broker/dispatch_native.c) up to the first entry that is anything else, which it
        returns for the caller to apply here (or the batch's length). Without `positions` (not
        read for a batch that held no message before `start`) it stops at the first message."""
        assert self._native is not None
        stop, runs, items = self._native.scan(
            payloads if type(payloads) is list else list(payloads),
            positions,
            kinds if type(kinds) is list else list(kinds),
            EntryKind.DATA.value,
            start,
            HEADER_BYTES,
            NATIVE_SPECIAL_TOPICS,
            NATIVE_STOP_KEYS,
            self.index.item_count,
        )
        queue, arrivals = self.queues.queue, self._arrivals
        for topic, queue_id, queue_offset, units in runs:
            queue(topic, queue_id).append_units(queue_offset, units)
            if arrivals:  # a long-polled pull waits on some queue
                event = arrivals.pop((topic, queue_id), None)
                if event is not None:
                    event.set()
        if items:
            self.index.put_items(items)
        return int(stop)

    def _dispatch(self, index: int, physical_offset: int, body: bytes) -> None:
        shaped = self._shaped_reads.pop(index, None) if self._shaped_reads else None
        if shaped is not None and shaped[0] is body:  # the leader's own proposal, read by shape
            read: DispatchRead = shaped[1]
        else:
            read = stored_message.read_dispatch(body)
        # the fields as locals: one unpack, not a named attribute lookup at each use
        size, queue_id, queue_offset, stored_at, sys_flag, store_ms, topic, properties = read
        assert stored_at == physical_offset, (index, stored_at, physical_offset)
        found = props.table(properties)  # one pass for all the keys looked up below
        if topic in SCHEDULE_TOPICS:  # a delayed message: its unit holds its due time
            tag_hash = due_of(properties)
            self._schedule_arrival.set()
            self._schedule_arrival = trio.Event()
        else:
            tags = found.get(b"TAGS")
            tag_hash = tags_code(tags.decode(errors="replace")) if tags else 0
        self.queues.queue(topic, queue_id).append(queue_offset, physical_offset, size, tag_hash)
        source_text = found.get(SOURCE_BYTES)
        if source_text:  # a delayed message delivered: its source is done
            source = Source.parse(source_text)
            if source is not None:
                self._once.delivered(source)
                self._apply_meta(index, DeliveryProgress.delivered_op(source))
        if topic == HALF_TOPIC:  # a half message of a transaction: pending from now
            op = TransactionProgress.half_op(queue_offset, store_ms, immunity_ms_of(properties))
            self._apply_meta(index, op)
        elif HALF_OFFSET_BYTES in found:  # a commit: its half is resolved
            half = half_offset_of(properties)
            if half is not None:
                self._apply_meta(index, TransactionProgress.end_op(half, HOW_COMMIT))
        self.index.index_fields(topic, physical_offset, store_ms, sys_flag, found)
        if self._arrivals:  # a long-polled pull waits on some queue
            event = self._arrivals.pop((topic, queue_id), None)
            if event is not None:
                event.set()

    def remember_shaped(self, placed: list[tuple[int, Placed]]) -> None:
        """What the leader assigned to the messages it proposes, by index (see `_shaped`)."""
        self._shaped.update(placed)

    # --- the leader's half: offsets assigned as messages enter the log (ProposalShaper) ------

    def on_role_change(self, role: RoleState) -> None:
        if role.role is not Role.LEADER or role.term != self._role.term:
            self._ready_term = None
            self._next_offsets.clear()
            self._once.clear()
            self._shaped_reads.clear()
            self._packed.clear()
        self._role = role

    @property
    def wants_packed(self) -> bool:
        """Whether `note_packed` saves `shape` a read: only the Python dispatcher's (the C half
        reads a record faster than a send handler can note its fields)."""
        return self._native is None

    def note_packed(self, record: bytes, read: DispatchRead) -> None:
        """A record a send handler of this leader packed, and the fields it packed it from
        (offsets 0; as read_dispatch would read them): shape takes these when it gets this
        very record instead of reading it. Records never proposed here (a write given up, a
        leadership lost) are forgotten at a role change or past a bound."""
        packed = self._packed
        if len(packed) >= RECENT_SENDS_MAX:
            packed.clear()
        packed[id(record)] = (record, read)

    def shape(
        self, first_index: int, positions: Sequence[int], payloads: list[bytes]
    ) -> list[bytes]:
        if self._ready_term != self._role.term:
            # entries of earlier terms may still be unapplied: their offsets are not known yet
            if self._role.role is not Role.LEADER or self.applied_index < first_index - 1:
                self._packed.clear()  # these records are answered BUSY, never proposed
                raise ProposalRefused(
                    Status.BUSY, "the new leader is still applying its log; retry shortly"
                )
            self._ready_term = self._role.term
            self._next_offsets.clear()
            self._once.clear()
        shaped: list[bytes] = []
        last_shape: list[QueueKey] = []
        self._last_shape = last_shape
        next_offsets, reads = self._next_offsets, self._shaped_reads
        keep_reads = self._native is None  # the C half reads a record faster than a dict holds it
        if len(reads) > RECENT_SENDS_MAX:  # the applier far behind: it reads those itself
            reads.clear()
        once = self._once
        once.begin()
        packed = self._packed
        placed: list[tuple[int, Placed]] = []
        new_tuple = stored_message.new_tuple  # a Placed without its Python-level __new__
        native = self._native
        count = len(payloads)
        assert len(positions) == count, (len(positions), count)
        if native is not None and type(positions) is not list:
            positions = list(positions)
        k = 0
        while k < count:
            if native is not None:  # the plain records from k on, in C; then the one it left
                k = native.shape(
                    payloads,
                    positions,
                    k,
                    first_index,
                    HEADER_BYTES,
                    next_offsets,
                    NATIVE_STOP_KEYS,
                    Placed,
                    shaped,
                    last_shape,
                    placed,
                )
                if k >= count:
                    break
            position, payload, index = positions[k], payloads[k], first_index + k
            k += 1
            known = packed.pop(id(payload), None) if packed else None
            if known is not None and known[0] is payload:  # a send handler's: fields known
                size, queue_id, _, _, sys_flag, store_ms, topic, properties = known[1]
            else:
                kind = entry_type(payload)
                if kind is not EntryType.MESSAGE:
                    if kind is EntryType.META and TXN_END_BYTES in payload:
                        once.note_resolution(payload)
                    shaped.append(payload)
                    continue
                size, queue_id, _, _, sys_flag, store_ms, topic, properties = (
                    stored_message.read_dispatch(payload)
                )
            if SOURCE_BYTES in properties:
                if not once.first_delivery(properties, self.metadata.schedule):
                    shaped.append(void_entry(len(payload)))
                    continue
            elif HALF_OFFSET_BYTES in properties:
                halves = next_offsets.get(HALF_QUEUE, self.metadata.transactions.end)
                if not once.first_commit(properties, self.metadata.transactions, halves):
                    shaped.append(void_entry(len(payload)))
                    continue
            key = (topic, queue_id)
            offset = next_offsets.get(key)
            if offset is None:
                queue = self.queues.find(topic, queue_id)
                offset = 0 if queue is None else queue.max_queue_offset
            record = bytearray(payload)
            physical_offset = position + HEADER_BYTES
            stored_message.patch_offsets(record, 0, offset, physical_offset)
            next_offsets[key] = offset + 1
            last_shape.append(key)
            placed.append((index, new_tuple(Placed, (queue_id, offset, physical_offset))))
            proposed = bytes(record)
            shaped.append(proposed)
            if keep_reads:
                read = (
                    size,
                    queue_id,
                    offset,
                    physical_offset,
                    sys_flag,
                    store_ms,
                    topic,
                    properties,
                )
                reads[index] = (proposed, read)
        self.remember_shaped(placed)
        return shaped

    def refused(self) -> None:
        for key in self._last_shape:
            self._next_offsets[key] -= 1
        self._last_shape = []
        self._shaped_reads.clear()  # rare: the ones still valid are read again when applied
        self._packed.clear()
        self._once.refused()

    # --- what handlers read ---------------------------------------------------------------------

    async def wait_applied(self, index: int) -> None:
        while self.applied_index < index:
            await self._applied.wait()

    async def wait_applied_term(self, term: int) -> None:
        """Return once an entry of `term` (or later) is applied: on a leader of `term`, every
        entry of earlier terms that will ever commit is then applied."""
        while self.applied_term < term:
            await self._applied.wait()

    async def wait_schedule_arrival(self) -> None:
        """Return once a message for a schedule queue is applied (the caller bounds the wait)."""
        await self._schedule_arrival.wait()

    def placed_range(self, first: int, last: int, *, shaped_here: bool) -> list[Placed | None]:
        """Where the messages at first..last landed, for each one this replica remembers:
        `shaped_here`, it proposed them as leader and saw them commit in that term, so its own
        assignment holds. Otherwise (a write forwarded to the leader) None for each: the
        committed record says. Looked up in C-level steps (a batch's answer)."""
        if not shaped_here:
            return [None] * (last - first + 1)
        return self._shaped.get_range(first, last)

    async def wait_arrival(self, topic: str, queue_id: int) -> None:
        """Return once a message for (topic, queue_id) is applied (the caller bounds the wait)."""
        key = (topic, queue_id)
        event = self._arrivals.get(key)
        if event is None:
            event = self._arrivals[key] = trio.Event()
        await event.wait()

    def queue_range(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(min, max) queue offsets held; (0, 0) for a queue that has none."""
        queue = self.queues.find(topic, queue_id)
        if queue is None:
            return 0, 0
        return queue.min_queue_offset, queue.max_queue_offset

    def units(self, topic: str, queue_id: int, queue_offset: int, count_max: int) -> list[Unit]:
        queue = self.queues.find(topic, queue_id)
        if queue is None:
            return []
        return queue.read(queue_offset, count_max)

    async def read_in(self, records: Iterable[tuple[int, int]]) -> int:
        """Read in, in a worker thread, the log bytes of these (physical offset, size) records,
        in log order, that left the page cache behind the log's tail (nearby ones merged), so
        that reading them on the loop does not wait for the disk in a fault of the segment's
        mapping while every client waits. The bytes read in: 0, the common case, when all
        are in the tail."""
        spans: list[tuple[int, int]] = []
        for physical_offset, size in records:
            lo, hi = physical_offset - HEADER_BYTES, physical_offset + size
            if spans and spans[-1][0] <= lo <= spans[-1][1] + COLD_SPAN_GAP_MAX:
                spans[-1] = (spans[-1][0], max(hi, spans[-1][1]))
            else:
                spans.append((lo, hi))
        runs = self.store.cold_runs(spans)
        return await trio.to_thread.run_sync(read_in, runs) if runs else 0

    async def read_in_records(self, physical_offsets: Iterable[int]) -> None:
        """`read_in` for messages looked up by physical offset (queries, send-backs,
        transaction ends) before they are read on the loop. Their sizes are not known yet: the
        first COLD_RECORD_BYTES of each (all of most messages; the rest of a larger one faults
        in on the loop, one read-ahead)."""
        store = self.store
        cold = sorted(p for p in physical_offsets if store.left_cache(p - HEADER_BYTES))
        if cold:
            self.lookup_cold_read_bytes += await self.read_in((p, COLD_RECORD_BYTES) for p in cold)

    def record_at(self, physical_offset: int) -> bytes:
        """The stored message at `physical_offset` (Compacted, CorruptEntry as the log store)."""
        return self.store.get_at(physical_offset - HEADER_BYTES).body


class RecentPlacements:
    """Placements by log index, bounded: at least the newest `bound // 2` and at most `bound`.
    Two dicts, the older dropped whole when the newer fills: a put is one C-level dict update
    for a whole proposal, with no eviction step per message (an OrderedDict evicted one item
    a message, a plain dict used as a FIFO scanned its freed slots: docs/decisions.md)."""

    def __init__(self, bound: int) -> None:
        self._half = max(bound // 2, 1)
        self._new: dict[int, Placed] = {}
        self._old: dict[int, Placed] = {}

    def update(self, placed: list[tuple[int, Placed]]) -> None:
        new = self._new
        new.update(placed)
        if len(new) >= self._half:
            self._old, self._new = new, {}

    def get(self, index: int) -> Placed | None:
        found = self._new.get(index)
        return found if found is not None else self._old.get(index)

    def get_range(self, first: int, last: int) -> list[Placed | None]:
        """get() of each index first..last."""
        indexes = range(first, last + 1)
        found = list(map(self._new.get, indexes))
        if None in found:  # some in the older dict (or in neither)
            found = list(map(self.get, indexes))
        return found

    def __len__(self) -> int:
        return len(self._new) + len(self._old)
