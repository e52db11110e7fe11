"""PULL_MESSAGE (11): stored records back to back, filtered, with long polling.

Any replica serves a pull from its own applied state, so the stored bytes go out as they are.
A TAG subscription is matched by the tag hash in the ConsumeQueue; an SQL92 one by its compiled
predicate on the properties of each stored record (broker/filter/), so unmatched messages never
leave the broker. With the suspend flag a pull that finds nothing new is held until a message
for its queue is applied or its suspend time runs out (below the C++ client's 30 s), on a task
of its own, so the connection's other requests go on meanwhile; messages the filter skips
while it is held do not end the hold.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from broker.consume_queue import Unit
from broker.context import Broker
from broker.filter.errors import FilterError
from broker.filter.subscription import EVERYTHING, SubscriptionFilter, compile_subscription
from broker.metadata import PERM_READ
from dledger.log.errors import LogError
from remoting import stored_message
from remoting.codes import ResponseCode
from remoting.command import RemotingCommand
from remoting.connection import Connection
from remoting.errors import CorruptMessage
from remoting.headers import PullMessageRequestHeader, PullMessageResponseHeader

log = logging.getLogger("broker.pull")

FLAG_COMMIT_OFFSET, FLAG_SUSPEND, FLAG_SUBSCRIPTION = 1, 2, 4
PULL_MESSAGES_MAX = 32  # RocketMQ's maxTransferCountOnMessageInMemory
PULL_BYTES_MAX = 256 * 1024  # RocketMQ's maxTransferBytesOnMessageInMemory
SCAN_UNITS_MAX = 800  # units looked at per pull when a filter skips most (16000 bytes of CQ)
SUSPEND_S_MAX = 25.0  # held pulls end before the C++ client's 30 s timeout


async def handle_pull(
    broker: Broker, request: RemotingCommand, connection: Connection
) -> RemotingCommand:
    header = PullMessageRequestHeader.decode(request.ext_fields)
    topic, queue_id = header.topic, header.queue_id
    if log.isEnabledFor(logging.DEBUG):
        log.debug("pull %s %s", connection.peer, dict(request.ext_fields))
    refused = _group_refusal(broker, request, header)
    if refused is not None:
        return refused
    config = broker.topic(topic)
    if config is None:
        return request.response(
            ResponseCode.TOPIC_NOT_EXIST,
            f"topic[{topic}] not exist, apply first please!",
            _fields(header.queue_offset, 0, 0),
        )
    if not config.perm & PERM_READ:
        return request.response(
            ResponseCode.NO_PERMISSION,
            f"the topic[{topic}] pulling message is forbidden",
            _fields(header.queue_offset, 0, 0),
        )
    if not 0 <= queue_id < config.read_queues:  # RocketMQ's check: read queues, not all queues
        return request.response(
            ResponseCode.SYSTEM_ERROR,
            f"queueId[{queue_id}] is illegal, topic:[{topic}] "
            f"topicConfig.readQueueNums:[{config.read_queues}] consumer:[{connection.peer}]",
            _fields(header.queue_offset, 0, 0),
        )
    wanted_filter = _subscription_filter(broker, request, header)
    if isinstance(wanted_filter, RemotingCommand):
        return wanted_filter
    if header.sys_flag & FLAG_COMMIT_OFFSET and header.commit_offset >= 0:
        broker.offsets.commit(header.consumer_group, topic, queue_id, header.commit_offset)
    wanted = max(1, min(header.max_msg_nums, PULL_MESSAGES_MAX))
    suspend_s = (
        min(header.suspend_timeout_millis / 1000, SUSPEND_S_MAX)
        if header.sys_flag & FLAG_SUSPEND
        else 0.0
    )
    deadline = trio.current_time() + suspend_s
    offset, held = header.queue_offset, False
    while True:
        response = await _read(
            broker, request, topic, queue_id, offset, wanted, wanted_filter, _sure(broker)
        )
        now = trio.current_time()
        if held and response.code == ResponseCode.PULL_RETRY_IMMEDIATELY and now < deadline:
            # only messages the filter skips came while held: read on past them, hold on
            offset = int(response.ext_fields["nextBeginOffset"])
            await trio.lowlevel.checkpoint()
            continue
        if response.code != ResponseCode.PULL_NOT_FOUND or now >= deadline:
            return response
        with trio.move_on_at(deadline):
            await broker.state.wait_arrival(topic, queue_id)
        held = True


async def _read_in_cold(
    broker: Broker, units: list[Unit], wanted: int, codes: frozenset[int] | None
) -> None:
    """A consumer far behind pulls messages that left the log's page cache (behind its cache
    tail): read them in a worker thread first, so that the pull does not wait for the disk on
    the event loop, in a fault of the segment's mapping, while every other client waits. The
    first unit tells whether the pull starts in the cache, the common case."""
    state = broker.state
    if not units or not state.store.left_cache(units[0].physical_offset):
        return
    matching = [u for u in units if codes is None or u.tag_hash in codes]
    broker.cold_read_bytes += await state.read_in(
        (u.physical_offset, u.size) for u in matching[:wanted]
    )


def _subscription_filter(
    broker: Broker, request: RemotingCommand, header: PullMessageRequestHeader
) -> SubscriptionFilter | RemotingCommand:
    """The filter this pull reads with, or the refusal (RocketMQ 4.9's PullMessageProcessor):
    the subscription the pull carries (flag 4), compiled (cached by its text), or else the one
    the group's heartbeat registered here (compiled then; a group with none reads everything)."""
    fields = _fields(header.queue_offset, 0, 0)
    if header.sys_flag & FLAG_SUBSCRIPTION:
        try:
            found = compile_subscription(header.expression_type, header.subscription)
        except FilterError as err:
            log.info("pull of %s by %s: %s", header.topic, header.consumer_group, err)
            return request.response(
                ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                f"parse the consumer's subscription failed: {err}",
                fields,
            )
    else:
        sub = broker.clients.subscription(header.consumer_group, header.topic)
        if sub is None:
            found = EVERYTHING
        elif sub.filter is None:
            return request.response(
                ResponseCode.FILTER_DATA_NOT_EXIST,
                "The broker's consumer filter data is not exist!Your expression may be wrong! "
                f"({sub.error})",
                fields,
            )
        elif sub.filter.by_properties and sub.version < header.sub_version:
            return request.response(
                ResponseCode.FILTER_DATA_NOT_LATEST,
                "the consumer's consumer filter data not latest",
                fields,
            )
        else:
            found = sub.filter
    if found.by_properties and not broker.config.enable_property_filter:
        return request.response(
            ResponseCode.SYSTEM_ERROR,
            f"The broker does not support consumer to filter message by {found.expression_type}",
            fields,
        )
    return found


def _group_refusal(
    broker: Broker, request: RemotingCommand, header: PullMessageRequestHeader
) -> RemotingCommand | None:
    """RocketMQ's checks of the subscription group, before the topic's: an unknown group is
    refused when groups are not created on first use; a group with consuming disabled too."""
    group = broker.state.metadata.groups.get(header.consumer_group)
    fields = _fields(header.queue_offset, 0, 0)
    if group is None and not broker.config.auto_create_subscription_group:
        return request.response(
            ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
            f"subscription group [{header.consumer_group}] does not exist "
            "(autoCreateSubscriptionGroup is false: create it first)",
            fields,
        )
    if group is not None and not group.consume_enable:
        return request.response(
            ResponseCode.NO_PERMISSION,
            f"subscription group no permission, {header.consumer_group}",
            fields,
        )
    return None


def _sure(broker: Broker) -> bool:
    """Whether this replica's queues end where the group's committed log does: it leads and
    has applied all it knows committed. Only then is an offset past a queue's end illegal; on
    a follower (or a leader still applying) it may be one this replica has not applied yet,
    so the pull waits for it instead of moving the consumer (RocketMQ's slave, without
    offsetCheckInSlave, keeps the offset too)."""
    return broker.is_leader and broker.state.applied_index >= broker.node.commit_index


def _fields(next_begin: int, lo: int, hi: int) -> dict[str, str]:
    return PullMessageResponseHeader(
        suggest_which_broker_id=0, next_begin_offset=next_begin, min_offset=lo, max_offset=hi
    ).encode()


async def _read(
    broker: Broker,
    request: RemotingCommand,
    topic: str,
    queue_id: int,
    offset: int,
    wanted: int,
    wanted_filter: SubscriptionFilter,
    sure: bool,
) -> RemotingCommand:
    state = broker.state
    lo, hi = state.queue_range(topic, queue_id)
    if offset > hi and not sure:
        return request.response(
            ResponseCode.PULL_NOT_FOUND,
            f"offset {offset} is past this replica's applied end, {hi}",
            _fields(offset, lo, hi),
        )
    if hi == 0:
        if offset == 0:
            return request.response(
                ResponseCode.PULL_NOT_FOUND, "no message in the queue yet", _fields(0, lo, hi)
            )
        return request.response(
            ResponseCode.PULL_OFFSET_MOVED, "the queue is empty", _fields(0, lo, hi)
        )
    if offset < lo:
        return request.response(
            ResponseCode.PULL_OFFSET_MOVED,
            f"offset {offset} is below the queue's first, {lo}",
            _fields(lo, lo, hi),
        )
    if offset == hi:
        return request.response(
            ResponseCode.PULL_NOT_FOUND, "no new message", _fields(offset, lo, hi)
        )
    if offset > hi:
        return request.response(
            ResponseCode.PULL_OFFSET_MOVED,
            f"offset {offset} is past the queue's end, {hi}",
            _fields(hi, lo, hi),
        )
    codes, predicate = wanted_filter.tag_codes, wanted_filter.predicate
    scan = wanted if codes is None and predicate is None else SCAN_UNITS_MAX
    units = state.units(topic, queue_id, offset, scan)
    await _read_in_cold(broker, units, wanted, codes)
    records: list[bytes] = []
    size = 0
    next_begin = offset
    for unit in units:
        if codes is not None and unit.tag_hash not in codes:
            next_begin += 1
            continue
        if records and (len(records) >= wanted or size + unit.size > PULL_BYTES_MAX):
            break
        try:
            record = state.record_at(unit.physical_offset)
        except LogError as err:
            log.warning("pull of %s/%d at %d: %s", topic, queue_id, next_begin, err)
            if records:
                break
            return request.response(
                ResponseCode.PULL_OFFSET_MOVED,
                f"the message at offset {next_begin} is gone: {err}",
                _fields(next_begin + 1, lo, hi),
            )
        if predicate is not None and not _matches(predicate, record, topic, queue_id, next_begin):
            next_begin += 1
            continue
        records.append(record)
        size += len(record)
        next_begin += 1
    if not records:
        return request.response(
            ResponseCode.PULL_RETRY_IMMEDIATELY,
            "no message matched the filter",
            _fields(next_begin, lo, hi),
        )
    return request.response(
        ResponseCode.SUCCESS, "FOUND", _fields(next_begin, lo, hi), b"".join(records)
    )


def _matches(
    predicate: Callable[[dict[str, str]], bool],
    record: bytes,
    topic: str,
    queue_id: int,
    queue_offset: int,
) -> bool:
    """Whether an SQL92 subscription wants this stored message; one whose properties cannot
    be read is skipped, with a warning."""
    try:
        properties = stored_message.read_properties(record)
    except CorruptMessage as err:
        log.warning("pull of %s/%d at %d skips an unreadable message: %s", topic, queue_id,
                    queue_offset, err)  # fmt: skip
        return False
    return predicate(properties)
