"""A send on the wire: the message made ready once (UNIQ_KEY, properties, compression), the
SEND_MESSAGE_V2 (310) or SEND_BATCH_MESSAGE (320) request built per attempt (the queue id
changes), and the broker's answer read back (protocol reference section 3.2).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from itertools import repeat

import attrs

from client import batch, limits
from client.errors import InvalidMessage
from client.message import Message, MessageQueue, compress_body
from client.send_result import STORED_CODES, SendResult
from remoting import properties as props
from remoting.codes import RequestCode, ResponseCode
from remoting.command import RemotingCommand
from remoting.errors import HeaderFieldError, MessageFormatError
from remoting.headers import (
    RAFT_FORWARDED_FIELD,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
)
from remoting.message_id import UniqIdGenerator

# Our broker answers SYSTEM_ERROR with this remark prefix when the write reached the Raft
# leader but its commit is unknown (broker/send.py, WriteUnknown): the message may be stored.
OUTCOME_UNKNOWN_REMARK = "outcome unknown"


@attrs.frozen
class Outgoing:
    """One message or one batch, encoded and ready to be sent to any queue of its topic."""

    topic: str
    body: bytes  # as sent: zlib when sys_flag has the compressed bit; records for a batch
    sys_flag: int
    flag: int
    properties: str  # the properties string of a single message; "" for a batch
    uniq_key: str  # comma-joined for a batch, one per message
    is_batch: bool = False

    @property
    def body_bytes(self) -> int:
        return len(self.body)


def _properties(message: Message, uniq_key: str) -> tuple[dict[str, str], bytes]:
    wire = message.wire_properties(uniq_key)
    try:
        return wire, props.encode(wire)
    except MessageFormatError as err:  # BadProperty (a lone surrogate too), PropertiesTooLong
        raise InvalidMessage("properties", str(err)) from err


def uniq_key_of(message: Message, ids: UniqIdGenerator) -> str:
    """The message's own UNIQ_KEY if the application set one (to resend a message whose outcome
    was unknown under the same id), else a new one."""
    return message.properties.get(props.UNIQ_KEY) or ids.next_id()


def prepare(message: Message, ids: UniqIdGenerator) -> Outgoing:
    """A single message made ready: its UNIQ_KEY set, its body compressed from 4 KiB."""
    uniq_key = uniq_key_of(message, ids)
    _, encoded = _properties(message, uniq_key)
    body, sys_flag = compress_body(message.body)
    return Outgoing(message.topic, body, sys_flag, message.flag, encoded.decode(), uniq_key)


def prepare_batches(messages: Sequence[Message], ids: UniqIdGenerator) -> list[Outgoing]:
    """The messages (validated, of one topic) cut by the splitter into batches made ready."""
    if not messages:
        raise InvalidMessage("batch", "no messages")
    topic = messages[0].topic
    plain = True
    for i, message in enumerate(messages):
        if message.topic != topic:
            raise InvalidMessage(
                "batch", f"message {i} is for {message.topic!r}, the first for {topic!r}"
            )
        if message.delay_level:
            raise InvalidMessage("batch", f"message {i} has a delay level; batches cannot")
        if plain and (message.properties or message.tags or message.keys):
            plain = False
    if plain:
        records, sizes, keys = _plain_records(topic, messages, ids)
    else:
        records, sizes, keys = [], [], []
        for message in messages:
            uniq_key = uniq_key_of(message, ids)
            record, size = prepare_record(message, uniq_key)
            records.append(record)
            sizes.append(size)
            keys.append(uniq_key)
    return [
        batch_outgoing(topic, records[r.start : r.stop], keys[r.start : r.stop])
        for r in batch.split(sizes)
    ]


_PLAIN_PROPERTIES = b"UNIQ_KEY\x01%s\x02WAIT\x01true\x02"  # what prepare_record gives them


def _plain_records(
    topic: str, messages: Sequence[Message], ids: UniqIdGenerator
) -> tuple[list[bytes], list[int], list[str]]:
    """prepare_record's records and sizes, and the UNIQ_KEYs, for messages with no properties,
    tags or keys (the usual batch): their properties differ only in the UNIQ_KEY, so every
    step is a C-level map over the batch instead of a dict and an encode per message."""
    count = len(messages)
    keys = ids.next_ids(count)
    properties = list(map(_PLAIN_PROPERTIES.__mod__, map(str.encode, keys)))
    properties_length = len(properties[0])  # the same for every id of one generator
    bodies = [message.body for message in messages]
    lengths = list(map(len, bodies))
    heads = map(
        batch.RECORD_HEAD.pack,
        map(
            (batch.RECORD_HEAD.size + batch.PROPERTIES_LENGTH.size + properties_length).__add__,
            lengths,
        ),
        repeat(0, count),
        repeat(0, count),
        [message.flag for message in messages],
        lengths,
    )
    records = list(
        map(
            b"".join,
            zip(heads, bodies, repeat(batch.PROPERTIES_LENGTH.pack(properties_length)), properties),
        )
    )
    pairs = 2  # UNIQ_KEY and WAIT
    overhead = batch.encoded_message_size(topic, b"", properties[0], pairs)
    return records, list(map(overhead.__add__, lengths)), keys


def prepare_record(message: Message, uniq_key: str) -> tuple[bytes, int]:
    """One message of a batch made ready (with its UNIQ_KEY, not compressed, as RocketMQ's
    batches): its record in a batch body, and its size as the splitter counts it."""
    wire, encoded = _properties(message, uniq_key)
    return (
        batch.encode_record(message.body, message.flag, encoded),
        batch.encoded_message_size(message.topic, message.body, encoded, len(wire)),
    )


def batch_outgoing(topic: str, records: Sequence[bytes], uniq_keys: Sequence[str]) -> Outgoing:
    """A SEND_BATCH_MESSAGE of these records (prepare_record), which the splitter let go as one."""
    return Outgoing(topic, b"".join(records), 0, 0, "", ",".join(uniq_keys), is_batch=True)


# SEND_MESSAGE_V2's one-letter names ("a" producerGroup, "b" topic, ...), read from the header
# class that declares them, so the fields below are built without its general encoder.
_V2 = {f.name: f.metadata["v2"] for f in attrs.fields(SendMessageRequestHeader)}


def request(
    group: str, outgoing: Outgoing, queue_id: int, *, oneway: bool = False
) -> RemotingCommand:
    """The request that sends `outgoing` to queue `queue_id` of the broker it goes to: the
    fields SendMessageRequestHeader(...).encode(short_names=True) gives, built directly (this
    runs once per attempt of every send)."""
    fields = {
        _V2["producer_group"]: group,
        _V2["topic"]: outgoing.topic,
        _V2["default_topic"]: limits.DEFAULT_TOPIC,
        _V2["default_topic_queue_nums"]: _DEFAULT_TOPIC_QUEUES_TEXT,
        _V2["queue_id"]: str(queue_id),
        _V2["sys_flag"]: str(outgoing.sys_flag),
        _V2["born_timestamp"]: str(time.time_ns() // 1_000_000),
        _V2["flag"]: str(outgoing.flag),
        _V2["reconsume_times"]: "0",
        _V2["unit_mode"]: "false",
    }
    if outgoing.is_batch:
        fields[_V2["batch"]] = "true"
        code = RequestCode.SEND_BATCH_MESSAGE
    else:
        fields[_V2["properties"]] = outgoing.properties
        code = RequestCode.SEND_MESSAGE_V2
    return RemotingCommand.request(code, fields, outgoing.body, oneway=oneway)


_DEFAULT_TOPIC_QUEUES_TEXT = str(limits.DEFAULT_TOPIC_QUEUES)


def outcome_unknown(response: RemotingCommand) -> bool:
    """A refusal that says the message may be stored after all."""
    return response.code == ResponseCode.SYSTEM_ERROR and response.remark.startswith(
        OUTCOME_UNKNOWN_REMARK
    )


def forwarded(response: RemotingCommand) -> bool:
    """The answer came from a replica of ours that forwarded the write to its Raft leader
    (docs/protocol.md#raftforwarded): the route that named it master is stale."""
    return response.ext_fields.get(RAFT_FORWARDED_FIELD) == "true"


def stored_result(
    response: RemotingCommand, queue: MessageQueue, outgoing: Outgoing
) -> SendResult | None:
    """The SendResult of an answer that says "stored", else None."""
    status = STORED_CODES.get(response.code)
    if status is None:
        return None
    try:
        header = SendMessageResponseHeader.decode(response.ext_fields)
    except HeaderFieldError:  # stored, says the code; where, the broker did not say
        return SendResult(status, outgoing.uniq_key, "", queue, -1)
    placed = MessageQueue(queue.topic, queue.broker_name, header.queue_id)
    return SendResult(status, outgoing.uniq_key, header.msg_id, placed, header.queue_offset)


RETRYABLE_CODES = frozenset(
    {
        # RocketMQ 4.9's retryResponseCodes: worth another queue or another broker
        ResponseCode.TOPIC_NOT_EXIST,
        ResponseCode.SERVICE_NOT_AVAILABLE,
        ResponseCode.SYSTEM_ERROR,
        ResponseCode.NO_PERMISSION,
        ResponseCode.NO_BUYER_ID,
        ResponseCode.NOT_IN_CURRENT_UNIT,
        # and flow control: another group may have room
        ResponseCode.SYSTEM_BUSY,
    }
)
