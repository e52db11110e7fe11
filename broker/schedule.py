"""The leader's delivery of delayed messages (RocketMQ's ScheduleMessageService and RocketMQ 5's
timer, on the replicated log).

While a replica leads, one `Scheduler` per term reads the schedule queues from its applied
state and proposes, for each record that is due, a copy in its real topic that names the
record in SCHEDULE_SOURCE (broker/delays.py). Nothing else records progress: applying that
copy marks the record delivered on every replica (broker/schedule_progress.py), and the
leader's shaper lets no copy of an already delivered record into the log (broker/state.py).
So a new leader continues where the old one stopped, with nothing lost and nothing delivered
twice; docs/decisions.md "Delayed messages are delivered exactly once across a failover" has
the argument.

- Level queues (SCHEDULE_TOPIC_XXXX, one per level) are FIFO by due time, as each holds one
  delay: a cursor per queue delivers from the queue's watermark on, in order, and stops at
  the first record not yet due (the ConsumeQueue unit's tag hash is the due time).
- The timer queue (rmq_sys_wheel_timer) holds arbitrary due times: its records from the
  watermark on go into a heap by due time, built when the term starts and fed as records are
  applied. Its oldest records are rolled forward (copied to the queue's tail, same due time)
  when the queue holds more than TIMER_WINDOW_MAX records past the watermark, or when a record
  is older than the roll age (a quarter of the log's retention, at most a day): the watermark
  then keeps up, the set of delivered offsets above it stays small, and no waiting record
  sits in a segment retention may delete.
- A level record older than the roll age is rolled the same way, to the timer queue (same due
  time; a level queue is FIFO by due time, so it cannot take it at its tail). Only a level
  longer than the roll age has such records: with the default retention (72 h) and levels
  (at most 2 h) none is ever rolled. docs/decisions.md "Delayed messages outlive the log's
  retention" says why rolling rather than holding retention back.

Deliveries of one pass go into one append (at most DELIVERIES_PER_APPEND_MAX records and
DELIVERY_BATCH_BYTES_MAX bytes); a due record is proposed within one pass of its due time, a
few ms after it under normal load. Records below a queue's first offset were deleted by
retention and are skipped with a "schedule_skip" entry.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
import trio

from broker import delays
from broker.consume_queue import Unit
from broker.delays import SCHEDULE_TOPIC, TIMER_QUEUE_ID, TIMER_TOPIC, Source
from broker.entries import encode_meta
from broker.leader_tasks import each_term_led
from broker.metadata import PERM_READ, PERM_WRITE, Metadata, TopicConfig
from broker.schedule_progress import DeliveryProgress
from broker.state import BrokerState
from dledger.log.errors import LogError
from dledger.node import Node
from dledger.wire import Status
from remoting import properties as props
from remoting import stored_message
from remoting.errors import MessageFormatError
from remoting.stored_message import STORE_HOST_V6_FLAG, Host

if TYPE_CHECKING:
    from broker.context import Broker

log = logging.getLogger("broker.schedule")

DELIVERIES_PER_APPEND_MAX = 64  # records proposed in one append
DELIVERY_BATCH_BYTES_MAX = 4 << 20  # and their bytes (at least one record)
SCAN_UNITS_MAX = 4096  # ConsumeQueue units looked at per queue and pass
IDLE_CHECK_S = 1.0  # with nothing due sooner, look again this often (arrivals also wake it)
RETRY_S = 0.05  # after a refused append (the leader still applying, a transfer, ...)
ARRIVAL_COALESCE_S = 0.01  # after a schedule record arrives, wait this long for more
TIMER_WINDOW_MAX = 100_000  # timer records past the watermark before the oldest are rolled
TIMER_ROLL_AGE_MS_MAX = 86_400_000  # a timer record older than this is rolled forward
TIMER_ROLL_MARGIN_MS = 60_000  # ... unless it is due within this: then it is delivered
TIMER_PENDING_MAX = 1_000_000  # timer messages waiting; more are refused (SYSTEM_BUSY)
PROPOSED_PRUNE_AT = 4096  # forget proposed offsets below the watermark past this many


def wall_ms() -> int:
    return int(time.time() * 1000)


@attrs.frozen
class ScheduleConfig:
    levels: tuple[int, ...]  # messageDelayLevel, ms
    store_host: Host  # what delivered records carry (this replica's client address)
    roll_age_ms: int = TIMER_ROLL_AGE_MS_MAX


@attrs.frozen
class Item:
    """One entry a pass proposes: a due record's delivery, a roll, or a skip operation."""

    source: Source
    physical_offset: int = 0
    size: int = 0
    roll: bool = False
    skip: bool = False  # every record of the source's queue below its offset is gone
    due_ms: int = 0  # a timer record's, taken off the heap


