"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310), SEND_BATCH_MESSAGE (320) and the C++ batch flag.

A send becomes one log entry per message, a batch one append of consecutive entries (all or
none), preceded in the same append by the topic's creation when it is auto-created. SEND_OK
means a quorum holds the messages (fsynced by it under SYNC_FLUSH): the answer waits for the
commit. The leader writes queue and physical offsets into the records as they enter the log
(broker/state.py), so the answer's msgId and queueOffset are those every replica holds.

A half message of a transaction (TRAN_MSG=true) is stored to RMQ_SYS_TRANS_HALF_TOPIC instead
(broker/transactions.py); its answer's queueOffset is its offset there (what END_TRANSACTION
names as tranStateTableOffset) and transactionId its UNIQ_KEY. It cannot be delayed or batched.
"""

from __future__ import annotations

import functools
import logging
import operator
import random
import re
import struct
import time
from itertools import accumulate
from typing import NamedTuple

from isal.isal_zlib import crc32  # what stored_message.Packer sums bodies with

from broker import delays
from broker.context import Broker
from broker.delays import SCHEDULE_TOPICS, TIMER_TOPIC, DelayIllegal
from broker.entries import encode_meta
from broker.metadata import (
    DEFAULT_TOPIC,
    DLQ_GROUP_PREFIX,
    PERM_INHERIT,
    PERM_READ,
    PERM_WRITE,
    RETRY_GROUP_PREFIX,
    GroupConfig,
    Metadata,
    TopicConfig,
    topic_problem,
)
from broker.native import native
from broker.schedule import TIMER_PENDING_MAX, schedule_topic_op, timer_backlog
from broker.state import Placed
from broker.transaction_progress import PENDING_MAX
from broker.transactions import (
    HALF_OFFSET_BYTES,
    HALF_QUEUE_ID,
    HALF_TOPIC,
    PREPARED,
    TRAN_MSG_BYTES,
    TRANSACTION_BITS,
    half_properties,
    half_sys_flag,
    is_half,
    strip_half_offset,
)
from broker.writes import WriteFailed, WriteUnknown, Written
from dledger.client import ClientError
from dledger.limits import PROPOSAL_ENTRIES_MAX
from remoting import limits, stored_message
from remoting import properties as props
from remoting.codes import RequestCode, ResponseCode, SerializeType, code_name
from remoting.command import RemotingCommand
from remoting.connection import Connection
from remoting.errors import BadProperty, HeaderFieldError, MessageFormatError, PropertiesTooLong
from remoting.frame import encode_header, json_frame
from remoting.headers import (
    RAFT_FORWARDED_FIELD,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    header_specs,
)
from remoting.message_id import Host, offset_msg_ids_text, packed_host
from remoting.stored_message import new_tuple

log = logging.getLogger("broker.send")

# A batch body: records of totalSize, magic, bodyCRC, flag, bodyLen, body, propLen(int16), props
BATCH_HEAD = struct.Struct(">iiiii")
INT16 = struct.Struct(">h")
BATCH_MESSAGES_MAX = 1024  # RocketMQ has none beyond the 4 MiB body; ours bounds one append
CLUSTER_BYTES = props.CLUSTER.encode()
# any of these in a send's properties: a transaction's half or commit, a delay, or a CLUSTER
# the client set (_plain)
_SPECIAL_MARKERS = (TRAN_MSG_BYTES, HALF_OFFSET_BYTES, CLUSTER_BYTES, *delays.DELAY_MARKERS)
_SPECIAL_MARKER = re.compile(b"|".join(map(re.escape, _SPECIAL_MARKERS)))
NOT_SENDABLE = frozenset({*SCHEDULE_TOPICS, HALF_TOPIC})  # RocketMQ's NOT_ALLOWED_SEND_TOPIC_SET
DELAYABLE = (0, 0x8)  # as RocketMQ, only a plain or committed message is delayed
DLQ_QUEUES = 1  # RocketMQ's DLQ_NUMS_PER_GROUP
SEND_TIMEOUT_S = 3.0  # the C++ client's default send timeout; a write waits at most this
# sends read together share appends of at most this many entries (a leader takes at most
# PROPOSAL_ENTRIES_MAX in one append; a forwarded larger one is refused BAD_REQUEST)
APPEND_ENTRIES_MAX = PROPOSAL_ENTRIES_MAX // 2


class Outgoing(NamedTuple):  # a tuple: one per message of every batch
    body: bytes
    flag: int
    properties: bytes


class SendRefused(Exception):
    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark


def parse_batch(body: bytes) -> list[Outgoing]:
    out: list[Outgoing] = []
    # the struct methods, the append and the size as locals: this runs for every message
    head, int16, append, end_of_body = (
        BATCH_HEAD.unpack_from,
        INT16.unpack_from,
        out.append,
        len(body),
    )
    at = 0
    while at < end_of_body:
        if end_of_body - at < BATCH_HEAD.size:
            raise SendRefused(ResponseCode.MESSAGE_ILLEGAL, "a batch record is cut short")
        total, _magic, _crc, flag, body_len = head(body, at)
        end = at + total
        props_at = at + BATCH_HEAD.size + body_len
        if total < BATCH_HEAD.size + 2 or end > end_of_body or body_len < 0 or props_at + 2 > end:
            raise SendRefused(ResponseCode.MESSAGE_ILLEGAL, f"a batch record at {at} has bad sizes")
        (props_len,) = int16(body, props_at)
        if props_len < 0 or props_at + 2 + props_len != end:
            raise SendRefused(ResponseCode.MESSAGE_ILLEGAL, f"a batch record at {at} has bad sizes")
        # by tuple.__new__: Outgoing(...) runs a Python-level __new__ (100 ns, not 270)
        append(
            new_tuple(
                Outgoing, (body[at + BATCH_HEAD.size : props_at], flag, body[props_at + 2 : end])
            )
        )
        at = end
        if len(out) > BATCH_MESSAGES_MAX:
            raise SendRefused(
                ResponseCode.MESSAGE_ILLEGAL, f"a batch of more than {BATCH_MESSAGES_MAX} messages"
            )
    if not out:
        raise SendRefused(ResponseCode.MESSAGE_ILLEGAL, "an empty batch")
    return out


def default_topic_config(broker: Broker) -> TopicConfig:
    perm = PERM_WRITE | 4 | (PERM_INHERIT if broker.config.auto_create_topic else 0)
    return TopicConfig(DEFAULT_TOPIC, 8, 8, perm)


def topic_for_send(
    broker: Broker, header: SendMessageRequestHeader
) -> tuple[TopicConfig, bytes | None]:
    """The topic's config, and the metadata entry creating it when it must be auto-created."""
    topic = header.topic
    problem = topic_problem(topic)
    if problem is not None:
        raise SendRefused(ResponseCode.SYSTEM_ERROR, problem)
    if topic in NOT_SENDABLE:  # RocketMQ's TopicValidator.isNotAllowedSendTopic
        raise SendRefused(
            ResponseCode.NO_PERMISSION, f"Sending message to topic[{topic}] is forbidden."
        )
    config = broker.topic(topic)
    if config is not None:
        return config, None
    template = broker.topic(header.default_topic) if header.default_topic else None
    if template is None or not template.perm & PERM_INHERIT or not broker.config.auto_create_topic:
        raise SendRefused(
            ResponseCode.TOPIC_NOT_EXIST,
            f"topic[{topic}] not exist, apply first please!",
        )
    queues = max(1, min(header.default_topic_queue_nums, template.write_queues))
    config = TopicConfig(topic, queues, queues, template.perm & ~PERM_INHERIT)
    return config, encode_meta(Metadata.topic_op(config))


