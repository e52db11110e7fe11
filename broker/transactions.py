"""Transactional messages, the pure half: half records, committed records and check requests
(RocketMQ's TransactionalMessageBridge and EndTransactionProcessor; docs/protocol.md
#transactional-messages, docs/formats.md#properties).

A send with TRAN_MSG=true (or the prepared sys flag 0x4) is a half message: whoever builds its
record stores it to RMQ_SYS_TRANS_HALF_TOPIC queue 0 instead of its topic, with the real topic
and queue in REAL_TOPIC / REAL_QID, the producer group in PGROUP and the transaction bits of its
sys flag cleared (as RocketMQ's parseHalfMessageInner), so no consumer of the real topic sees
it. Its queue offset in the half queue (RocketMQ's tranStateTableOffset) names it.

END_TRANSACTION with commit (0x8) stores a copy in the real topic, with the commit bits in its
sys flag, the half's physical offset as preparedTransactionOffset, REAL_TOPIC / REAL_QID /
TRAN_MSG removed (as RocketMQ's endMessageTransaction) and TRAN_HALF_OFFSET naming the half.
Applying that copy resolves the half (broker/transaction_progress.py), and the leader's shaper
lets no second copy of the same half into the log (broker/state.py): the commit is its own op
record, as a delayed message's delivery is its own progress. A rollback is only an op record
(a "txn_end" metadata entry).
"""

from __future__ import annotations

import attrs

from broker.entries import encode_meta
from broker.transaction_progress import HOW_ROLLBACK, TransactionProgress
from remoting import properties as props
from remoting import stored_message
from remoting.headers import CheckTransactionStateRequestHeader
from remoting.message_id import offset_msg_id
from remoting.stored_message import STORE_HOST_V6_FLAG, Host, StoredMessage

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"  # RocketMQ's; one queue
HALF_QUEUE_ID = 0
# On a committed message: the queue offset of the half it commits (ours). The broker removes it
# from every send and send-back, so only END_TRANSACTION's commits carry it.
HALF_OFFSET = "TRAN_HALF_OFFSET"
HALF_OFFSET_BYTES = HALF_OFFSET.encode()

# MessageSysFlag's transaction type bits
TRANSACTION_BITS = 0xC
NOT_TYPE = 0x0  # END_TRANSACTION with it (the producer's UNKNOWN) changes nothing
PREPARED = 0x4
COMMIT = 0x8
ROLLBACK = 0xC


TRAN_MSG_BYTES = props.TRAN_MSG.encode()
IMMUNITY_BYTES = props.CHECK_IMMUNITY_TIME_IN_SECONDS.encode()
IMMUNITY_DIGITS_MAX = 9  # seconds; about 31 years, far past any retention


def is_half(properties_data: bytes, sys_flag: int) -> bool:
    """Whether a sent message is a half message: TRAN_MSG=true (what RocketMQ's broker looks
    at) or the prepared sys flag (what the protocol's sysFlag says)."""
    if sys_flag & TRANSACTION_BITS == PREPARED:
        return True
    if TRAN_MSG_BYTES not in properties_data:
        return False
    value = props.find(properties_data, TRAN_MSG_BYTES)
    return value is not None and value.lower() == b"true"


def immunity_ms_of(properties_data: bytes) -> int | None:
    """A half's CHECK_IMMUNITY_TIME_IN_SECONDS in ms: its first check is due that long after
    its store time, instead of transactionTimeOut (RocketMQ's checkImmunityTime). None when it
    has none, or one that is not a count of seconds (RocketMQ then uses transactionTimeOut
    too)."""
    if IMMUNITY_BYTES not in properties_data:
        return None
    raw = props.find(properties_data, IMMUNITY_BYTES)
    if raw is None or not raw.isdigit() or len(raw) > IMMUNITY_DIGITS_MAX:
        return None
    return int(raw) * 1000


def half_properties(
    properties: dict[str, str], real_topic: str, real_queue_id: int, producer_group: str
) -> dict[str, str]:
    """A half message's properties as its record holds them."""
    out = {k: v for k, v in properties.items() if k != HALF_OFFSET}
    out[props.TRAN_MSG] = "true"
    out.setdefault(props.PGROUP, producer_group)
    out[props.REAL_TOPIC] = real_topic
    out[props.REAL_QID] = str(real_queue_id)
    return out


