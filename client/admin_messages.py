"""The admin API's message operations: queries by id, key and queue offset, printMsg's range
read, and resetOffsetByTime. Called through client.admin.Admin.

- By id: an offsetMsgId names its store host and physical offset, so VIEW_MESSAGE_BY_ID goes
  there (and to the other replicas of its group, which hold the same bytes at the same offset);
  a UNIQ_KEY (the id a producer returns) is looked up with QUERY_MESSAGE on every broker group
  of the topic, as RocketMQ's queryMsgById does when the id is not an offsetMsgId.
- By queue offset, and printMsg: PULL_MESSAGE as the tools consumer group, which commits
  nothing (our broker does not serve QUERY_CONSUME_QUEUE; a pull works on any 4.x broker).
- resetOffsetByTime: SEARCH_OFFSET_BY_TIMESTAMP per queue, then UPDATE_CONSUMER_OFFSET
  (RocketMQ's "old" reset, for groups whose consumers are offline: our broker does not serve
  INVOKE_BROKER_TO_RESET_OFFSET, and a live consumer would commit its own offsets over it).
`mqadmin sendMessage` goes through the Producer (Admin.send_message).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from client.admin_results import FoundMessage, OffsetReset
from client.errors import BrokerUnreachable, MQBrokerError, MQClientError
from client.message import MessageExt, MessageQueue, decode_records
from client.route import BrokerData, TopicRoute
from remoting.codes import RequestCode, ResponseCode
from remoting.command import RemotingCommand
from remoting.errors import BadMessageId, HeaderFieldError, MessageFormatError
from remoting.headers import (
    OffsetResponseHeader,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    QueryConsumerOffsetRequestHeader,
    QueryMessageRequestHeader,
    QueueRequestHeader,
    SearchOffsetRequestHeader,
    UpdateConsumerOffsetRequestHeader,
    ViewMessageRequestHeader,
)
from remoting.message_id import parse_offset_msg_id

if TYPE_CHECKING:
    from client.admin import Admin

TOOLS_CONSUMER_GROUP = "TOOLS_CONSUMER"  # RocketMQ's MixAll.TOOLS_CONSUMER_GROUP
TOOLS_PRODUCER_GROUP = "TOOLS_PRODUCER"
QUERY_MESSAGES_MAX = 64  # RocketMQ's maxMsgsNumBatch: one QUERY_MESSAGE answer at most
UNIQ_KEY_QUERY_MESSAGES_MAX = 32  # the broker caps a query by UNIQ_KEY at this
UNIQUE_KEY_QUERY_FIELD = "_UNIQUE_KEY_QUERY"
PULL_MESSAGES_MAX = 32  # the broker's bound on one pull
PRINT_COUNT_DEFAULT = 100  # printMsg prints at most this many messages unless told
PRINT_COUNT_MAX = 100_000  # and never more: a topic can hold more than a terminal shows
PULL_SYS_FLAG_SUBSCRIPTION = 4  # PullSysFlag: the subscription is in the request
END_OF_TIME_MS = (1 << 63) - 1


def _decode(body: bytes, broker_name: str, what: str) -> list[MessageExt]:
    try:
        return decode_records(body, broker_name)
    except (MessageFormatError, ValueError) as err:
        raise MQClientError(f"{what}: unreadable records ({err})") from None


def _broker_of(route: TopicRoute, broker_name: str) -> BrokerData:
    data = route.broker(broker_name)
    if data is None:
        known = ", ".join(sorted(d.broker_name for d in route.broker_datas)) or "none"
        raise MQClientError(
            f"topic {route.topic} has no queues on broker {broker_name!r} (it is on: {known})"
        )
    return data


# --- by id -----------------------------------------------------------------------------------


def _offset_id(msg_id: str) -> tuple[str, int] | None:
    """(store address, physical offset) when `msg_id` reads as an offsetMsgId, else None."""
    try:
        (host, port), physical_offset = parse_offset_msg_id(msg_id)
    except BadMessageId:
        return None
    if not 0 < port < 65536:
        return None
    return f"{host}:{port}", physical_offset


async def _view(
    admin: Admin, msg_id: str, physical_offset: int, replicas: list[tuple[str, str]]
) -> FoundMessage:
    """VIEW_MESSAGE_BY_ID at each (address, broker name) in turn, until one answers the record
    whose offsetMsgId is `msg_id`: the same store host and position, so a replica of another
    group that has some other message at that position is not taken for it."""
    request = RemotingCommand.request(
        RequestCode.VIEW_MESSAGE_BY_ID, ViewMessageRequestHeader(offset=physical_offset).encode()
    )
    problems = []
    for address, broker_name in replicas:
        try:
            response = await admin.call(address, request, "view message")
        except BrokerUnreachable as err:
            problems.append(str(err))
            continue
        if response.code != ResponseCode.SUCCESS:
            problems.append(f"{address}: {response.remark}")
            continue
        records = _decode(response.body, broker_name, f"message from {address}")
        if records and records[0].offset_msg_id == msg_id.upper():
            return FoundMessage(records[0], address)
        problems.append(f"{address}: holds another message there")
    raise MQClientError("; ".join(problems))


async def by_id(admin: Admin, msg_id: str, topic: str | None) -> list[FoundMessage]:
    """The message an offsetMsgId names, or those of `topic` with this UNIQ_KEY.

    An offsetMsgId goes to its store host, then to the other replicas of the host's group (the
    same message sits at the same position on each). When no name server lists the host any
    more (a master that died and was replaced), every replica of every group is asked, and
    only the record with that store host and position is taken. With `-t`, an id that is not
    found as an offsetMsgId is looked up as a UNIQ_KEY."""
    msg_id = msg_id.strip()
    store = _offset_id(msg_id)
    if store is None and not topic:
        raise MQClientError(
            f"{msg_id!r} is not an offsetMsgId (32 or 56 hex digits naming a broker); "
            "to look it up as a UNIQ_KEY give its topic with -t"
        )
    problems: list[str] = []

    async def view(replicas: list[tuple[str, str]]) -> list[FoundMessage]:
        assert store is not None
        try:
            return [await _view(admin, msg_id, store[1], replicas)]
        except MQClientError as err:
            problems.append(f"as an offsetMsgId: {err}")
            return []

    info = await admin.cluster_info() if store is not None else None
    group = info.group_at(store[0]) if info is not None and store is not None else None
    if store is not None and group is not None:  # its group's replicas hold it at that place
        others = [a for a in group.addresses() if a != store[0]]
        found = await view([(a, group.broker_name) for a in [store[0], *others]])
        if found:
            return found
    if topic:
        found = await _query(admin, topic, msg_id, 0, END_OF_TIME_MS, uniq_key=True)
        if found:
            return found
        problems.append(f"no message of topic {topic} has the UNIQ_KEY {msg_id}")
    if store is not None and info is not None and group is None:  # a host nobody lists: all
        everyone = [(a, n) for n in sorted(info.brokers) for a in info.brokers[n].addresses()]
        found = await view([(store[0], ""), *everyone])
        if found:
            return found
    raise MQClientError(f"message {msg_id} not found: " + "; ".join(problems))


# --- by key ----------------------------------------------------------------------------------


async def _query(
    admin: Admin,
    topic: str,
    key: str,
    begin_ms: int,
    end_ms: int,
    *,
    uniq_key: bool,
    max_num: int = QUERY_MESSAGES_MAX,
) -> list[FoundMessage]:
    """QUERY_MESSAGE on every broker group of `topic`; only messages that really carry `key`
    (the index is a hash table: another key may share the slot), newest first."""
    route = await admin.topic_route(topic)
    header = QueryMessageRequestHeader(
        topic=topic,
        key=key,
        max_num=UNIQ_KEY_QUERY_MESSAGES_MAX if uniq_key else max_num,
        begin_timestamp=begin_ms,
        end_timestamp=end_ms,
    ).encode()
    if uniq_key:
        header[UNIQUE_KEY_QUERY_FIELD] = "true"
    request = RemotingCommand.request(RequestCode.QUERY_MESSAGE, header)
    found = []
    for data in sorted(route.broker_datas, key=lambda d: d.broker_name):
        response, address = await admin.call_group(data, request, f"query {topic} by key {key}")
        if response.code == ResponseCode.QUERY_NOT_FOUND:
            continue
        if response.code != ResponseCode.SUCCESS:
            raise MQBrokerError(response.code, response.remark, address)
        for message in _decode(response.body, data.broker_name, f"query answer from {address}"):
            if message.msg_id == key or (not uniq_key and key in message.keys):
                found.append(FoundMessage(message, address))
    found.sort(key=lambda f: f.message.store_timestamp_ms, reverse=True)
    return found


async def by_key(
    admin: Admin,
    topic: str,
    key: str,
    begin_ms: int,
    end_ms: int | None,
    max_num: int = QUERY_MESSAGES_MAX,
) -> list[FoundMessage]:
    """Messages of `topic` whose KEYS hold `key` (or whose UNIQ_KEY is `key`), stored within
    [begin_ms, end_ms]: the newest `max_num` (1-64) of them, newest first. Raises ValueError
    for a `max_num` out of range."""
    if not 1 <= max_num <= QUERY_MESSAGES_MAX:
        raise ValueError(f"max_num must be 1..{QUERY_MESSAGES_MAX}, not {max_num}")
    end = END_OF_TIME_MS if end_ms is None else end_ms
    found = await _query(admin, topic, key, begin_ms, end, uniq_key=False, max_num=max_num)
    return found[:max_num]


# --- by queue offset, and printMsg ----------------------------------------------------------


async def _pull(
    admin: Admin, data: BrokerData, queue: MessageQueue, queue_offset: int, count: int
) -> tuple[RemotingCommand, list[MessageExt], str]:
    header = PullMessageRequestHeader(
        consumer_group=TOOLS_CONSUMER_GROUP,
        topic=queue.topic,
        queue_id=queue.queue_id,
        queue_offset=queue_offset,
        max_msg_nums=count,
        sys_flag=PULL_SYS_FLAG_SUBSCRIPTION,
        commit_offset=0,
        suspend_timeout_millis=0,
        subscription="*",
        sub_version=0,
        expression_type="TAG",
    ).encode()
    request = RemotingCommand.request(RequestCode.PULL_MESSAGE, header)
    response, address = await admin.call_group(data, request, f"pull {queue}")
    records = []
    if response.code == ResponseCode.SUCCESS:
        records = _decode(response.body, data.broker_name, f"pull answer from {address}")
    elif response.code not in (
        ResponseCode.PULL_NOT_FOUND,
        ResponseCode.PULL_OFFSET_MOVED,
        ResponseCode.PULL_RETRY_IMMEDIATELY,
    ):
        raise MQBrokerError(response.code, f"pull {queue}: {response.remark}", address)
    return response, records, address


async def by_offset(
    admin: Admin, topic: str, broker_name: str, queue_id: int, queue_offset: int
) -> FoundMessage:
    """The message at `queue_offset` of one queue."""
    route = await admin.topic_route(topic)
    data = _broker_of(route, broker_name)
    queue = MessageQueue(topic, broker_name, queue_id)
    response, records, address = await _pull(admin, data, queue, queue_offset, 1)
    if records and records[0].queue_offset == queue_offset:
        return FoundMessage(records[0], address)
    try:
        pulled = PullMessageResponseHeader.decode(response.ext_fields)
        held = f"the queue holds offsets {pulled.min_offset}..{pulled.max_offset - 1}"
    except HeaderFieldError:
        held = response.remark
    raise MQClientError(f"no message at offset {queue_offset} of {queue}: {held}")


async def _queue_offset(
    admin: Admin, data: BrokerData, queue: MessageQueue, code: RequestCode, timestamp_ms: int = 0
) -> int:
    """GET_MIN_OFFSET, GET_MAX_OFFSET or SEARCH_OFFSET_BY_TIMESTAMP of one queue."""
    if code is RequestCode.SEARCH_OFFSET_BY_TIMESTAMP:
        fields = SearchOffsetRequestHeader(
            topic=queue.topic, queue_id=queue.queue_id, timestamp=timestamp_ms
        ).encode()
    else:
        fields = QueueRequestHeader(topic=queue.topic, queue_id=queue.queue_id).encode()
    response, address = await admin.call_group_ok(
        data, RemotingCommand.request(code, fields), f"{code.name} of {queue}"
    )
    try:
        return OffsetResponseHeader.decode(response.ext_fields).offset
    except HeaderFieldError as err:
        raise MQClientError(f"{code.name} of {queue} from {address}: {err}") from None


async def print_range(
    admin: Admin,
    topic: str,
    begin_ms: int | None,
    end_ms: int | None,
    begin_offset: int | None,
    end_offset: int | None,
    count_max: int,
) -> list[FoundMessage]:
    """Messages of every readable queue of `topic`, queue by queue, from `begin_offset` (or
    the first stored at or after `begin_ms`, or the queue's first) up to before `end_offset`
    (or the first stored at or after `end_ms`, or the queue's end); at most `count_max`."""
    if not 1 <= count_max <= PRINT_COUNT_MAX:
        raise MQClientError(f"the message count must be 1..{PRINT_COUNT_MAX}, not {count_max}")
    route = await admin.topic_route(topic)
    out: list[FoundMessage] = []
    for queue in route.read_queues():
        if len(out) >= count_max:
            break
        data = _broker_of(route, queue.broker_name)
        if begin_offset is not None:
            at = begin_offset
        elif begin_ms is not None:
            at = await _queue_offset(
                admin, data, queue, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, begin_ms
            )
        else:
            at = await _queue_offset(admin, data, queue, RequestCode.GET_MIN_OFFSET)
        if end_offset is not None:
            end = end_offset
        elif end_ms is not None:
            end = await _queue_offset(
                admin, data, queue, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, end_ms
            )
        else:
            end = await _queue_offset(admin, data, queue, RequestCode.GET_MAX_OFFSET)
        while at < end and len(out) < count_max:
            count = min(PULL_MESSAGES_MAX, end - at, count_max - len(out))
            response, records, address = await _pull(admin, data, queue, at, count)
            out += [FoundMessage(m, address) for m in records if m.queue_offset < end][:count]
            try:
                following = PullMessageResponseHeader.decode(response.ext_fields).next_begin_offset
            except HeaderFieldError:
                break
            if following <= at:  # PULL_NOT_FOUND at the queue's end, or no progress
                break
            at = following
    return out


# --- resetOffsetByTime ---------------------------------------------------------------------------


async def reset_by_time(
    admin: Admin, group: str, topic: str, timestamp_ms: int
) -> list[OffsetReset]:
    """Set `group`'s offset in every readable queue of `topic` to the first message stored at
    or after `timestamp_ms` (the queue's end when none was)."""
    route = await admin.topic_route(topic)
    out = []
    for queue in route.read_queues():
        data = _broker_of(route, queue.broker_name)
        new = await _queue_offset(
            admin, data, queue, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, timestamp_ms
        )
        fields = QueryConsumerOffsetRequestHeader(
            consumer_group=group, topic=topic, queue_id=queue.queue_id
        ).encode()
        response, _address = await admin.call_group(
            data, RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET, fields), "offset"
        )
        old = -1
        if response.code == ResponseCode.SUCCESS:
            old = OffsetResponseHeader.decode(response.ext_fields).offset
        fields = UpdateConsumerOffsetRequestHeader(
            consumer_group=group, topic=topic, queue_id=queue.queue_id, commit_offset=new
        ).encode()
        await admin.call_group_ok(
            data,
            RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, fields),
            f"reset offset of {group} on {queue}",
        )
        out.append(OffsetReset(queue, old, new))
    return out