class _Prepared(NamedTuple):  # a tuple: dispatch_native.c prepare_plains makes the usual ones
    """One send request made into log entries, not written yet."""

    request: RemotingCommand
    # the first message's properties as sent: its UNIQ_KEY names the send in an outcome-unknown
    # error, and a half's transaction id
    first_properties: bytes
    metas: list[bytes]  # entries that must precede the records (a topic's creation, ...)
    records: list[bytes]
    queue_id: int
    halves: int  # half messages of a transaction among the records


async def handle_send(
    broker: Broker, request: RemotingCommand, connection: Connection
) -> RemotingCommand:
    """One send request, as a batch of one (handle_sends)."""
    (response,) = await handle_sends(broker, [request], connection)
    return response


async def handle_sends(
    broker: Broker, requests: list[RemotingCommand], connection: Connection
) -> list[RemotingCommand]:
    """Send requests read from one connection in one go (remoting.connection.Batching): each
    made into entries and checked on its own, then one append of all of them (each request's
    entries consecutive, in the order the requests came; the entries creating topics first), and
    one answer each. Per request this is what handle_send does; per batch it is one task, one
    write and one wait for the commit instead of one each (more than one append only past
    APPEND_ENTRIES_MAX entries)."""
    answers = await _handle_sends(broker, requests, connection, encoded=False)
    commands = [a for a in answers if isinstance(a, RemotingCommand)]
    assert len(commands) == len(answers), "an encoded answer where none was asked for"
    return commands


async def handle_sends_encoded(
    broker: Broker, requests: list[RemotingCommand], connection: Connection
) -> list[RemotingCommand | bytes]:
    """handle_sends, with each SEND_OK the leader gives a JSON-header request (without a half)
    already encoded as its frame, from a template (`_send_ok_frame`): ~0.4 us, where the
    response's command, `answering` and `encode` took ~2.8. What the connection writes is the
    same bytes (tests/broker/test_send_batched.py)."""
    return await _handle_sends(broker, requests, connection, encoded=True)