class Scheduler:
    """One leader term's deliveries."""

    def __init__(
        self,
        state: BrokerState,
        node: Node,
        config: ScheduleConfig,
        now_ms: Callable[[], int] = wall_ms,
    ) -> None:
        self._state = state
        self._node = node
        self._config = config
        self._now_ms = now_ms
        self._cursors: dict[int, int] = {}  # level queue id -> next queue offset to look at
        self._heap: list[tuple[int, int, int, int]] = []  # timer (due, offset, physical, size)
        self._timer_scanned = -1  # timer offsets below are in the heap or delivered
        self._proposed: set[int] = set()  # timer offsets proposed in this term
        self._skipped: dict[tuple[str, int], int] = {}  # skip proposed, per queue
        self._head_stored_ms: tuple[int, int] | None = None  # (offset, store time) of the head
        self._level_stored_ms: dict[int, tuple[int, int]] = {}  # the same, per level queue
        self.delivered = 0
        self.rolled = 0

    async def run(self, term: int) -> None:
        """Deliver until cancelled (the supervisor cancels at the end of `term`)."""
        state = self._state
        await state.wait_applied_term(term)  # every earlier term's delivery is applied now
        while not state.metadata_complete:  # rebuilt from a cut log: wait for its snapshot
            with trio.move_on_after(IDLE_CHECK_S):
                await state.wait_schedule_arrival()
        log.info("delivering delayed messages as the leader of term %d", term)
        while True:
            now = self._now_ms()
            items, next_due = self._pass(now)
            if items:
                if await self._propose(items):
                    continue
                await trio.sleep(RETRY_S)
                continue
            wait_s = IDLE_CHECK_S if next_due is None else (next_due - now) / 1000
            with trio.move_on_after(min(max(wait_s, 0.0), IDLE_CHECK_S)) as waiting:
                await state.wait_schedule_arrival()
            if not waiting.cancelled_caught:  # woken by an arrival: let a burst of them land
                await trio.sleep(min(ARRIVAL_COALESCE_S, max(wait_s, 0.0)))

    # --- what is due ------------------------------------------------------------------------

    def _pass(self, now: int) -> tuple[list[Item], int | None]:
        """The entries to propose now, and the next due time when there are none."""
        items: list[Item] = []
        room = [DELIVERIES_PER_APPEND_MAX, DELIVERY_BATCH_BYTES_MAX]
        next_due = None
        for queue_id in range(self._level_queues()):
            due = self._level_pass(queue_id, now, items, room)
            if due is not None and (next_due is None or due < next_due):
                next_due = due
        due = self._timer_pass(now, items, room)
        if due is not None and (next_due is None or due < next_due):
            next_due = due
        return items, next_due

    def _level_queues(self) -> int:
        config = self._state.metadata.topics.get(SCHEDULE_TOPIC)
        return max(len(self._config.levels), config.queues if config is not None else 0)

    def _take(self, items: list[Item], item: Item, room: list[int]) -> bool:
        """Add `item` if the pass has room (always the first one)."""
        if items and (room[0] <= 0 or room[1] < item.size):
            return False
        items.append(item)
        room[0] -= 1
        room[1] -= item.size
        return True

    def _floor(self, topic: str, queue_id: int, items: list[Item], room: list[int]) -> int:
        """The queue's first offset still held; past the watermark, a skip to it is proposed."""
        lo, _ = self._state.queue_range(topic, queue_id)
        watermark = self._state.metadata.schedule.of(topic, queue_id).watermark
        behind = watermark < lo and self._skipped.get((topic, queue_id), -1) < lo
        if behind and self._take(items, Item(Source(topic, queue_id, lo), skip=True), room):
            log.warning(
                "%s queue %d: records %d..%d were deleted before their delivery",
                topic,
                queue_id,
                watermark,
                lo - 1,
            )
        return lo

    def _level_pass(
        self, queue_id: int, now: int, items: list[Item], room: list[int]
    ) -> int | None:
        """Take the due records of one level queue, in order; the next due time, if any."""
        state = self._state
        progress = state.metadata.schedule.of(SCHEDULE_TOPIC, queue_id)
        lo = self._floor(SCHEDULE_TOPIC, queue_id, items, room)
        _, hi = state.queue_range(SCHEDULE_TOPIC, queue_id)
        # the cursor moves past records proposed (in _propose) or found delivered, never past
        # one only taken into this pass: a refused append leaves them to the next pass
        cursor = scan = max(self._cursors.get(queue_id, progress.watermark), lo)
        next_due = None
        while scan < hi and next_due is None:
            units = state.units(SCHEDULE_TOPIC, queue_id, scan, min(SCAN_UNITS_MAX, hi - scan))
            for unit in units:
                source = Source(SCHEDULE_TOPIC, queue_id, scan)
                if progress.delivered(scan):
                    cursor = scan + 1 if cursor == scan else cursor
                elif unit.tag_hash > now and not self._level_too_old(source, unit, now):
                    next_due = unit.tag_hash
                    break
                else:  # due, or waiting too long for its segment's retention: rolled
                    roll = unit.tag_hash > now
                    item = Item(source, unit.physical_offset, unit.size, roll=roll)
                    if not self._take(items, item, room):
                        next_due = now
                        break
                scan += 1
            if len(units) < SCAN_UNITS_MAX:
                break
        self._cursors[queue_id] = cursor
        return next_due

    def _level_too_old(self, source: Source, unit: Unit, now: int) -> bool:
        """Whether a waiting level record is older than the roll age and not due within the
        margin: then it is rolled to the timer queue (same due time) before retention can
        delete its segment. Only a level longer than the roll age (a quarter of the log's
        retention) ever has such records; the records after it in its queue are younger."""
        if unit.tag_hash - now <= TIMER_ROLL_MARGIN_MS:
            return False
        known = self._level_stored_ms.get(source.queue_id)
        if known is None or known[0] != source.queue_offset:
            try:
                record = self._state.record_at(unit.physical_offset)
            except LogError:
                return False  # gone: the skip handles it
            known = (source.queue_offset, stored_message.read_store_timestamp(record))
            self._level_stored_ms[source.queue_id] = known
        return now - known[1] > self._config.roll_age_ms

    def _timer_pass(self, now: int, items: list[Item], room: list[int]) -> int | None:
        state = self._state
        progress = state.metadata.schedule.of(TIMER_TOPIC, TIMER_QUEUE_ID)
        lo = self._floor(TIMER_TOPIC, TIMER_QUEUE_ID, items, room)
        _, hi = state.queue_range(TIMER_TOPIC, TIMER_QUEUE_ID)
        self._scan_timers(progress.watermark, lo, hi)
        heap = self._heap
        while heap:
            due, offset, physical_offset, size = heap[0]
            if offset < lo or offset in self._proposed or progress.delivered(offset):
                heapq.heappop(heap)
                continue
            if due > now:
                break
            source = Source(TIMER_TOPIC, TIMER_QUEUE_ID, offset)
            if not self._take(items, Item(source, physical_offset, size, due_ms=due), room):
                return now
            heapq.heappop(heap)  # back in by _propose if the append is refused
        self._roll(now, max(progress.watermark, lo), hi, items, room)
        return heap[0][0] if heap else None

    def _scan_timers(self, watermark: int, lo: int, hi: int) -> None:
        """Put the timer records applied since the last pass into the heap."""
        state = self._state
        start = max(self._timer_scanned, watermark, lo)
        progress = state.metadata.schedule.of(TIMER_TOPIC, TIMER_QUEUE_ID)
        while start < hi:
            units = state.units(TIMER_TOPIC, TIMER_QUEUE_ID, start, min(SCAN_UNITS_MAX, hi - start))
            for k, unit in enumerate(units):
                offset = start + k
                if not progress.delivered(offset) and offset not in self._proposed:
                    heapq.heappush(
                        self._heap, (unit.tag_hash, offset, unit.physical_offset, unit.size)
                    )
            start += len(units)
            if not units:
                break
        self._timer_scanned = start

    def _roll(self, now: int, head: int, hi: int, items: list[Item], room: list[int]) -> None:
        """Roll the oldest waiting timer records forward while the window is too long or the
        oldest is older than the roll age (and not due within the margin)."""
        state = self._state
        progress = state.metadata.schedule.of(TIMER_TOPIC, TIMER_QUEUE_ID)
        offset = head
        end = min(hi, head + SCAN_UNITS_MAX)
        while offset < end:
            if progress.delivered(offset) or offset in self._proposed:
                offset += 1
                continue
            unit = state.units(TIMER_TOPIC, TIMER_QUEUE_ID, offset, 1)[0]
            if unit.tag_hash - now <= TIMER_ROLL_MARGIN_MS:
                return  # due soon: the heap delivers it
            if hi - offset <= TIMER_WINDOW_MAX and not self._too_old(offset, unit, now):
                return
            source = Source(TIMER_TOPIC, TIMER_QUEUE_ID, offset)
            if not self._take(
                items, Item(source, unit.physical_offset, unit.size, roll=True), room
            ):
                return
            offset += 1

    def _too_old(self, offset: int, unit: Unit, now: int) -> bool:
        known = self._head_stored_ms
        if known is None or known[0] != offset:
            try:
                record = self._state.record_at(unit.physical_offset)
            except LogError:
                return False  # gone: the skip handles it
            known = self._head_stored_ms = (offset, stored_message.read_store_timestamp(record))
        return now - known[1] > self._config.roll_age_ms

    # --- proposing ----------------------------------------------------------------------------

    async def _propose(self, items: list[Item]) -> bool:
        """Propose `items` as one append; False when the leader refused it (try again)."""
        now = self._now_ms()
        bodies = [self._entry(item, now) for item in items]
        reply = await self._node.append(bodies)
        if reply.status not in (Status.OK, Status.OUTCOME_UNKNOWN):
            log.info("deliveries refused (%s: %s); trying again", reply.status.name, reply.message)
            for item in items:
                if item.source.topic == TIMER_TOPIC and not (item.roll or item.skip):
                    entry = (item.due_ms, item.source.queue_offset, item.physical_offset, item.size)
                    heapq.heappush(self._heap, entry)
            return False
        # OK, or unknown: in this leader's log, so committed unless the term ends (and with it
        # this scheduler); either way not to be proposed again in this term
        for item in items:
            source = item.source
            if item.skip:
                self._skipped[(source.topic, source.queue_id)] = source.queue_offset
            elif source.topic == SCHEDULE_TOPIC:
                cursor = self._cursors.get(source.queue_id, 0)
                self._cursors[source.queue_id] = max(cursor, source.queue_offset + 1)
                self.rolled += item.roll
                self.delivered += not item.roll
            else:
                self._proposed.add(source.queue_offset)
                self.rolled += item.roll
                self.delivered += not item.roll
        if len(self._proposed) > PROPOSED_PRUNE_AT:
            watermark = self._state.metadata.schedule.of(TIMER_TOPIC, TIMER_QUEUE_ID).watermark
            self._proposed = {o for o in self._proposed if o >= watermark}
        return True

    def _entry(self, item: Item, now: int) -> bytes:
        """The log entry for `item`: the delivered (or rolled) record, or an operation."""
        source = item.source
        if item.skip:
            op = DeliveryProgress.skip_op(source.topic, source.queue_id, source.queue_offset)
            return encode_meta(op)
        try:
            message = stored_message.decode(self._state.record_at(item.physical_offset))
            target: delays.Target | None
            if item.roll:
                target = delays.rolled(message.properties, source)
            else:
                target = delays.delivered(message.properties, source)
            if target is not None:
                return stored_message.pack(
                    queue_id=target.queue_id,
                    flag=message.flag,
                    queue_offset=0,
                    physical_offset=0,
                    sys_flag=message.sys_flag & ~STORE_HOST_V6_FLAG,
                    born_timestamp_ms=message.born_timestamp_ms,
                    born_host=message.born_host,
                    store_timestamp_ms=now,
                    store_host=self._config.store_host,
                    reconsume_times=message.reconsume_times,
                    prepared_transaction_offset=0,
                    body=message.body,
                    topic=target.topic,
                    properties_data=props.encode(target.properties),
                )
            why = "it names no real topic and queue"
        except (LogError, MessageFormatError) as err:
            why = str(err)
        log.error("schedule record %s is dropped undelivered: %s", source.text(), why)
        return encode_meta(DeliveryProgress.delivered_op(source))