def half_sys_flag(sys_flag: int) -> int:
    """A half record's sys flag: no transaction type (RocketMQ resets it), IPv4 hosts."""
    return sys_flag & ~TRANSACTION_BITS & ~0x30


@attrs.frozen
class Target:
    """Where a half goes when committed."""

    topic: str
    queue_id: int


def target_of(half: StoredMessage) -> Target | None:
    """The real topic and queue a half names, or None when it is no readable half."""
    topic = half.properties.get(props.REAL_TOPIC)
    queue_text = half.properties.get(props.REAL_QID, "")
    if half.topic != HALF_TOPIC or not topic or not queue_text.isdigit():
        return None
    return Target(topic, int(queue_text))


def committed_record(half: StoredMessage, store_host: Host, now_ms: int) -> bytes:
    """The message a committed half becomes in its real topic (offsets are the leader's to
    write). Raises ValueError for a record that is no half; MessageFormatError as pack."""
    target = target_of(half)
    if target is None:
        raise ValueError(f"the record at {half.physical_offset} is not a half message")
    drop = (props.REAL_TOPIC, props.REAL_QID, props.TRAN_MSG)
    properties = {k: v for k, v in half.properties.items() if k not in drop}
    properties[HALF_OFFSET] = str(half.queue_offset)
    return stored_message.pack(
        queue_id=target.queue_id,
        flag=half.flag,
        queue_offset=0,
        physical_offset=0,
        sys_flag=(half.sys_flag & ~TRANSACTION_BITS & ~STORE_HOST_V6_FLAG) | COMMIT,
        born_timestamp_ms=half.born_timestamp_ms,
        born_host=half.born_host,
        store_timestamp_ms=now_ms,
        store_host=store_host,
        reconsume_times=half.reconsume_times,
        prepared_transaction_offset=half.physical_offset,
        body=half.body,
        topic=target.topic,
        properties_data=props.encode(properties),
    )


def resolution_entry(half: StoredMessage, how: int, store_host: Host, now_ms: int) -> bytes:
    """The log entry that commits (COMMIT) or rolls back (ROLLBACK) `half`: the committed
    record, or a "txn_end" entry. Raises as committed_record."""
    assert how in (COMMIT, ROLLBACK), how
    if how == COMMIT:
        return committed_record(half, store_host, now_ms)
    return encode_meta(TransactionProgress.end_op(half.queue_offset, HOW_ROLLBACK))


def half_offset_of(properties_data: bytes) -> int | None:
    """The half a stored message commits (its TRAN_HALF_OFFSET), or None."""
    raw = props.find(properties_data, HALF_OFFSET_BYTES)
    if raw is None or not raw.isdigit() or len(raw) > 18:
        return None
    return int(raw)


def strip_half_offset(properties_data: bytes) -> bytes:
    """A sent message's properties without a TRAN_HALF_OFFSET a client set (only commits may
    carry one); unchanged when it has none, or when they do not decode (then nothing in them
    counts as one either: see half_offset_of's callers, which read the same bytes)."""
    if HALF_OFFSET_BYTES not in properties_data:
        return properties_data
    try:
        values = props.decode(properties_data)
    except UnicodeDecodeError:
        return properties_data
    if values.pop(HALF_OFFSET, None) is None:
        return properties_data
    return props.encode(values)


@attrs.frozen
class Check:
    """A CHECK_TRANSACTION_STATE for one half: its header, its body and whom it goes to."""

    producer_group: str
    header: CheckTransactionStateRequestHeader
    body: bytes  # the half as a record in its real topic and queue (RocketMQ's)
    uniq_key: str


def check_of(half: StoredMessage) -> Check | None:
    """The check request for a half (RocketMQ's sendCheckMessage), or None when the record
    is no readable half."""
    target = target_of(half)
    if target is None:
        return None
    uniq_key = half.properties.get(props.UNIQ_KEY, "")
    header = CheckTransactionStateRequestHeader(
        tran_state_table_offset=half.queue_offset,
        commit_log_offset=half.physical_offset,
        msg_id=uniq_key or None,
        transaction_id=uniq_key or None,
        offset_msg_id=offset_msg_id(half.store_host, half.physical_offset),
    )
    body = stored_message.encode(attrs.evolve(half, topic=target.topic, queue_id=target.queue_id))
    return Check(half.properties.get(props.PGROUP, ""), header, body, uniq_key)