async def _handle_sends(
    broker: Broker, requests: list[RemotingCommand], connection: Connection, *, encoded: bool
) -> list[RemotingCommand | bytes]:
    responses: list[RemotingCommand | bytes | None] = [None] * len(requests)
    prepared: list[tuple[int, _Prepared]] = []
    broker.send_requests += len(requests)
    made = _prepare_plains(broker, requests, connection) or [None] * len(requests)
    for i, (request, plain) in enumerate(zip(requests, made, strict=True)):
        if plain is not None:
            prepared.append((i, plain))
            continue
        try:
            prepared.append((i, _prepare_any(broker, request, connection)))
        except SendRefused as refused:
            responses[i] = request.response(refused.code, refused.remark)
        except HeaderFieldError as err:  # as remoting.dispatch answers it for a single request
            log.info("%s: bad %s: %s", connection.peer, code_name(request.code), err)
            responses[i] = request.response(ResponseCode.SYSTEM_ERROR, str(err))
    for chunk in _appends(prepared):
        await _append_and_answer(broker, chunk, responses, encoded)
    assert all(r is not None for r in responses)
    return [r for r in responses if r is not None]


def _appends(prepared: list[tuple[int, _Prepared]]) -> list[list[tuple[int, _Prepared]]]:
    """The prepared requests in runs of at most APPEND_ENTRIES_MAX entries, one append each
    (a leader refuses a larger append: dledger.limits.PROPOSAL_ENTRIES_MAX); a request larger
    than that alone is one run, as it would be on its own."""
    runs: list[list[tuple[int, _Prepared]]] = []
    entries = 0
    for item in prepared:
        size = len(item[1].metas) + len(item[1].records)
        if not runs or entries + size > APPEND_ENTRIES_MAX:
            runs.append([])
            entries = 0
        runs[-1].append(item)
        entries += size
    return runs


async def _append_and_answer(
    broker: Broker,
    run: list[tuple[int, _Prepared]],
    responses: list[RemotingCommand | bytes | None],
    encoded: bool,
) -> None:
    """One append of `run`'s entries (those creating topics first, then each request's records
    in order) and each request's answer into `responses`."""
    metas = list(dict.fromkeys(meta for _, p in run for meta in p.metas))
    records = [record for _, p in run for record in p.records]
    try:
        _check_disk(broker)
        broker.send_appends += 1
        written = await broker.writes.append(metas + records, SEND_TIMEOUT_S)
    except SendRefused as refused:
        for i, p in run:
            responses[i] = p.request.response(refused.code, refused.remark)
        return
    except (WriteFailed, WriteUnknown) as err:
        for i, p in run:
            failed = _write_refusal(err, p)
            responses[i] = p.request.response(failed.code, failed.remark)
        return
    # each request with the log index of its first record: a run's records are consecutive
    firsts = list(
        accumulate((len(p.records) for _, p in run), initial=written.last_index - len(records) + 1)
    )
    answering = list(zip(run, firsts[:-1], strict=True))
    if encoded and written.through_leader:
        answering = await _send_oks(broker, answering, responses)
    for (i, p), first in answering:
        try:
            responses[i] = await _answer(broker, p, written, first, encoded)
        except SendRefused as refused:
            responses[i] = p.request.response(refused.code, refused.remark)


Answering = list[tuple[tuple[int, _Prepared], int]]  # ((response slot, request), first index)


async def _send_oks(
    broker: Broker, answering: Answering, responses: list[RemotingCommand | bytes | None]
) -> Answering:
    """The leader's SEND_OK frames, in `responses`, for the requests of a committed run that
    `_answer` would write from `_SEND_OK_HEADER`: one message, no half, a JSON header. All in
    one pass over one placements lookup, where `_answer` takes a coroutine and ten calls a
    request (~2 us of bench.broker's leader a message: docs/decisions.md); the pass is
    broker/dispatch_native.c send_ok_frames where it is built (~0.2 us a request against
    ~1). Returns the others, for `_answer`; all of them when the placements are not known
    here."""
    first = answering[0][1]
    last = answering[-1][1] + len(answering[-1][0][1].records) - 1
    try:
        placed = await broker.placements(first, last, shaped_here=True)
    except ClientError:  # each request's own lookup says what it says
        return answering
    if native is not None:
        rest: Answering = native.send_ok_frames(
            answering, placed, first, _send_ok_parts(broker.store_host), SerializeType.JSON,
            responses,
        )  # fmt: skip
        return rest
    return _send_oks_python(answering, placed, first, responses, broker.store_host)