async def supervise(
    node: Node,
    state: BrokerState,
    config: ScheduleConfig,
    now_ms: Callable[[], int] = wall_ms,
) -> None:
    """Run a Scheduler for each term this replica leads, cancelled when the term ends."""

    async def run(term: int) -> None:
        await Scheduler(state, node, config, now_ms).run(term)

    await each_term_led(node, run)


async def run_schedules(broker: Broker) -> None:
    """The broker's delivery of delayed messages (started beside the node)."""
    config = broker.config
    roll_age_ms = int(min(TIMER_ROLL_AGE_MS_MAX, config.file_reserved_hours * 3_600_000 / 4))
    schedule = ScheduleConfig(config.delay_levels, broker.store_host, max(roll_age_ms, 1))
    await supervise(broker.node, broker.state, schedule)


# --- what a send needs ---------------------------------------------------------------------------


def schedule_topic_op(
    metadata: Metadata, delay: delays.Delay, levels: int
) -> dict[str, object] | None:
    """The topic entry creating (or widening) the schedule topic `delay` goes to, or None."""
    config = metadata.topics.get(delay.topic)
    wanted = max(levels, delay.queue_id + 1) if delay.topic == SCHEDULE_TOPIC else 1
    if config is not None and config.queues >= wanted:
        return None
    return Metadata.topic_op(TopicConfig(delay.topic, wanted, wanted, PERM_READ | PERM_WRITE))