# the fields send_ok_frames reads by position (dispatch_native.c PREPARED_*, COMMAND_*)
assert _Prepared._fields == (
    "request", "first_properties", "metas", "records", "queue_id", "halves"
)  # fmt: skip
assert len(RemotingCommand._fields) == 9
assert RemotingCommand._fields.index("opaque") == 1
assert RemotingCommand._fields.index("serialization") == 8


def _send_oks_python(
    answering: Answering,
    placed: list[Placed],
    first: int,
    responses: list[RemotingCommand | bytes | None],
    store_host: Host,
) -> Answering:
    """`_send_oks`' pass in Python: the definition send_ok_frames is held to."""
    template = _send_ok_header(store_host)
    rest: Answering = []
    for item in answering:
        (i, p), index = item
        request = p.request
        if len(p.records) != 1 or p.halves or request.serialization is not SerializeType.JSON:
            rest.append(item)
            continue
        where = placed[index - first]
        responses[i] = json_frame(
            template % (request.opaque, where.physical_offset, p.queue_id, where.queue_offset)
        )
    return rest


def _check_disk(broker: Broker) -> None:
    disk_full = broker.disk.full()
    if disk_full is not None:  # RocketMQ's checkStoreStatus: the store is not writable
        raise SendRefused(
            ResponseCode.SERVICE_NOT_AVAILABLE,
            f"service not available now. It may be caused by one of the following reasons: "
            f"{disk_full}, messages are put to the slave, message store has been shut down, etc.",
        )


def _write_refusal(err: WriteFailed | WriteUnknown, prepared: _Prepared) -> SendRefused:
    if isinstance(err, WriteFailed):
        return SendRefused(ResponseCode.SERVICE_NOT_AVAILABLE, f"service not available now: {err}")
    return _outcome_unknown(prepared.first_properties, f"(the message may be stored): {err}")


def _prepare_plain(
    broker: Broker, request: RemotingCommand, connection: Connection
) -> _Prepared | None:
    """`_prepare_plains` of one request."""
    made = _prepare_plains(broker, [request], connection)
    return made[0] if made is not None else None


def _prepare_plains(
    broker: Broker, requests: list[RemotingCommand], connection: Connection
) -> list[_Prepared | None] | None:
    """What `_prepare_any` makes of each usual send among `requests` (read from `connection`
    in one go), made by one C call for them all (broker/dispatch_native.c prepare_plains,
    ~0.7 us a request where `_prepare_any` takes ~7): one message (not a batch) with plain
    properties, every header field in the form a client writes it (text, or digits for a
    number), to an existing writable topic and a queue it has, not a transaction's half, not a
    retry topic's send (it may go to the dead letters). None for any other request, and for anything `_prepare_any`
    would refuse: that path then makes or refuses it, the definition of both
    (tests/broker/test_send_plain.py holds them to the same records). None instead of the list
    when no request can be made here (no C half, a peer or store host that is not IPv4). The
    requests share one store timestamp: they are appended together."""
    if native is None:
        return None
    born_host, store_host = _ipv4_host(connection.peer), _ipv4_store_host(broker.store_host)
    if born_host is None or store_host is None:
        return None
    made: list[_Prepared | None] = native.prepare_plains(
        requests, *_SEND_FIELD_NAMES, RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2,
        broker.state.metadata.topics, _plain_topic_part, _SPECIAL_MARKERS, born_host,
        store_host, _cluster_property(broker.config.cluster), int(time.time() * 1000),
        min(limits.STORED_MESSAGE_BYTES_MAX, broker.config.message_bytes_max),
        limits.PROPERTIES_BYTES_MAX, PERM_WRITE, TRANSACTION_BITS, PREPARED, crc32, _Prepared,
    )  # fmt: skip
    if broker.is_leader and broker.state.wants_packed:
        note = broker.state.note_packed
        for plain in made:
            if plain is not None:
                note(plain.records[0], stored_message.read_dispatch(plain.records[0]))
    return made


_SEND_FIELD_NAMES = tuple(
    tuple(wire for _, wire, _, _ in header_specs(SendMessageRequestHeader, short))
    for short in (False, True)
)
# the kinds read_send_fields reads the fields as, in this order (dispatch_native.c
# SEND_FIELD_KINDS)
assert [(kind, required) for _, _, kind, required in header_specs(SendMessageRequestHeader, False)] == [
    ("text", True), ("text", True), ("text", True), ("int", True), ("int", True), ("int", True),
    ("int", True), ("int", True), ("text", False), ("int", False), ("bool", False),
    ("int", False), ("bool", False),
]  # fmt: skip


@functools.lru_cache(maxsize=1024)
def _plain_topic_part(topic: str) -> bytes | None:
    """A V1 record's topic length and topic, for a topic `_prepare_plain` may send to (a valid
    name, not a retry topic, not a topic no one may send to); else None."""
    if topic_problem(topic) is not None or topic in NOT_SENDABLE:
        return None
    if topic.startswith(RETRY_GROUP_PREFIX):
        return None
    data = topic.encode()
    return bytes((len(data),)) + data if len(data) <= 127 else None


@functools.lru_cache(maxsize=4096)
def _ipv4_host(peer: str) -> bytes | None:
    """A client's address "host:port" as a record stores its born host (4 bytes of IPv4 and the
    port), or None (IPv6, or not an address): `_prepare_any` stores those as it does."""
    return _ipv4_store_host(_host(peer))


def _ipv4_store_host(host: tuple[str, int]) -> bytes | None:
    """A host as a V4 record stores it: the 4 bytes of IPv4 and the port, as an offsetMsgId
    starts; None for IPv6 or what is not an address."""
    try:
        packed = packed_host(host)
    except (OSError, struct.error):
        return None
    return packed if len(packed) == 8 else None


def _prepare_any(broker: Broker, request: RemotingCommand, connection: Connection) -> _Prepared:
    """Any send request's entries, or SendRefused (HeaderFieldError for a header it cannot
    read): the definition `_prepare_plains` is held to."""
    short = request.code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE)
    header = SendMessageRequestHeader.decode(request.ext_fields, short_names=short)
    dead = _dead_letter(broker, header)
    config, create = dead if dead is not None else topic_for_send(broker, header)
    if not config.perm & PERM_WRITE:
        raise SendRefused(
            ResponseCode.NO_PERMISSION, f"the topic[{config.name}] sending message is forbidden"
        )
    queue_id = header.queue_id
    if queue_id < 0 or dead is not None:
        queue_id = random.randrange(config.write_queues)
    if queue_id >= config.write_queues:
        raise SendRefused(
            ResponseCode.SYSTEM_ERROR,
            f"queueId[{queue_id}] is illegal, topic:[{config.name}] "
            f"topicConfig.writeQueueNums:[{config.write_queues}] consumer:[{connection.peer}]",
        )
    batch = request.code == RequestCode.SEND_BATCH_MESSAGE or bool(header.batch)
    born_host = _host(connection.peer)
    store_host = broker.store_host
    now_ms = int(time.time() * 1000)
    metas = [create] if create is not None else []
    prepared_flag = header.sys_flag & TRANSACTION_BITS == PREPARED
    cluster_pair = _cluster_property(broker.config.cluster)
    if batch and native is not None and not prepared_flag:  # all plain: packed in C
        packed = _pack_plain_batch(
            broker, header, config.name, queue_id, request.body, born_host, now_ms, cluster_pair
        )
        if packed is not None:
            records, first_properties = packed
            return _Prepared(request, first_properties, metas, records, queue_id, 0)
    if batch:
        outgoing = parse_batch(request.body)
    else:
        outgoing = [Outgoing(request.body, header.flag, (header.properties or "").encode())]
    records = []
    note = broker.state.note_packed if broker.is_leader and broker.state.wants_packed else None
    halves = 0
    packer: stored_message.Packer | None = None
    packed_as: tuple[str, int, int] | None = None
    for message in outgoing:
        properties = message.properties
        topic, record_queue_id = config.name, queue_id
        sys_flag = header.sys_flag & ~0x30  # hosts are stored as IPv4 (C++ reads them so)
        plain = not prepared_flag and _plain(properties)
        if plain:  # no half, delay, SOURCE, commit offset or CLUSTER: the looks below find none
            pass
        elif is_half(properties, header.sys_flag):
            if batch:  # RocketMQ's CommitLog.asyncPutMessages refuses it too
                raise SendRefused(
                    ResponseCode.MESSAGE_ILLEGAL,
                    "a transactional message cannot be sent in a batch; send each on its own",
                )
            properties = _half(broker, header, config.name, queue_id, properties, now_ms)
            topic, record_queue_id = HALF_TOPIC, HALF_QUEUE_ID
            sys_flag = half_sys_flag(header.sys_flag)
            if broker.topic(HALF_TOPIC) is None:
                half_topic = TopicConfig(HALF_TOPIC, 1, 1, PERM_READ | PERM_WRITE)
                metas.append(encode_meta(Metadata.topic_op(half_topic)))
            halves += 1
        elif delays.needs_look(properties):
            delayable = header.sys_flag & TRANSACTION_BITS in DELAYABLE and dead is None
            delay, properties = _delayed(
                broker, config.name, queue_id, properties, now_ms, delayable
            )
            if delay is not None:
                if batch:  # RocketMQ's CommitLog.putMessages refuses it too
                    raise SendRefused(ResponseCode.MESSAGE_ILLEGAL, "a batch cannot be delayed")
                topic, record_queue_id = delay.topic, delay.queue_id
                op = schedule_topic_op(
                    broker.state.metadata, delay, len(broker.config.delay_levels)
                )
                if op is not None:
                    metas.append(encode_meta(op))
        else:
            properties = strip_half_offset(properties)
        if plain or props.find(properties, CLUSTER_BYTES) is None:
            properties += cluster_pair
        try:
            if packer is None or packed_as != (topic, record_queue_id, sys_flag):
                packed_as = (topic, record_queue_id, sys_flag)  # a batch's messages: once
                packer = stored_message.Packer(
                    queue_id=record_queue_id,
                    sys_flag=sys_flag,
                    born_timestamp_ms=header.born_timestamp,
                    born_host=born_host,
                    store_timestamp_ms=now_ms,
                    store_host=store_host,
                    reconsume_times=header.reconsume_times or 0,
                    topic=topic,
                )
            # offsets 0: the leader writes both as the entry enters the log
            record = packer.pack(message.flag, message.body, properties)
        except MessageFormatError as err:
            raise SendRefused(ResponseCode.MESSAGE_ILLEGAL, str(err)) from err
        if len(record) > broker.config.message_bytes_max:
            raise SendRefused(
                ResponseCode.MESSAGE_ILLEGAL,
                f"the message is {len(record)} bytes stored; maxMessageSize is "
                f"{broker.config.message_bytes_max}",
            )
        if note is not None:  # shape will take these fields instead of reading the record back
            note(record, (len(record), record_queue_id, 0, 0, sys_flag, now_ms, topic, properties))
        records.append(record)
    return _Prepared(request, outgoing[0].properties, metas, records, queue_id, halves)