def timer_backlog(state: BrokerState) -> int:
    """Timer messages waiting (as this replica has applied them)."""
    lo, hi = state.queue_range(TIMER_TOPIC, TIMER_QUEUE_ID)
    progress = state.metadata.schedule.of(TIMER_TOPIC, TIMER_QUEUE_ID)
    return max(0, hi - max(progress.watermark, lo) - len(progress.ahead))


def schedule_info(state: BrokerState) -> dict[str, str]:
    """GET_BROKER_RUNTIME_INFO's lines on delays: RocketMQ's `scheduleMessageOffset_<level>`,
    "delivered,max" queue offsets of each level queue that holds records, and ours for the
    timer queue, `timerMessageOffset` the same way and `timerBacklog` (records waiting)."""
    table = {}
    for topic, queue_id, _ in state.queues:
        if topic not in delays.SCHEDULE_TOPICS:
            continue
        _, hi = state.queue_range(topic, queue_id)
        watermark = state.metadata.schedule.of(topic, queue_id).watermark
        key = (
            "timerMessageOffset"
            if topic == TIMER_TOPIC
            else f"scheduleMessageOffset_{queue_id + 1}"
        )
        table[key] = f"{watermark},{hi}"
    table["timerBacklog"] = str(timer_backlog(state))
    return table