def _pack_plain_batch(
    broker: Broker,
    header: SendMessageRequestHeader,
    topic: str,
    queue_id: int,
    body: bytes,
    born_host: tuple[str, int],
    now_ms: int,
    cluster_pair: bytes,
) -> tuple[list[bytes], bytes] | None:
    """A batch's records and its first message's properties as `_prepare_any`'s loop makes them
    for plain messages, packed by the C half (broker/dispatch_native.c, pack_batch); None when
    any message is not plain or anything is wrong, for that loop to handle or refuse."""
    assert native is not None
    try:
        template = stored_message.Packer(
            queue_id=queue_id,
            sys_flag=header.sys_flag & ~0x30,
            born_timestamp_ms=header.born_timestamp,
            born_host=born_host,
            store_timestamp_ms=now_ms,
            store_host=broker.store_host,
            reconsume_times=header.reconsume_times or 0,
            topic=topic,
        ).pack(0, b"", b"")
    except MessageFormatError:
        return None
    head_bytes = stored_message.FIXED_V4.size
    topic_part = template[head_bytes : len(template) - 2]  # the topic's length and the topic
    return native.pack_batch(
        body,
        template[:head_bytes],
        topic_part,
        cluster_pair,
        _SPECIAL_MARKERS,
        min(limits.STORED_MESSAGE_BYTES_MAX, broker.config.message_bytes_max),
        limits.PROPERTIES_BYTES_MAX,
        BATCH_MESSAGES_MAX,
        crc32,
    )


def _plain(properties: bytes) -> bool:
    """Whether none of is_half, delays.needs_look, strip_half_offset and the CLUSTER lookup can
    find anything in these properties (what most sends carry): one search for all their
    markers, ~450 ns, not the four calls' ~1,400."""
    return _SPECIAL_MARKER.search(properties) is None


_PHYSICAL_OFFSET = operator.attrgetter("physical_offset")  # of a Placed, in C


@functools.lru_cache(maxsize=16)
def _cluster_property(cluster: str) -> bytes:
    """The CLUSTER pair the broker adds to a message that has none (one broker: one value)."""
    return props.encode({props.CLUSTER: cluster})


async def _answer(
    broker: Broker, prepared: _Prepared, written: Written, first: int, encoded: bool = False
) -> RemotingCommand | bytes:
    """SEND_OK for a request whose records were written from log index `first` on; `encoded`:
    as its frame where `_send_ok_frame` can write it."""
    request, queue_id = prepared.request, prepared.queue_id
    store_host = broker.store_host
    last = first + len(prepared.records) - 1
    try:
        placed = await broker.placements(first, last, shaped_here=written.through_leader)
    except ClientError as err:  # stored, but this replica cannot learn where yet
        raise _outcome_unknown(
            prepared.first_properties,
            f"(the message is stored at log index {first}, but its queue offset could not be "
            f"read: {err})",
        ) from err
    if not prepared.halves:  # SendMessageResponseHeader's encode, written out: ~1.5 us less
        msg_id = offset_msg_ids_text(store_host, list(map(_PHYSICAL_OFFSET, placed)))
        if encoded and written.through_leader and request.serialization is SerializeType.JSON:
            return _send_ok_frame(request.opaque, msg_id, queue_id, placed[0].queue_offset)
        fields = _send_ok_fields(msg_id, queue_id, placed[0].queue_offset, written.through_leader)
        return request.response(ResponseCode.SUCCESS, ext_fields=fields)
    uniq = props.find(prepared.first_properties, b"UNIQ_KEY")
    response = SendMessageResponseHeader(
        msg_id=offset_msg_ids_text(store_host, list(map(_PHYSICAL_OFFSET, placed))),
        queue_id=queue_id,
        queue_offset=placed[0].queue_offset,
        transaction_id=uniq.decode(errors="replace") if uniq else None,
        raft_forwarded=None if written.through_leader else True,
    ).encode()
    response["MSG_REGION"] = "DefaultRegion"
    response["TRACE_ON"] = "true"
    return request.response(ResponseCode.SUCCESS, ext_fields=response)


def _send_ok_fields(
    msg_id: str, queue_id: int, queue_offset: int, through_leader: bool
) -> dict[str, str]:
    """A SEND_OK's extFields for a send without a half."""
    fields = {"msgId": msg_id, "queueId": str(queue_id), "queueOffset": str(queue_offset)}
    if not through_leader:
        fields[RAFT_FORWARDED_FIELD] = "true"
    fields["MSG_REGION"] = "DefaultRegion"
    fields["TRACE_ON"] = "true"
    return fields


def _send_ok_template(msg_id_spec: bytes = b"%s") -> bytes:
    """The JSON header of the leader's SEND_OK for a send without a half, as `encode_header`
    writes it, with %d for the opaque, the queue id and offset and `msg_id_spec` for the
    msgId."""
    marks = {"opaque": 2_000_000_001, "queue_id": 1_999_999_991, "queue_offset": 9_000_000_000_001}
    msg_id_mark = "F" * 31 + "E"
    request = RemotingCommand.request(RequestCode.SEND_MESSAGE, {}).with_opaque(marks["opaque"])
    fields = _send_ok_fields(msg_id_mark, marks["queue_id"], marks["queue_offset"], True)
    header = encode_header(request.response(ResponseCode.SUCCESS, ext_fields=fields))
    header = header.replace(b"%", b"%%")
    for mark, spec in [(str(marks["opaque"]), b"%d"), (msg_id_mark, msg_id_spec)] + [
        (str(marks[k]), b"%d") for k in ("queue_id", "queue_offset")
    ]:
        assert header.count(mark.encode()) == 1, (mark, header)
        header = header.replace(mark.encode(), spec)
    return header


_SEND_OK_HEADER = _send_ok_template()


@functools.lru_cache(maxsize=16)
def _send_ok_header(store_host: Host) -> bytes:
    """`_SEND_OK_HEADER` with the msgId of one message stored by `store_host` written in: its
    host's hex, then %016X for the physical offset (offset_msg_ids_text's text for one offset
    of 0..2**63-1). The values go in as (opaque, physical offset, queue id, queue offset)."""
    host = packed_host(store_host).hex().upper().encode()
    return _send_ok_template(host.replace(b"%", b"%%") + b"%016X")


@functools.lru_cache(maxsize=16)
def _send_ok_parts(store_host: Host) -> tuple[bytes, ...]:
    """`_send_ok_header(store_host)`'s text in the five pieces around its four values (the
    opaque, the physical offset's 16 hex digits, the queue id and offset), for
    send_ok_frames."""
    parts = re.split(rb"%d|%016X", _send_ok_header(store_host).replace(b"%%", b"\0"))
    assert len(parts) == 5, parts
    return tuple(part.replace(b"\0", b"%") for part in parts)


def _send_ok_frame(opaque: int, msg_id: str, queue_id: int, queue_offset: int) -> bytes:
    """The frame of the leader's SEND_OK to a JSON-header request without a half: the bytes
    `encode(request.response(SUCCESS, ext_fields=_send_ok_fields(...)).answering(request))`
    makes, written into `_SEND_OK_HEADER`."""
    return json_frame(_SEND_OK_HEADER % (opaque, msg_id.encode(), queue_id, queue_offset))


def _outcome_unknown(first_properties: bytes, why: str) -> SendRefused:
    """SYSTEM_ERROR with the remark our client reads as "may be stored" (client/send_request.py
    OUTCOME_UNKNOWN_REMARK), naming the UNIQ_KEY the application can dedupe by."""
    uniq = props.find(first_properties, b"UNIQ_KEY")
    return SendRefused(
        ResponseCode.SYSTEM_ERROR,
        f"outcome unknown {why}; UNIQ_KEY {uniq.decode() if uniq else '?'}",
    )


def _dead_letter(
    broker: Broker, header: SendMessageRequestHeader
) -> tuple[TopicConfig, bytes | None] | None:
    """RocketMQ's handleRetryTopicMsg: a send to %RETRY%<group> (a client giving a message back
    by itself when CONSUMER_SEND_MSG_BACK failed) whose reconsumeTimes reached the limit (the
    request's maxReconsumeTimes, else the group's retryMaxTimes) goes to %DLQ%<group>, created
    as send-back creates it (broker/send_back.py), and is not delayed. None for other sends."""
    if not header.topic.startswith(RETRY_GROUP_PREFIX):
        return None
    group = header.topic[len(RETRY_GROUP_PREFIX) :]
    group_config = broker.state.metadata.groups.get(group)
    if group_config is None:
        if not broker.config.auto_create_subscription_group:
            raise SendRefused(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {group}"
            )
        group_config = GroupConfig(group)
    limit = header.max_reconsume_times
    if limit is None or limit < 0:
        limit = group_config.retry_max_times
    if (header.reconsume_times or 0) < limit:
        return None
    topic = DLQ_GROUP_PREFIX + group
    config = broker.topic(topic)
    if config is not None:
        return config, None
    config = TopicConfig(topic, DLQ_QUEUES, DLQ_QUEUES, PERM_READ | PERM_WRITE)
    return config, encode_meta(Metadata.topic_op(config))


def _delayed(
    broker: Broker, topic: str, queue_id: int, properties: bytes, now_ms: int, delayable: bool
) -> tuple[delays.Delay | None, bytes]:
    """The delay a message asks for (none unless `delayable`) and its properties as stored:
    rewritten for a schedule queue when delayed (broker/delays.py), without a SCHEDULE_SOURCE
    a client set (only the leader's deliveries may carry one), else as they came."""
    try:
        values = props.decode(properties)
    except UnicodeDecodeError:
        return None, properties  # stored as it came; nothing in it we could read
    stripped = values.pop(delays.SOURCE, None) is not None
    config = broker.config
    max_ms = config.timer_max_delay_s * 1000
    try:
        delay = delays.delay_of(values, now_ms, config.delay_levels, max_ms) if delayable else None
    except DelayIllegal as err:
        raise SendRefused(ResponseCode.MESSAGE_ILLEGAL, str(err)) from err
    if delay is None:
        return None, props.encode(values) if stripped else properties
    if delay.topic == TIMER_TOPIC and timer_backlog(broker.state) >= TIMER_PENDING_MAX:
        raise SendRefused(
            ResponseCode.SYSTEM_BUSY,
            f"[TIMER] {TIMER_PENDING_MAX} timer messages are waiting already; try again later",
        )
    try:
        data = props.encode(delays.scheduled_properties(values, topic, queue_id, delay))
    except (BadProperty, PropertiesTooLong) as err:
        raise SendRefused(ResponseCode.MESSAGE_ILLEGAL, str(err)) from err
    return delay, data


def _half(
    broker: Broker,
    header: SendMessageRequestHeader,
    topic: str,
    queue_id: int,
    properties: bytes,
    now_ms: int,
) -> bytes:
    """A half message's properties as stored (broker/transactions.py), or SendRefused: it
    asks for a delay, or too many halves wait for their end already."""
    try:
        values = props.decode(properties)
    except UnicodeDecodeError:
        raise SendRefused(
            ResponseCode.MESSAGE_ILLEGAL, "the properties of a transactional message are not UTF-8"
        ) from None
    config = broker.config
    try:
        delay = delays.delay_of(
            values, now_ms, config.delay_levels, config.timer_max_delay_s * 1000
        )
    except DelayIllegal as err:
        raise SendRefused(ResponseCode.MESSAGE_ILLEGAL, str(err)) from err
    if delay is not None:
        raise SendRefused(
            ResponseCode.MESSAGE_ILLEGAL,
            "a transactional message cannot be delayed: remove its delay level (DELAY) and "
            "delivery time (TIMER_*, __STARTDELIVERTIME) properties",
        )
    pending = len(broker.state.metadata.transactions.pending)
    if pending >= PENDING_MAX:
        raise SendRefused(
            ResponseCode.SYSTEM_BUSY,
            f"[TRANSACTION] {pending} half messages wait for their commit or rollback already; "
            "try again later",
        )
    values.pop(delays.SOURCE, None)
    try:
        return props.encode(half_properties(values, topic, queue_id, header.producer_group))
    except (BadProperty, PropertiesTooLong) as err:
        raise SendRefused(ResponseCode.MESSAGE_ILLEGAL, str(err)) from err


def _host(peer: str) -> tuple[str, int]:
    host, _, port = peer.rpartition(":")
    try:
        return host.strip("[]") or "127.0.0.1", int(port)
    except ValueError:
        return "127.0.0.1", 0


__all__ = ["Placed", "handle_send", "handle_sends", "handle_sends_encoded"]
